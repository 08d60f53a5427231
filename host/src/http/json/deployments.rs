//! Deployments' shapes: what to deploy with which options in; a
//! deployment, its status, phase and progress out (the progress events
//! carry the same `Phase` and `Progress`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::object;
use crate::model;
use crate::model::Receipt;

/// Which deployer, with which options.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = DeployRequest)]
pub struct DeployBody {
    /// The name of a loaded deployer (`GET /v1/deployers`).
    #[schema(value_type = String, required = true, min_length = 1, example = "archive")]
    pub deployer: Option<String>,
    /// Checked against the deployer's options schema; at most 64 KiB.
    #[schema(value_type = Option<Object>)]
    pub options: Option<Value>,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeployParams {
    /// `false`: answer 202 at once and let the deployment run on.
    pub wait: Option<bool>,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// How many, newest first (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PublishedParams {
    /// Skip this many puts, in the order they were made (the `next` of
    /// the page before; default 0).
    #[param(minimum = 0)]
    pub after: Option<usize>,
    /// How many (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// A deployment lists at most this many of its puts; its
/// `/published` pages them all.
pub const PUBLISHED_SHOWN: usize = 100;

/// Some of a deployment's puts, in the order they were made.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct PublishedPage {
    /// Where to ask from for the next page (`after`); null at the end.
    #[schema(required = true)]
    pub next: Option<usize>,
    pub published: Vec<Published>,
    /// How many puts it made in all.
    pub total: usize,
}

#[derive(Serialize, Deserialize, ToSchema, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Recorded by a rule step that needs an admin's approval
    /// (`POST /v1/deployments/{id}/approve`); nothing runs it before.
    AwaitingApproval,
    Queued,
    Running,
    Completed,
    Failed,
}

impl Status {
    /// Completed or failed: a queued or running deployment has more to come.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Completed | Status::Failed)
    }
}

impl From<model::Status> for Status {
    fn from(status: model::Status) -> Self {
        match status {
            model::Status::AwaitingApproval => Status::AwaitingApproval,
            model::Status::Queued => Status::Queued,
            model::Status::Running => Status::Running,
            model::Status::Completed => Status::Completed,
            model::Status::Failed => Status::Failed,
        }
    }
}

#[derive(Serialize, Deserialize, ToSchema, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Fetching,
    Deploying,
}

