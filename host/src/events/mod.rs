//! What happened, for whoever listens: one closed `enum Event`, logged at
//! once and stored in the event log (`db::events`). Every change of a
//! deployment's status (recorded, started at once or claimed, approved,
//! ended by its run, a sweep, a cancel, an expiry or restart recovery)
//! carries its events into the transaction that writes it
//! (`Events::report`): one commit, so a kill after it loses none. The
//! other events (progress, plugins) are published after what they report
//! and appended by one task per process, in publishing order, what waits
//! batched into one write. Readers (the SSE stream, the webhook) follow the log, never this
//! process's memory, so they see every server's events. Publishing never
//! waits for the database: while it refuses writes (a full disk) the
//! events wait here and are offered again (a state change's event waits
//! with its change, which its caller offers again). What an event's stored
//! `data` says is the wire's business: the encoder is handed in
//! (`http::event_data`), never imported.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::db::events::{ModelReport, NewEvent, Report};
use crate::db::{self, Db};
use crate::model::{Deployment, TrainedModel};
use crate::runtime::Change;

mod event;

pub use event::{Event, EventKind};

/// The most events one append carries.
const BATCH: usize = 256;
/// Events waiting for the database beyond which progress events (each
/// superseded by the next) are dropped rather than kept; the others are
/// always kept.
const MAX_WAITING: usize = 100_000;

/// Publishes events into the log. Clones share one queue and one appender.
#[derive(Clone)]
pub struct Events {
    shared: Arc<Shared>,
}

struct Shared {
    /// Whose events these are, as the log records them.
    server_id: String,
    /// An event's `data` as the log stores it.
    encode: fn(&Event) -> String,
    waiting: Mutex<Waiting>,
    /// Wakes the appender: something was published, or closing began.
    wake: Notify,
    closing: CancellationToken,
    appender: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Waiting {
    events: VecDeque<NewEvent>,
    /// Progress events dropped since the queue last overflowed.
    dropped: u64,
}

impl Events {
    /// Publishing into `db`'s event log, recorded as `server_id`'s, each
    /// event's `data` written by `encode`; starts the appender in `loops`.
    pub fn stored(
        db: Db,
        server_id: String,
        encode: fn(&Event) -> String,
        loops: &crate::loops::Loops,
    ) -> Self {
        let shared = Arc::new(Shared {
            server_id: server_id.clone(),
            encode,
            waiting: Mutex::new(Waiting::default()),
            wake: Notify::new(),
            closing: CancellationToken::new(),
            appender: Mutex::new(None),
        });
        let appender = loops.spawn("event appender", append(db, server_id, shared.clone()));
        *shared.appender.lock().unwrap() = Some(appender);
        Self { shared }
    }

    /// Stores what is still waiting, trying for at most `patience` (the
    /// database may refuse), and stops the appender; what could not be
    /// stored is logged as lost.
    pub async fn close(&self, patience: Duration) {
        self.shared.closing.cancel();
        self.shared.wake.notify_one();
        let appender = self.shared.appender.lock().unwrap().take();
        let Some(mut appender) = appender else { return };
        if tokio::time::timeout(patience, &mut appender).await.is_err() {
            appender.abort();
            let lost = self.shared.waiting.lock().unwrap().events.len();
            tracing::error!(
                lost,
                "the database did not take the last events before the server stopped: they are not in the event log"
            );
        }
    }

    /// Logs `event` and queues it for the log; never waits.
    pub fn publish(&self, event: Event) {
        let progress = matches!(event, Event::DeploymentProgress { .. });
        let new = self.shared.stamp(&event);
        let mut waiting = self.shared.waiting.lock().unwrap();
        if progress && waiting.events.len() >= MAX_WAITING {
            if waiting.dropped == 0 {
                tracing::warn!(
                    waiting = waiting.events.len(),
                    "the event log is far behind (is the database refusing writes?): progress events are dropped until it catches up"
                );
            }
            waiting.dropped += 1;
            return;
        }
        waiting.events.push_back(new);
        crate::metrics::events_waiting(waiting.events.len());
        drop(waiting);
        self.shared.wake.notify_one();
    }

    /// The events `word` makes of a deployment's row, for the database to
    /// store in the transaction that writes that row (`db::events::Report`):
    /// the change and its event are one commit, in the log's order. Each is
    /// logged when worded, as a published one is.
    pub fn report(&self, word: impl Fn(&Deployment) -> Vec<Event> + Send + 'static) -> Report {
        let shared = self.shared.clone();
        // Worded inside the database's write (on SQLite, the committer's
        // task): the caller's span keeps the log line in its request.
        let span = tracing::Span::current();
        Report {
            server_id: self.shared.server_id.clone(),
            events: Box::new(move |row| {
                let _request = span.enter();
                word(row).iter().map(|e| shared.stamp(e)).collect()
            }),
            wake: None,
        }
    }

