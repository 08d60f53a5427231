//! The events' shapes: the `data` of each kind, as SSE and the webhook
//! carry it, written from an `Event` by `event` and read back by kind by
//! `EventData::read` (the CLI following a deployment); and the stream's
//! query parameters. The kind names are `events`'; the tests here tie
//! `read` to them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::{Cause, Phase, Progress, PublishedProgress};
use crate::events::{Event, EventKind};
use crate::model;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsParams {
    /// Start after this event id: the `id` of the last event received
    /// (0: from the oldest kept). Without it (and without
    /// `Last-Event-ID`), the stream starts now.
    #[param(value_type = Option<i64>, minimum = 0)]
    pub after: Option<String>,
}

/// `deployment.queued` and `deployment.started`.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeploymentStarted {
    /// The rule and the event that fired it, when a rule recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub deploy_id: i64,
    pub deployer: String,
    pub model_id: i64,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeploymentProgress {
    pub deploy_id: i64,
    pub model_id: i64,
    pub phase: Phase,
    pub progress: Progress,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeploymentCompleted {
    /// The rule and the event that fired it, when a rule recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub deploy_id: i64,
    pub deployer: String,
    pub duration_ms: i64,
    pub model_id: i64,
    /// What it put into publishing targets, in all (the deployment lists
    /// each put).
    #[serde(default)]
    pub published: PublishedProgress,
    #[serde(rename = "ref")]
    pub reference: String,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeploymentFailed {
    /// The rule and the event that fired it, when a rule recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub deploy_id: i64,
    pub deployer: String,
    pub duration_ms: i64,
    pub error: String,
    pub model_id: i64,
    /// What it did put before it failed, in all.
    #[serde(default)]
    pub published: PublishedProgress,
}

/// `model.registered`: rules fire from it.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct ModelRegistered {
    /// Who registered it: a token's name, or `MLflow webhook` / `MLflow
    /// catch-up` for a version berth took from an MLflow registry; absent
    /// on a server without tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub job_id: String,
    pub model_id: i64,
    pub name: String,
    /// The signer of its verified signature (`key sha256:HEX`, or a
    /// certificate's subject, names and issuer); absent when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
}

/// `deployment.awaiting_approval`: recorded by `rule`, held for an admin.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeploymentAwaitingApproval {
    pub deploy_id: i64,
    pub deployer: String,
    pub model_id: i64,
    pub rule: String,
}

/// `deployment.approved`: queued next.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct DeploymentApproved {
    /// The admin token's name; null on a server without tokens.
    pub by: Option<String>,
    /// The rule and the event that fired it, when a rule recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub deploy_id: i64,
    pub deployer: String,
    pub model_id: i64,
}

/// `rule.failed`: a rule matched an event but made no deployment.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct RuleFailed {
    pub error: String,
    pub event_id: i64,
    pub model_id: i64,
    pub rule: String,
}

/// `plugin.loaded` and `plugin.removed`.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct PluginNamed {
    pub name: String,
}

/// `plugin.rejected`: the refused file and why (`GET /v1/deployers` lists
/// it with more, as a `Rejected`).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct PluginRejected {
    pub file: String,
    pub reason: String,
}

/// An event's `data`, one variant per kind.
#[derive(Serialize)]
#[serde(untagged)]
pub enum EventData {
    ModelRegistered(ModelRegistered),
    DeploymentAwaitingApproval(DeploymentAwaitingApproval),
    DeploymentApproved(DeploymentApproved),
    RuleFailed(RuleFailed),
    DeploymentQueued(DeploymentStarted),
    DeploymentStarted(DeploymentStarted),
    DeploymentProgress(DeploymentProgress),
    DeploymentCompleted(DeploymentCompleted),
    DeploymentFailed(DeploymentFailed),
    PluginLoaded(PluginNamed),
    PluginRemoved(PluginNamed),
    PluginRejected(PluginRejected),
}

impl EventData {
    /// The data of an event of `kind`, as a client hears it. `None` for a
    /// kind this build does not know (a newer server's) and for data it
    /// cannot read: a client skips those events rather than stop.
    pub fn read(kind: &str, data: Value) -> Option<EventData> {
        fn typed<T: serde::de::DeserializeOwned>(
            data: Value,
            kind: fn(T) -> EventData,
        ) -> Option<EventData> {
            serde_json::from_value(data).ok().map(kind)
        }
        // Stored names only: the rules' underscore aliases are no kind
        // of the log.
        let kind = EventKind::parse(kind).filter(|k| k.as_str() == kind)?;
        match kind {
            EventKind::ModelRegistered => typed(data, EventData::ModelRegistered),
            EventKind::DeploymentAwaitingApproval => {
                typed(data, EventData::DeploymentAwaitingApproval)
            }
            EventKind::DeploymentApproved => typed(data, EventData::DeploymentApproved),
            EventKind::RuleFailed => typed(data, EventData::RuleFailed),
            EventKind::DeploymentQueued => typed(data, EventData::DeploymentQueued),
            EventKind::DeploymentStarted => typed(data, EventData::DeploymentStarted),
            EventKind::DeploymentProgress => typed(data, EventData::DeploymentProgress),
            EventKind::DeploymentCompleted => typed(data, EventData::DeploymentCompleted),
            EventKind::DeploymentFailed => typed(data, EventData::DeploymentFailed),
            EventKind::PluginLoaded => typed(data, EventData::PluginLoaded),
            EventKind::PluginRemoved => typed(data, EventData::PluginRemoved),
            EventKind::PluginRejected => typed(data, EventData::PluginRejected),
        }
    }

