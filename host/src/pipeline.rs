//! The one place that knows the whole order of a deployment: look up the
//! model, find the deployer and check the options, record the deployment,
//! fetch and verify, run the deployer in its sandbox, record the outcome,
//! publish the event. Every step is owned by its own module; this file only
//! sequences them and turns their errors into the deployment's error text.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::db::{self, Db, Ending, NewDeployment};
use crate::deployers::Deployers;
use crate::events::{Event, Events};
use crate::fetch::{self, Fetcher};
use crate::live::{Live, Running};
use crate::metrics;
use crate::model::{Deployment, Outcome, Phase, Status, TrainedModel};
use crate::runtime::{CallError, DeployCall, Plugin};

/// How often a running deployment's progress reaches the database and the
/// event stream, at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// How soon, and at most how long after, a refused end record is offered
/// to the database again.
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(250);
const RECORD_RETRY_MAX: Duration = Duration::from_secs(10);

/// Free space below which a failed deployer's volume counts as full
/// (without a reserve).
const FULL_BELOW: u64 = 1 << 20;

/// How the server stopped under a running deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Asked to (SIGINT/SIGTERM): the pipeline recorded the row itself.
    Graceful,
    /// Killed or crashed: the row is found `running` at the next start.
    Unseen,
}

/// The error recorded for a deployment the server stopped under, saying
/// what it was doing (`phase`: `None` for a row from before phases were
/// recorded) and, for an unseen stop, what probably happened.
pub fn interrupted(phase: Option<Phase>, stop: Stop) -> String {
    let doing = match phase {
        Some(Phase::Fetching) => " while fetching the model",
        Some(Phase::Deploying) => " while deploying",
        None => "",
    };
    let cause = match stop {
        Stop::Graceful => "",
        Stop::Unseen => " (killed or crashed?)",
    };
    format!("interrupted{doing}: the server stopped before it finished{cause}")
}

/// Options larger than this are refused before anything else happens.
pub const MAX_OPTIONS_BYTES: usize = 64 * 1024;

/// Why a deployment could not start. Nothing was recorded.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("model {0} does not exist")]
    UnknownModel(i64),
    #[error("no deployers are loaded: put a deployer's .wasm file into the plugins folder ({0})")]
    NoDeployers(String),
    #[error(
        "deployer {0} is still loading (the server compiles its plugins after it starts); try again in a few seconds, GET /readyz says when all are loaded"
    )]
    StillLoading(String),
    #[error(
        "the server's volume ({dir}) has {} free, less than the {} berth keeps to record the end of every deployment (--min-free-mib); free some space: reads keep working",
        crate::human::size(*.free), crate::human::size(*.reserve)
    )]
    LowOnSpace {
        dir: String,
        free: u64,
        reserve: u64,
    },
    #[error("unknown deployer {name:?}; the loaded deployers are: {}", .known.join(", "))]
    UnknownDeployer { name: String, known: Vec<String> },
    #[error("{0}")]
    BadOptions(String),
    #[error("the deployment could not be recorded: {0}")]
    Record(#[from] db::Error),
}

/// Runs deployments: the only owner of their order, of the tasks that carry
/// them out and of their cancellation.
pub struct Pipeline {
    db: Db,
    events: Events,
    deployers: Arc<Deployers>,
    fetcher: Fetcher,
    /// Identifies this server process's rows among replicas.
    server_id: String,
    /// Deployment out-dirs live under here, one per deployment id.
    out_root: PathBuf,
    /// Cancelled when the server stops: every running deployment is
    /// interrupted and recorded as failed.
    shutdown: CancellationToken,
    /// Every deployment task, so a stop can wait for their rows.
    tasks: TaskTracker,
    live: Live,
    /// Bytes of the data volume new deployments leave free.
    reserve: u64,
}

/// Why a cancel request was refused.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("deployment {0} does not exist")]
    Unknown(i64),
    #[error("deployment {id} already ended ({status}); only a running deployment can be cancelled")]
    Ended { id: i64, status: &'static str },
    #[error("deployment {0} is running on another berth server; send the cancel there")]
    Elsewhere(i64),
    #[error("{0}")]
    Record(#[from] db::Error),
}

/// Why an attached deployment has no stored outcome to show.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("recording the end of deployment: {0}")]
    Record(#[from] db::Error),
    #[error("the deployment task crashed: {0}")]
    Crashed(String),
}

/// What to deploy, and how.
pub struct Request<'a> {
    pub model_id: i64,
    pub deployer: &'a str,
    /// A JSON object, at most `MAX_OPTIONS_BYTES`.
    pub options_json: &'a str,
    /// The name of the API token that asked (none without tokens).
    pub created_by: Option<&'a str>,
}

