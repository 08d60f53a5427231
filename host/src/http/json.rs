//! The API's JSON shapes both ways — request bodies and query parameters
//! in, models, deployments, deployers, events and errors out — with their
//! OpenAPI schemas, and the extractors that turn a malformed request into a
//! sentence. The only place that knows field names on the wire; handlers
//! convert to domain types by hand.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::error::Error;
use crate::artifacts::Listing;
use crate::db::StoredVersion;
use crate::deployers::Source;
use crate::events::Event;
use crate::model::{self, TrainedModel};
use crate::runtime::{self, Plugin, Rejection};

/// `Json<T>` whose rejection is a 400 with serde's explanation.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Body(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(Error::BadRequest(
                "send the body as JSON with the header Content-Type: application/json".into(),
            )),
            Err(e) => Err(Error::BadRequest(format!(
                "the request body is not acceptable: {}",
                e.body_text()
            ))),
        }
    }
}

/// An `{id}` path segment: a positive integer.
pub struct Id(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let raw = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e: PathRejection| Error::BadRequest(e.body_text()))?;
        match raw.0.parse::<i64>() {
            Ok(id) if id > 0 => Ok(Id(id)),
            _ => Err(Error::BadRequest(format!(
                "{:?} is not an id: ids are positive integers",
                raw.0
            ))),
        }
    }
}

/// `{id}` and a `{*path}` after it: an artifact of a deployment.
pub struct IdAndPath(pub i64, pub String);

impl<S: Send + Sync> FromRequestParts<S> for IdAndPath {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path((raw, path)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e: PathRejection| Error::BadRequest(e.body_text()))?;
        match raw.parse::<i64>() {
            Ok(id) if id > 0 => Ok(IdAndPath(id, path)),
            _ => Err(Error::BadRequest(format!(
                "{raw:?} is not an id: ids are positive integers"
            ))),
        }
    }
}

/// Query parameters, with a 400 that names the bad one.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Params(q.0))
            .map_err(|e: QueryRejection| Error::BadRequest(e.body_text()))
    }
}

// Requests. Every field is optional here so that a missing one is reported
// by validation with the others, not by serde alone; the schemas say which
// ones a registration needs.

/// A trained model to register: what it is, where its files live, and
/// each file's size and (optionally) sha256.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Registration)]
pub struct RegisterBody {
    #[schema(value_type = String, required = true, min_length = 1, max_length = 1024, example = "support-bot-lora")]
    pub name: Option<String>,
    /// Names the model's directory: letters, digits, `_`, `-`, `.`,
    /// starting with a letter or digit. Registered once.
    #[schema(value_type = String, required = true, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", example = "ft-2026-11-29-a")]
    pub job_id: Option<String>,
    #[schema(max_length = 1024)]
    pub base_model: Option<String>,
    #[schema(max_length = 1024)]
    pub model_size: Option<String>,
    #[schema(max_length = 1024)]
    pub dataset: Option<String>,
    pub num_examples: Option<u64>,
    pub num_train_steps: Option<u64>,
    pub final_loss: Option<f64>,
    /// Training parameters, kept as given.
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// An `http`, `https` or `file` URL template: `{path}` is replaced by
    /// each file's path, `{job_id}` by the job id.
    #[schema(value_type = String, required = true, pattern = r"\{path\}", example = "http://files.internal/{job_id}/{path}")]
    pub source: Option<String>,
    #[serde(default)]
    pub files: Vec<FileBody>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RegistrationFile)]
pub struct FileBody {
    /// Relative and `/`-separated; no `..`, no empty segments.
    #[schema(value_type = String, required = true, min_length = 1, max_length = 1024, example = "adapter_config.json")]
    pub path: Option<String>,
    #[schema(value_type = u64, required = true, example = 412)]
    pub size_bytes: Option<u64>,
    #[schema(pattern = "^[0-9a-fA-F]{64}$")]
    pub sha256: Option<String>,
}

