//! `/v1/models`: register, list, show and delete trained models.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::ApiContext;
use super::error::Error;
use super::json::{self, Body, Id, RegisterBody};
use crate::auth::Caller;
use crate::validate::{self, FileDraft, ModelDraft};

pub fn router() -> Router<ApiContext> {
    Router::new()
        .route("/v1/models", get(list).post(register))
        .route("/v1/models/{id}", get(show).delete(remove))
}

async fn register(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Body(body): Body<RegisterBody>,
) -> Result<(StatusCode, Json<Value>), Error> {
    let draft = ModelDraft {
        name: body.name,
        job_id: body.job_id,
        base_model: body.base_model,
        model_size: body.model_size,
        dataset: body.dataset,
        num_examples: body.num_examples,
        num_train_steps: body.num_train_steps,
        final_loss: body.final_loss,
        params: body.params,
        source: body.source,
        files: body
            .files
            .into_iter()
            .map(|f| FileDraft {
                path: f.path,
                size_bytes: f.size_bytes,
                sha256: f.sha256,
            })
            .collect(),
    };
    let mut model =
        validate::model(draft).map_err(|p| Error::BadRequest(format!("invalid model: {p}")))?;
    model.created_by = caller.map(|Extension(c)| c.name);
    let stored = ctx.db.insert_model(&model).await?;
    tracing::info!(model_id = stored.id, job_id = %stored.job_id, files = stored.files.len(), "model registered");
    Ok((StatusCode::CREATED, Json(json::model(&stored))))
}

async fn list(State(ctx): State<ApiContext>) -> Result<Json<Value>, Error> {
    let models = ctx.db.models().await?;
    Ok(Json(
        json!({ "models": models.iter().map(json::model).collect::<Vec<_>>() }),
    ))
}

async fn show(State(ctx): State<ApiContext>, Id(id): Id) -> Result<Json<Value>, Error> {
    match ctx.db.model(id).await? {
        Some(model) => Ok(Json(json::model(&model))),
        None => Err(Error::NotFound(format!("model {id} does not exist"))),
    }
}

/// Deletes the records only: the files on disk are never deleted by berth.
async fn remove(State(ctx): State<ApiContext>, Id(id): Id) -> Result<StatusCode, Error> {
    if ctx.db.delete_model(id).await? {
        tracing::info!(model_id = id, "model deleted (its files stay on disk)");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Error::NotFound(format!("model {id} does not exist")))
    }
}