/// A recorded, running deployment, ready to be carried out.
struct Started {
    deployment: Deployment,
    model: TrainedModel,
    /// The model's directory when its files were already verified at
    /// start: the row was recorded `deploying` and nothing is fetched.
    verified: Option<PathBuf>,
    plugin: Arc<Plugin>,
    running: Arc<Running>,
}

/// Cancels a deployment when dropped, unless it ended first: what an
/// attached run holds, so a client that leaves cancels its work.
struct CancelOnDrop(Arc<Running>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel("cancelled: the client disconnected");
    }
}

impl Pipeline {
    pub fn new(
        db: Db,
        events: Events,
        deployers: Arc<Deployers>,
        fetcher: Fetcher,
        server_id: String,
        out_root: PathBuf,
    ) -> Self {
        Self {
            db,
            events,
            deployers,
            fetcher,
            server_id,
            out_root,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            live: Live::default(),
            reserve: 0,
        }
    }

    /// Refuses new deployments while the volume of the out-dirs (the data
    /// dir's) has less than `bytes` free, so that every deployment started
    /// can still record its end.
    pub fn reserve(mut self, bytes: u64) -> Self {
        self.reserve = bytes;
        self
    }

    /// Records the deployment and carries it out while the caller waits;
    /// the answer is the stored row once it ended. The work runs in a task
    /// of its own so that it always records its outcome: if the caller's
    /// future is dropped (a client disconnected), the deployment is
    /// cancelled, not abandoned.
    pub async fn run_attached(
        self: &Arc<Self>,
        request: Request<'_>,
    ) -> Result<Deployment, RunError> {
        let started = self.start(request).await?;
        let _cancel_on_drop = CancelOnDrop(started.running.clone());
        let pipeline = self.clone();
        // The task carries the request's span, so the deployment's log
        // lines carry its request id.
        self.tasks
            .spawn(async move { pipeline.run(started).await }.in_current_span())
            .await
            .map_err(|e| RunError::Crashed(e.to_string()))?
            .map_err(RunError::Record)
    }

    /// Records the deployment and carries it out in the background; the
    /// answer is the running row.
    pub async fn run_detached(
        self: &Arc<Self>,
        request: Request<'_>,
    ) -> Result<Deployment, StartError> {
        let started = self.start(request).await?;
        let deployment = started.deployment.clone();
        let pipeline = self.clone();
        // Outlives the response, and still carries the request's span.
        self.tasks.spawn(
            async move {
                if let Err(e) = pipeline.run(started).await {
                    tracing::error!("recording the end of a background deployment: {e}");
                }
            }
            .in_current_span(),
        );
        Ok(deployment)
    }

    fn check_reserve(&self) -> Result<(), StartError> {
        if self.reserve == 0 {
            return Ok(());
        }
        let free = crate::space::free_bytes(&self.out_root).unwrap_or(u64::MAX);
        if free >= self.reserve {
            return Ok(());
        }
        Err(StartError::LowOnSpace {
            dir: self.out_root.display().to_string(),
            free,
            reserve: self.reserve,
        })
    }

    /// Steps 1–3: nothing is recorded unless all checks pass.
    async fn start(&self, request: Request<'_>) -> Result<Started, StartError> {
        let Request {
            model_id,
            deployer,
            options_json,
            created_by,
        } = request;
        let model = self
            .db
            .model(model_id)
            .await?
            .ok_or(StartError::UnknownModel(model_id))?;
        self.check_reserve()?;
        let plugins = self.deployers.current();
        if !plugins.deployers.contains_key(deployer) && self.deployers.is_loading(deployer) {
            return Err(StartError::StillLoading(deployer.to_string()));
        }
        if plugins.deployers.is_empty() {
            return Err(StartError::NoDeployers(
                self.deployers.dir().display().to_string(),
            ));
        }
        let plugin = plugins.deployers.get(deployer).cloned().ok_or_else(|| {
            StartError::UnknownDeployer {
                name: deployer.to_string(),
                known: plugins.deployers.keys().cloned().collect(),
            }
        })?;
        self.deployers
            .runtime()
            .check_options(&plugin, options_json)
            .await
            .map_err(|e| {
                StartError::BadOptions(format!("deployer {deployer} refused the options: {e}"))
            })?;

        let dir = self.fetcher.dir_of(&model.job_id);
        // An unchanged model needs no fetch: its row starts `deploying`,
        // one write fewer than a phase recorded after the fetch, and a
        // kill from here on reads "interrupted while deploying" as it
        // would once the deployer started.
        let verified = self.fetcher.verified(&model);
        let phase = match verified {
            Some(_) => Phase::Deploying,
            None => Phase::Fetching,
        };
        let out_root = self.out_root.clone();
        let deployment = self
            .db
            .insert_deployment(
                NewDeployment {
                    model_id,
                    deployer,
                    options_json,
                    dir: &dir.display().to_string(),
                    server_id: &self.server_id,
                    created_by,
                },
                phase,
                move |id| out_root.join(id.to_string()).display().to_string(),
            )
            .await?;
        let running = Arc::new(Running::new(
            deployment.id,
            deployer,
            self.shutdown.child_token(),
        ));
        if verified.is_some() {
            let bytes = model.files.iter().map(|f| f.size_bytes).sum();
            let files = model.files.len();
            fetch::Observer::fetched(&*running, bytes, bytes, files, files);
            running.set_phase(Phase::Deploying);
        }
        self.live.insert(running.clone());
        metrics::deployment_started();
        self.events.publish(Event::DeploymentStarted {
            deploy_id: deployment.id,
            model_id,
            deployer: deployer.to_string(),
        });
        Ok(Started {
            deployment,
            model,
            verified,
            plugin,
            running,
        })
    }