/// Which deployer, with which options.
#[derive(Deserialize, ToSchema)]
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
pub struct EventsParams {
    /// Start after this event id: the `id` of the last event received
    /// (0: from the oldest kept). Without it (and without
    /// `Last-Event-ID`), the stream starts now.
    #[param(value_type = Option<i64>, minimum = 0)]
    pub after: Option<String>,
}

// Answers. Fields are in alphabetical order: the order these answers had
// when they were built as `serde_json` maps, kept so their bytes stay the
// same.

/// Stored JSON text (always an object when berth wrote it) back as JSON.
fn object(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| json!({}))
}

/// Every refusal: a sentence saying what is wrong and what to do.
#[derive(Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    pub error: String,
}

#[derive(Serialize, ToSchema)]
pub struct Model {
    pub base_model: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The name of the API token that registered it; null without tokens.
    #[schema(required = true)]
    pub created_by: Option<String>,
    pub dataset: String,
    pub files: Vec<ModelFile>,
    #[schema(required = true)]
    pub final_loss: Option<f64>,
    pub id: i64,
    pub job_id: String,
    pub model_size: String,
    pub name: String,
    pub num_examples: u64,
    pub num_train_steps: u64,
    #[schema(value_type = Object)]
    pub params: Value,
    pub source: String,
}

