//! `GET /v1/events`: the event stream as server-sent events.

use std::time::Duration;

use axum::extract::State;
use axum::response::Sse;
use axum::response::sse::{self, KeepAlive};
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::json;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(stream))
}

/// Server-sent events, from the moment of subscribing until the server stops.
///
/// Each is `event: KIND` and `data: JSON`, with a comment every 15 s to
/// keep the connection open. The kinds, and the schema of their data: `deployment.started`
/// (DeploymentStarted), `deployment.progress` (DeploymentProgress, at most
/// 4 a second), `deployment.completed` (DeploymentCompleted),
/// `deployment.failed` (DeploymentFailed), `plugin.loaded` and
/// `plugin.removed` (PluginNamed), `plugin.rejected` (Rejected). A
/// subscriber that falls behind loses the oldest events and is told so in
/// a comment (`: missed N events`).
#[utoipa::path(get, path = "/v1/events", operation_id = "events", tag = "events",
    responses((status = OK, description = "An endless stream of events", body = String, content_type = "text/event-stream")))]
async fn stream(
    State(ctx): State<ApiContext>,
) -> Sse<impl Stream<Item = Result<sse::Event, axum::Error>>> {
    // The stream ends when the server stops, or a graceful shutdown would
    // wait for subscribers forever.
    let stop = ctx.pipeline.stopping().clone().cancelled_owned();
    let events = BroadcastStream::new(ctx.events.subscribe())
        .take_until(stop)
        .map(|item| match item {
            Ok(event) => sse::Event::default()
                .event(event.kind())
                .json_data(json::event(&event)),
            // A subscriber that fell behind is told how much it missed.
            Err(BroadcastStreamRecvError::Lagged(missed)) => {
                Ok(sse::Event::default().comment(format!("missed {missed} events")))
            }
        });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
