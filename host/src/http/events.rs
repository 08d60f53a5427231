//! `GET /v1/events`: the event log as server-sent events, from a cursor
//! (`Last-Event-ID`, `?after=`) or from now, then following it: woken when
//! any server appends, and on a tick in case a wake-up was lost.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Sse;
use axum::response::sse::{self, KeepAlive};
use futures::{Stream, StreamExt};
use tokio::sync::broadcast;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::extract::Params;
use super::json::{self, ErrorBody};
use crate::db::events::{Kinds, StoredEvent};
use crate::db::{Db, Topic};

/// Events read from the log at a time.
const PAGE: u32 = 500;
/// How often a subscriber looks at the log without a wake-up.
const POLL: Duration = Duration::from_secs(2);

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(stream))
}

/// Server-sent events from the event log, of every server sharing the
/// database, in id order, until the server stops.
///
/// Each is `id: N`, `event: KIND` and `data: JSON`, with a comment every
/// 15 s to keep the connection open. Without a cursor the stream starts
/// now; with `Last-Event-ID` (as `EventSource` sends when it reconnects)
/// or `?after=N` it starts with the first event after N still kept (the
/// header wins over the parameter), so a client that reconnects misses
/// nothing the log still holds. A cursor older than the log's retention
/// is told so in a comment (`: missed events A to B: …`) and continues
/// from the oldest kept. The kinds, and the schema of their data:
/// `deployment.queued` (DeploymentStarted, only for a deployment that has
/// to wait for a server with room), `deployment.started`
/// (DeploymentStarted: a server took it), `deployment.progress`
/// (DeploymentProgress, at most 4 a second), `deployment.completed`
/// (DeploymentCompleted), `deployment.failed` (DeploymentFailed),
/// `plugin.loaded` and `plugin.removed` (PluginNamed), `plugin.rejected`
/// (PluginRejected), `model.registered` (ModelRegistered),
/// `deployment.awaiting_approval` (DeploymentAwaitingApproval: a rule's
/// step held for an admin), `deployment.approved` (DeploymentApproved),
/// `rule.failed` (RuleFailed: a rule matched but made no deployment).
#[utoipa::path(get, path = "/v1/events", operation_id = "events", tag = "events",
    params(
        json::EventsParams,
        ("Last-Event-ID" = Option<String>, Header,
            description = "Start after this event id (a whole number); wins over `after`"),
    ),
    responses(
        (status = OK, description = "An endless stream of events", body = String, content_type = "text/event-stream"),
        (status = BAD_REQUEST, description = "`after` or `Last-Event-ID` is not an event id", body = ErrorBody),
    ))]
async fn stream(
    State(ctx): State<ApiContext>,
    Params(params): Params<json::EventsParams>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<sse::Event, Infallible>>>, Error> {
    let header = match headers.get("last-event-id") {
        Some(value) => Some(cursor(
            "the Last-Event-ID header",
            value.to_str().unwrap_or("(not text)"),
        )?),
        None => None,
    };
    let after = match &params.after {
        Some(after) => Some(cursor("after", after)?),
        None => None,
    };
    // Listening starts before the log is read, so nothing appended in
    // between goes unnoticed.
    let wakeups = ctx.db.wakeups(Topic::Events);
    let bounds = ctx.db.event_bounds().await?;
    let mut notice = None;
    let cursor = match header.or(after) {
        // From now: whatever is appended from here on, including what
        // this server published and has yet to store.
        None => bounds.last,
        Some(cursor) if cursor < bounds.pruned_through => {
            notice = Some(missed(cursor, bounds.pruned_through));
            bounds.pruned_through
        }
        Some(cursor) if cursor > bounds.last => {
            notice = Some(format!(
                "no event {cursor} in this event log yet (the last is {}): following from there",
                bounds.last
            ));
            bounds.last
        }
        Some(cursor) => cursor,
    };
    let follow = Follow {
        db: ctx.db.clone(),
        cursor,
        read: VecDeque::new(),
        notice,
        wakeups: Some(wakeups),
        tick: tokio::time::interval(POLL),
    };
    // The stream ends when the server stops, or a graceful shutdown would
    // wait for subscribers forever.
    let stop = ctx.shutdown.clone().cancelled_owned();
    let events = futures::stream::unfold(follow, Follow::next)
        .map(Ok)
        .take_until(stop);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// A cursor as the client gave it.
fn cursor(name: &str, value: &str) -> Result<i64, Error> {
    match value.trim().parse::<i64>() {
        Ok(id) if id >= 0 => Ok(id),
        _ => Err(Error::BadRequest(format!(
            "{name}: {value:?} is not an event id; give the id of the last event received \
             (a whole number, 0 for the oldest kept)"
        ))),
    }
}

fn missed(cursor: i64, pruned_through: i64) -> String {
    format!(
        "missed events {} to {pruned_through}: the event log no longer keeps them (its retention); \
         continuing from the oldest kept",
        cursor + 1
    )
}

/// One subscriber's place in the log.
struct Follow {
    db: Db,
    /// The id of the last event sent (or the start).
    cursor: i64,
    /// Read from the log, not sent yet.
    read: VecDeque<StoredEvent>,
    /// A comment to send before anything else.
    notice: Option<String>,
    /// `None` once the wake-ups ended (the database closing): the tick
    /// alone then.
    wakeups: Option<broadcast::Receiver<String>>,
    tick: tokio::time::Interval,
}

impl Follow {
    async fn next(mut self) -> Option<(sse::Event, Self)> {
        loop {
            if let Some(notice) = self.notice.take() {
                return Some((sse::Event::default().comment(notice), self));
            }
            if let Some(event) = self.read.pop_front() {
                self.cursor = event.id;
                let sse = sse::Event::default()
                    .id(event.id.to_string())
                    .event(&event.kind)
                    .data(&event.data);
                return Some((sse, self));
            }
            match self.db.events_after(self.cursor, Kinds::All, PAGE).await {
                Ok(rows) if !rows.is_empty() => {
                    // Ids may skip (an append rolled back), or retention
                    // may have pruned past this subscriber.
                    if rows[0].id > self.cursor + 1
                        && let Ok(bounds) = self.db.event_bounds().await
                        && bounds.pruned_through > self.cursor
                    {
                        self.notice = Some(missed(self.cursor, bounds.pruned_through));
                    }
                    self.read.extend(rows);
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    "an event subscriber could not read the event log ({e}); looking again in {}",
                    crate::human::duration(POLL)
                ),
            }
            self.wait().await;
        }
    }

    /// Until a wake-up or the tick.
    async fn wait(&mut self) {
        let Some(wakeups) = &mut self.wakeups else {
            self.tick.tick().await;
            return;
        };
        tokio::select! {
            woken = wakeups.recv() => {
                if let Err(broadcast::error::RecvError::Closed) = woken {
                    self.wakeups = None;
                }
            }
            _ = self.tick.tick() => {}
        }
    }
}
