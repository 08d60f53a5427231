//! The one place that knows the whole order of a deployment: look up the
//! model, find the deployer and check the options, record the deployment,
//! fetch and verify, run the deployer in its sandbox, record the outcome,
//! publish the event. Every step is owned by its own module; this folder
//! only sequences them and turns their errors into the deployment's error
//! text. The order, by file: `admit` (the one gate: checks, records,
//! takes it here or queues it), `queue` (takes queued ones while there is
//! room), `run` (carries out one taken here and records its end),
//! `cancel`, `leases` and `fence` (keep rows true across servers and
//! restarts, and stop what runs here before its lease runs out),
//! `approvals` (an admin's decisions and their expiry), `caused` (a rule's
//! firing), `copies` (a model's local copy, dropped only when nothing
//! pins it), `sentences` (the words for a deployment that did not end by
//! itself). Never reads a request or writes SQL; never stops the
//! server: it is handed the server's stop token.

mod admit;
mod approvals;
mod cancel;
mod caused;
pub mod copies;
mod fence;
mod leases;
mod pickles;
mod queue;
mod run;
mod sentences;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::db::{self, Db, Topic};
use crate::deployers::Deployers;
use crate::events::{Event, Events};
use crate::fetch::Fetcher;
use crate::live::{Live, Running};
use crate::loops::Loops;
use crate::model::{Deployment, Published, Status, TrainedModel};
use crate::model_trust::ModelTrust;
use crate::runtime::Plugin;

pub use admit::{MAX_OPTIONS_BYTES, Request, RunError, StartError};
pub use approvals::DecideError;
pub use cancel::CancelError;
pub use caused::{Fired, Firing};
pub use pickles::PicklePolicy;
pub use queue::QueueSettings;

use queue::QUEUE_POLL;
use sentences::ACCEPTOR_STOPPED;

/// Runs deployments: the only owner of their order, of the tasks that carry
/// them out and of their cancellation.
pub struct Pipeline {
    db: Db,
    events: Events,
    deployers: Arc<Deployers>,
    fetcher: Arc<Fetcher>,
    /// Identifies this server process's rows among replicas.
    server_id: String,
    /// How people know this server: its host and address.
    server_name: String,
    queue: QueueSettings,
    /// One permit per deployment this server may run at once.
    room: Arc<tokio::sync::Semaphore>,
    /// Deployment out-dirs live under here, one per deployment id.
    out_root: PathBuf,
    /// The server's stop: every running deployment is interrupted and
    /// recorded as failed, the workers end.
    shutdown: CancellationToken,
    /// Every deployment task, so a stop can wait for their rows.
    tasks: TaskTracker,
    live: Live,
    /// The request span of each deployment queued here and not claimed
    /// yet: a deployment claimed here logs under its request's id.
    spans: std::sync::Mutex<HashMap<i64, (Instant, tracing::Span)>>,
    /// Bytes of the data volume new deployments leave free.
    reserve: u64,
    /// When this server last renewed its leases: its fence.
    renewals: fence::Renewals,
    /// What a deployment of pickle files does (`--pickle`).
    pickles: PicklePolicy,
    /// Whom models must be signed by, and whether that is required.
    model_trust: Arc<ModelTrust>,
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

impl Pipeline {
    /// A pipeline whose work stops when `shutdown` is cancelled.
    pub fn new(
        db: Db,
        events: Events,
        deployers: Arc<Deployers>,
        fetcher: Fetcher,
        server_id: String,
        out_root: PathBuf,
        shutdown: CancellationToken,
    ) -> Self {
        let queue = QueueSettings::default();
        Self {
            db,
            events,
            deployers,
            fetcher: Arc::new(fetcher),
            server_name: server_id.clone(),
            server_id,
            queue,
            room: Arc::new(tokio::sync::Semaphore::new(queue.max_running)),
            out_root,
            shutdown,
            tasks: TaskTracker::new(),
            live: Live::default(),
            spans: Default::default(),
            reserve: 0,
            renewals: fence::Renewals::new(),
            pickles: PicklePolicy::default(),
            model_trust: Arc::default(),
        }
    }

    /// What a deployment of a model holding pickle files does.
    pub fn pickles(mut self, policy: PicklePolicy) -> Self {
        self.pickles = policy;
        self
    }

    /// Whom models must be signed by (`--model-signatures`,
    /// `--model-signer`): registrations verify against it, and the gate
    /// asks it.
    pub fn model_trust(mut self, trust: ModelTrust) -> Self {
        self.model_trust = Arc::new(trust);
        self
    }

    pub fn trust_in_models(&self) -> &ModelTrust {
        &self.model_trust
    }

    /// How this server shares the queue, and the name other servers'
    /// records give it.
    pub fn queue(mut self, settings: QueueSettings, server_name: String) -> Self {
        self.room = Arc::new(tokio::sync::Semaphore::new(settings.max_running.max(1)));
        self.queue = settings;
        self.server_name = server_name;
        self
    }