    /// The events `word` makes of a model's row, for the database to store
    /// in the transaction that records it (`db::events::ModelReport`), so a
    /// registration and its event are one commit: rules never miss one.
    pub fn report_model(
        &self,
        word: impl FnOnce(&TrainedModel) -> Vec<Event> + Send + 'static,
    ) -> ModelReport {
        let shared = self.shared.clone();
        // As `report`: the log line stays in the request's span.
        let span = tracing::Span::current();
        ModelReport {
            server_id: self.shared.server_id.clone(),
            events: Box::new(move |row| {
                let _request = span.enter();
                word(row).iter().map(|e| shared.stamp(e)).collect()
            }),
        }
    }

    /// Logs `event` and makes it the log's record, for a write that stores
    /// it in its own transaction.
    pub fn stamp(&self, event: &Event) -> NewEvent {
        self.shared.stamp(event)
    }

    /// Publishes what a change of the served deployers did. Called after
    /// the swap, so a listener that asks finds what it was told.
    pub(crate) fn announce(&self, changes: Vec<Change>) {
        for change in changes {
            self.publish(match change {
                Change::Loaded { name, .. } => Event::PluginLoaded { name },
                Change::Removed { name } => Event::PluginRemoved { name },
                Change::Rejected(rejection) => Event::PluginRejected {
                    file: rejection.file,
                    reason: rejection.reason,
                },
            });
        }
    }
}

impl Shared {
    /// Logs `event` and makes it the log's record.
    fn stamp(&self, event: &Event) -> NewEvent {
        event.log();
        NewEvent {
            kind: event.kind().to_string(),
            data: (self.encode)(event),
            created_at: db::now(),
        }
    }
}

/// The appender: stores what waits, oldest first, one batch per write, and
/// wakes the log's readers on every server. A refused write keeps the
/// batch at the front and is tried again, less often each time (`Backoff`).
async fn append(db: Db, server_id: String, shared: Arc<Shared>) {
    let mut backoff = Backoff::new();
    let mut refused_since: Option<SystemTime> = None;
    loop {
        let batch: Vec<NewEvent> = {
            let waiting = shared.waiting.lock().unwrap();
            waiting.events.iter().take(BATCH).cloned().collect()
        };
        if batch.is_empty() {
            if shared.closing.is_cancelled() {
                return;
            }
            shared.wake.notified().await;
            continue;
        }
        match db.append_events(&server_id, &batch).await {
            Ok(_) => {
                let (left, dropped) = {
                    let mut waiting = shared.waiting.lock().unwrap();
                    waiting.events.drain(..batch.len());
                    let dropped = if waiting.events.len() < MAX_WAITING / 2 {
                        std::mem::take(&mut waiting.dropped)
                    } else {
                        0
                    };
                    (waiting.events.len(), dropped)
                };
                crate::metrics::events_waiting(left);
                if dropped > 0 {
                    tracing::warn!(
                        dropped,
                        "the event log caught up; progress events dropped meanwhile are not in it"
                    );
                }
                if let Some(since) = refused_since.take() {
                    tracing::info!(
                        refused_for = %crate::human::duration(since.elapsed().unwrap_or_default()),
                        "the database takes events again: those held back are stored"
                    );
                }
                backoff.reset();
            }
            Err(e) => {
                refused_since.get_or_insert_with(SystemTime::now);
                let wait = backoff.next_wait();
                tracing::warn!(
                    waiting = shared.waiting.lock().unwrap().events.len(),
                    "could not store events ({e}); they are kept and offered again in {}",
                    crate::human::duration(wait)
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Deletes the events older than `retention` until `stop`, checking every
/// tenth of the retention (at least every 10 minutes, at most every
/// second). Readers whose cursor falls behind are told by the SSE stream.
pub async fn prune(db: Db, retention: Duration, stop: CancellationToken) {
    let every = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(600));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let before = humantime::format_rfc3339_millis(SystemTime::now() - retention).to_string();
        let mut pruned = 0;
        loop {
            match db.prune_events(&before, 10_000).await {
                Ok((deleted, more)) => {
                    pruned += deleted;
                    if !more {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        "could not prune the event log ({e}); trying again in {}",
                        crate::human::duration(every)
                    );
                    break;
                }
            }
        }
        if pruned > 0 {
            tracing::debug!(pruned, "pruned events older than the retention");
        }
    }
}

#[cfg(test)]
mod tests;
