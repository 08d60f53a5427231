//! Deployments: start one (attached or in the background), list a model's,
//! show one, cancel one, read its log. The pipeline runs them; this module
//! only translates HTTP.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::extract::{Body, Id, Params};
use super::json::{
    self, DeployBody, DeployParams, ErrorBody, ListParams, Published, PublishedPage,
    PublishedParams,
};
use crate::auth::Caller;
use crate::model::Status;
use crate::pipeline::{CancelError, Request};

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(deploy, list))
        .routes(routes!(show))
        .routes(routes!(cancel))
        .routes(routes!(logs))
        .routes(routes!(published))
}

/// Deploys a model: fetches and verifies its files, runs the deployer.
///
/// Answers when the deployment has ended, or at once with `wait=false`.
#[utoipa::path(post, path = "/v1/models/{id}/deployments", operation_id = "deploy", tag = "deployments",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The model's id"), DeployParams),
    request_body = DeployBody,
    responses(
        (status = OK, description = "The deployment completed", body = json::Deployment),
        (status = ACCEPTED, description = "With `wait=false`: the deployment is queued, for a server with room to run", body = json::Deployment),
        (status = BAD_REQUEST, description = "A bad id, body or parameter, an unknown deployer, or options its schema refuses", body = ErrorBody),
        (status = NOT_FOUND, description = "No such model", body = ErrorBody),
        (status = CONFLICT, description = "Under `--pickle refuse`: an earlier fetch found pickle files in the model, and the deployer's manifest does not say `accepts_pickle = true`; `error` names the files", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be written", body = ErrorBody),
        (status = BAD_GATEWAY, description = "The deployment failed: the stored row, with its `error`", body = json::Deployment),
        (status = SERVICE_UNAVAILABLE, description = "The deployer is still loading after a start; try again shortly", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait before trying again"))),
    ))]
async fn deploy(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Id(model_id): Id,
    Params(params): Params<DeployParams>,
    Body(body): Body<DeployBody>,
) -> Result<(StatusCode, Json<json::Deployment>), Error> {
    let Some(deployer) = body.deployer.filter(|d| !d.is_empty()) else {
        return Err(Error::BadRequest(
            "deployer is required: the name of a loaded deployer (see GET /v1/deployers)".into(),
        ));
    };
    // Checked, as every path's options are, by the pipeline's one gate.
    let options = match body.options {
        None | Some(Value::Null) => "{}".to_string(),
        Some(value) => value.to_string(),
    };
    let created_by = caller.map(|Extension(c)| c.name);
    let request = Request {
        model_id,
        deployer: &deployer,
        options_json: &options,
        created_by: created_by.as_deref(),
    };
    if params.wait == Some(false) {
        let queued = ctx.pipeline.run_detached(request).await?;
        return Ok((StatusCode::ACCEPTED, Json(queued.into())));
    }
    let stored = ctx.pipeline.run_attached(request).await?;
    let status = match stored.status {
        Status::Completed => StatusCode::OK,
        _ => StatusCode::BAD_GATEWAY,
    };
    Ok((status, Json(stored.into())))
}

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 500;