    /// Refuses new deployments while the volume of the out-dirs (the data
    /// dir's) has less than `bytes` free, so that every deployment started
    /// can still record its end.
    pub fn reserve(mut self, bytes: u64) -> Self {
        self.reserve = bytes;
        self
    }

    /// Starts serving the queue: claiming deployments while there is
    /// room, keeping leases, hearing cancels, ending what nobody will
    /// finish, stopping what runs here when the leases cannot be renewed.
    /// The tasks end when the server stops; `loops` supervises them. A
    /// fence that ends before then leaves nothing to stop a deployment
    /// past its lease: what runs here is stopped, and nothing more runs
    /// (fail closed).
    pub fn start_workers(self: &Arc<Self>, loops: &Loops) {
        loops.spawn("queue worker", self.clone().serve_queue().in_current_span());
        loops.spawn("lease keeper", self.clone().keep_leases().in_current_span());
        let pipeline = self.clone();
        loops.spawn_then(
            "fence",
            self.clone().fence().in_current_span(),
            move |how| pipeline.unguarded(how),
        );
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

    /// Whether the plugins folder's first load has ended: until then a
    /// deployer a rule names may just not be here yet.
    pub fn deployers_loaded(&self) -> bool {
        self.deployers.still_loading().is_empty()
    }

    /// The deployer's log lines: live while running here, stored after.
    pub async fn logs(&self, deploy_id: i64) -> Result<Option<String>, db::Error> {
        match self.live.get(deploy_id) {
            Some(running) => Ok(Some(running.logs())),
            None => self.db.deployment_logs(deploy_id).await,
        }
    }

    /// Reads a deployment, from `row` as last read, until it ended (woken
    /// by `ended`, or on a tick), at most for `limit`; returns the last
    /// row read. A server that stops meanwhile cancels it if nobody took
    /// it yet, since the caller goes too; a database that cannot be
    /// reached meanwhile is waited for.
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
                    self.ask_cancel(id, ACCEPTOR_STOPPED).await?;
                }
            } else {
                let until = deadline
                    .unwrap_or_else(|| tokio::time::Instant::now() + QUEUE_POLL)
                    .min(tokio::time::Instant::now() + QUEUE_POLL);
                // One running here hands over the row it recorded, or
                // says it was ended elsewhere: its wake-up is not awaited,
                // since it may come before the hand-over.
                let here = self.live.get(id);
                let ended_here = async {
                    match &here {
                        Some(running) => running.finished().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = self.shutdown.cancelled(), if !stopped => {}
                    _ = tokio::time::sleep_until(until) => {}
                    _ = heard_of(ended, id), if here.is_none() => {}
                    _ = ended_here => {}
                }
                if let Some(recorded) = here.as_ref().and_then(|r| r.ended()) {
                    row = recorded.clone();
                    continue;
                }
            }
            // An unreachable database is waited out, not answered: the
            // deployment goes on (or is ended by the lease rules) and the
            // caller still wants its end.
            match self.db.deployment(id).await {
                Ok(read) => row = read.ok_or(db::Error::NotRunning(id))?,
                Err(e) if e.is_unreachable() => {
                    tracing::debug!(deploy_id = id, "waiting for a deployment's end: {e}");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Tells every server (this one included) that `topic` changed for
    /// deployment `id`. A wake-up that cannot be sent is only a delay:
    /// everyone also looks on a tick.
    async fn wake(&self, topic: Topic, id: i64) {
        if let Err(e) = self.db.notify(topic, &id.to_string()).await {
            tracing::warn!(deploy_id = id, "could not wake the other servers: {e}");
        }
    }

    /// How a write that ends deployments stores the end of each in its
    /// own transaction, waking their waiters at the commit.
    fn ended_report(&self) -> db::events::Report {
        self.events
            .report(|row| vec![ended(row)])
            .waking(Topic::Ended)
    }
}

/// That deployment `row` started, on the server it names.
fn started(row: &Deployment) -> Event {
    Event::DeploymentStarted {
        deploy_id: row.id,
        model_id: row.model_id,
        deployer: row.deployer.clone(),
        cause: row.cause.clone(),
    }
}

/// How deployment `row` ended, from its stored row.
fn ended(row: &Deployment) -> Event {
    let (deploy_id, model_id, deployer) = (row.id, row.model_id, row.deployer.clone());
    // None for a deployment that never ran here: ended by a sweep,
    // a restart or a cancel while queued.
    let duration_ms = row.duration_ms.unwrap_or(0);
    match (&row.reference, &row.error) {
        (Some(reference), _) if row.status == Status::Completed => Event::DeploymentCompleted {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            reference: reference.clone(),
            published: Published::of(&row.published),
            cause: row.cause.clone(),
        },
        (_, error) => Event::DeploymentFailed {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            error: error.clone().unwrap_or_default(),
            published: Published::of(&row.published),
            cause: row.cause.clone(),
        },
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