    /// Cancels a deployment running in this process.
    pub async fn cancel(&self, deploy_id: i64) -> Result<Deployment, CancelError> {
        let Some(running) = self.live.get(deploy_id) else {
            return match self.db.deployment(deploy_id).await? {
                None => Err(CancelError::Unknown(deploy_id)),
                Some(d) if d.status == Status::Running => Err(CancelError::Elsewhere(deploy_id)),
                Some(d) => Err(CancelError::Ended {
                    id: deploy_id,
                    status: d.status.as_str(),
                }),
            };
        };
        running.cancel("cancelled");
        // The guest stops within a tick; wait for the row so the answer
        // shows the outcome (bounded: a stuck host call has its own limit).
        let _ = tokio::time::timeout(Duration::from_secs(10), running.finished()).await;
        self.db
            .deployment(deploy_id)
            .await?
            .ok_or(CancelError::Unknown(deploy_id))
    }

    /// Stops the server's work: every running deployment is interrupted
    /// and recorded as failed, and event streams end.
    pub fn stop(&self) {
        self.shutdown.cancel();
    }

    /// Cancelled when the server stops.
    pub fn stopping(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Waits (at most `limit`) until every deployment task has ended: at
    /// shutdown, so interrupted deployments get to record how they ended.
    pub async fn drain(&self, limit: Duration) {
        self.tasks.close();
        if tokio::time::timeout(limit, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = self.tasks.len(),
                "stopping without the outcome of deployments still running after {}",
                crate::human::duration(limit)
            );
        }
    }

    /// The deployer's log lines: live while running here, stored after.
    pub async fn logs(&self, deploy_id: i64) -> Result<Option<String>, db::Error> {
        match self.live.get(deploy_id) {
            Some(running) => Ok(Some(running.logs())),
            None => self.db.deployment_logs(deploy_id).await,
        }
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
        let duration_ms = i64::try_from(took.as_millis()).unwrap_or(i64::MAX);
        let ending = Ending {
            outcome: &outcome,
            duration_ms,
            progress: &running.snapshot(),
            logs: &running.logs(),
        };
        let stored = self.record_end(deployment.id, &ending).await;
        self.live.remove(deployment.id);
        metrics::deployment_ended(&deployment.deployer, &outcome, took);
        running.finish();
        let stored = stored?;
        let (deploy_id, model_id, deployer) = (stored.id, stored.model_id, stored.deployer.clone());
        self.events.publish(match outcome {
            Outcome::Completed { reference, .. } => Event::DeploymentCompleted {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                reference,
            },
            Outcome::Failed { error } => Event::DeploymentFailed {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                error,
            },
        });
        Ok(stored)
    }

