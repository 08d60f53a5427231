//! The one place that knows the whole order of a deployment: look up the
//! model, find the deployer and check the options, record the deployment,
//! fetch and verify, run the deployer in its sandbox, record the outcome,
//! publish the event. Every step is owned by its own module; this file only
//! sequences them and turns their errors into the deployment's error text.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::db::{self, Db, NewDeployment};
use crate::events::{Event, Events};
use crate::fetch::{self, Fetcher};
use crate::model::{Deployment, Outcome, TrainedModel};
use crate::runtime::{CallError, DeployCall, LogReporter, Plugin, PluginSet, Runtime};

/// Options larger than this are refused before anything else happens.
pub const MAX_OPTIONS_BYTES: usize = 64 * 1024;

/// Why a deployment could not start. Nothing was recorded.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("model {0} does not exist")]
    UnknownModel(i64),
    #[error("no deployers are loaded: put a deployer's .wasm file into the plugins folder ({0})")]
    NoDeployers(String),
    #[error("unknown deployer {name:?}; the loaded deployers are: {}", .known.join(", "))]
    UnknownDeployer { name: String, known: Vec<String> },
    #[error("{0}")]
    BadOptions(String),
    #[error("the deployment could not be recorded: {0}")]
    Record(#[from] db::Error),
}

/// Everything a deployment needs, shared by the HTTP handlers.
pub struct Pipeline {
    pub db: Db,
    pub fetcher: Fetcher,
    pub runtime: Arc<Runtime>,
    plugins: RwLock<Arc<PluginSet>>,
    pub plugins_dir: PathBuf,
    pub events: Events,
    /// Identifies this server process's rows among replicas.
    pub server_id: String,
    /// Deployment out-dirs live under here, one per deployment id.
    pub out_root: PathBuf,
    /// Cancelled when the server stops: every running deployment is
    /// interrupted and recorded as failed.
    pub shutdown: CancellationToken,
}

/// A recorded, running deployment, ready to be carried out.
pub struct Started {
    pub deployment: Deployment,
    model: TrainedModel,
    plugin: Arc<Plugin>,
}

impl Pipeline {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: Db,
        fetcher: Fetcher,
        runtime: Arc<Runtime>,
        plugins: PluginSet,
        plugins_dir: PathBuf,
        events: Events,
        server_id: String,
        out_root: PathBuf,
    ) -> Self {
        Self {
            db,
            fetcher,
            runtime,
            plugins: RwLock::new(Arc::new(plugins)),
            plugins_dir,
            events,
            server_id,
            out_root,
            shutdown: CancellationToken::new(),
        }
    }

    /// The deployers as they are now; a running deployment keeps the
    /// version it started with.
    pub fn plugins(&self) -> Arc<PluginSet> {
        self.plugins.read().expect("plugin set lock").clone()
    }

    /// Steps 1–3: nothing is recorded unless all checks pass.
    pub async fn start(&self, model_id: i64, deployer: &str, options_json: &str) -> Result<Started, StartError> {
        let model = self.db.model(model_id).await?.ok_or(StartError::UnknownModel(model_id))?;
        let plugins = self.plugins();
        if plugins.deployers.is_empty() {
            return Err(StartError::NoDeployers(self.plugins_dir.display().to_string()));
        }
        let plugin = plugins.deployers.get(deployer).cloned().ok_or_else(|| StartError::UnknownDeployer {
            name: deployer.to_string(),
            known: plugins.deployers.keys().cloned().collect(),
        })?;
        self.runtime
            .check_options(&plugin, options_json)
            .await
            .map_err(|e| StartError::BadOptions(format!("deployer {deployer} refused the options: {e}")))?;

        let dir = self.fetcher.dir_of(&model.job_id);
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
                },
                &move |id| out_root.join(id.to_string()).display().to_string(),
            )
            .await?;
        self.events.publish(Event::DeploymentStarted {
            deploy_id: deployment.id,
            model_id,
            deployer: deployer.to_string(),
        });
        Ok(Started { deployment, model, plugin })
    }

    /// Steps 4–7. Always ends the recorded deployment, whatever happens; the
    /// returned row is the stored one.
    pub async fn run(&self, started: Started, cancel: CancellationToken) -> Result<Deployment, db::Error> {
        let Started { deployment, model, plugin } = started;
        let clock = Instant::now();
        let cancel = {
            // Either the caller or a server stop cancels.
            let both = self.shutdown.child_token();
            let linked = both.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => linked.cancel(),
                    _ = linked.cancelled() => {}
                }
            });
            both
        };
        let outcome = match self.carry_out(&deployment, &model, &plugin, &cancel).await {
            Ok(outcome) => outcome,
            Err(error) => Outcome::Failed { error },
        };
        let duration_ms = i64::try_from(clock.elapsed().as_millis()).unwrap_or(i64::MAX);
        let stored = self.db.finish_deployment(deployment.id, &outcome, duration_ms).await?;
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

    async fn carry_out(
        &self,
        deployment: &Deployment,
        model: &TrainedModel,
        plugin: &Plugin,
        cancel: &CancellationToken,
    ) -> Result<Outcome, String> {
        let model_dir = self
            .fetcher
            .fetch(model, Arc::new(fetch::Quiet), cancel)
            .await
            .map_err(|e| match e {
                fetch::Error::Cancelled => self.cancelled(),
                e => format!("fetching model {}: {e}", model.id),
            })?;
        let out_dir = PathBuf::from(&deployment.out_dir);
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| format!("cannot create the output directory {}: {e}", out_dir.display()))?;
        let call = DeployCall {
            deploy_id: deployment.id,
            model,
            model_dir: &model_dir,
            out_dir: &out_dir,
            options_json: &deployment.options_json,
        };
        let reporter = Arc::new(LogReporter {
            plugin: plugin.name.clone(),
            deploy_id: Some(deployment.id),
        });
        match self.runtime.deploy(plugin, call, reporter, cancel).await {
            Ok(deployed) => Ok(Outcome::Completed {
                reference: deployed.reference,
                details_json: serde_json::Value::Object(deployed.details).to_string(),
            }),
            Err(CallError::Cancelled) => Err(self.cancelled()),
            Err(e) => Err(format!("deployer {}: {e}", plugin.name)),
        }
    }
}

impl Pipeline {
    fn cancelled(&self) -> String {
        if self.shutdown.is_cancelled() {
            "interrupted: the server stopped before it finished".to_string()
        } else {
            "cancelled: the client disconnected or the deployment was cancelled".to_string()
        }
    }
}
