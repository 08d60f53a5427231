//! Fencing by time: a server that cannot renew its leases (the database
//! is down, or this server is cut off from it) stops its own deployments
//! before their leases can run out. Another server ends a deployment only
//! once its lease has run out, so a deployment never runs here while
//! another server has ended it. Also remembers this server's last outage,
//! for the words of what other servers lost meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::Pipeline;
use super::sentences::{fenced, unguarded};

/// How long before a lease runs out its server stops what it runs: time
/// for a guest to be interrupted (epochs tick every few milliseconds) and
/// a put to be dropped.
pub(super) fn guard(lease: Duration) -> Duration {
    lease / 5
}

/// When this server last renewed its leases, and its outages.
pub(super) struct Renewals {
    /// When the last beat that renewed every lease started: each lease it
    /// wrote runs out a lease after that.
    renewed: Mutex<Instant>,
    outage: Mutex<Outage>,
}

#[derive(Default)]
struct Outage {
    /// When the beats began failing, while they fail.
    since: Option<Instant>,
    /// The last outage: how long it was, and when it ended.
    last: Option<(Duration, Instant)>,
}

impl Renewals {
    pub(super) fn new() -> Self {
        Self {
            renewed: Mutex::new(Instant::now()),
            outage: Mutex::default(),
        }
    }

    /// A beat that started `at` renewed every lease.
    pub(super) fn renewed(&self, at: Instant) {
        *self.renewed.lock().expect("renewal lock") = at;
        let mut outage = self.outage.lock().expect("outage lock");
        if let Some(since) = outage.since.take() {
            outage.last = Some((at.saturating_duration_since(since), at));
        }
    }

    /// A beat that started `at` could not renew the leases.
    pub(super) fn failed(&self, at: Instant) {
        self.outage
            .lock()
            .expect("outage lock")
            .since
            .get_or_insert(at);
    }

    fn last_renewed(&self) -> Instant {
        *self.renewed.lock().expect("renewal lock")
    }

    /// How long this server could not reach the database, when it could
    /// not at some time in the last `within`.
    pub(super) fn recent_outage(&self, within: Duration) -> Option<Duration> {
        let outage = self.outage.lock().expect("outage lock");
        if let Some(since) = outage.since {
            return Some(since.elapsed());
        }
        outage
            .last
            .filter(|(_, ended)| ended.elapsed() <= within)
            .map(|(lasted, _)| lasted)
    }
}

impl Pipeline {
    /// The fence ended while the server runs (`how`): fail closed. What
    /// runs here is stopped, and closing the room (`--max-running`'s
    /// permits) keeps anything more from starting here: a deployment
    /// asked for is queued for another server, and the queue worker
    /// claims nothing.
    pub(super) fn unguarded(&self, how: &str) {
        self.room.close();
        let reason = unguarded(how);
        for running in self.live.all() {
            running.cancel(&reason);
        }
    }

    /// Stops each deployment running here whose lease is about to run out
    /// unrenewed: renewed last by a beat, or by its claim if that came
    /// later. Runs until the server stops.
    pub(super) async fn fence(self: Arc<Self>) {
        let lease = self.queue.lease;
        let stop_after = lease.saturating_sub(guard(lease));
        // Well within the guard, so a deployment is stopped in time.
        let mut tick = tokio::time::interval(guard(lease) / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let renewed = self.renewals.last_renewed();
            let due: Vec<_> = self
                .live
                .all()
                .into_iter()
                .filter(|running| {
                    let leased = renewed.max(running.leased_at().into());
                    leased.elapsed() >= stop_after
                        && !running.is_finished()
                        && running.reason().is_none()
                })
                .collect();
            if due.is_empty() {
                continue;
            }
            let cut_off = renewed.elapsed();
            tracing::error!(
                count = due.len(),
                "could not renew this server's leases for {}: stopping {} of its running deployments before their leases run out",
                crate::human::duration(cut_off),
                due.len()
            );
            let reason = fenced(cut_off, lease);
            for running in due {
                running.cancel(&reason);
            }
        }
    }
}
