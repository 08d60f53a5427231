//! Wake-ups between servers sharing a database: their topics, and how
//! this process hands them to its waiters. The tables are the truth; a
//! wake-up only says "look again now" so that a replica need not wait for
//! its next poll. On SQLite (one server) they stay in the process; on
//! PostgreSQL they travel as `NOTIFY`, one channel per topic (`postgres`
//! sends and hears them). A wake-up can be lost (a listener reconnecting):
//! whoever waits on one also looks on a tick. Never reads a table.

use tokio::sync::broadcast;

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

pub(super) const TOPICS: [Topic; 5] = [
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

    pub(super) fn of(channel: &str) -> Option<Topic> {
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

    /// Tells every waiter to look: what was said while nobody listened
    /// is lost.
    pub(super) fn deliver_all(&self) {
        for topic in TOPICS {
            self.deliver(topic, String::new());
        }
    }
}