impl From<TrainedModel> for Model {
    fn from(m: TrainedModel) -> Self {
        Model {
            base_model: m.base_model,
            created_at: m.created_at,
            created_by: m.created_by,
            dataset: m.dataset,
            files: m.files.into_iter().map(ModelFile::from).collect(),
            final_loss: m.final_loss,
            id: m.id,
            job_id: m.job_id,
            model_size: m.model_size,
            name: m.name,
            num_examples: m.num_examples,
            num_train_steps: m.num_train_steps,
            params: object(&m.params_json),
            source: m.source,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct ModelFile {
    pub path: String,
    /// Lowercase hex; null when the registration gave only the size.
    #[schema(required = true)]
    pub sha256: Option<String>,
    pub size_bytes: u64,
}

impl From<model::ModelFile> for ModelFile {
    fn from(f: model::ModelFile) -> Self {
        ModelFile {
            path: f.path,
            sha256: f.sha256,
            size_bytes: f.size_bytes,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct Models {
    pub models: Vec<Model>,
}

impl From<Vec<TrainedModel>> for Models {
    fn from(models: Vec<TrainedModel>) -> Self {
        Models {
            models: models.into_iter().map(Model::from).collect(),
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Queued,
    Running,
    Completed,
    Failed,
}

impl From<model::Status> for Status {
    fn from(status: model::Status) -> Self {
        match status {
            model::Status::Queued => Status::Queued,
            model::Status::Running => Status::Running,
            model::Status::Completed => Status::Completed,
            model::Status::Failed => Status::Failed,
        }
    }
}

#[derive(Serialize, ToSchema)]
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

/// Which compiler made the code a deployer's new calls run: `baseline`
/// (Winch, for the seconds after the plugin arrived, while Cranelift
/// compiles it in the background) or `optimized` (Cranelift).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Baseline,
    Optimized,
}

impl From<runtime::Tier> for Tier {
    fn from(tier: runtime::Tier) -> Self {
        match tier {
            runtime::Tier::Baseline => Tier::Baseline,
            runtime::Tier::Optimized => Tier::Optimized,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct Deployment {
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
            reference: d.reference,
            server: d.server,
            started_at: d.started_at,
            status: d.status.into(),
        }
    }
}

#[derive(Serialize, ToSchema)]
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

/// How far a deployment has come: bytes and files fetched, and the
/// deployer's own count.
#[derive(Serialize, ToSchema)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub deployer: DeployerProgress,
    pub files_done: usize,
    pub files_total: usize,
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
        }
    }
}

/// The deployer's `progress` calls; units are its choice.
#[derive(Serialize, ToSchema)]
pub struct DeployerProgress {
    pub done: u64,
    pub note: String,
    pub total: u64,
}

/// Where a deployer comes from: `folder` (the server's plugins folder,
/// which wins every conflict) or `api` (stored over the API, shared by the
/// servers on one database).
#[derive(Serialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    Folder,
    Api,
}

#[derive(Serialize, ToSchema)]
pub struct Deployer {
    /// When the version it serves was pushed; null for a folder deployer.
    #[schema(format = DateTime, required = true)]
    pub added_at: Option<String>,
    /// The API token that pushed the version it serves; null for a folder
    /// deployer or without tokens.
    #[schema(required = true)]
    pub added_by: Option<String>,
    pub allowed_hosts: Vec<String>,
    pub description: String,
    /// The names of the environment variables its manifest grants.
    pub env: Vec<String>,
    pub memory_mib: u64,
    pub name: String,
    /// The JSON Schema its options are checked against (any JSON the
    /// deployer gave), or null.
    #[schema(value_type = Value, required = true)]
    pub options_schema: Option<Value>,
    pub origin: Origin,
    /// What a deployment's output directory may hold, in MiB.
    pub out_mib: u64,
    /// Of the `.wasm` file.
    pub sha256: String,
    /// The id of the trusted key (`--trusted-key`) whose signature over
    /// its bytes it loaded with, as minisign prints it; null when it loaded
    /// without a verified signature.
    #[schema(
        required = true,
        pattern = "^[0-9A-F]{16}$",
        example = "C3A9D84E0B7F1265"
    )]
    pub signed_by: Option<String>,
    pub tier: Tier,
    pub timeout_s: u64,
    /// Which of its versions it serves (1 is the first pushed); null for
    /// a folder deployer.
    #[schema(required = true, minimum = 1)]
    pub version: Option<i64>,
    /// The `berth:deployer` version it was built for.
    pub wit_version: String,
}

impl Deployer {
    pub fn new(p: &Plugin, source: &Source) -> Self {
        let stored = match source {
            Source::Folder => None,
            Source::Api(version) => Some(version),
        };
        Deployer {
            added_at: stored.map(|v| v.added_at.clone()),
            added_by: stored.and_then(|v| v.added_by.clone()),
            allowed_hosts: p
                .manifest
                .allowed_hosts
                .iter()
                .map(|h| h.to_string())
                .collect(),
            description: p.description.clone(),
            env: p
                .manifest
                .env
                .iter()
                .map(|(name, _)| name.clone())
                .collect(),
            memory_mib: p.limits.memory_mib,
            name: p.name.clone(),
            options_schema: p
                .options_schema
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok()),
            origin: match source {
                Source::Folder => Origin::Folder,
                Source::Api(_) => Origin::Api,
            },
            out_mib: p.limits.out_mib,
            sha256: p.sha256.clone(),
            signed_by: p.signed_by.clone(),
            tier: p.tier().into(),
            timeout_s: p.limits.timeout.as_secs(),
            version: stored.map(|v| v.number),
            wit_version: p.wit_version.clone(),
        }
    }
}

/// A file in the plugins folder that is not serving, and why.
#[derive(Serialize, ToSchema)]
pub struct Rejected {
    /// The plugin file in the folder, or `NAME.wasm` for a deployer stored
    /// over the API.
    pub file: String,
    pub origin: Origin,
    pub reason: String,
    /// Of the refused version stored over the API; null for a folder file.
    #[schema(required = true)]
    pub sha256: Option<String>,
}

impl Rejected {
    pub fn new(r: &Rejection, source: &Source) -> Self {
        let (origin, sha256) = match source {
            Source::Folder => (Origin::Folder, None),
            Source::Api(version) => (Origin::Api, Some(version.sha256.clone())),
        };
        Rejected {
            file: r.file.clone(),
            origin,
            reason: r.reason.clone(),
            sha256,
        }
    }
}

/// One version of a deployer stored over the API.
#[derive(Serialize, ToSchema)]
pub struct DeployerVersion {
    #[schema(format = DateTime)]
    pub added_at: String,
    /// The API token that pushed it; null without tokens.
    #[schema(required = true)]
    pub added_by: Option<String>,
    /// Whether the deployer serves this version now.
    pub current: bool,
    /// Whether a manifest came with it.
    pub manifest: bool,
    /// 1 for the first version pushed, then 2, …
    #[schema(minimum = 1)]
    pub number: i64,
    pub sha256: String,
    /// Whether a detached signature came with it.
    pub signed: bool,
    /// Of the `.wasm`, in bytes.
    pub size: i64,
}

impl DeployerVersion {
    pub fn new(v: &StoredVersion, current: &StoredVersion) -> Self {
        DeployerVersion {
            added_at: v.added_at.clone(),
            added_by: v.added_by.clone(),
            current: v.id == current.id,
            manifest: v.manifest.is_some(),
            number: v.number,
            sha256: v.sha256.clone(),
            signed: v.signature.is_some(),
            size: v.size,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct DeployerVersions {
    pub name: String,
    /// Oldest first.
    pub versions: Vec<DeployerVersion>,
}

/// `POST /v1/deployers/{name}/rollback`: which version to serve again.
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    /// The version to serve (its sha256); absent: the one before the
    /// version served now.
    pub sha256: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Deployers {
    pub deployers: Vec<Deployer>,
    /// Plugin files still compiling after a start: deployers soon.
    pub loading: Vec<String>,
    pub rejected: Vec<Rejected>,
}

// Events: the `data` of each kind, as SSE and the webhook carry it.

#[derive(Serialize, ToSchema)]
pub struct DeploymentStarted {
    pub deploy_id: i64,
    pub deployer: String,
    pub model_id: i64,
}

#[derive(Serialize, ToSchema)]
pub struct DeploymentProgress {
    pub deploy_id: i64,
    pub model_id: i64,
    pub phase: Phase,
    pub progress: Progress,
}

#[derive(Serialize, ToSchema)]
pub struct DeploymentCompleted {
    pub deploy_id: i64,
    pub deployer: String,
    pub duration_ms: i64,
    pub model_id: i64,
    #[serde(rename = "ref")]
    pub reference: String,
}

#[derive(Serialize, ToSchema)]
pub struct DeploymentFailed {
    pub deploy_id: i64,
    pub deployer: String,
    pub duration_ms: i64,
    pub error: String,
    pub model_id: i64,
}

/// `plugin.loaded` and `plugin.removed`. (`plugin.rejected` carries a
/// `Rejected`, as `GET /v1/deployers` lists it.)
#[derive(Serialize, ToSchema)]
pub struct PluginNamed {
    pub name: String,
}

/// An event's `data`, one shape per kind.
#[derive(Serialize)]
#[serde(untagged)]
pub enum EventData {
    DeploymentStarted(DeploymentStarted),
    DeploymentProgress(DeploymentProgress),
    DeploymentCompleted(DeploymentCompleted),
    DeploymentFailed(DeploymentFailed),
    Plugin(PluginNamed),
    PluginRejected(PluginRejected),
}

/// `plugin.rejected`'s data.
#[derive(Serialize)]
pub struct PluginRejected {
    pub file: String,
    pub reason: String,
}

pub fn event(event: &Event) -> EventData {
    match event.clone() {
        Event::DeploymentQueued {
            deploy_id,
            model_id,
            deployer,
        }
        | Event::DeploymentStarted {
            deploy_id,
            model_id,
            deployer,
        } => EventData::DeploymentStarted(DeploymentStarted {
            deploy_id,
            deployer,
            model_id,
        }),
        Event::DeploymentProgress {
            deploy_id,
            model_id,
            phase,
            progress,
        } => EventData::DeploymentProgress(DeploymentProgress {
            deploy_id,
            model_id,
            phase: phase.into(),
            progress: progress.into(),
        }),
        Event::DeploymentCompleted {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            reference,
        } => EventData::DeploymentCompleted(DeploymentCompleted {
            deploy_id,
            deployer,
            duration_ms,
            model_id,
            reference,
        }),
        Event::DeploymentFailed {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            error,
        } => EventData::DeploymentFailed(DeploymentFailed {
            deploy_id,
            deployer,
            duration_ms,
            error,
            model_id,
        }),
        Event::PluginLoaded { name } | Event::PluginRemoved { name } => {
            EventData::Plugin(PluginNamed { name })
        }
        Event::PluginRejected { file, reason } => {
            EventData::PluginRejected(PluginRejected { file, reason })
        }
    }
}

/// A webhook POST's body: `{"data": DATA, "type": KIND}`, the data as
/// the event log holds it.
pub fn webhook_body(kind: &str, data: &str) -> String {
    let data = serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_string()));
    json!({ "type": kind, "data": data }).to_string()
}

/// `GET /v1/webhook`: where delivery to the webhook stands, on every
/// server.
#[derive(Serialize, ToSchema)]
pub struct WebhookState {
    /// Every deployment event up to this id was delivered or given up.
    pub delivered_through: i64,
    /// The id of the server delivering (`DATA_DIR/server-id`); null while
    /// none holds the lease.
    pub delivering_server: Option<String>,
    /// The event being retried, while deliveries fail; null otherwise.
    pub failing: Option<WebhookFailing>,
    /// Events given up after the give-up time, since the webhook was
    /// first configured.
    pub given_up: i64,
    /// Deployment events after `delivered_through`, still to deliver.
    pub pending: i64,
    /// The receiver, without user, password and query.
    pub url: String,
}

#[derive(Serialize, ToSchema)]
pub struct WebhookFailing {
    pub event_id: i64,
    pub last_error: String,
    /// When the next attempt is due.
    pub next_attempt: String,
    /// The first failed attempt at this event.
    pub since: String,
}

impl From<crate::db::events::WebhookState> for WebhookState {
    fn from(s: crate::db::events::WebhookState) -> Self {
        WebhookState {
            delivered_through: s.delivered_id,
            delivering_server: s.holder,
            failing: s.failure.map(|f| WebhookFailing {
                event_id: f.event_id,
                last_error: f.last_error,
                next_attempt: f.next_attempt,
                since: f.since,
            }),
            given_up: s.given_up,
            pending: s.pending,
            url: s.url,
        }
    }
}

/// `GET /v1/deployments/{id}/files`: what the deployer left in its
/// output directory, as far as it may be served.
#[derive(Serialize, ToSchema)]
pub struct Artifacts {
    /// Regular files only, sorted by path.
    pub files: Vec<Artifact>,
    /// More files than are listed.
    pub truncated: bool,
}

#[derive(Serialize, ToSchema)]
pub struct Artifact {
    /// Relative to the output directory, `/`-separated.
    pub path: String,
    pub size_bytes: u64,
    /// RFC 3339 UTC with milliseconds.
    pub modified: String,
}

impl From<&Listing> for Artifacts {
    fn from(listing: &Listing) -> Self {
        Artifacts {
            files: listing
                .files
                .iter()
                .map(|a| Artifact {
                    path: a.path.clone(),
                    size_bytes: a.size_bytes,
                    modified: humantime::format_rfc3339_millis(a.modified).to_string(),
                })
                .collect(),
            truncated: listing.truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelFile;

    fn model() -> TrainedModel {
        let mut model = TrainedModel::from_files(
            "ft-1",
            "http://files.local/{job_id}/{path}".into(),
            vec![
                ModelFile {
                    path: "a.bin".into(),
                    size_bytes: 10,
                    sha256: Some("ab".repeat(32)),
                },
                ModelFile {
                    path: "b/c.json".into(),
                    size_bytes: 2,
                    sha256: None,
                },
            ],
        );
        model.final_loss = Some(0.5);
        model.params_json = r#"{"rank":8}"#.into();
        model.created_at = "2026-12-01T10:00:00.000Z".into();
        model
    }

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
        }
    }