impl From<model::Phase> for Phase {
    fn from(phase: model::Phase) -> Self {
        match phase {
            model::Phase::Fetching => Phase::Fetching,
            model::Phase::Deploying => Phase::Deploying,
        }
    }
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Deployment {
    /// An admin's decision, on a step that needed one; null otherwise and
    /// while it awaits.
    #[serde(default)]
    #[schema(required = true)]
    pub approval: Option<Approval>,
    /// The rule and event that asked for it; null when a person did.
    #[serde(default)]
    #[schema(required = true)]
    pub cause: Option<Cause>,
    #[schema(format = DateTime, required = true)]
    pub completed_at: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The name of the API token that asked for it; null without tokens.
    #[schema(required = true)]
    pub created_by: Option<String>,
    pub deployer: String,
    /// What the deployer reported besides its reference (`{}` until completed).
    #[schema(value_type = Object)]
    pub details: Value,
    /// Where the verified files are, on the server's disk.
    pub dir: String,
    #[schema(required = true)]
    pub duration_ms: Option<i64>,
    #[schema(required = true)]
    pub error: Option<String>,
    pub id: i64,
    pub model_id: i64,
    #[schema(value_type = Object)]
    pub options: Value,
    /// Where the deployer wrote (its `/out`), on the server's disk.
    pub out_dir: String,
    /// While running: what it is doing.
    #[schema(required = true)]
    pub phase: Option<Phase>,
    /// The sha256 of the deployer's `.wasm` it runs: the version asked for.
    #[schema(required = true)]
    pub plugin_sha256: Option<String>,
    pub progress: Progress,
    /// What it put into publishing targets, in order; kept when it failed
    /// halfway. The first 100 puts: `GET /v1/deployments/{id}/published`
    /// pages them all.
    pub published: Vec<Published>,
    /// All its puts and their bytes.
    #[serde(default)]
    pub published_total: PublishedProgress,
    /// What the deployer made (a URL, a path, an id); null unless completed.
    #[serde(rename = "ref")]
    #[schema(required = true)]
    pub reference: Option<String>,
    /// The id of the berth server that runs (or ran) it; null while queued.
    #[schema(required = true)]
    pub server: Option<String>,
    /// When a server claimed it; null while queued.
    #[schema(format = DateTime, required = true)]
    pub started_at: Option<String>,
    pub status: Status,
}

impl From<model::Deployment> for Deployment {
    fn from(d: model::Deployment) -> Self {
        Deployment {
            approval: d.approval.map(Approval::from),
            cause: d.cause.map(Cause::from),
            completed_at: d.completed_at,
            created_at: d.created_at,
            created_by: d.created_by,
            deployer: d.deployer,
            details: object(&d.details_json),
            dir: d.dir,
            duration_ms: d.duration_ms,
            error: d.error,
            id: d.id,
            model_id: d.model_id,
            options: object(&d.options_json),
            out_dir: d.out_dir,
            phase: d.phase.map(Phase::from),
            plugin_sha256: d.plugin_sha256,
            progress: d.progress.into(),
            published_total: PublishedProgress {
                bytes: d.published.iter().map(|r| r.bytes).sum(),
                files: d.published.len(),
            },
            published: d
                .published
                .into_iter()
                .take(PUBLISHED_SHOWN)
                .map(Published::from)
                .collect(),
            reference: d.reference,
            server: d.server,
            started_at: d.started_at,
            status: d.status.into(),
        }
    }
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Deployments {
    pub deployments: Vec<Deployment>,
}

impl From<Vec<model::Deployment>> for Deployments {
    fn from(deployments: Vec<model::Deployment>) -> Self {
        Deployments {
            deployments: deployments.into_iter().map(Deployment::from).collect(),
        }
    }
}

/// Why a rule recorded a deployment.
#[derive(Serialize, Deserialize, ToSchema, Clone, Debug, PartialEq)]
pub struct Cause {
    /// The stored event that fired the rule (`GET /v1/events?after=`).
    pub event_id: i64,
    /// The deployment whose completion fired it; null for a registration.
    #[schema(required = true)]
    pub previous_deployment_id: Option<i64>,
    pub rule: String,
}

impl From<model::Cause> for Cause {
    fn from(c: model::Cause) -> Self {
        Cause {
            event_id: c.event_id,
            previous_deployment_id: c.previous,
            rule: c.rule,
        }
    }
}

/// What an admin decided about a deployment that awaited approval.
#[derive(Serialize, Deserialize, ToSchema, Clone, Debug, PartialEq)]
pub struct Approval {
    #[schema(format = DateTime)]
    pub at: String,
    /// The admin token's name; null on a server without tokens.
    #[schema(required = true)]
    pub by: Option<String>,
    #[schema(required = true)]
    pub comment: Option<String>,
    pub decision: Decision,
}

#[derive(Serialize, Deserialize, ToSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approved,
    Rejected,
}

impl From<model::Approval> for Approval {
    fn from(a: model::Approval) -> Self {
        Approval {
            at: a.at,
            by: a.by,
            comment: a.comment,
            decision: match a.decision {
                model::Decision::Approved => Decision::Approved,
                model::Decision::Rejected => Decision::Rejected,
            },
        }
    }
}

/// What `approve` and `reject` take: an optional comment, kept with the
/// decision.
#[derive(Serialize, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    #[schema(max_length = 2000)]
    pub comment: Option<String>,
}

/// One put into a publishing target.
#[derive(Serialize, Deserialize, ToSchema, Clone, Debug, PartialEq)]
pub struct Published {
    pub bytes: u64,
    /// The destination's entity tag, when it gave one.
    #[schema(required = true)]
    pub etag: Option<String>,
    /// Under the target's URL.
    pub key: String,
    /// Lowercase hex SHA-256 of what was put; the destination checked it.
    pub sha256: String,
    /// The target's name.
    pub target: String,
    /// Where it is: the target's URL and the key.
    pub url: String,
}

impl From<Receipt> for Published {
    fn from(r: Receipt) -> Self {
        Published {
            bytes: r.bytes,
            etag: r.etag,
            key: r.key,
            sha256: r.sha256,
            target: r.target,
            url: r.url,
        }
    }
}

/// How far a deployment has come: bytes and files fetched, the deployer's
/// own count, and what it published.
#[derive(Serialize, Deserialize, ToSchema, Default)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// The deployer's own requests under targets so far (its log has a
    /// line for each: method, url, status, bytes each way).
    #[serde(default)]
    pub calls: CallsProgress,
    pub deployer: DeployerProgress,
    pub files_done: usize,
    pub files_total: usize,
    /// Put into publishing targets so far.
    #[serde(default)]
    pub published: PublishedProgress,
}

/// Requests of the deployer's own under publishing targets, and their
/// body bytes each way.
#[derive(Serialize, Deserialize, ToSchema, Default)]
pub struct CallsProgress {
    pub count: u64,
    pub received_bytes: u64,
    pub sent_bytes: u64,
}

/// Bytes (sent, counting a retried part again until its put is done) and
/// files put into publishing targets.
#[derive(Serialize, Deserialize, ToSchema, Default)]
pub struct PublishedProgress {
    pub bytes: u64,
    pub files: usize,
}

