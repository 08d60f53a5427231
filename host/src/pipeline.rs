//! The one place that knows the whole order of a deployment: look up the
//! model, find the deployer and check the options, record the deployment,
//! fetch and verify, run the deployer in its sandbox, record the outcome,
//! publish the event. Every step is owned by its own module; this file only
//! sequences them and turns their errors into the deployment's error text.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::db::{self, Beat, CancelAsked, Claim, Db, Ending, NewDeployment, Runnable, Topic};
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
    let doing = doing(phase);
    let cause = match stop {
        Stop::Graceful => "",
        Stop::Unseen => " (killed or crashed?)",
    };
    format!("interrupted{doing}: the server stopped before it finished{cause}")
}

/// What a deployment was doing, as its error says: `None` for a row from
/// before phases were recorded.
fn doing(phase: Option<Phase>) -> &'static str {
    match phase {
        Some(Phase::Fetching) => " while fetching the model",
        Some(Phase::Deploying) => " while deploying",
        None => "",
    }
}

/// The error recorded for a deployment whose owner stopped renewing its
/// lease: `owner` names the server.
pub fn lost(owner: &str, phase: Option<Phase>) -> String {
    let doing = doing(phase);
    format!(
        "lost{doing}: berth server {owner} stopped renewing its lease on this deployment (killed, frozen or cut off from the database?)"
    )
}

/// The error recorded for a queued deployment no live server can run.
fn unrunnable(deployer: &str, sha256: &str, waited: Duration) -> String {
    format!(
        "no berth server could run it: none has deployer {deployer} at sha256 {sha256} loaded, \
         and none took it within {} (--queue-timeout-s); load that version of the deployer \
         on a server, or deploy again with the version the servers have",
        crate::human::duration(waited)
    )
}

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
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            max_running: 32,
            lease: Duration::from_secs(15),
            queue_timeout: Duration::from_secs(300),
        }
    }
}

/// How often a server with room looks at the queue without being woken:
/// a wake-up can be lost, and a plugin loaded later makes rows runnable.
const QUEUE_POLL: Duration = Duration::from_secs(1);

/// The most queued deployments a server claims in one transaction.
const CLAIM_BATCH: usize = 16;

/// How long a cancel waits for the deployment's row to end before it
/// answers that the cancel was accepted.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

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
    /// How people know this server: its host and address.
    server_name: String,
    queue: QueueSettings,
    /// One permit per deployment this server may run at once.
    room: Arc<tokio::sync::Semaphore>,
    /// Deployment out-dirs live under here, one per deployment id.
    out_root: PathBuf,
    /// Cancelled when the server stops: every running deployment is
    /// interrupted and recorded as failed.
    shutdown: CancellationToken,
    /// Every deployment task, so a stop can wait for their rows.
    tasks: TaskTracker,
    live: Live,
    /// The request span of each deployment queued here and not claimed
    /// yet: a deployment claimed here logs under its request's id.
    spans: std::sync::Mutex<HashMap<i64, (Instant, tracing::Span)>>,
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
    #[error("{0}")]
    Record(#[from] db::Error),
}