    #[track_caller]
    fn check(answer: impl Serialize, expected: &str) {
        assert_eq!(serde_json::to_string(&answer).unwrap(), expected);
    }

    /// The bytes the answers had when they were `serde_json` maps (keys in
    /// alphabetical order): clients may compare them.
    #[test]
    fn answers_keep_their_bytes() {
        check(
            Model::from(model()),
            r#"{"base_model":"","created_at":"2026-12-01T10:00:00.000Z","created_by":null,"dataset":"","files":[{"path":"a.bin","sha256":"abababababababababababababababababababababababababababababababab","size_bytes":10},{"path":"b/c.json","sha256":null,"size_bytes":2}],"final_loss":0.5,"id":1,"job_id":"ft-1","model_size":"","name":"ft-1","num_examples":0,"num_train_steps":0,"params":{"rank":8},"source":"http://files.local/{job_id}/{path}"}"#,
        );
        check(
            Deployment::from(running()),
            r#"{"completed_at":null,"created_at":"2026-12-01T10:00:01.000Z","created_by":"ci","deployer":"archive","details":{},"dir":"/m/ft-1","duration_ms":null,"error":null,"id":3,"model_id":1,"options":{"level":9},"out_dir":"/o/3","phase":"fetching","plugin_sha256":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","progress":{"bytes_done":5,"bytes_total":12,"deployer":{"done":0,"note":"","total":0},"files_done":1,"files_total":2},"ref":null,"server":"5e4a1d2c3b4a5968","started_at":"2026-12-01T10:00:01.250Z","status":"running"}"#,
        );
        let completed = model::Deployment {
            status: model::Status::Completed,
            phase: None,
            reference: Some("r".into()),
            details_json: r#"{"k":"v"}"#.into(),
            duration_ms: Some(42),
            completed_at: Some("2026-12-01T10:00:02.000Z".into()),
            created_by: None,
            ..running()
        };
        check(
            Deployment::from(completed),
            r#"{"completed_at":"2026-12-01T10:00:02.000Z","created_at":"2026-12-01T10:00:01.000Z","created_by":null,"deployer":"archive","details":{"k":"v"},"dir":"/m/ft-1","duration_ms":42,"error":null,"id":3,"model_id":1,"options":{"level":9},"out_dir":"/o/3","phase":null,"plugin_sha256":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","progress":{"bytes_done":5,"bytes_total":12,"deployer":{"done":0,"note":"","total":0},"files_done":1,"files_total":2},"ref":"r","server":"5e4a1d2c3b4a5968","started_at":"2026-12-01T10:00:01.250Z","status":"completed"}"#,
        );
        check(
            ErrorBody {
                error: "model 9 does not exist".into(),
            },
            r#"{"error":"model 9 does not exist"}"#,
        );
    }

