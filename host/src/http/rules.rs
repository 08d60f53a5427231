//! `/v1/rules`: list, show, create, change (and disable) and delete deploy
//! rules. `rules::Rules` checks and stores them; this module only
//! translates HTTP.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::extract::Body;
use super::json::{self, ErrorBody, ProblemsBody, RuleBody};
use crate::auth::Caller;
use crate::rules::{RuleError, Spec, set::Listed};

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(show, change, remove))
}

/// Every rule, declared and stored, with its last firings.
#[utoipa::path(get, path = "/v1/rules", operation_id = "list_rules", tag = "rules",
    responses(
        (status = OK, description = "The rules, by name", body = json::Rules),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn list(State(ctx): State<ApiContext>) -> Result<Json<json::Rules>, Error> {
    let mut rules = Vec::new();
    for listed in ctx.rules.all().await? {
        rules.push(answer(&ctx, listed).await?);
    }
    Ok(Json(json::Rules { rules }))
}

/// One rule, with its last firings.
#[utoipa::path(get, path = "/v1/rules/{name}", operation_id = "show_rule", tag = "rules",
    params(("name" = String, Path, description = "The rule's name")),
    responses(
        (status = OK, description = "The rule", body = json::Rule),
        (status = NOT_FOUND, description = "No such rule", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn show(
    State(ctx): State<ApiContext>,
    Path(name): Path<String>,
) -> Result<Json<json::Rule>, Error> {
    let listed = ctx.rules.get(&name).await.map_err(refused)?;
    Ok(Json(answer(&ctx, listed).await?))
}

/// Stores a rule, shared by every server. Needs the admin role.
#[utoipa::path(post, path = "/v1/rules", operation_id = "create_rule", tag = "rules",
    request_body = RuleBody,
    responses(
        (status = CREATED, description = "The stored rule", body = json::Rule),
        (status = BAD_REQUEST, description = "Every problem of the rule, each with its field: an unknown deployer, options it refuses, an unknown `${…}`, a cycle, a chain deeper than 8", body = ProblemsBody),
        (status = CONFLICT, description = "A rule of that name exists, or the rules file declares it", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be written", body = ErrorBody),
    ))]
async fn create(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Body(body): Body<RuleBody>,
) -> Result<(StatusCode, Json<json::Rule>), Error> {
    let spec = spec(body)?;
    let by = caller.map(|Extension(c)| c.name);
    let listed = ctx.rules.create(spec, by).await.map_err(refused)?;
    Ok((StatusCode::CREATED, Json(answer(&ctx, listed).await?)))
}

/// Replaces a stored rule (`disabled: true` keeps it without firing).
/// Needs the admin role.
#[utoipa::path(put, path = "/v1/rules/{name}", operation_id = "change_rule", tag = "rules",
    params(("name" = String, Path, description = "The rule's name")),
    request_body = RuleBody,
    responses(
        (status = OK, description = "The changed rule", body = json::Rule),
        (status = BAD_REQUEST, description = "Every problem of the rule, each with its field", body = ProblemsBody),
        (status = NOT_FOUND, description = "No such stored rule", body = ErrorBody),
        (status = CONFLICT, description = "The rules file declares it: change it there", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be written", body = ErrorBody),
    ))]
async fn change(
    State(ctx): State<ApiContext>,
    Path(name): Path<String>,
    Body(body): Body<RuleBody>,
) -> Result<Json<json::Rule>, Error> {
    let spec = spec(body)?;
    let listed = ctx.rules.change(&name, spec).await.map_err(refused)?;
    Ok(Json(answer(&ctx, listed).await?))
}

/// Deletes a stored rule; the deployments it caused keep their cause.
/// Needs the admin role.
#[utoipa::path(delete, path = "/v1/rules/{name}", operation_id = "delete_rule", tag = "rules",
    params(("name" = String, Path, description = "The rule's name")),
    responses(
        (status = NO_CONTENT, description = "Deleted"),
        (status = NOT_FOUND, description = "No such stored rule", body = ErrorBody),
        (status = CONFLICT, description = "The rules file declares it: change it there", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be written", body = ErrorBody),
    ))]
async fn remove(
    State(ctx): State<ApiContext>,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    ctx.rules.delete(&name).await.map_err(refused)?;
    Ok(StatusCode::NO_CONTENT)
}

/// The body as a rule: its parts read by the rules file's format.
fn spec(body: RuleBody) -> Result<Spec, Error> {
    let value = serde_json::to_value(&body).map_err(|e| Error::Internal(e.to_string()))?;
    let mut value = value;
    if value.get("match").is_some_and(|m| m.is_null()) {
        value.as_object_mut().map(|o| o.remove("match"));
    }
    serde_json::from_value(value).map_err(|e| Error::BadRequest(format!("not a rule: {e}")))
}

async fn answer(ctx: &ApiContext, listed: Listed) -> Result<json::Rule, Error> {
    let firings = ctx.db.firings_of(&listed.spec.name, 10).await?;
    Ok(json::Rule::new(listed, firings))
}

fn refused(e: RuleError) -> Error {
    match e {
        RuleError::Invalid(problems) => Error::InvalidRule(problems),
        e @ (RuleError::Declared(_) | RuleError::Exists(_)) => Error::Conflict(e.to_string()),
        e @ RuleError::Unknown(_) => Error::NotFound(e.to_string()),
        RuleError::Record(e) => e.into(),
    }
}
