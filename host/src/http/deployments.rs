//! Deployments: start one (the pipeline, synchronously), list a model's,
//! show one. A client that disconnects from a synchronous deploy cancels it.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::Error;
use super::json::{self, Body, Id, Params};
use crate::model::Status;
use crate::pipeline::{CancelError, MAX_OPTIONS_BYTES, Pipeline};

pub fn router() -> Router<Arc<Pipeline>> {
    Router::new()
        .route("/v1/models/{id}/deployments", post(deploy).get(list))
        .route("/v1/deployments/{id}", get(show))
        .route("/v1/deployments/{id}/cancel", post(cancel))
        .route("/v1/deployments/{id}/logs", get(logs))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployBody {
    deployer: Option<String>,
    options: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployParams {
    /// `false`: answer 202 at once and let the deployment run on.
    wait: Option<bool>,
}

async fn deploy(
    State(pipeline): State<Arc<Pipeline>>,
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
    let started = pipeline.start(model_id, &deployer, &options).await?;

    if params.wait == Some(false) {
        let running = json::deployment(&started.deployment);
        let worker = pipeline.clone();
        tokio::spawn(async move {
            if let Err(e) = worker.run(started).await {
                tracing::error!("recording the end of a background deployment: {e}");
            }
        });
        return Ok((StatusCode::ACCEPTED, Json(running)));
    }

    // The work runs in its own task so that it always records its outcome;
    // this handler's future is dropped when the client disconnects, and the
    // guard then cancels the work instead of abandoning it.
    let _cancel_on_disconnect = started.cancel_on_drop();
    let worker = pipeline.clone();
    let task = tokio::spawn(async move { worker.run(started).await });
    let stored = task
        .await
        .map_err(|e| Error::Internal(format!("deployment task crashed: {e}")))??;
    let status = match stored.status {
        Status::Completed => StatusCode::OK,
        _ => StatusCode::BAD_GATEWAY,
    };
    Ok((status, Json(json::deployment(&stored))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    limit: Option<u32>,
}

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 500;

async fn list(
    State(pipeline): State<Arc<Pipeline>>,
    Id(model_id): Id,
    Params(params): Params<ListParams>,
) -> Result<Json<Value>, Error> {
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(Error::BadRequest(format!(
            "limit must be between 1 and {MAX_LIMIT}, got {limit}"
        )));
    }
    if pipeline.db.model(model_id).await?.is_none() {
        return Err(Error::NotFound(format!("model {model_id} does not exist")));
    }
    let deployments = pipeline.db.deployments_of(model_id, limit).await?;
    Ok(Json(
        json!({ "deployments": deployments.iter().map(json::deployment).collect::<Vec<_>>() }),
    ))
}

async fn show(State(pipeline): State<Arc<Pipeline>>, Id(id): Id) -> Result<Json<Value>, Error> {
    match pipeline.db.deployment(id).await? {
        Some(d) => Ok(Json(json::deployment(&d))),
        None => Err(Error::NotFound(format!("deployment {id} does not exist"))),
    }
}

/// Stops a running deployment; answers with the row once it has ended.
async fn cancel(State(pipeline): State<Arc<Pipeline>>, Id(id): Id) -> Result<Json<Value>, Error> {
    match pipeline.cancel(id).await {
        Ok(deployment) => Ok(Json(json::deployment(&deployment))),
        Err(e @ CancelError::Unknown(_)) => Err(Error::NotFound(e.to_string())),
        Err(e @ (CancelError::Ended { .. } | CancelError::Elsewhere(_))) => {
            Err(Error::Conflict(e.to_string()))
        }
        Err(CancelError::Record(e)) => Err(e.into()),
    }
}

/// The deployer's log lines (its `log` calls and its stdout/stderr).
async fn logs(State(pipeline): State<Arc<Pipeline>>, Id(id): Id) -> Result<String, Error> {
    pipeline
        .logs(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("deployment {id} does not exist")))
}
