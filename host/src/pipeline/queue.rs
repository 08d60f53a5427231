//! The queue worker: takes the oldest queued deployments this server can
//! run while it has room (`--max-running`), on a wake-up or a tick, and
//! hands each to `run` under the span of the request that queued it, if
//! that request came here. Never decides the order (the database's claim
//! does) and never ends a row.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::db::{self, Runnable, Topic};
use crate::model::TrainedModel;

use super::{Pipeline, Started};

/// How servers share the queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueSettings {
    /// Deployments this server runs at once; the rest wait, in order.
    pub max_running: usize,
    /// How long a server's claim on a running deployment lasts unless
    /// renewed; renewed every third of it.
    pub lease: Duration,
    /// How long a deployment nobody can run stays queued.
    pub queue_timeout: Duration,
    /// How long a deployment a rule held for approval waits for an admin.
    pub approval_expiry: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            max_running: 32,
            lease: Duration::from_secs(15),
            queue_timeout: Duration::from_secs(300),
            approval_expiry: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// How often a server with room looks at the queue without being woken:
/// a wake-up can be lost, and a plugin loaded later makes rows runnable.
/// Also how often a waiting caller reads its deployment's row again.
pub(super) const QUEUE_POLL: Duration = Duration::from_secs(1);

/// The most queued deployments a server claims in one transaction.
const CLAIM_BATCH: usize = 16;

impl Pipeline {
    /// Takes queued deployments while this server has room, until it
    /// stops: up to `CLAIM_BATCH` in one transaction, each run in a task
    /// of its own holding one of `--max-running` permits. A room closed
    /// (the fence ended) takes nothing more: the worker waits for the
    /// stop.
    pub(super) async fn serve_queue(self: Arc<Self>) {
        let mut queued = self.db.wakeups(Topic::Queue);
        loop {
            let first = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return,
                permit = self.room.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => {
                        self.shutdown.cancelled().await;
                        return;
                    }
                },
            };
            let mut permits = vec![first];
            while permits.len() < CLAIM_BATCH {
                match self.room.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }
            let wanted = permits.len();
            match self.claim(wanted).await {
                Ok(claimed) => {
                    let full = claimed.len() == wanted;
                    for (started, permit) in claimed.into_iter().zip(permits) {
                        let span = self.request_span(started.deployment.id);
                        self.launch(started, permit, span);
                    }
                    if full {
                        continue;
                    }
                }
                Err(e) => tracing::warn!("could not take deployments from the queue: {e}"),
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = queued.recv() => {}
                _ = tokio::time::sleep(QUEUE_POLL) => {}
            }
        }
    }

    /// Keeps the span of the request that queued deployment `id` here, for
    /// the run that claims it.
    pub(super) fn queued_here(&self, id: i64) {
        self.spans
            .lock()
            .expect("spans lock")
            .insert(id, (Instant::now(), tracing::Span::current()));
    }

    /// The span of the request that queued deployment `id`, if it was
    /// this server's; entries of deployments other servers claimed are
    /// forgotten once they could no longer be waiting.
    fn request_span(&self, id: i64) -> tracing::Span {
        let mut spans = self.spans.lock().expect("spans lock");
        let timeout = self.queue.queue_timeout;
        spans.retain(|_, (queued, _)| queued.elapsed() < timeout);
        match spans.remove(&id) {
            Some((_, span)) => span,
            None => tracing::info_span!("deployment", deploy_id = id),
        }
    }

    /// Claims the oldest queued deployments this server can run (at most
    /// `limit`) and makes them live here. A claim honours the reserve as
    /// an admission does: a server whose volume is below `--min-free-mib`
    /// claims nothing (one with room takes the row; this one looks again
    /// on its next tick), so that every deployment it runs can record its
    /// end.
    async fn claim(&self, limit: usize) -> Result<Vec<Started>, db::Error> {
        if let Err(low) = self.check_reserve() {
            tracing::debug!("claiming nothing: {low}");
            return Ok(Vec::new());
        }
        let plugins = self.deployers.runnable();
        let runnable = Runnable(plugins.keys().cloned().collect());
        let leased_at = std::time::Instant::now();
        let lease_until = db::now_ms() + db::millis(self.queue.lease);
        let claimed = self
            .db
            .claim(
                &self.server_id,
                &runnable,
                lease_until,
                self.out_dir(),
                limit,
                // Each claim's start is stored with it.
                Some(self.events.report(|row| vec![super::started(row)])),
            )
            .await?;
        if !claimed.is_empty() {
            crate::failpoint::abort_after("claim");
        }
        let mut started = Vec::with_capacity(claimed.len());
        let mut models: HashMap<i64, Option<TrainedModel>> = HashMap::new();
        for deployment in claimed {
            let key = Runnable::key(
                &deployment.deployer,
                deployment.plugin_sha256.as_deref().unwrap_or_default(),
            );
            // Claimed by the keys of this set: a row without one is left
            // to its lease, as below.
            let Some(plugin) = plugins.get(&key).cloned() else {
                tracing::warn!(
                    deploy_id = deployment.id,
                    "deployment {} was claimed for {}, which this server no longer serves; its \
                     lease will run out and a sweep will fail it",
                    deployment.id,
                    deployment.deployer
                );
                continue;
            };
            // Once claimed, a row is run or left to its lease: a row
            // claimed here that is not live is not renewed, so its lease
            // runs out and a sweep fails it.
            let model = match models.get(&deployment.model_id) {
                Some(model) => model.clone(),
                None => match self.db.model(deployment.model_id).await {
                    Ok(model) => {
                        models.insert(deployment.model_id, model.clone());
                        model
                    }
                    Err(e) => {
                        tracing::warn!(
                            deploy_id = deployment.id,
                            "could not read the model of a claimed deployment; it fails when its lease runs out: {e}"
                        );
                        continue;
                    }
                },
            };
            // Deleted meanwhile, and its deployments with it.
            let Some(model) = model else { continue };
            let (model, verified) = self.verified(model).await;
            started.push(self.make_live(deployment, model, verified, plugin, leased_at));
        }
        // A model fetched already is not fetched again: the rows say
        // deploying from here on, so a kill reads "interrupted while
        // deploying" as it would once the deployer started.
        let verified = started
            .iter()
            .filter(|s| s.verified.is_some())
            .map(|s| s.deployment.id)
            .collect();
        if let Err(e) = self.db.mark_deploying(verified).await {
            // Only what a kill would read: they run all the same.
            tracing::warn!("could not record that claimed deployments skip their fetch: {e}");
        }
        Ok(started)
    }
}
