//! The HTTP API: one module per resource, each with its own `router()`.
//! Only this module knows JSON shapes and status codes.

mod deployers;
mod deployments;
mod error;
mod events;
mod json;
mod models;
mod openapi;
mod webhook;

pub use webhook::{Webhook, signature};

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::db::Db;
use crate::deployers::Deployers;
use crate::events::Events;
use crate::pipeline::Pipeline;

/// A registration lists every file of a model; allow large ones.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// What the handlers reach: records to read and write directly, the
/// pipeline for anything that runs a deployment, the deployers and the
/// event stream to show.
#[derive(Clone)]
pub struct ApiContext {
    pub db: Db,
    pub events: Events,
    pub deployers: Arc<Deployers>,
    pub pipeline: Arc<Pipeline>,
}

/// Every route with its docs, in one place: `app` serves these routes and
/// `document` describes them, so neither has one the other lacks.
fn routes() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::with_openapi(openapi::base())
        .merge(models::router())
        .merge(deployments::router())
        .merge(deployers::router())
        .merge(events::router())
        .routes(routes!(healthz))
        .merge(openapi::router())
}

/// The whole API; `serve` runs it, tests call it with `oneshot`.
pub fn app(ctx: ApiContext) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .fallback(|| async {
            error::Error::NotFound(
                "no such endpoint; the API lives under /v1 (see README.md)".into(),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(ctx)
}

/// The OpenAPI document of `app`, as `GET /openapi.json` serves it.
fn document() -> utoipa::openapi::OpenApi {
    openapi::guard(routes().into_openapi())
}

/// Liveness: answers while the process serves requests.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "server",
    responses((status = OK, description = "`ok`", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}
