//! A subscription to `/v1/events`, over real HTTP or in-process: the
//! server-sent events parsed into kind and JSON data, read until a test's
//! condition holds. Never decides what a test expects of them.

use std::fmt::Display;
use std::panic::Location;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::Value;

/// A hang guard, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

/// One server-sent event: `id: N`, `event: KIND` and `data: JSON`.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: Option<i64>,
    pub kind: String,
    pub data: Value,
}

pub struct Subscription {
    chunks: BoxStream<'static, Result<Bytes, String>>,
    /// Bytes after the last complete event (a chunk may end mid-character).
    partial: Vec<u8>,
    received: Vec<Event>,
    /// Comments other than keep-alives ("missed …").
    comments: Vec<String>,
}

impl Subscription {
    /// Reads the body of an answered `GET /v1/events`.
    pub fn new<E: Display>(chunks: impl Stream<Item = Result<Bytes, E>> + Send + 'static) -> Self {
        Self {
            chunks: chunks.map(|c| c.map_err(|e| e.to_string())).boxed(),
            partial: Vec::new(),
            received: Vec::new(),
            comments: Vec::new(),
        }
    }

    /// Reads until `done` holds for the events received so far, and returns
    /// them all: every event since subscribing, progress included, in order.
    /// Panics, naming the caller, if the stream ends or `done` still does not
    /// hold after 60 s.
    #[track_caller]
    pub fn until(&mut self, done: impl Fn(&[Event]) -> bool) -> impl Future<Output = &[Event]> {
        let caller = Location::caller();
        async move {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while !done(&self.received) {
                self.read(deadline, caller, "the awaited events").await;
            }
            &self.received[..]
        }
    }

    /// Reads until a comment holding `fragment` arrives; returns it.
    #[track_caller]
    pub fn until_comment(&mut self, fragment: &str) -> impl Future<Output = String> {
        let caller = Location::caller();
        async move {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                if let Some(c) = self.comments.iter().find(|c| c.contains(fragment)) {
                    return c.clone();
                }
                self.read(deadline, caller, &format!("a comment {fragment:?}"))
                    .await;
            }
        }
    }

    /// Reads one chunk and parses the blocks it completes.
    async fn read(&mut self, deadline: tokio::time::Instant, caller: &Location<'_>, awaited: &str) {
        let chunk = match tokio::time::timeout_at(deadline, self.chunks.next()).await {
            Ok(Some(Ok(chunk))) => chunk,
            Ok(Some(Err(e))) => panic!("{caller}: reading the event stream: {e}"),
            Ok(None) => panic!("{caller}: the event stream ended; {}", self.summary()),
            Err(_) => panic!(
                "{caller}: {awaited} did not arrive within {PATIENCE:?}; {}",
                self.summary()
            ),
        };
        self.partial.extend_from_slice(&chunk);
        while let Some(end) = self.partial.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = self.partial.drain(..end + 2).collect();
            let block = String::from_utf8_lossy(&block);
            match parse(&block) {
                Some(event) => self.received.push(event),
                None => self.comments.extend(
                    block
                        .lines()
                        .filter_map(|l| l.strip_prefix(": "))
                        .map(str::to_string),
                ),
            }
        }
    }

    fn summary(&self) -> String {
        let kinds: Vec<&str> = self.received.iter().map(|e| e.kind.as_str()).collect();
        format!("received {kinds:?}")
    }
}

/// An event block; `None` for a comment (keep-alive, "missed …").
fn parse(block: &str) -> Option<Event> {
    let id = block
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .map(|id| {
            id.parse()
                .unwrap_or_else(|_| panic!("an event id that is not a number: {id}"))
        });
    let kind = block.lines().find_map(|l| l.strip_prefix("event: "))?;
    let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
    let data = serde_json::from_str(data)
        .unwrap_or_else(|e| panic!("event {kind}: data is not JSON ({e}): {data}"));
    Some(Event {
        id,
        kind: kind.to_string(),
        data,
    })
}

/// Whether deployment `id` has ended among `events`.
pub fn ended(events: &[Event], id: &Value) -> bool {
    events.iter().any(|e| {
        matches!(
            e.kind.as_str(),
            "deployment.completed" | "deployment.failed"
        ) && e.data["deploy_id"] == *id
    })
}
