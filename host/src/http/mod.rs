//! The HTTP API: one module per resource, each with its own `router()`.
//! Only this module knows JSON shapes and status codes.

mod deployers;
mod deployments;
mod error;
mod events;
mod json;
mod metrics;
mod models;
mod observe;
mod webhook;

pub use webhook::{Webhook, signature};

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::get;

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

/// The whole API; `serve` runs it, tests call it with `oneshot`.
pub fn app(ctx: ApiContext) -> Router {
    Router::new()
        .merge(models::router())
        .merge(deployments::router())
        .merge(deployers::router())
        .merge(events::router())
        .merge(metrics::router())
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async {
            error::Error::NotFound(
                "no such endpoint; the API lives under /v1 (see README.md)".into(),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
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
