//! Carrying out one deployment this server took, in a task of its own:
//! fetch and verify (unless the model was verified already and its files'
//! formats are recorded), record the formats the fetch told, apply the
//! pickle policy (`pickles`), run the deployer in its sandbox, pass progress on at a bounded rate, remove a
//! failed deployment's output, record the end (kept and offered again
//! while the database refuses) and publish it. Never decides whether or
//! where a deployment runs (`admit` and `queue` do).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::backoff::Backoff;
use crate::db::{self, Db, Ending, Topic};
use crate::events::{Event, Events};
use crate::fetch;
use crate::live::Running;
use crate::metrics;
use crate::model::{Deployment, Format, Outcome, Phase, TrainedModel};
use crate::runtime::{CallError, DeployCall, Plugin};

use super::sentences::{CANCELLED, Stop, interrupted};
use super::{Pipeline, Started};

/// How often a running deployment's progress reaches the database and the
/// event stream, at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Free space below which a failed deployer's volume counts as full
/// (without a reserve).
const FULL_BELOW: u64 = 1 << 20;

impl Pipeline {
    /// Runs a deployment this server took, in a task of its own holding
    /// `permit` (one of `--max-running`) until its end is recorded.
    pub(super) fn launch(
        self: &Arc<Self>,
        started: Started,
        permit: tokio::sync::OwnedSemaphorePermit,
        span: tracing::Span,
    ) {
        let pipeline = self.clone();
        self.tasks.spawn(
            async move {
                let _permit = permit;
                if let Err(e) = pipeline.run(started).await {
                    tracing::error!("recording the end of a deployment: {e}");
                }
            }
            .instrument(span),
        );
    }

    /// Steps 4–7. Always ends the recorded deployment, whatever happens; the
    /// returned row is the stored one.
    async fn run(&self, started: Started) -> Result<Deployment, db::Error> {
        let Started {
            deployment,
            model,
            verified,
            plugin,
            running,
        } = started;
        metrics::deployment_started();
        let clock = Instant::now();
        let reporter = self.tasks.spawn(
            report_progress(
                self.db.clone(),
                self.events.clone(),
                running.clone(),
                model.id,
            )
            .in_current_span(),
        );
        let outcome = match self
            .carry_out(&deployment, &model, verified, &plugin, &running)
            .await
        {
            Ok(outcome) => outcome,
            Err(error) => Outcome::Failed { error },
        };
        reporter.abort();
        if let Outcome::Failed { .. } = outcome {
            remove_failed_output(PathBuf::from(&deployment.out_dir)).await;
        }
        let took = clock.elapsed();
        let duration_ms = db::millis(took);
        let ending = Ending {
            outcome: &outcome,
            duration_ms,
            progress: &running.snapshot(),
            logs: &running.logs(),
            published: &running.published(),
        };
        let stored = self.record_end(deployment.id, &ending).await;
        if let (Err(db::Error::NotRunning(_)), Outcome::Completed { .. }) = (&stored, &outcome) {
            // Another server failed the row first (the lease ran out while
            // the database was away): the record says failed, so the
            // output is no one's product.
            remove_failed_output(PathBuf::from(&deployment.out_dir)).await;
        }
        self.live.remove(deployment.id);
        metrics::deployment_ended(&deployment.deployer, &outcome, took);
        running.finish(stored.as_ref().ok().cloned());
        stored
    }