    /// The deployment a deployment event is about.
    pub fn deploy_id(&self) -> Option<i64> {
        match self {
            EventData::DeploymentQueued(e) | EventData::DeploymentStarted(e) => Some(e.deploy_id),
            EventData::DeploymentProgress(e) => Some(e.deploy_id),
            EventData::DeploymentCompleted(e) => Some(e.deploy_id),
            EventData::DeploymentFailed(e) => Some(e.deploy_id),
            EventData::DeploymentAwaitingApproval(e) => Some(e.deploy_id),
            EventData::DeploymentApproved(e) => Some(e.deploy_id),
            EventData::ModelRegistered(_)
            | EventData::RuleFailed(_)
            | EventData::PluginLoaded(_)
            | EventData::PluginRemoved(_)
            | EventData::PluginRejected(_) => None,
        }
    }
}

pub fn event(event: &Event) -> EventData {
    let started = |deploy_id: &i64,
                   model_id: &i64,
                   deployer: &String,
                   cause: &Option<model::Cause>| DeploymentStarted {
        cause: cause.clone().map(Cause::from),
        deploy_id: *deploy_id,
        deployer: deployer.clone(),
        model_id: *model_id,
    };
    match event {
        Event::ModelRegistered {
            model_id,
            name,
            job_id,
            signed_by,
            by,
        } => EventData::ModelRegistered(ModelRegistered {
            by: by.clone(),
            job_id: job_id.clone(),
            model_id: *model_id,
            name: name.clone(),
            signed_by: signed_by.clone(),
        }),
        Event::DeploymentAwaitingApproval {
            deploy_id,
            model_id,
            deployer,
            rule,
        } => EventData::DeploymentAwaitingApproval(DeploymentAwaitingApproval {
            deploy_id: *deploy_id,
            deployer: deployer.clone(),
            model_id: *model_id,
            rule: rule.clone(),
        }),
        Event::DeploymentApproved {
            deploy_id,
            model_id,
            deployer,
            by,
            cause,
        } => EventData::DeploymentApproved(DeploymentApproved {
            by: by.clone(),
            cause: cause.clone().map(Cause::from),
            deploy_id: *deploy_id,
            deployer: deployer.clone(),
            model_id: *model_id,
        }),
        Event::RuleFailed {
            rule,
            event_id,
            model_id,
            error,
        } => EventData::RuleFailed(RuleFailed {
            error: error.clone(),
            event_id: *event_id,
            model_id: *model_id,
            rule: rule.clone(),
        }),
        Event::DeploymentQueued {
            deploy_id,
            model_id,
            deployer,
            cause,
        } => EventData::DeploymentQueued(started(deploy_id, model_id, deployer, cause)),
        Event::DeploymentStarted {
            deploy_id,
            model_id,
            deployer,
            cause,
        } => EventData::DeploymentStarted(started(deploy_id, model_id, deployer, cause)),
        Event::DeploymentProgress {
            deploy_id,
            model_id,
            phase,
            progress,
        } => EventData::DeploymentProgress(DeploymentProgress {
            deploy_id: *deploy_id,
            model_id: *model_id,
            phase: (*phase).into(),
            progress: progress.clone().into(),
        }),
        Event::DeploymentCompleted {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            reference,
            published,
            cause,
        } => EventData::DeploymentCompleted(DeploymentCompleted {
            cause: cause.clone().map(Cause::from),
            deploy_id: *deploy_id,
            deployer: deployer.clone(),
            duration_ms: *duration_ms,
            model_id: *model_id,
            published: PublishedProgress {
                bytes: published.bytes,
                files: published.files,
            },
            reference: reference.clone(),
        }),
        Event::DeploymentFailed {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            error,
            published,
            cause,
        } => EventData::DeploymentFailed(DeploymentFailed {
            cause: cause.clone().map(Cause::from),
            deploy_id: *deploy_id,
            deployer: deployer.clone(),
            duration_ms: *duration_ms,
            error: error.clone(),
            model_id: *model_id,
            published: PublishedProgress {
                bytes: published.bytes,
                files: published.files,
            },
        }),
        Event::PluginLoaded { name } => EventData::PluginLoaded(PluginNamed { name: name.clone() }),
        Event::PluginRemoved { name } => {
            EventData::PluginRemoved(PluginNamed { name: name.clone() })
        }
        Event::PluginRejected { file, reason } => EventData::PluginRejected(PluginRejected {
            file: file.clone(),
            reason: reason.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::mem::discriminant;

    use super::*;
    use crate::model::Published;

    /// Each kind's data keeps its bytes, and reads back by its kind into
    /// the same variant with the same bytes.
    #[test]
    fn events_keep_their_bytes_and_read_back_by_kind() {
        let deployer = || "archive".to_string();
        let progress = model::Progress {
            bytes_done: 5,
            bytes_total: 12,
            files_done: 1,
            files_total: 2,
            ..Default::default()
        };
        #[rustfmt::skip]
        let cases = [
            (Event::DeploymentQueued { deploy_id: 3, model_id: 1, deployer: deployer(), cause: None },
             r#"{"deploy_id":3,"deployer":"archive","model_id":1}"#),
            (Event::DeploymentStarted { deploy_id: 3, model_id: 1, deployer: deployer(), cause: None },
             r#"{"deploy_id":3,"deployer":"archive","model_id":1}"#),
            // Caused by a rule: the rule and the event that fired it.
            (Event::DeploymentStarted { deploy_id: 4, model_id: 1, deployer: deployer(), cause: Some(model::Cause { rule: "publish".into(), event_id: 7, previous: Some(3) }) },
             r#"{"cause":{"event_id":7,"previous_deployment_id":3,"rule":"publish"},"deploy_id":4,"deployer":"archive","model_id":1}"#),
            (Event::DeploymentProgress { deploy_id: 3, model_id: 1, phase: model::Phase::Deploying, progress },
             r#"{"deploy_id":3,"model_id":1,"phase":"deploying","progress":{"bytes_done":5,"bytes_total":12,"calls":{"count":0,"received_bytes":0,"sent_bytes":0},"deployer":{"done":0,"note":"","total":0},"files_done":1,"files_total":2,"published":{"bytes":0,"files":0}}}"#),
            (Event::DeploymentCompleted { deploy_id: 3, model_id: 1, deployer: deployer(), duration_ms: 42, reference: "r".into(), published: Published { files: 2, bytes: 12 }, cause: None },
             r#"{"deploy_id":3,"deployer":"archive","duration_ms":42,"model_id":1,"published":{"bytes":12,"files":2},"ref":"r"}"#),
            (Event::DeploymentFailed { deploy_id: 3, model_id: 1, deployer: deployer(), duration_ms: 42, error: "e".into(), published: Published::default(), cause: None },
             r#"{"deploy_id":3,"deployer":"archive","duration_ms":42,"error":"e","model_id":1,"published":{"bytes":0,"files":0}}"#),
            (Event::ModelRegistered { model_id: 1, name: "n".into(), job_id: "j".into(), signed_by: None, by: None },
             r#"{"job_id":"j","model_id":1,"name":"n"}"#),
            (Event::ModelRegistered { model_id: 1, name: "n".into(), job_id: "j".into(), signed_by: Some("key sha256:ab".into()), by: Some("MLflow webhook".into()) },
             r#"{"by":"MLflow webhook","job_id":"j","model_id":1,"name":"n","signed_by":"key sha256:ab"}"#),
            (Event::DeploymentAwaitingApproval { deploy_id: 3, model_id: 1, deployer: deployer(), rule: "prod".into() },
             r#"{"deploy_id":3,"deployer":"archive","model_id":1,"rule":"prod"}"#),
            (Event::DeploymentApproved { deploy_id: 3, model_id: 1, deployer: deployer(), by: Some("ops".into()), cause: None },
             r#"{"by":"ops","deploy_id":3,"deployer":"archive","model_id":1}"#),
            (Event::RuleFailed { rule: "prod".into(), event_id: 9, model_id: 1, error: "e".into() },
             r#"{"error":"e","event_id":9,"model_id":1,"rule":"prod"}"#),
            (Event::PluginLoaded { name: deployer() }, r#"{"name":"archive"}"#),
            (Event::PluginRejected { file: "x.wasm".into(), reason: "bad".into() }, r#"{"file":"x.wasm","reason":"bad"}"#),
            (Event::PluginRemoved { name: deployer() }, r#"{"name":"archive"}"#),
        ];
        for (e, expected) in cases {
            let written = event(&e);
            assert_eq!(serde_json::to_string(&written).unwrap(), expected);
            let data = serde_json::from_str(expected).unwrap();
            let read = EventData::read(e.kind(), data)
                .unwrap_or_else(|| panic!("{} does not read back", e.kind()));
            assert_eq!(discriminant(&read), discriminant(&written), "{}", e.kind());
            assert_eq!(serde_json::to_string(&read).unwrap(), expected);
        }
        let data = || serde_json::json!({"deploy_id": 3});
        assert!(
            EventData::read("deployment.paused", data()).is_none(),
            "a newer kind"
        );
        assert!(
            EventData::read("deployment.progress", data()).is_none(),
            "data it cannot read"
        );
    }
}
