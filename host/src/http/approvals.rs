//! Approvals: the deployments rules held for an admin, and the admin's
//! decision on one (`approve`, `reject`, with an optional comment). The
//! pipeline records the decision; this module only translates HTTP.

use axum::extract::State;
use axum::{Extension, Json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::extract::Id;
use super::json::{self, DecisionBody, ErrorBody};
use crate::auth::Caller;
use crate::model::Decision;
use crate::pipeline::DecideError;

/// The longest comment kept with a decision.
const MAX_COMMENT_CHARS: usize = 2000;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(pending))
        .routes(routes!(approve))
        .routes(routes!(reject))
}

/// The deployments awaiting an admin's approval, oldest first.
#[utoipa::path(get, path = "/v1/approvals", operation_id = "list_approvals", tag = "rules",
    responses(
        (status = OK, description = "The deployments with status `awaiting_approval`", body = json::Deployments),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn pending(State(ctx): State<ApiContext>) -> Result<Json<json::Deployments>, Error> {
    Ok(Json(ctx.db.awaiting_approval(500).await?.into()))
}

/// Approves a deployment a rule held: it is queued and runs on a server
/// with room. Needs the admin role.
#[utoipa::path(post, path = "/v1/deployments/{id}/approve", operation_id = "approve_deployment", tag = "rules",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id")),
    request_body(content = Option<DecisionBody>, description = "Optional: a comment kept with the decision"),
    responses(
        (status = OK, description = "The deployment, now queued, with its `approval`", body = json::Deployment),
        (status = BAD_REQUEST, description = "A bad id or body (a comment over 2000 characters or with a control character)", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment", body = ErrorBody),
        (status = CONFLICT, description = "It is not awaiting approval (decided already, or never held)", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be written", body = ErrorBody),
    ))]
async fn approve(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Id(id): Id,
    body: axum::body::Bytes,
) -> Result<Json<json::Deployment>, Error> {
    decide(&ctx, caller, id, Decision::Approved, &body).await
}

/// Rejects a deployment a rule held: it fails, never having run, its
/// error naming who rejected it and the comment. Needs the admin role.
#[utoipa::path(post, path = "/v1/deployments/{id}/reject", operation_id = "reject_deployment", tag = "rules",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id")),
    request_body(content = Option<DecisionBody>, description = "Optional: a comment kept with the decision"),
    responses(
        (status = OK, description = "The deployment, now failed, with its `approval`", body = json::Deployment),
        (status = BAD_REQUEST, description = "A bad id or body (a comment over 2000 characters or with a control character)", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment", body = ErrorBody),
        (status = CONFLICT, description = "It is not awaiting approval (decided already, or never held)", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be written", body = ErrorBody),
    ))]
async fn reject(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Id(id): Id,
    body: axum::body::Bytes,
) -> Result<Json<json::Deployment>, Error> {
    decide(&ctx, caller, id, Decision::Rejected, &body).await
}

async fn decide(
    ctx: &ApiContext,
    caller: Option<Extension<Caller>>,
    id: i64,
    decision: Decision,
    body: &[u8],
) -> Result<Json<json::Deployment>, Error> {
    let body: DecisionBody = if body.iter().all(u8::is_ascii_whitespace) {
        DecisionBody::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            Error::BadRequest(format!(
                "the body must be empty or a JSON object {{\"comment\": \"…\"}}: {e}"
            ))
        })?
    };
    let comment = body.comment.filter(|c| !c.trim().is_empty());
    if comment
        .as_ref()
        .is_some_and(|c| c.chars().count() > MAX_COMMENT_CHARS)
    {
        return Err(Error::BadRequest(format!(
            "comment is longer than {MAX_COMMENT_CHARS} characters; say it more briefly"
        )));
    }
    // Kept in the deployment's error too, as text a person reads.
    if comment
        .as_ref()
        .is_some_and(|c| c.chars().any(char::is_control))
    {
        return Err(Error::BadRequest(
            "comment holds a control character (a line break, a tab, NUL…); write it on one line"
                .into(),
        ));
    }
    let by = caller.map(|Extension(c)| c.name);
    match ctx
        .pipeline
        .decide(id, decision, by.as_deref(), comment.as_deref())
        .await
    {
        Ok(row) => Ok(Json(row.into())),
        Err(e @ DecideError::Unknown(_)) => Err(Error::NotFound(e.to_string())),
        Err(e @ DecideError::NotAwaiting { .. }) => Err(Error::Conflict(e.to_string())),
        Err(DecideError::Record(e)) => Err(e.into()),
    }
}
