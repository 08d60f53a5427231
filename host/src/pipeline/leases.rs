//! What keeps the rows of running deployments true across servers and
//! restarts: this server renews its leases and hears cancels asked on
//! others; any server fails the deployments of a server that stopped
//! renewing, queued ones nobody can run and approvals nobody gave in
//! time (`approvals`); a restart fails what the
//! previous run of this server left running. Every row ended here is
//! published as `deployment.failed`, as a run's end is. Never runs a
//! deployment.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use tracing::Instrument;

use crate::backoff::Backoff;
use crate::db::{self, Beat, Runnable, Topic};
use crate::live::Running;
use crate::metrics;

use super::Pipeline;
use super::run::remove_failed_output;
use super::sentences::{CLAIM_LOST, Stop, interrupted, lost, lost_in_outage, unrunnable};

/// How soon a beat that failed is tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl Pipeline {
    /// Keeps this server's leases, hears cancels asked on other servers,
    /// and ends what nobody will finish: deployments whose owner's lease
    /// ran out, and queued ones no live server can run. Runs until the
    /// server stops.
    pub(super) async fn keep_leases(self: Arc<Self>) {
        let mut cancels = self.db.wakeups(Topic::Cancel);
        let mut tick = tokio::time::interval(self.queue.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                heard = cancels.recv() => {
                    let id = heard.ok().and_then(|p| p.parse::<i64>().ok());
                    if let Some(running) = id.and_then(|id| self.live.get(id)) {
                        self.hear_cancel(&running).await;
                    } else if id.is_none() {
                        // Missed some: the next beat reads every cancel.
                        tick.reset_immediately();
                    }
                }
                _ = tick.tick() => {
                    if let Err(e) = self.beat().await {
                        tracing::warn!(
                            "could not renew this server's leases ({e}); its deployments are stopped {} after the last renewal",
                            crate::human::duration(self.queue.lease.saturating_sub(super::fence::guard(self.queue.lease)))
                        );
                        // Renewed as soon as the database is back, not a
                        // tick later: the fence may be near.
                        tick.reset_after(RETRY.min(self.queue.lease / 3));
                    }
                    match self.db.queued_count().await {
                        Ok(n) => metrics::deployments_queued(n),
                        Err(e) => tracing::debug!("could not count the queue: {e}"),
                    }
                    if self.deployers.has_retired() {
                        match self.db.queued_keys().await {
                            Ok(keys) => self.deployers.drop_retired(&keys, self.queue.lease),
                            Err(e) => tracing::debug!("could not read the queue's versions: {e}"),
                        }
                    }
                    if let Err(e) = self.sweep().await {
                        tracing::warn!("could not end deployments nobody will finish: {e}");
                    }
                    if let Err(e) = self.expire_approvals().await {
                        tracing::warn!("could not end approvals that expired: {e}");
                    }
                }
            }
        }
        // Stopping: the deployments interrupted here still record their
        // ends, under leases kept until they have. One made live meanwhile
        // (a request admitted as the stop came) is waited for next round.
        loop {
            let live = self.live.all();
            if live.is_empty() {
                break;
            }
            let recorded = futures::future::join_all(live.iter().map(|r| r.finished()));
            tokio::select! {
                _ = recorded => {}
                _ = tick.tick() => {
                    if let Err(e) = self.beat().await {
                        tracing::warn!("could not renew this server's leases while stopping: {e}");
                    }
                }
            }
        }
        if let Err(e) = self.db.leave(&self.server_id).await {
            tracing::debug!("could not remove this server from the servers list: {e}");
        }
    }

    async fn hear_cancel(&self, running: &Running) {
        match self.db.cancel_reason(running.deploy_id).await {
            Ok(Some(reason)) => running.cancel(&reason),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                deploy_id = running.deploy_id,
                "could not read the cancel asked for a deployment: {e}"
            ),
        }
    }

    /// Renews the leases; a deployment of this server whose row it no
    /// longer owns (failed by another server after a lapse) is stopped.
    /// Gives up after a lease: a database cut off without a word (no
    /// reset, no answer) must not hold the beats, whose fence goes up
    /// meanwhile anyway.
    async fn beat(&self) -> Result<(), db::Error> {
        let started = tokio::time::Instant::now();
        let beat = tokio::time::timeout(self.queue.lease, self.renew());
        let renewed = match beat.await {
            Ok(renewed) => renewed,
            Err(_) => Err(db::Error::Unreachable(sqlx::Error::Io(
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no answer within {}",
                        crate::human::duration(self.queue.lease)
                    ),
                ),
            ))),
        };
        match &renewed {
            Ok(()) => self.renewals.renewed(started),
            Err(_) => self.renewals.failed(started),
        }
        renewed
    }

    async fn renew(&self) -> Result<(), db::Error> {
        let now_ms = db::now_ms();
        // The ones asked about are the ones checked: a deployment made live
        // meanwhile is renewed by the next beat.
        let live = self.live.all();
        let owned = self
            .db
            .beat(Beat {
                server_id: self.server_id.clone(),
                name: self.server_name.clone(),
                runnable: Runnable(self.deployers.runnable().into_keys().collect()),
                now_ms,
                lease_until: now_ms + db::millis(self.queue.lease),
                live: live.iter().map(|r| r.deploy_id).collect(),
            })
            .await?;
        let mut kept = HashSet::new();
        for (id, cancel) in owned {
            kept.insert(id);
            if let (Some(reason), Some(running)) = (cancel, self.live.get(id)) {
                running.cancel(&reason);
            }
        }
        for running in live {
            if !kept.contains(&running.deploy_id) && !running.is_finished() {
                running.cancel(CLAIM_LOST);
            }
        }
        Ok(())
    }

    /// Fails the deployments of servers that stopped renewing their
    /// leases, and queued ones no live server can run.
    async fn sweep(&self) -> Result<(), db::Error> {
        let now_ms = db::now_ms();
        // This server's own outage explains why the others' leases ran out
        // better than they can: they were cut off too, and stopped.
        let outage = self.renewals.recent_outage(2 * self.queue.lease);
        let mut ended = self
            .db
            .fail_expired(
                now_ms,
                move |owner, phase| match outage {
                    Some(outage) => lost_in_outage(owner, phase, outage),
                    None => lost(owner, phase),
                },
                Some(self.ended_report()),
            )
            .await?;
        let waited = self.queue.queue_timeout;
        let queued_before =
            humantime::format_rfc3339_millis(SystemTime::now() - waited).to_string();
        // Alive: renewed within the last three beats.
        let alive_since = now_ms - db::millis(self.queue.lease);
        ended.extend(
            self.db
                .fail_unrunnable(
                    queued_before,
                    alive_since,
                    move |deployer, sha| unrunnable(deployer, sha, waited),
                    Some(self.ended_report()),
                )
                .await?,
        );
        // Their ends were stored with them, and their waiters woken.
        if !ended.is_empty() {
            crate::failpoint::abort_after("sweep");
        }
        for row in ended {
            tracing::warn!(deploy_id = row.id, "{}", row.error.as_deref().unwrap_or(""));
        }
        Ok(())
    }

    /// At start, before taking work: fails the deployments the previous
    /// run of this server left running (it was killed or crashed, so
    /// nothing recorded their end), removes what their deployers wrote and
    /// publishes how each ended. A database that refuses (a full disk)
    /// must not keep the server from serving reads: then this tries again
    /// in the background, until it succeeds or the server stops.
    pub async fn recover(self: &Arc<Self>) {
        let Err(e) = self.fail_leftovers().await else {
            return;
        };
        tracing::error!(
            "could not mark the deployments left running by the previous run as failed ({e}); trying again in the background"
        );
        let pipeline = self.clone();
        let retry = async move {
            let mut backoff = Backoff::new();
            let mut wait = backoff.next_wait();
            loop {
                tokio::select! {
                    _ = pipeline.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                let Err(e) = pipeline.fail_leftovers().await else {
                    return;
                };
                wait = backoff.next_wait();
                tracing::warn!(
                    "still cannot mark the deployments left running by the previous run as failed ({e}); trying again in {}",
                    crate::human::duration(wait)
                );
            }
        };
        tokio::spawn(retry.in_current_span());
    }

    async fn fail_leftovers(&self) -> Result<(), db::Error> {
        let failed = self
            .db
            .fail_leftovers(
                &self.server_id,
                |phase| interrupted(phase, Stop::Unseen),
                Some(self.ended_report()),
            )
            .await?;
        if !failed.is_empty() {
            crate::failpoint::abort_after("recover");
            tracing::warn!(
                count = failed.len(),
                "marked deployments left running by the previous run as failed"
            );
        }
        for row in failed {
            // Their deployers were cut off: what they wrote is half made.
            remove_failed_output(PathBuf::from(&row.out_dir)).await;
        }
        Ok(())
    }
}
