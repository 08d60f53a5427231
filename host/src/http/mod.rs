//! The HTTP API: one module per resource, each with its own `router()`.
//! Only this module knows JSON shapes and status codes.

mod artifacts;
mod auth;
mod deployers;
mod deployments;
mod error;
mod events;
mod json;
mod metrics;
mod models;
mod observe;
mod page;
mod webhook;

pub use webhook::{Webhook, signature};

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::get;

use crate::auth::Tokens;
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
    /// The accepted API tokens; `None`: the API is open (loopback only).
    pub tokens: Option<Arc<Tokens>>,
}

/// Readiness: 503 with what is still loading until the server's first load
/// of the plugins folder is done (liveness is `/healthz`).
async fn ready(
    axum::extract::State(ctx): axum::extract::State<ApiContext>,
) -> Result<&'static str, error::Error> {
    let loading = ctx.deployers.still_loading();
    if loading.is_empty() {
        return Ok("ready");
    }
    Err(error::Error::Unavailable(format!(
        "not ready: still loading {} of the plugins folder's deployers ({})",
        loading.len(),
        loading.join(", ")
    )))
}

/// The whole API; `serve` runs it, tests call it with `oneshot`.
pub fn app(ctx: ApiContext) -> Router {
    Router::new()
        .merge(models::router())
        .merge(deployments::router())
        .merge(artifacts::router())
        .merge(deployers::router())
        .merge(events::router())
        .merge(metrics::router())
        .merge(page::router())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .fallback(|| async {
            error::Error::NotFound(
                "no such endpoint; the API lives under /v1 (see README.md)".into(),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(ctx.clone(), auth::require))
        // Outermost, so every answer (refusals too) has an id and a count.
        .layer(middleware::from_fn(observe::observe))
        .with_state(ctx)
}

/// `--metrics-listen`: `/metrics` alone, for an address the API is not on.
pub fn metrics_app() -> Router {
    metrics::router().fallback(|| async {
        error::Error::NotFound("this address serves only GET /metrics".into())
    })
}
