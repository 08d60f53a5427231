//! Admission, steps 1–3 of a deployment: the model exists, the volume has
//! its reserve, the deployer is loaded and takes the options, and is not
//! refused the model's known pickle files (`pickles`); then the row
//! is recorded, taken here at once if this server has room, else queued
//! for whichever server has. An attached caller then waits for the end,
//! and a caller that leaves cancels its deployment. Nothing is recorded
//! unless every check passes; never runs a deployment itself (`run` does).

use std::path::PathBuf;
use std::sync::Arc;

use crate::db::{self, Claim, NewDeployment, Topic};
use crate::events::Event;
use crate::fetch;
use crate::live::Running;
use crate::model::{Deployment, Phase, Status, TrainedModel};
use crate::runtime::Plugin;

use super::sentences::CLIENT_LEFT;
use super::{Pipeline, Started};

/// The most files a model may have for its verification record to be
/// checked on an async thread (a `stat` each, and a read of the record).
const LOOKED_AT_HERE: usize = 16;

/// Options larger than this are refused before anything else happens.
pub const MAX_OPTIONS_BYTES: usize = 64 * 1024;

/// What to deploy, and how.
pub struct Request<'a> {
    pub model_id: i64,
    pub deployer: &'a str,
    /// A JSON object, at most `MAX_OPTIONS_BYTES`.
    pub options_json: &'a str,
    /// The name of the API token that asked (none without tokens).
    pub created_by: Option<&'a str>,
}

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
    /// `--pickle refuse`, for a model whose pickle files an earlier fetch
    /// found, and a deployer that does not accept them.
    #[error("{0}")]
    Pickles(String),
    /// `--model-signatures require`, and the model is not signed so.
    #[error("{0}")]
    Unsigned(String),
    #[error("the deployment could not be recorded: {0}")]
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
            if let Err(e) = pipeline.ask_cancel(id, CLIENT_LEFT).await {
                tracing::warn!(
                    deploy_id = id,
                    "could not cancel the deployment of a client that left: {e}"
                );
            }
        });
    }
}

impl Pipeline {
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
        let recorded = self.admit(request).await?;
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
        self.admit(request).await
    }

    /// Steps 1–3: nothing is recorded unless all checks pass.
    async fn admit(self: &Arc<Self>, request: Request<'_>) -> Result<Deployment, StartError> {
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
        self.model_trust
            .allows(&model)
            .map_err(StartError::Unsigned)?;
        self.check_reserve()?;
        let (plugin, options_json) = self.checked_step(deployer, options_json).await?;
        let options_json = options_json.as_str();
        let pickles = super::pickles::pickle_paths(&model.files, None);
        if let Some(why) = super::pickles::refusal(self.pickles, &model, &plugin, &pickles) {
            return Err(StartError::Pickles(why));
        }

        let dir = self.fetcher.dir_of(&model.job_id);
        // With room here and nobody waiting, this server takes it at once;
        // otherwise it waits in the queue for whichever server has room.
        let permit = self.room.clone().try_acquire_owned().ok();
        // A queued one is looked at when it is claimed, not now too.
        let (model, verified) = match &permit {
            Some(_) => self.verified(model).await,
            None => (model, None),
        };
        let leased_at = std::time::Instant::now();
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
                Some(self.events.report(|row| {
                    vec![match row.status {
                        Status::Running => super::started(row),
                        _ => Event::DeploymentQueued {
                            deploy_id: row.id,
                            model_id: row.model_id,
                            deployer: row.deployer.clone(),
                            cause: row.cause.clone(),
                        },
                    }]
                })),
            )
            .await?;
        match permit {
            Some(permit) if deployment.status == Status::Running => {
                let started =
                    self.make_live(deployment.clone(), model, verified, plugin, leased_at);
                self.launch(started, permit, tracing::Span::current());
            }
            _ => {
                self.queued_here(deployment.id);
                self.wake(Topic::Queue, deployment.id).await;
            }
        }
        Ok(deployment)
    }

    /// The served deployer `deployer`, if it takes `options_json`; and
    /// the options as recorded (a deployer granted one target may be asked
    /// without naming it). The one gate of options, whoever asks (the API,
    /// a rule's firing): a JSON object of at most `MAX_OPTIONS_BYTES`,
    /// that the deployer's `check-options` takes.
    pub(crate) async fn checked_step(
        &self,
        deployer: &str,
        options_json: &str,
    ) -> Result<(Arc<Plugin>, String), StartError> {
        if options_json.len() > MAX_OPTIONS_BYTES {
            return Err(StartError::BadOptions(format!(
                "options are {} bytes; at most {} KiB are accepted",
                options_json.len(),
                MAX_OPTIONS_BYTES / 1024
            )));
        }
        if !serde_json::from_str::<serde_json::Value>(options_json).is_ok_and(|v| v.is_object()) {
            return Err(StartError::BadOptions(
                "options must be a JSON object".into(),
            ));
        }
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
        let options_json = crate::runtime::default_target(&plugin, options_json)
            .unwrap_or_else(|| options_json.to_string());
        self.deployers
            .runtime()
            .check_options(&plugin, &options_json)
            .await
            .map_err(|e| {
                StartError::BadOptions(format!("deployer {deployer} refused the options: {e}"))
            })?;
        Ok((plugin, options_json))
    }

    pub(super) fn check_reserve(&self) -> Result<(), StartError> {
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

    /// The model's directory, if its verification record vouches for
    /// every file as it is now (`Fetcher::verified`). That reads the record
    /// and the metadata of each file: for a large model off the async
    /// threads; a small one is looked at here, where the hand-off to a
    /// blocking thread and back would cost more than the few `stat`s.
    pub(super) async fn verified(&self, model: TrainedModel) -> (TrainedModel, Option<PathBuf>) {
        if model.files.len() <= LOOKED_AT_HERE {
            let verified = self.fetcher.verified(&model);
            return (model, verified);
        }
        let fetcher = self.fetcher.clone();
        tokio::task::spawn_blocking(move || {
            let verified = fetcher.verified(&model);
            (model, verified)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// Where this server's deployment `id` writes.
    pub(super) fn out_dir(&self) -> Box<dyn Fn(i64) -> String + Send> {
        let out_root = self.out_root.clone();
        Box::new(move |id| out_root.join(id.to_string()).display().to_string())
    }

    /// Makes a deployment this server took live here: cancellable, its
    /// progress and log kept, a verified model's files counted as fetched,
    /// its lease counted from `leased_at` (before its `lease_until` was).
    pub(super) fn make_live(
        &self,
        deployment: Deployment,
        model: TrainedModel,
        verified: Option<PathBuf>,
        plugin: Arc<Plugin>,
        leased_at: std::time::Instant,
    ) -> Started {
        let running = Arc::new(
            Running::new(
                deployment.id,
                &deployment.deployer,
                self.shutdown.child_token(),
            )
            .leased_from(leased_at),
        );
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
}