/// Why an attached deployment has no stored outcome to show.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("reading the deployment's outcome: {0}")]
    Record(#[from] db::Error),
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

/// A claimed deployment, ready to be carried out.
struct Started {
    deployment: Deployment,
    model: TrainedModel,
    /// The model's directory when its files were already verified at
    /// start: the row was recorded `deploying` and nothing is fetched.
    verified: Option<PathBuf>,
    plugin: Arc<Plugin>,
    running: Arc<Running>,
}

/// Cancels a deployment when dropped, unless disarmed once it ended: what
/// an attached run holds, so a client that leaves cancels its work,
/// wherever it runs.
struct CancelOnDrop {
    pipeline: Arc<Pipeline>,
    deploy_id: Option<i64>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.deploy_id else {
            return;
        };
        let pipeline = self.pipeline.clone();
        self.pipeline.tasks.spawn(async move {
            if let Err(e) = pipeline
                .ask_cancel(id, "cancelled: the client disconnected")
                .await
            {
                tracing::warn!(
                    deploy_id = id,
                    "could not cancel the deployment of a client that left: {e}"
                );
            }
        });
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
        let queue = QueueSettings::default();
        Self {
            db,
            events,
            deployers,
            fetcher,
            server_name: server_id.clone(),
            server_id,
            queue,
            room: Arc::new(tokio::sync::Semaphore::new(queue.max_running)),
            out_root,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            live: Live::default(),
            spans: Default::default(),
            reserve: 0,
        }
    }

    /// How this server shares the queue, and the name other servers'
    /// records give it.
    pub fn queue(mut self, settings: QueueSettings, server_name: String) -> Self {
        self.room = Arc::new(tokio::sync::Semaphore::new(settings.max_running.max(1)));
        self.queue = settings;
        self.server_name = server_name;
        self
    }

    /// Starts serving the queue: claiming deployments while there is
    /// room, keeping leases, hearing cancels, ending what nobody will
    /// finish. Both tasks end when the server stops.
    pub fn start_workers(self: &Arc<Self>) {
        tokio::spawn(self.clone().serve_queue().in_current_span());
        tokio::spawn(self.clone().keep_leases().in_current_span());
    }

    /// Refuses new deployments while the volume of the out-dirs (the data
    /// dir's) has less than `bytes` free, so that every deployment started
    /// can still record its end.
    pub fn reserve(mut self, bytes: u64) -> Self {
        self.reserve = bytes;
        self
    }

    /// Records the deployment (run here at once if there is room, else
    /// queued) and waits until it ended, wherever it ran; the answer is
    /// the stored row. If the caller's future is dropped (a
    /// client disconnected), the deployment is cancelled, not abandoned.
    pub async fn run_attached(
        self: &Arc<Self>,
        request: Request<'_>,
    ) -> Result<Deployment, RunError> {
        // Heard from before the insert, so a fast end is not missed.
        let mut ended = self.db.wakeups(Topic::Ended);
        let recorded = self.start(request).await?;
        let mut cancel_on_drop = CancelOnDrop {
            pipeline: self.clone(),
            deploy_id: Some(recorded.id),
        };
        let stored = self.wait_ended(recorded, &mut ended, None).await?;
        if stored.status.is_final() {
            cancel_on_drop.deploy_id = None;
        }
        Ok(stored)
    }

    /// Records the deployment (run here at once if there is room, else
    /// queued for a server with room); the answer is its row.
    pub async fn run_detached(
        self: &Arc<Self>,
        request: Request<'_>,
    ) -> Result<Deployment, StartError> {
        self.start(request).await
    }

    /// Reads a deployment, from `row` as last read, until it ended (woken
    /// by `ended`, or on a tick), at most for `limit`; returns the last
    /// row read. A server that stops meanwhile cancels it if nobody took
    /// it yet, since the caller goes too.
    async fn wait_ended(
        &self,
        mut row: Deployment,
        ended: &mut tokio::sync::broadcast::Receiver<String>,
        limit: Option<Duration>,
    ) -> Result<Deployment, db::Error> {
        let id = row.id;
        let deadline = limit.map(|limit| tokio::time::Instant::now() + limit);
        let mut stopped = false;
        loop {
            if row.status.is_final() || deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return Ok(row);
            }
            // The caller goes with this server: a deployment nobody took
            // yet is not left for later; one running here is interrupted
            // by the stop, one running elsewhere ends there, recorded.
            if self.shutdown.is_cancelled() && !stopped {
                stopped = true;
                if row.status == Status::Queued {
                    self.ask_cancel(id, "cancelled: the server that accepted it stopped")
                        .await?;
                }
            } else {
                let until = deadline
                    .unwrap_or_else(|| tokio::time::Instant::now() + QUEUE_POLL)
                    .min(tokio::time::Instant::now() + QUEUE_POLL);
                tokio::select! {
                    _ = self.shutdown.cancelled(), if !stopped => {}
                    _ = tokio::time::sleep_until(until) => {}
                    _ = heard_of(ended, id) => {}
                }
            }
            row = self
                .db
                .deployment(id)
                .await?
                .ok_or(db::Error::NotRunning(id))?;
        }
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
    async fn start(self: &Arc<Self>, request: Request<'_>) -> Result<Deployment, StartError> {
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
        // With room here and nobody waiting, this server takes it at once;
        // otherwise it waits in the queue for whichever server has room.
        let permit = self.room.clone().try_acquire_owned().ok();
        let verified = permit.as_ref().and(self.fetcher.verified(&model));
        let claim = permit.as_ref().map(|_| Claim {
            server_id: self.server_id.clone(),
            lease_until: db::now_ms() + db::millis(self.queue.lease),
            // An unchanged model needs no fetch: the row says deploying
            // from its insert, so a kill reads "interrupted while
            // deploying" as it would once the deployer started.
            phase: match verified {
                Some(_) => Phase::Deploying,
                None => Phase::Fetching,
            },
            out_dir: self.out_dir(),
        });
        let deployment = self
            .db
            .insert_deployment(
                NewDeployment {
                    model_id,
                    deployer,
                    options_json,
                    dir: &dir.display().to_string(),
                    plugin_sha256: &plugin.sha256,
                    created_by,
                },
                claim,
            )
            .await?;
        match permit {
            Some(permit) if deployment.status == Status::Running => {
                let started = self.make_live(deployment.clone(), model, verified, plugin);
                self.launch(started, permit, tracing::Span::current());
            }
            _ => {
                self.events.publish(Event::DeploymentQueued {
                    deploy_id: deployment.id,
                    model_id,
                    deployer: deployment.deployer.clone(),
                });
                self.spans
                    .lock()
                    .expect("spans lock")
                    .insert(deployment.id, (Instant::now(), tracing::Span::current()));
                self.wake(Topic::Queue, deployment.id).await;
            }
        }
        Ok(deployment)
    }

    /// Where this server's deployment `id` writes.
    fn out_dir(&self) -> Box<dyn Fn(i64) -> String + Send> {
        let out_root = self.out_root.clone();
        Box::new(move |id| out_root.join(id.to_string()).display().to_string())
    }

    /// Makes a deployment this server took live here: cancellable, its
    /// progress and log kept, a verified model's files counted as fetched.
    fn make_live(
        &self,
        deployment: Deployment,
        model: TrainedModel,
        verified: Option<PathBuf>,
        plugin: Arc<Plugin>,
    ) -> Started {
        let running = Arc::new(Running::new(
            deployment.id,
            &deployment.deployer,
            self.shutdown.child_token(),
        ));
        if verified.is_some() {
            let bytes = model.files.iter().map(|f| f.size_bytes).sum();
            let files = model.files.len();
            fetch::Observer::fetched(&*running, bytes, bytes, files, files);
            running.set_phase(Phase::Deploying);
        }
        self.live.insert(running.clone());
        Started {
            deployment,
            model,
            verified,
            plugin,
            running,
        }
    }

    /// Runs a deployment this server took, in a task of its own holding
    /// `permit` (one of `--max-running`) until its end is recorded.
    fn launch(
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

    /// Tells every server (this one included) that `topic` changed for
    /// deployment `id`. A wake-up that cannot be sent is only a delay:
    /// everyone also looks on a tick.
    async fn wake(&self, topic: Topic, id: i64) {
        if let Err(e) = self.db.notify(topic, &id.to_string()).await {
            tracing::warn!(deploy_id = id, "could not wake the other servers: {e}");
        }
    }

    /// Takes queued deployments while this server has room, until it
    /// stops: up to `CLAIM_BATCH` in one transaction, each run in a task
    /// of its own holding one of `--max-running` permits.
    pub async fn serve_queue(self: Arc<Self>) {
        let mut queued = self.db.wakeups(Topic::Queue);
        loop {
            let first = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return,
                permit = self.room.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
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
    /// `limit`) and makes them live here.
    async fn claim(&self, limit: usize) -> Result<Vec<Started>, db::Error> {
        let plugins = self.deployers.runnable();
        let runnable = Runnable(plugins.keys().cloned().collect());
        let lease_until = db::now_ms() + db::millis(self.queue.lease);
        let claimed = self
            .db
            .claim(
                &self.server_id,
                &runnable,
                lease_until,
                self.out_dir(),
                limit,
            )
            .await?;
        let mut started = Vec::with_capacity(claimed.len());
        let mut models: HashMap<i64, Option<TrainedModel>> = HashMap::new();
        for deployment in claimed {
            let key = Runnable::key(
                &deployment.deployer,
                deployment.plugin_sha256.as_deref().unwrap_or_default(),
            );
            let plugin = plugins
                .get(&key)
                .cloned()
                .expect("a deployment is claimed by the key of a plugin of this set");
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
            let verified = self.fetcher.verified(&model);
            started.push(self.make_live(deployment, model, verified, plugin));
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

    /// Keeps this server's leases, hears cancels asked on other servers,
    /// and ends what nobody will finish: deployments whose owner's lease
    /// ran out, and queued ones no live server can run. Runs until the
    /// server stops.
    pub async fn keep_leases(self: Arc<Self>) {
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
                        tracing::warn!("could not renew this server's leases: {e}");
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
                }
            }
        }
        // Stopping: the deployments interrupted here still record their
        // ends, under leases kept until they have.
        while !self.live.all().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if tick.tick().now_or_never().is_some()
                && let Err(e) = self.beat().await
            {
                tracing::warn!("could not renew this server's leases while stopping: {e}");
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
    async fn beat(&self) -> Result<(), db::Error> {
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
        let mut kept = std::collections::HashSet::new();
        for (id, cancel) in owned {
            kept.insert(id);
            if let (Some(reason), Some(running)) = (cancel, self.live.get(id)) {
                running.cancel(&reason);
            }
        }
        for running in live {
            if !kept.contains(&running.deploy_id) && !running.is_finished() {
                running.cancel(
                    "cancelled: this server lost its claim on the deployment (its lease ran out and another server ended it, or its record was deleted)",
                );
            }
        }
        Ok(())
    }

    /// Fails the deployments of servers that stopped renewing their
    /// leases, and queued ones no live server can run.
    async fn sweep(&self) -> Result<(), db::Error> {
        let now_ms = db::now_ms();
        let mut ended = self.db.fail_expired(now_ms, lost).await?;
        let waited = self.queue.queue_timeout;
        let queued_before =
            humantime::format_rfc3339_millis(SystemTime::now() - waited).to_string();
        // Alive: renewed within the last three beats.
        let alive_since = now_ms - db::millis(self.queue.lease);
        ended.extend(
            self.db
                .fail_unrunnable(queued_before, alive_since, move |deployer, sha| {
                    unrunnable(deployer, sha, waited)
                })
                .await?,
        );
        for row in ended {
            tracing::warn!(deploy_id = row.id, "{}", row.error.as_deref().unwrap_or(""));
            self.publish_end(&row);
            self.wake(Topic::Ended, row.id).await;
        }
        Ok(())
    }

    /// Publishes how a deployment ended, from its stored row.
    fn publish_end(&self, row: &Deployment) {
        let (deploy_id, model_id, deployer) = (row.id, row.model_id, row.deployer.clone());
        // None for a deployment that never ran here: ended by a sweep or
        // a cancel while queued.
        let duration_ms = row.duration_ms.unwrap_or(0);
        self.events.publish(match (&row.reference, &row.error) {
            (Some(reference), _) if row.status == Status::Completed => Event::DeploymentCompleted {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                reference: reference.clone(),
            },
            (_, error) => Event::DeploymentFailed {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                error: error.clone().unwrap_or_default(),
            },
        });
    }

    /// Cancels a deployment, whichever server runs it: a queued one ends
    /// at once; a running one is stopped by its owner, and the answer is
    /// its row once it ended (or, after `CANCEL_WAIT`, still running: the
    /// cancel is recorded and will be carried out).
    pub async fn cancel(&self, deploy_id: i64) -> Result<Deployment, CancelError> {
        let mut ended = self.db.wakeups(Topic::Ended);
        match self.ask_cancel(deploy_id, "cancelled").await? {
            CancelAsked::Unknown => Err(CancelError::Unknown(deploy_id)),
            CancelAsked::Ended(status) => Err(CancelError::Ended {
                id: deploy_id,
                status: status.as_str(),
            }),
            CancelAsked::Dequeued(row) => Ok(*row),
            CancelAsked::Running { .. } => {
                let row = self
                    .db
                    .deployment(deploy_id)
                    .await?
                    .ok_or(CancelError::Unknown(deploy_id))?;
                Ok(self.wait_ended(row, &mut ended, Some(CANCEL_WAIT)).await?)
            }
        }
    }

    /// Records a cancel and makes it reach the deployment: ended here if
    /// it was queued, stopped here if it runs here, else its owner is
    /// woken.
    async fn ask_cancel(&self, deploy_id: i64, reason: &str) -> Result<CancelAsked, db::Error> {
        let asked = self
            .db
            .request_cancel(deploy_id, reason, &format!("{reason} (before it started)"))
            .await?;
        match &asked {
            CancelAsked::Dequeued(row) => {
                self.publish_end(row);
                self.wake(Topic::Ended, deploy_id).await;
            }
            CancelAsked::Running { .. } => match self.live.get(deploy_id) {
                Some(running) => running.cancel(reason),
                None => self.wake(Topic::Cancel, deploy_id).await,
            },
            CancelAsked::Unknown | CancelAsked::Ended(_) => {}
        }
        Ok(asked)
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
        metrics::deployment_started();
        self.events.publish(Event::DeploymentStarted {
            deploy_id: deployment.id,
            model_id: deployment.model_id,
            deployer: deployment.deployer.clone(),
        });
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
        };
        let stored = self.record_end(deployment.id, &ending).await;
        self.live.remove(deployment.id);
        metrics::deployment_ended(&deployment.deployer, &outcome, took);
        running.finish();
        let stored = stored?;
        self.publish_end(&stored);
        self.wake(Topic::Ended, stored.id).await;
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

/// Resolves when `ended` tells of deployment `id`, or of something this
/// server may have missed (an empty payload, wake-ups it fell behind on).
async fn heard_of(ended: &mut tokio::sync::broadcast::Receiver<String>, id: i64) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match ended.recv().await {
            Ok(payload) if !payload.is_empty() && payload.parse::<i64>() != Ok(id) => {}
            Err(RecvError::Closed) => std::future::pending().await,
            _ => return,
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