impl From<model::Progress> for Progress {
    fn from(p: model::Progress) -> Self {
        Progress {
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            deployer: DeployerProgress {
                done: p.deployer_done,
                note: p.deployer_note,
                total: p.deployer_total,
            },
            files_done: p.files_done,
            files_total: p.files_total,
            published: PublishedProgress {
                bytes: p.published_bytes,
                files: p.published_files,
            },
            calls: CallsProgress {
                count: p.calls,
                sent_bytes: p.calls_sent_bytes,
                received_bytes: p.calls_received_bytes,
            },
        }
    }
}

/// The deployer's `progress` calls; units are its choice.
#[derive(Serialize, Deserialize, ToSchema, Default)]
pub struct DeployerProgress {
    pub done: u64,
    pub note: String,
    pub total: u64,
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::*;

    fn running() -> model::Deployment {
        model::Deployment {
            id: 3,
            model_id: 1,
            deployer: "archive".into(),
            options_json: r#"{"level":9}"#.into(),
            status: model::Status::Running,
            phase: Some(model::Phase::Fetching),
            progress: model::Progress {
                bytes_done: 5,
                bytes_total: 12,
                files_done: 1,
                files_total: 2,
                ..Default::default()
            },
            dir: "/m/ft-1".into(),
            out_dir: "/o/3".into(),
            reference: None,
            details_json: "{}".into(),
            error: None,
            duration_ms: None,
            created_at: "2026-12-01T10:00:01.000Z".into(),
            completed_at: None,
            created_by: Some("ci".into()),
            plugin_sha256: Some("cd".repeat(32)),
            server: Some("5e4a1d2c3b4a5968".into()),
            started_at: Some("2026-12-01T10:00:01.250Z".into()),
            published: Vec::new(),
            cause: None,
            approval: None,
        }
    }

    #[test]
    fn deployments_keep_their_bytes() {
        check(
            Deployment::from(running()),
            r#"{"approval":null,"cause":null,"completed_at":null,"created_at":"2026-12-01T10:00:01.000Z","created_by":"ci","deployer":"archive","details":{},"dir":"/m/ft-1","duration_ms":null,"error":null,"id":3,"model_id":1,"options":{"level":9},"out_dir":"/o/3","phase":"fetching","plugin_sha256":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","progress":{"bytes_done":5,"bytes_total":12,"calls":{"count":0,"received_bytes":0,"sent_bytes":0},"deployer":{"done":0,"note":"","total":0},"files_done":1,"files_total":2,"published":{"bytes":0,"files":0}},"published":[],"published_total":{"bytes":0,"files":0},"ref":null,"server":"5e4a1d2c3b4a5968","started_at":"2026-12-01T10:00:01.250Z","status":"running"}"#,
        );
        let completed = model::Deployment {
            status: model::Status::Completed,
            phase: None,
            reference: Some("r".into()),
            details_json: r#"{"k":"v"}"#.into(),
            duration_ms: Some(42),
            completed_at: Some("2026-12-01T10:00:02.000Z".into()),
            created_by: None,
            published: vec![Receipt {
                target: "releases".into(),
                key: "ft-1/a.bin".into(),
                url: "s3://team/models/ft-1/a.bin".into(),
                bytes: 12,
                sha256: "ab".repeat(32),
                etag: Some("\"e1\"".into()),
            }],
            cause: Some(model::Cause {
                rule: "publish".into(),
                event_id: 7,
                previous: Some(2),
            }),
            approval: Some(model::Approval {
                decision: model::Decision::Approved,
                by: Some("ops".into()),
                at: "2026-12-01T10:00:00.500Z".into(),
                comment: None,
            }),
            ..running()
        };
        check(
            Deployment::from(completed),
            r#"{"approval":{"at":"2026-12-01T10:00:00.500Z","by":"ops","comment":null,"decision":"approved"},"cause":{"event_id":7,"previous_deployment_id":2,"rule":"publish"},"completed_at":"2026-12-01T10:00:02.000Z","created_at":"2026-12-01T10:00:01.000Z","created_by":null,"deployer":"archive","details":{"k":"v"},"dir":"/m/ft-1","duration_ms":42,"error":null,"id":3,"model_id":1,"options":{"level":9},"out_dir":"/o/3","phase":null,"plugin_sha256":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","progress":{"bytes_done":5,"bytes_total":12,"calls":{"count":0,"received_bytes":0,"sent_bytes":0},"deployer":{"done":0,"note":"","total":0},"files_done":1,"files_total":2,"published":{"bytes":0,"files":0}},"published":[{"bytes":12,"etag":"\"e1\"","key":"ft-1/a.bin","sha256":"abababababababababababababababababababababababababababababababab","target":"releases","url":"s3://team/models/ft-1/a.bin"}],"published_total":{"bytes":12,"files":1},"ref":"r","server":"5e4a1d2c3b4a5968","started_at":"2026-12-01T10:00:01.250Z","status":"completed"}"#,
        );
    }
}