    /// Stores how a deployment ended. A database that refuses (a full
    /// disk, a lost connection) does not lose the outcome: it is kept here
    /// and offered again, less often each time, until it is stored; only
    /// a row that is no longer running is given up on.
    async fn record_end(
        &self,
        deploy_id: i64,
        ending: &Ending<'_>,
    ) -> Result<Deployment, db::Error> {
        let mut wait = RECORD_RETRY_FIRST;
        loop {
            match self.db.finish_deployment(deploy_id, ending).await {
                Err(e @ (db::Error::NotRunning(_) | db::Error::Corrupt(_))) => return Err(e),
                Err(e) => tracing::warn!(
                    deploy_id,
                    "could not record the end of deployment {deploy_id} ({e}); keeping its outcome and trying again in {}",
                    crate::human::duration(wait)
                ),
                Ok(stored) => {
                    if wait > RECORD_RETRY_FIRST {
                        tracing::info!(
                            deploy_id,
                            "recorded the end of deployment {deploy_id} after retrying"
                        );
                    }
                    return Ok(stored);
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RECORD_RETRY_MAX);
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
        let model_dir = match verified {
            Some(dir) => {
                metrics::fetch_ended(true, Duration::ZERO);
                dir
            }
            None => self.fetch(model, running).await?,
        };
        let out_dir = PathBuf::from(&deployment.out_dir);
        std::fs::create_dir_all(&out_dir).map_err(|e| {
            format!(
                "cannot create the output directory {}: {e}",
                out_dir.display()
            )
        })?;
        let call = DeployCall {
            deploy_id: deployment.id,
            model,
            model_dir: &model_dir,
            out_dir: &out_dir,
            options_json: &deployment.options_json,
        };
        match self
            .deployers
            .runtime()
            .deploy(plugin, call, running.clone(), cancel)
            .await
        {
            Ok(deployed) => Ok(Outcome::Completed {
                reference: deployed.reference,
                details_json: serde_json::Value::Object(deployed.details).to_string(),
            }),
            Err(CallError::Cancelled) => Err(self.cancelled(running)),
            Err(e) => Err(format!(
                "deployer {}: {e}{}",
                plugin.name,
                self.full_volume(&out_dir)
            )),
        }
    }

    /// Fetches the model, then records the deploying phase.
    async fn fetch(&self, model: &TrainedModel, running: &Arc<Running>) -> Result<PathBuf, String> {
        let clock = Instant::now();
        let fetched = self
            .fetcher
            .fetch(model, running.clone(), running.token())
            .await;
        metrics::fetch_ended(fetched.is_ok(), clock.elapsed());
        let model_dir = fetched.map_err(|e| match e {
            fetch::Error::Cancelled => self.cancelled(running),
            e => format!("fetching model {}: {e}", model.id),
        })?;
        running.set_phase(Phase::Deploying);
        // Recorded before the deployer starts rather than at the next
        // progress tick: a server killed from here on fails the row as
        // interrupted while deploying when it starts again.
        if let Err(e) = self
            .db
            .update_progress(running.deploy_id, Phase::Deploying, &running.snapshot())
            .await
        {
            tracing::warn!(
                deploy_id = running.deploy_id,
                "could not record the phase: {e}"
            );
        }
        Ok(model_dir)
    }

    /// What a deployer cannot say: WASI hands a guest a bare I/O error
    /// for a full disk, so a failure on a volume left (nearly) full is
    /// told so, before the removal of its output frees the space again.
    fn full_volume(&self, out_dir: &std::path::Path) -> String {
        let nearly_full = self.reserve.max(FULL_BELOW);
        match crate::space::free_bytes(out_dir) {
            Ok(free) if free < nearly_full => format!(
                " (the output volume had {} free when it ended: the disk filled up)",
                crate::human::size(free)
            ),
            _ => String::new(),
        }
    }
}

impl Pipeline {
    fn cancelled(&self, running: &Running) -> String {
        match running.reason() {
            Some(reason) => reason.to_string(),
            None if self.shutdown.is_cancelled() => {
                interrupted(Some(running.phase()), Stop::Graceful)
            }
            None => "cancelled".to_string(),
        }
    }
}

/// A failed deployment's output is half made and nobody's product: it is
/// removed, so failures cannot fill the disk. A completed one is kept.
pub async fn remove_failed_output(out_dir: PathBuf) {
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
    loop {
        tick.tick().await;
        let Some((phase, progress)) = running.take_update() else {
            continue;
        };
        if let Err(e) = db
            .update_progress(running.deploy_id, phase, &progress)
            .await
        {
            tracing::warn!(
                deploy_id = running.deploy_id,
                "could not record progress: {e}"
            );
        }
        events.publish(Event::DeploymentProgress {
            deploy_id: running.deploy_id,
            model_id,
            phase,
            progress,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interruption_says_what_was_running_and_how_the_server_stopped() {
        let stopped = "the server stopped before it finished";
        for (phase, stop, expected) in [
            (
                Some(Phase::Fetching),
                Stop::Graceful,
                format!("interrupted while fetching the model: {stopped}"),
            ),
            (
                Some(Phase::Deploying),
                Stop::Graceful,
                format!("interrupted while deploying: {stopped}"),
            ),
            (
                Some(Phase::Fetching),
                Stop::Unseen,
                format!("interrupted while fetching the model: {stopped} (killed or crashed?)"),
            ),
            (
                Some(Phase::Deploying),
                Stop::Unseen,
                format!("interrupted while deploying: {stopped} (killed or crashed?)"),
            ),
            (
                None,
                Stop::Unseen,
                format!("interrupted: {stopped} (killed or crashed?)"),
            ),
        ] {
            assert_eq!(interrupted(phase, stop), expected, "{phase:?} {stop:?}");
        }
    }
}
