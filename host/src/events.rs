//! What happened, for whoever listens: one closed `enum Event`, published
//! after the database write it reports, logged, and fanned out to
//! subscribers (the SSE stream). A slow subscriber loses old events; it
//! never slows a deployment.

use tokio::sync::broadcast;

use crate::model::{Phase, Progress};

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Recorded, waiting for a server with room.
    DeploymentQueued {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
    },
    /// Claimed by a server, which runs it.
    DeploymentStarted {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
    },
    DeploymentProgress {
        deploy_id: i64,
        model_id: i64,
        phase: Phase,
        progress: Progress,
    },
    DeploymentCompleted {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
        duration_ms: i64,
        reference: String,
    },
    DeploymentFailed {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
        duration_ms: i64,
        error: String,
    },
    PluginLoaded {
        name: String,
    },
    PluginRejected {
        file: String,
        reason: String,
    },
    PluginRemoved {
        name: String,
    },
}

impl Event {
    /// The event's type, as SSE `event:` names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::DeploymentQueued { .. } => "deployment.queued",
            Event::DeploymentStarted { .. } => "deployment.started",
            Event::DeploymentProgress { .. } => "deployment.progress",
            Event::DeploymentCompleted { .. } => "deployment.completed",
            Event::DeploymentFailed { .. } => "deployment.failed",
            Event::PluginLoaded { .. } => "plugin.loaded",
            Event::PluginRejected { .. } => "plugin.rejected",
            Event::PluginRemoved { .. } => "plugin.removed",
        }
    }
}

#[derive(Clone)]
pub struct Events {
    sender: broadcast::Sender<Event>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            sender: broadcast::channel(1024).0,
        }
    }
}

impl Events {
    pub fn publish(&self, event: Event) {
        match &event {
            Event::DeploymentQueued {
                deploy_id,
                model_id,
                deployer,
            } => {
                tracing::info!(deploy_id, model_id, deployer, "deployment queued");
            }
            Event::DeploymentStarted {
                deploy_id,
                model_id,
                deployer,
            } => {
                tracing::info!(deploy_id, model_id, deployer, "deployment started");
            }
            Event::DeploymentCompleted {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                reference,
            } => {
                tracing::info!(
                    deploy_id,
                    model_id,
                    deployer,
                    duration_ms,
                    reference,
                    "deployment completed"
                );
            }
            Event::DeploymentFailed {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                error,
            } => {
                tracing::warn!(
                    deploy_id,
                    model_id,
                    deployer,
                    duration_ms,
                    "deployment failed: {error}"
                );
            }
            Event::DeploymentProgress {
                deploy_id,
                phase,
                progress,
                ..
            } => {
                tracing::debug!(
                    deploy_id,
                    phase = phase.as_str(),
                    ?progress,
                    "deployment progress"
                );
            }
            // The plugin loader logs these itself, with more detail.
            Event::PluginLoaded { .. }
            | Event::PluginRejected { .. }
            | Event::PluginRemoved { .. } => {}
        }
        // No subscriber is fine: events are not stored.
        let _ = self.sender.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }
}
