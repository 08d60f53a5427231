//! Fencing by time: a server that cannot renew its leases (the database
//! is down, or this server is cut off from it) stops its own deployments
//! before their leases can run out. Another server ends a deployment only
//! once its lease has run out, so a deployment never runs here while
//! another server has ended it. Also remembers this server's last outage,
//! for the words of what other servers lost meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::Pipeline;
use super::sentences::fenced;

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
    renewed: watch::Sender<Instant>,
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
            renewed: watch::Sender::new(Instant::now()),
            outage: Mutex::default(),
        }
    }

    /// A beat that started `at` renewed every lease.
    pub(super) fn renewed(&self, at: Instant) {
        self.renewed.send_replace(at);
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
    /// Stops this server's deployments when its leases are about to run
    /// out unrenewed, and keeps stopping any it starts meanwhile until a
    /// beat renews them again. Runs until the server stops.
    pub(super) async fn fence(self: Arc<Self>) {
        let lease = self.queue.lease;
        let mut renewals = self.renewals.renewed.subscribe();
        // A deployment that starts while the fence is up is stopped within
        // this long.
        let recheck = guard(lease) / 4;
        loop {
            let renewed = *renewals.borrow_and_update();
            let stop_at = renewed + lease.saturating_sub(guard(lease));
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                changed = renewals.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(stop_at) => {}
            }
            let cut_off = renewed.elapsed();
            let live: Vec<_> = self
                .live
                .all()
                .into_iter()
                .filter(|running| !running.is_finished() && running.reason().is_none())
                .collect();
            if !live.is_empty() {
                tracing::error!(
                    count = live.len(),
                    "could not renew this server's leases for {}: stopping its {} running deployments before their leases run out",
                    crate::human::duration(cut_off),
                    live.len()
                );
            }
            let reason = fenced(cut_off, lease);
            for running in live {
                running.cancel(&reason);
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = renewals.changed() => {}
                _ = tokio::time::sleep(recheck) => {}
            }
        }
    }
}
