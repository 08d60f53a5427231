//! Wake-ups between servers sharing a database. The tables are the truth;
//! a wake-up only says "look again now" so that a replica need not wait
//! for its next poll. On PostgreSQL they travel as `NOTIFY` on one
//! channel per topic, heard by one `LISTEN`ing connection per server; on
//! SQLite (one server) they stay in the process. A wake-up can be lost (a
//! listener reconnecting): whoever waits on one also looks on a tick.

use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// A deployment was queued, or a server has room again.
    Queue,
    /// A cancel was recorded on a deployment (payload: its id).
    Cancel,
    /// A deployment ended (payload: its id).
    Ended,
    /// Events were appended to the log (payload: the last id).
    Events,
    /// A deployer stored over the API was added, changed or removed
    /// (payload: its name).
    Deployers,
}

const TOPICS: [Topic; 5] = [
    Topic::Queue,
    Topic::Cancel,
    Topic::Ended,
    Topic::Events,
    Topic::Deployers,
];

impl Topic {
    pub(super) fn channel(self) -> &'static str {
        match self {
            Topic::Queue => "berth_queue",
            Topic::Cancel => "berth_cancel",
            Topic::Ended => "berth_ended",
            Topic::Events => "berth_events",
            Topic::Deployers => "berth_deployers",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn of(channel: &str) -> Option<Topic> {
        TOPICS.into_iter().find(|t| t.channel() == channel)
    }
}

/// The wake-ups this process hears, one broadcast per topic.
pub(super) struct Wakeups {
    senders: [broadcast::Sender<String>; TOPICS.len()],
}

impl Wakeups {
    pub(super) fn new() -> Self {
        Self {
            senders: std::array::from_fn(|_| broadcast::channel(1024).0),
        }
    }

    pub(super) fn subscribe(&self, topic: Topic) -> broadcast::Receiver<String> {
        self.senders[topic.index()].subscribe()
    }

    /// Hands a wake-up to this process's waiters.
    pub(super) fn deliver(&self, topic: Topic, payload: String) {
        // Nobody waiting is fine.
        let _ = self.senders[topic.index()].send(payload);
    }

    /// Listens on PostgreSQL until `stop`, reconnecting after a lost
    /// connection (waiters look on their own tick meanwhile).
    pub(super) async fn listen(&self, url: &str, stop: CancellationToken) {
        let mut wait = Duration::from_millis(250);
        loop {
            let failure = tokio::select! {
                _ = stop.cancelled() => return,
                failure = self.listen_once(url) => failure,
            };
            tracing::warn!(
                "listening for other berth servers' wake-ups: {failure}; connecting again in {}",
                crate::human::duration(wait)
            );
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    async fn listen_once(&self, url: &str) -> sqlx::Error {
        let mut listener = match PgListener::connect(url).await {
            Ok(listener) => listener,
            Err(e) => return e,
        };
        let channels = TOPICS.map(Topic::channel);
        if let Err(e) = listener.listen_all(channels).await {
            return e;
        }
        // Whatever was missed while not listening: every waiter looks.
        for topic in TOPICS {
            self.deliver(topic, String::new());
        }
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    if let Some(topic) = Topic::of(notification.channel()) {
                        self.deliver(topic, notification.payload().to_string());
                    }
                }
                // The connection was lost; the next call connects again.
                // What was sent meanwhile is gone: every waiter looks.
                Ok(None) => {
                    for topic in TOPICS {
                        self.deliver(topic, String::new());
                    }
                }
                Err(e) => return e,
            }
        }
    }
}
