//! The vocabulary of what happened: one closed `enum Event`, its kind's
//! one name (`EventKind`, what the log, the wire and rules say), and the
//! line each event writes in the server's log.

use crate::model::{Cause, Phase, Progress, Published};

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Stored in the transaction that records the model: what rules
    /// `when = "model.registered"` fire from.
    ModelRegistered {
        model_id: i64,
        name: String,
        job_id: String,
        /// Who signed it, when its signature was verified.
        signed_by: Option<String>,
        /// Who registered it: a token's name, or what registered it by
        /// itself (`MLflow webhook`, `MLflow catch-up`); none on a server
        /// without tokens.
        by: Option<String>,
    },
    /// Recorded by rule `rule`, held until an admin approves it.
    DeploymentAwaitingApproval {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
        rule: String,
    },
    /// Approved by `by` (none on a server without tokens): queued next.
    DeploymentApproved {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
        by: Option<String>,
        /// The rule and firing that recorded it, if a rule did.
        cause: Option<Cause>,
    },
    /// Recorded, waiting for a server with room.
    DeploymentQueued {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
        /// The rule and firing that recorded it, if a rule did.
        cause: Option<Cause>,
    },
    /// Claimed by a server, which runs it.
    DeploymentStarted {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
        /// The rule and firing that recorded it, if a rule did.
        cause: Option<Cause>,
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
        /// What it put into publishing targets, in all (the deployment
        /// lists each put: an event stays small however many there were).
        published: Published,
        /// The rule and firing that recorded it, if a rule did.
        cause: Option<Cause>,
    },
    DeploymentFailed {
        deploy_id: i64,
        model_id: i64,
        deployer: String,
        duration_ms: i64,
        error: String,
        /// What it did put before it failed, in all.
        published: Published,
        /// The rule and firing that recorded it, if a rule did.
        cause: Option<Cause>,
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
    /// Rule `rule` matched the event `event_id` but made no deployment.
    RuleFailed {
        rule: String,
        event_id: i64,
        model_id: i64,
        error: String,
    },
}

/// The one vocabulary of events: each kind's name as the log stores it,
/// SSE's `event:` and the webhook's header name it, and rules' `when`
/// takes it (`model.registered`, `deployment.completed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    ModelRegistered,
    DeploymentAwaitingApproval,
    DeploymentApproved,
    RuleFailed,
    DeploymentQueued,
    DeploymentStarted,
    DeploymentProgress,
    DeploymentCompleted,
    DeploymentFailed,
    PluginLoaded,
    PluginRejected,
    PluginRemoved,
}

impl EventKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [EventKind; 12] = [
        EventKind::ModelRegistered,
        EventKind::DeploymentAwaitingApproval,
        EventKind::DeploymentApproved,
        EventKind::RuleFailed,
        EventKind::DeploymentQueued,
        EventKind::DeploymentStarted,
        EventKind::DeploymentProgress,
        EventKind::DeploymentCompleted,
        EventKind::DeploymentFailed,
        EventKind::PluginLoaded,
        EventKind::PluginRejected,
        EventKind::PluginRemoved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::ModelRegistered => "model.registered",
            EventKind::DeploymentAwaitingApproval => "deployment.awaiting_approval",
            EventKind::DeploymentApproved => "deployment.approved",
            EventKind::RuleFailed => "rule.failed",
            EventKind::DeploymentQueued => "deployment.queued",
            EventKind::DeploymentStarted => "deployment.started",
            EventKind::DeploymentProgress => "deployment.progress",
            EventKind::DeploymentCompleted => "deployment.completed",
            EventKind::DeploymentFailed => "deployment.failed",
            EventKind::PluginLoaded => "plugin.loaded",
            EventKind::PluginRejected => "plugin.rejected",
            EventKind::PluginRemoved => "plugin.removed",
        }
    }

    /// The kind named `name`; also the underscore spelling rules took
    /// before (`model_registered`), kept as an alias.
    pub fn parse(name: &str) -> Option<Self> {
        let dotted = name.replacen('_', ".", 1);
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name || kind.as_str() == dotted)
    }
}

impl Event {
    /// The event's kind.
    pub fn event_kind(&self) -> EventKind {
        match self {
            Event::ModelRegistered { .. } => EventKind::ModelRegistered,
            Event::DeploymentAwaitingApproval { .. } => EventKind::DeploymentAwaitingApproval,
            Event::DeploymentApproved { .. } => EventKind::DeploymentApproved,
            Event::RuleFailed { .. } => EventKind::RuleFailed,
            Event::DeploymentQueued { .. } => EventKind::DeploymentQueued,
            Event::DeploymentStarted { .. } => EventKind::DeploymentStarted,
            Event::DeploymentProgress { .. } => EventKind::DeploymentProgress,
            Event::DeploymentCompleted { .. } => EventKind::DeploymentCompleted,
            Event::DeploymentFailed { .. } => EventKind::DeploymentFailed,
            Event::PluginLoaded { .. } => EventKind::PluginLoaded,
            Event::PluginRejected { .. } => EventKind::PluginRejected,
            Event::PluginRemoved { .. } => EventKind::PluginRemoved,
        }
    }