    /// Stores how a deployment ended. A database that refuses (a full
    /// disk, a lost connection) does not lose the outcome: it is kept here
    /// and offered again, less often each time, until it is stored (a stop
    /// waits for it, up to the drain's limit); only a row that is no longer
    /// running is given up on.
    async fn record_end(
        &self,
        deploy_id: i64,
        ending: &Ending<'_>,
    ) -> Result<Deployment, db::Error> {
        let mut backoff = Backoff::new();
        loop {
            // Its waiters on every server are woken at the commit.
            let report = self
                .events
                .report(|row| vec![super::ended(row)])
                .waking(Topic::Ended);
            match self
                .db
                .finish_deployment(deploy_id, ending, Some(report))
                .await
            {
                Err(e @ (db::Error::NotRunning(_) | db::Error::Corrupt(_))) => return Err(e),
                Err(e) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(
                        deploy_id,
                        "could not record the end of deployment {deploy_id} ({e}); keeping its outcome and trying again in {}",
                        crate::human::duration(wait)
                    );
                    tokio::time::sleep(wait).await;
                }
                Ok(stored) => {
                    if backoff.retried() {
                        tracing::info!(
                            deploy_id,
                            "recorded the end of deployment {deploy_id} after retrying"
                        );
                    }
                    return Ok(stored);
                }
            }
        }
    }

    async fn carry_out(
        &self,
        deployment: &Deployment,
        model: &TrainedModel,
        verified: Option<PathBuf>,
        plugin: &Plugin,
        running: &Arc<Running>,
    ) -> Result<Outcome, String> {
        let cancel = running.token();
        // A copy verified already needs no fetch, unless the records do
        // not know its formats yet (verified by an older berth): then the
        // fetch of the vouched copy reads only each file's head.
        let (model_dir, formats) = match verified {
            Some(dir) if model.files.iter().all(|f| f.format.is_some()) => {
                metrics::fetch_ended(true, Duration::ZERO);
                (dir, None)
            }
            _ => {
                let fetched = self.fetch(model, running).await?;
                (fetched.dir, Some(fetched.formats))
            }
        };
        let pickles = super::pickles::pickle_paths(&model.files, formats.as_deref());
        if let Some(why) = super::pickles::refusal(self.pickles, model, plugin, &pickles) {
            return Err(why);
        }
        super::pickles::warn(self.pickles, model, plugin, &pickles, running.as_ref());
        let out_dir = PathBuf::from(&deployment.out_dir);
        tokio::fs::create_dir_all(&out_dir).await.map_err(|e| {
            format!(
                "cannot create the output directory {}: {e}",
                out_dir.display()
            )
        })?;
        let record = self.fetcher.record_of(&model.job_id);
        let call = DeployCall {
            deploy_id: deployment.id,
            model,
            model_dir: &model_dir,
            out_dir: &out_dir,
            record: Some(&record),
            options_json: &deployment.options_json,
        };
        let runtime = self.deployers.runtime();
        match runtime.deploy(plugin, call, running.clone(), cancel).await {
            Ok(deployed) => {
                runtime
                    .sign_published(&running.published(), running.clone(), cancel)
                    .await?;
                Ok(Outcome::Completed {
                    reference: deployed.reference,
                    details_json: serde_json::Value::Object(deployed.details).to_string(),
                })
            }
            Err(CallError::Cancelled) => Err(self.cancelled(running)),
            Err(e) => Err(format!(
                "deployer {}: {e}{}",
                plugin.name,
                self.full_volume(&out_dir)
            )),
        }
    }

    /// Fetches the model, records the formats it told that the records did
    /// not know, then the deploying phase.
    async fn fetch(
        &self,
        model: &TrainedModel,
        running: &Arc<Running>,
    ) -> Result<fetch::Fetched, String> {
        let clock = Instant::now();
        let fetched = self
            .fetcher
            .fetch_known(model, running.clone(), running.token())
            .await;
        metrics::fetch_ended(fetched.is_ok(), clock.elapsed());
        let fetched = fetched.map_err(|e| match e {
            fetch::Error::Cancelled => self.cancelled(running),
            e => format!("fetching model {}: {e}", model.id),
        })?;
        self.record_formats(model, &fetched.formats).await;
        running.set_phase(Phase::Deploying);
        // Recorded before the deployer starts rather than at the next
        // progress tick: a server killed from here on fails the row as
        // interrupted while deploying when it starts again.
        if let Err(e) = self
            .db
            .update_progress(
                running.deploy_id,
                Phase::Deploying,
                &running.snapshot(),
                None,
            )
            .await
        {
            tracing::warn!(
                deploy_id = running.deploy_id,
                "could not record the phase: {e}"
            );
        }
        Ok(fetched)
    }

    /// Records the formats `formats` (in the model's files' order) that
    /// the records do not know yet. Not recording them costs only a look
    /// at the files' heads next time.
    async fn record_formats(&self, model: &TrainedModel, formats: &[Format]) {
        let new: Vec<(String, Format)> = model
            .files
            .iter()
            .zip(formats)
            .filter(|(file, format)| file.format != Some(**format))
            .map(|(file, format)| (file.path.clone(), *format))
            .collect();
        if new.is_empty() {
            return;
        }
        if let Err(e) = self.db.record_formats(model.id, new).await {
            tracing::warn!(
                model_id = model.id,
                "could not record the files' formats: {e}"
            );
        }
    }

    /// What a deployer cannot say: WASI hands a guest a bare I/O error
    /// for a full disk, so a failure on a volume left (nearly) full is
    /// told so, before the removal of its output frees the space again.
    fn full_volume(&self, out_dir: &Path) -> String {
        let nearly_full = self.reserve.max(FULL_BELOW);
        match crate::space::free_bytes(out_dir) {
            Ok(free) if free < nearly_full => format!(
                " (the output volume had {} free when it ended: the disk filled up)",
                crate::human::size(free)
            ),
            _ => String::new(),
        }
    }

    /// The error of a deployment whose run was cancelled: the reason
    /// given, or the server's stop.
    fn cancelled(&self, running: &Running) -> String {
        match running.reason() {
            Some(reason) => reason.to_string(),
            None if self.shutdown.is_cancelled() => {
                interrupted(Some(running.phase()), Stop::Graceful)
            }
            None => CANCELLED.to_string(),
        }
    }
}

/// A failed deployment's output is half made and nobody's product: it is
/// removed, so failures cannot fill the disk. A completed one is kept.
pub(super) async fn remove_failed_output(out_dir: PathBuf) {
    // A deployer may have written many files; the removal blocks.
    let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&out_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!(
            "could not remove the output directory {} of a failed deployment: {e}",
            out_dir.display()
        )),
        _ => Ok(()),
    })
    .await;
    match removed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("{e}"),
        Err(e) => tracing::warn!("removing a failed deployment's output directory: {e}"),
    }
}

/// Passes a running deployment's progress to the database and the event
/// stream at most every `PROGRESS_EVERY`, so a fast fetch cannot flood
/// subscribers. Aborted when the deployment ends.
async fn report_progress(db: Db, events: Events, running: Arc<Running>, model_id: i64) {
    // The first tick one period after the start: the row and the started
    // event were written with the state this would report at once.
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    // The puts already written: the list is written again only when it
    // grew, not with every tick of progress.
    let mut written = 0;
    loop {
        tick.tick().await;
        let Some((phase, progress)) = running.take_update() else {
            continue;
        };
        let grown = (running.published_count() > written).then(|| running.published());
        if let Err(e) = db
            .update_progress(running.deploy_id, phase, &progress, grown.as_deref())
            .await
        {
            tracing::warn!(
                deploy_id = running.deploy_id,
                "could not record progress: {e}"
            );
        } else if let Some(published) = &grown {
            written = published.len();
        }
        events.publish(Event::DeploymentProgress {
            deploy_id: running.deploy_id,
            model_id,
            phase,
            progress,
        });
    }
}
