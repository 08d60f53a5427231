//! Deployments: start one (attached or in the background), list a model's,
//! show one, cancel one, read its log. The pipeline runs them; this module
//! only translates HTTP.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::ApiContext;
use super::error::Error;
use super::json::{self, Body, DeployBody, DeployParams, Id, ListParams, Params};
use crate::auth::Caller;
use crate::model::Status;
use crate::pipeline::{CancelError, MAX_OPTIONS_BYTES, Request};

pub fn router() -> Router<ApiContext> {
    Router::new()
        .route("/v1/models/{id}/deployments", post(deploy).get(list))
        .route("/v1/deployments/{id}", get(show))
        .route("/v1/deployments/{id}/cancel", post(cancel))
        .route("/v1/deployments/{id}/logs", get(logs))
}

async fn deploy(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Id(model_id): Id,
    Params(params): Params<DeployParams>,
    Body(body): Body<DeployBody>,
) -> Result<(StatusCode, Json<Value>), Error> {
    let Some(deployer) = body.deployer.filter(|d| !d.is_empty()) else {
        return Err(Error::BadRequest(
            "deployer is required: the name of a loaded deployer (see GET /v1/deployers)".into(),
        ));
    };
    let options = match body.options {
        None | Some(Value::Null) => "{}".to_string(),
        Some(value @ Value::Object(_)) => value.to_string(),
        Some(_) => return Err(Error::BadRequest("options must be a JSON object".into())),
    };
    if options.len() > MAX_OPTIONS_BYTES {
        return Err(Error::BadRequest(format!(
            "options are {} bytes; at most {} KiB are accepted",
            options.len(),
            MAX_OPTIONS_BYTES / 1024
        )));
    }
    let created_by = caller.map(|Extension(c)| c.name);
    let request = Request {
        model_id,
        deployer: &deployer,
        options_json: &options,
        created_by: created_by.as_deref(),
    };
    if params.wait == Some(false) {
        let running = ctx.pipeline.run_detached(request).await?;
        return Ok((StatusCode::ACCEPTED, Json(json::deployment(&running))));
    }
    let stored = ctx.pipeline.run_attached(request).await?;
    let status = match stored.status {
        Status::Completed => StatusCode::OK,
        _ => StatusCode::BAD_GATEWAY,
    };
    Ok((status, Json(json::deployment(&stored))))
}

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 500;

async fn list(
    State(ctx): State<ApiContext>,
    Id(model_id): Id,
    Params(params): Params<ListParams>,
) -> Result<Json<Value>, Error> {
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(Error::BadRequest(format!(
            "limit must be between 1 and {MAX_LIMIT}, got {limit}"
        )));
    }
    if ctx.db.model(model_id).await?.is_none() {
        return Err(Error::NotFound(format!("model {model_id} does not exist")));
    }
    let deployments = ctx.db.deployments_of(model_id, limit).await?;
    Ok(Json(
        json!({ "deployments": deployments.iter().map(json::deployment).collect::<Vec<_>>() }),
    ))
}

async fn show(State(ctx): State<ApiContext>, Id(id): Id) -> Result<Json<Value>, Error> {
    match ctx.db.deployment(id).await? {
        Some(d) => Ok(Json(json::deployment(&d))),
        None => Err(Error::NotFound(format!("deployment {id} does not exist"))),
    }
}

/// Stops a running deployment; answers with the row once it has ended.
async fn cancel(State(ctx): State<ApiContext>, Id(id): Id) -> Result<Json<Value>, Error> {
    match ctx.pipeline.cancel(id).await {
        Ok(deployment) => Ok(Json(json::deployment(&deployment))),
        Err(e @ CancelError::Unknown(_)) => Err(Error::NotFound(e.to_string())),
        Err(e @ (CancelError::Ended { .. } | CancelError::Elsewhere(_))) => {
            Err(Error::Conflict(e.to_string()))
        }
        Err(CancelError::Record(e)) => Err(e.into()),
    }
}

/// The deployer's log lines (its `log` calls and its stdout/stderr).
async fn logs(State(ctx): State<ApiContext>, Id(id): Id) -> Result<String, Error> {
    ctx.pipeline
        .logs(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("deployment {id} does not exist")))
}
