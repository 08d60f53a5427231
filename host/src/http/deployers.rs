//! `GET /v1/deployers`: what can deploy, which plugin files were refused,
//! and which are still loading after a start.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde_json::{Value, json};

use super::ApiContext;

pub fn router() -> Router<ApiContext> {
    Router::new().route("/v1/deployers", get(list))
}

async fn list(State(ctx): State<ApiContext>) -> Json<Value> {
    let plugins = ctx.deployers.current();
    let deployers: Vec<Value> = plugins
        .deployers
        .values()
        .map(|p| {
            json!({
                "name": p.name,
                "description": p.description,
                "options_schema": p.options_schema.as_deref().and_then(|s| serde_json::from_str::<Value>(s).ok()),
                "wit_version": p.wit_version,
                "sha256": p.sha256,
                "memory_mib": p.limits.memory_mib,
                "timeout_s": p.limits.timeout.as_secs(),
                "allowed_hosts": p.manifest.allowed_hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
                "env": p.manifest.env.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            })
        })
        .collect();
    let rejected: Vec<Value> = plugins
        .rejected
        .iter()
        .map(|r| json!({ "file": r.file, "reason": r.reason }))
        .collect();
    let loading = ctx.deployers.still_loading();
    Json(json!({ "deployers": deployers, "rejected": rejected, "loading": loading }))
}
