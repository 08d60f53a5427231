//! `GET /v1/events`: the event stream as server-sent events.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::Sse;
use axum::response::sse::{self, KeepAlive};
use axum::routing::get;
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::ApiContext;
use super::json;

pub fn router() -> Router<ApiContext> {
    Router::new().route("/v1/events", get(stream))
}

async fn stream(
    State(ctx): State<ApiContext>,
) -> Sse<impl Stream<Item = Result<sse::Event, Infallible>>> {
    // The stream ends when the server stops, or a graceful shutdown would
    // wait for subscribers forever.
    let stop = ctx.pipeline.stopping().clone().cancelled_owned();
    let events = BroadcastStream::new(ctx.events.subscribe())
        .take_until(stop)
        .map(|item| {
            Ok(match item {
                Ok(event) => sse::Event::default()
                    .event(event.kind())
                    .data(json::event(&event).to_string()),
                // A subscriber that fell behind is told how much it missed.
                Err(BroadcastStreamRecvError::Lagged(missed)) => {
                    sse::Event::default().comment(format!("missed {missed} events"))
                }
            })
        });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
