//! The HTTP API: one module per resource, each with its own `router()`.
//! Only this module defines JSON shapes (`json/`, which the CLI client
//! reads answers into) and status codes.

mod approvals;
mod artifacts;
mod auth;
mod blobs;
mod deployers;
mod deployments;
mod drain;
mod error;
mod events;
mod extract;
pub mod json;
mod metrics;
mod mlflow;
pub mod mlflow_catch_up;
mod models;
mod observe;
mod openapi;
mod page;
mod rules;
mod storage;
mod webhook;

pub use webhook::{Webhook, signature};

/// A registration as `POST /v1/models` takes it, from JSON text, checked by
/// the same rules; for `berth plugin run --model`. The error is the
/// sentence to show.
pub fn registration(text: &str) -> Result<crate::model::TrainedModel, String> {
    let body: json::RegisterBody = serde_json::from_str(text)
        .map_err(|e| format!("not a registration body as POST /v1/models takes it: {e}"))?;
    models::checked(body)
}

/// What a stored event says happened, for the rules that fire from it:
/// read back by its kind, as a client reads it.
pub fn happened(event: &crate::db::events::StoredEvent) -> Option<crate::rules::Happened> {
    use crate::rules::Happened;
    let data = serde_json::from_str(&event.data).ok()?;
    match json::EventData::read(&event.kind, data)? {
        json::EventData::ModelRegistered(e) => Some(Happened::Registered {
            model_id: e.model_id,
        }),
        json::EventData::DeploymentCompleted(e) => Some(Happened::Completed {
            deploy_id: e.deploy_id,
        }),
        _ => None,
    }
}

/// An event's `data` as SSE and the webhook carry it: the JSON text the
/// event log stores, so that what is sent is what was stored, whichever
/// server (of whichever version) stored it.
pub fn event_data(event: &crate::events::Event) -> String {
    serde_json::to_string(&json::event(event)).expect("event data serializes")
}

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::middleware;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Tokens;
use crate::catalog::Catalog;
use crate::db::Db;
use crate::deployers::Deployers;
use crate::events::Events;
use crate::fetch::Fetcher;
use crate::loops::Loops;
use crate::pipeline::Pipeline;
use crate::rules::Rules;
use crate::targets::Targets;
use json::ErrorBody;

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
    /// The deployers stored over the API.
    pub catalog: Arc<Catalog>,
    /// The deploy rules, declared and stored.
    pub rules: Arc<Rules>,
    pub pipeline: Arc<Pipeline>,
    /// The pipeline's fetcher: its sources' clients serve other readers of
    /// a registry (a deployer pulled over the API) or of a store (a
    /// registration whose files are listed).
    pub fetcher: Fetcher,
    /// The accepted API tokens; `None`: the API is open (loopback only).
    pub tokens: Option<Arc<Tokens>>,
    /// The webhook this server delivers to, if configured.
    pub webhook: Option<Arc<Webhook>>,
    /// The publishing targets of the sources file; the deployers' answers
    /// show the URLs of those they are granted.
    pub targets: Arc<Targets>,
    /// Cancelled when the server stops: answers that would last (event
    /// streams) end then.
    pub shutdown: CancellationToken,
    /// The most bytes the models dir may hold (`--models-max-gib`); `None`:
    /// no budget.
    pub models_max_bytes: Option<u64>,
    /// The server's long-lived loops: one that ended makes it not ready.
    pub loops: Loops,
    /// The MLflow tracking servers the sources file follows (`[[mlflow]]`).
    pub mlflow: Arc<crate::mlflow::Servers>,
}

/// Every route with its docs, in one place: `app` serves these routes and
/// `document` describes them, so neither has one the other lacks.
fn routes() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::with_openapi(openapi::base())
        .merge(models::router())
        .merge(storage::router())
        .merge(blobs::router())
        .merge(deployments::router())
        .merge(approvals::router())
        .merge(rules::router())
        .merge(artifacts::router())
        .merge(deployers::router())
        .merge(events::router())
        .merge(webhook::router())
        .merge(mlflow::router())
        .routes(routes!(healthz))
        .routes(routes!(ready))
        .merge(metrics::router())
        .merge(openapi::router())
}

/// The whole API; `serve` runs it, tests call it with `oneshot`.
pub fn app(ctx: ApiContext) -> Router {
    let (router, _) = routes().split_for_parts();
    // The page is not API: it is served, not documented.
    router
        .merge(page::router())
        .fallback(|| async {
            error::Error::NotFound(
                "no such endpoint; the API lives under /v1 (GET /openapi.json lists it)".into(),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(ctx.clone(), auth::require))
        // Outermost, so every answer (refusals too) has an id and a count.
        .layer(middleware::from_fn(observe::observe))
        .with_state(ctx)
}

/// The OpenAPI document of `app`, as `GET /openapi.json` serves it.
fn document() -> utoipa::openapi::OpenApi {
    openapi::with_layers(routes().into_openapi())
}

/// Liveness: answers while the process serves requests.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "server",
    responses((status = OK, description = "`ok`", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: 503 with a sentence while the database does not answer (a
/// ping, its answer kept a second) or until the server's first load of the
/// plugins folder is done (liveness is `/healthz`).
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "server",
    responses(
        (status = OK, description = "`ready`", body = String, content_type = "text/plain"),
        (status = SERVICE_UNAVAILABLE, description = "The database is unreachable, a loop of the server ended, or what is still loading", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait before asking again"))),
    ))]
async fn ready(State(ctx): State<ApiContext>) -> Result<&'static str, error::Error> {
    if let Err(why) = ctx.db.reachable().await {
        return Err(error::Error::Unavailable(format!(
            "not ready: the server cannot reach its database ({why}); it keeps trying"
        )));
    }
    let ended = ctx.loops.ended();
    if !ended.is_empty() {
        return Err(error::Error::Unavailable(format!(
            "not ready: {}; restart the server",
            ended.join("; ")
        )));
    }
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

/// `--metrics-listen`: `/metrics` alone, for an address the API is not on.
pub fn metrics_app() -> Router {
    let (router, _) = metrics::router().split_for_parts();
    router.fallback(|| async {
        error::Error::NotFound("this address serves only GET /metrics".into())
    })
}