    #[test]
    fn events_keep_their_bytes() {
        let deployer = || "archive".to_string();
        #[rustfmt::skip]
        let cases = [
            (Event::DeploymentStarted { deploy_id: 3, model_id: 1, deployer: deployer() },
             r#"{"deploy_id":3,"deployer":"archive","model_id":1}"#),
            (Event::DeploymentProgress { deploy_id: 3, model_id: 1, phase: model::Phase::Deploying, progress: running().progress },
             r#"{"deploy_id":3,"model_id":1,"phase":"deploying","progress":{"bytes_done":5,"bytes_total":12,"deployer":{"done":0,"note":"","total":0},"files_done":1,"files_total":2}}"#),
            (Event::DeploymentCompleted { deploy_id: 3, model_id: 1, deployer: deployer(), duration_ms: 42, reference: "r".into() },
             r#"{"deploy_id":3,"deployer":"archive","duration_ms":42,"model_id":1,"ref":"r"}"#),
            (Event::DeploymentFailed { deploy_id: 3, model_id: 1, deployer: deployer(), duration_ms: 42, error: "e".into() },
             r#"{"deploy_id":3,"deployer":"archive","duration_ms":42,"error":"e","model_id":1}"#),
            (Event::PluginLoaded { name: deployer() }, r#"{"name":"archive"}"#),
            (Event::PluginRejected { file: "x.wasm".into(), reason: "bad".into() }, r#"{"file":"x.wasm","reason":"bad"}"#),
            (Event::PluginRemoved { name: deployer() }, r#"{"name":"archive"}"#),
        ];
        for (e, expected) in cases {
            check(event(&e), expected);
        }
    }
}