/// A model's deployments, newest first.
#[utoipa::path(get, path = "/v1/models/{id}/deployments", operation_id = "list_deployments", tag = "deployments",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The model's id"), ListParams),
    responses(
        (status = OK, description = "The deployments", body = json::Deployments),
        (status = BAD_REQUEST, description = "A bad id or limit", body = ErrorBody),
        (status = NOT_FOUND, description = "No such model", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn list(
    State(ctx): State<ApiContext>,
    Id(model_id): Id,
    Params(params): Params<ListParams>,
) -> Result<Json<json::Deployments>, Error> {
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(Error::BadRequest(format!(
            "limit must be between 1 and {MAX_LIMIT}, got {limit}"
        )));
    }
    if ctx.db.model(model_id).await?.is_none() {
        return Err(Error::no_model(model_id));
    }
    Ok(Json(ctx.db.deployments_of(model_id, limit).await?.into()))
}

/// One deployment; while it runs, its `phase` and `progress`.
#[utoipa::path(get, path = "/v1/deployments/{id}", operation_id = "show_deployment", tag = "deployments",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id")),
    responses(
        (status = OK, description = "The deployment", body = json::Deployment),
        (status = BAD_REQUEST, description = "The id is not a positive integer", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn show(State(ctx): State<ApiContext>, Id(id): Id) -> Result<Json<json::Deployment>, Error> {
    match ctx.db.deployment(id).await? {
        Some(d) => Ok(Json(d.into())),
        None => Err(Error::no_deployment(id)),
    }
}

/// What a deployment put into publishing targets, a page at a time, in
/// the order of its puts.
#[utoipa::path(get, path = "/v1/deployments/{id}/published", operation_id = "deployment_published", tag = "deployments",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id"), PublishedParams),
    responses(
        (status = OK, description = "A page of its puts", body = PublishedPage),
        (status = BAD_REQUEST, description = "A bad id or limit", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn published(
    State(ctx): State<ApiContext>,
    Id(id): Id,
    Params(params): Params<PublishedParams>,
) -> Result<Json<PublishedPage>, Error> {
    let limit = params.limit.unwrap_or(json::PUBLISHED_SHOWN);
    if !(1..=MAX_PUBLISHED_PAGE).contains(&limit) {
        return Err(Error::BadRequest(format!(
            "limit must be between 1 and {MAX_PUBLISHED_PAGE}, got {limit}"
        )));
    }
    let Some(deployment) = ctx.db.deployment(id).await? else {
        return Err(Error::no_deployment(id));
    };
    let total = deployment.published.len();
    let after = params.after.unwrap_or(0).min(total);
    let end = after.saturating_add(limit).min(total);
    Ok(Json(PublishedPage {
        next: (end < total).then_some(end),
        published: deployment.published[after..end]
            .iter()
            .cloned()
            .map(Published::from)
            .collect(),
        total,
    }))
}

/// A page of puts holds at most this many.
const MAX_PUBLISHED_PAGE: usize = 1000;

/// Stops a queued or running deployment, on whichever server runs it;
/// answers with the row once it has ended (200), or with the row still
/// running if it did not end within 10 s (202: the cancel is recorded and
/// its server carries it out).
#[utoipa::path(post, path = "/v1/deployments/{id}/cancel", operation_id = "cancel_deployment", tag = "deployments",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id")),
    responses(
        (status = OK, description = "The deployment, failed: cancelled", body = json::Deployment),
        (status = ACCEPTED, description = "The cancel is recorded; the deployment had not ended yet", body = json::Deployment),
        (status = BAD_REQUEST, description = "The id is not a positive integer", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment", body = ErrorBody),
        (status = CONFLICT, description = "It has ended already", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read or written", body = ErrorBody),
    ))]
async fn cancel(
    State(ctx): State<ApiContext>,
    Id(id): Id,
) -> Result<(StatusCode, Json<json::Deployment>), Error> {
    match ctx.pipeline.cancel(id).await {
        Ok(deployment) => {
            let status = match deployment.status.is_final() {
                true => StatusCode::OK,
                false => StatusCode::ACCEPTED,
            };
            Ok((status, Json(deployment.into())))
        }
        Err(e @ CancelError::Unknown(_)) => Err(Error::NotFound(e.to_string())),
        Err(e @ CancelError::Ended { .. }) => Err(Error::Conflict(e.to_string())),
        Err(CancelError::Record(e)) => Err(e.into()),
    }
}

/// The deployer's log lines: its `log` calls and its stdout/stderr.
///
/// Bounded: the oldest lines are dropped first.
#[utoipa::path(get, path = "/v1/deployments/{id}/logs", operation_id = "deployment_logs", tag = "deployments",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id")),
    responses(
        (status = OK, description = "The log, one line per entry", body = String, content_type = "text/plain"),
        (status = BAD_REQUEST, description = "The id is not a positive integer", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn logs(State(ctx): State<ApiContext>, Id(id): Id) -> Result<String, Error> {
    ctx.pipeline
        .logs(id)
        .await?
        .ok_or_else(|| Error::no_deployment(id))
}