    /// The event's type, as SSE `event:` names it.
    pub fn kind(&self) -> &'static str {
        self.event_kind().as_str()
    }
}

/// The rule that caused a deployment, if one did.
fn rule_of(cause: &Option<Cause>) -> Option<&str> {
    cause.as_ref().map(|c| c.rule.as_str())
}

/// What an event's log line names besides its sentence; a field an event
/// does not have is left out of the line.
#[derive(Default)]
struct Fields<'a> {
    deploy_id: Option<i64>,
    model_id: Option<i64>,
    deployer: Option<&'a str>,
    rule: Option<&'a str>,
    event_id: Option<i64>,
    job_id: Option<&'a str>,
    by: Option<&'a str>,
    duration_ms: Option<i64>,
    reference: Option<&'a str>,
    phase: Option<&'static str>,
    progress: Option<&'a Progress>,
    error: Option<&'a str>,
}

impl Event {
    /// What the event's log line names.
    fn fields(&self) -> Fields<'_> {
        match self {
            Event::ModelRegistered {
                model_id, job_id, ..
            } => Fields {
                model_id: Some(*model_id),
                job_id: Some(job_id),
                ..Fields::default()
            },
            Event::DeploymentAwaitingApproval {
                deploy_id,
                model_id,
                deployer,
                rule,
            } => Fields {
                deploy_id: Some(*deploy_id),
                model_id: Some(*model_id),
                deployer: Some(deployer),
                rule: Some(rule),
                ..Fields::default()
            },
            Event::DeploymentApproved {
                deploy_id,
                model_id,
                deployer,
                by,
                cause,
            } => Fields {
                deploy_id: Some(*deploy_id),
                model_id: Some(*model_id),
                deployer: Some(deployer),
                by: by.as_deref(),
                rule: rule_of(cause),
                ..Fields::default()
            },
            Event::DeploymentQueued {
                deploy_id,
                model_id,
                deployer,
                cause,
            }
            | Event::DeploymentStarted {
                deploy_id,
                model_id,
                deployer,
                cause,
            } => Fields {
                deploy_id: Some(*deploy_id),
                model_id: Some(*model_id),
                deployer: Some(deployer),
                rule: rule_of(cause),
                ..Fields::default()
            },
            Event::DeploymentProgress {
                deploy_id,
                model_id,
                phase,
                progress,
            } => Fields {
                deploy_id: Some(*deploy_id),
                model_id: Some(*model_id),
                phase: Some(phase.as_str()),
                progress: Some(progress),
                ..Fields::default()
            },
            Event::DeploymentCompleted {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                reference,
                cause,
                ..
            } => Fields {
                deploy_id: Some(*deploy_id),
                model_id: Some(*model_id),
                deployer: Some(deployer),
                duration_ms: Some(*duration_ms),
                reference: Some(reference),
                rule: rule_of(cause),
                ..Fields::default()
            },
            Event::DeploymentFailed {
                deploy_id,
                model_id,
                deployer,
                duration_ms,
                error,
                cause,
                ..
            } => Fields {
                deploy_id: Some(*deploy_id),
                model_id: Some(*model_id),
                deployer: Some(deployer),
                duration_ms: Some(*duration_ms),
                error: Some(error),
                rule: rule_of(cause),
                ..Fields::default()
            },
            Event::RuleFailed {
                rule,
                event_id,
                model_id,
                error,
            } => Fields {
                rule: Some(rule),
                event_id: Some(*event_id),
                model_id: Some(*model_id),
                error: Some(error),
                ..Fields::default()
            },
            Event::PluginLoaded { .. }
            | Event::PluginRejected { .. }
            | Event::PluginRemoved { .. } => Fields::default(),
        }
    }

    /// One line in the server's log: the kind's name as a sentence
    /// (`deployment completed`) and the event's fields.
    pub(super) fn log(&self) {
        let kind = self.event_kind();
        let message = kind.as_str().replace(['.', '_'], " ");
        let f = self.fields();
        macro_rules! line {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    deploy_id = f.deploy_id,
                    model_id = f.model_id,
                    deployer = f.deployer,
                    rule = f.rule,
                    event_id = f.event_id,
                    job_id = f.job_id,
                    by = f.by,
                    duration_ms = f.duration_ms,
                    reference = f.reference,
                    phase = f.phase,
                    progress = f.progress.map(tracing::field::debug),
                    error = f.error,
                    "{message}"
                )
            };
        }
        match kind {
            EventKind::DeploymentFailed | EventKind::RuleFailed => line!(tracing::Level::WARN),
            EventKind::DeploymentProgress => line!(tracing::Level::DEBUG),
            // The plugin loader logs these itself, with more detail.
            EventKind::PluginLoaded | EventKind::PluginRejected | EventKind::PluginRemoved => {}
            _ => line!(tracing::Level::INFO),
        }
    }
}
