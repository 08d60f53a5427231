//! `GET /v1/events`: the event stream as server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::routing::get;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use crate::events::Event;
use crate::pipeline::Pipeline;

pub fn router() -> Router<Arc<Pipeline>> {
    Router::new().route("/v1/events", get(stream))
}

async fn stream(
    State(pipeline): State<Arc<Pipeline>>,
) -> axum::response::Sse<impl Stream<Item = Result<Sse, Infallible>>> {
    // The stream ends when the server stops, or a graceful shutdown would
    // wait for subscribers forever.
    let stop = pipeline.shutdown.clone().cancelled_owned();
    let events = BroadcastStream::new(pipeline.events.subscribe())
        .take_until(stop)
        .map(|item| {
            Ok(match item {
                Ok(event) => Sse::default()
                    .event(event.kind())
                    .data(body(&event).to_string()),
                // A subscriber that fell behind is told how much it missed.
                Err(BroadcastStreamRecvError::Lagged(missed)) => {
                    Sse::default().comment(format!("missed {missed} events"))
                }
            })
        });
    axum::response::Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// An event's JSON, as SSE `data:` and webhook `data` carry it.
pub(crate) fn body(event: &Event) -> Value {
    match event {
        Event::DeploymentStarted {
            deploy_id,
            model_id,
            deployer,
        } => {
            json!({ "deploy_id": deploy_id, "model_id": model_id, "deployer": deployer })
        }
        Event::DeploymentProgress {
            deploy_id,
            model_id,
            phase,
            progress,
        } => json!({
            "deploy_id": deploy_id, "model_id": model_id, "phase": phase.as_str(),
            "progress": super::json::progress(progress),
        }),
        Event::DeploymentCompleted {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            reference,
        } => json!({
            "deploy_id": deploy_id, "model_id": model_id, "deployer": deployer,
            "duration_ms": duration_ms, "ref": reference,
        }),
        Event::DeploymentFailed {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            error,
        } => json!({
            "deploy_id": deploy_id, "model_id": model_id, "deployer": deployer,
            "duration_ms": duration_ms, "error": error,
        }),
        Event::PluginLoaded { name } | Event::PluginRemoved { name } => json!({ "name": name }),
        Event::PluginRejected { file, reason } => json!({ "file": file, "reason": reason }),
    }
}
