//! The HTTP API: one module per resource, each with its own `router()`.
//! Only this module knows JSON shapes and status codes.

mod deployers;
mod deployments;
mod error;
mod events;
mod json;
mod models;
mod webhook;

pub use webhook::{Webhook, signature};

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;

use crate::pipeline::Pipeline;

/// A registration lists every file of a model; allow large ones.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

pub fn app(pipeline: Arc<Pipeline>) -> Router {
    Router::new()
        .merge(models::router())
        .merge(deployments::router())
        .merge(deployers::router())
        .merge(events::router())
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async {
            error::Error::NotFound(
                "no such endpoint; the API lives under /v1 (see README.md)".into(),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(pipeline)
}
