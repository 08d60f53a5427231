//! The API's JSON shapes both ways — request bodies and query parameters
//! in, models, deployments and events out — and the extractors that turn a
//! malformed request into a sentence. The only place that knows field names
//! on the wire; handlers convert to domain types by hand.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::error::Error;
use crate::artifacts::Listing;
use crate::events::Event;
use crate::model::{Deployment, Progress, TrainedModel};

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
// by validation with the others, not by serde alone.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    pub name: Option<String>,
    pub job_id: Option<String>,
    pub base_model: Option<String>,
    pub model_size: Option<String>,
    pub dataset: Option<String>,
    pub num_examples: Option<u64>,
    pub num_train_steps: Option<u64>,
    pub final_loss: Option<f64>,
    pub params: Option<Value>,
    pub source: Option<String>,
    #[serde(default)]
    pub files: Vec<FileBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBody {
    pub path: Option<String>,
    pub size_bytes: Option<u64>,
    pub sha256: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployBody {
    pub deployer: Option<String>,
    pub options: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployParams {
    /// `false`: answer 202 at once and let the deployment run on.
    pub wait: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub limit: Option<u32>,
}

// Answers.

/// Stored JSON text (always an object when berth wrote it) back as JSON.
fn object(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| json!({}))
}

pub fn model(m: &TrainedModel) -> Value {
    json!({
        "id": m.id,
        "name": m.name,
        "job_id": m.job_id,
        "base_model": m.base_model,
        "model_size": m.model_size,
        "dataset": m.dataset,
        "num_examples": m.num_examples,
        "num_train_steps": m.num_train_steps,
        "final_loss": m.final_loss,
        "params": object(&m.params_json),
        "source": m.source,
        "created_at": m.created_at,
        "created_by": m.created_by,
        "files": m.files.iter().map(|f| json!({
            "path": f.path,
            "size_bytes": f.size_bytes,
            "sha256": f.sha256,
        })).collect::<Vec<_>>(),
    })
}

pub fn deployment(d: &Deployment) -> Value {
    json!({
        "id": d.id,
        "model_id": d.model_id,
        "deployer": d.deployer,
        "options": object(&d.options_json),
        "status": d.status.as_str(),
        "phase": d.phase.map(|p| p.as_str()),
        "progress": progress(&d.progress),
        "dir": d.dir,
        "out_dir": d.out_dir,
        "ref": d.reference,
        "details": object(&d.details_json),
        "error": d.error,
        "duration_ms": d.duration_ms,
        "created_at": d.created_at,
        "completed_at": d.completed_at,
        "created_by": d.created_by,
    })
}

pub fn artifacts(listing: &Listing) -> Value {
    json!({
        "files": listing.files.iter().map(|a| json!({
            "path": a.path,
            "size_bytes": a.size_bytes,
            "modified": humantime::format_rfc3339_millis(a.modified).to_string(),
        })).collect::<Vec<_>>(),
        "truncated": listing.truncated,
    })
}

pub fn progress(p: &Progress) -> Value {
    json!({
        "bytes_done": p.bytes_done,
        "bytes_total": p.bytes_total,
        "files_done": p.files_done,
        "files_total": p.files_total,
        "deployer": { "done": p.deployer_done, "total": p.deployer_total, "note": p.deployer_note },
    })
}

/// An event's JSON, as SSE `data:` and webhook `data` carry it.
pub fn event(event: &Event) -> Value {
    match event {
        Event::DeploymentStarted {
            deploy_id,
            model_id,
            deployer,
        } => {
            json!({ "deploy_id": deploy_id, "model_id": model_id, "deployer": deployer })
        }
        Event::DeploymentProgress {
            deploy_id,
            model_id,
            phase,
            progress,
        } => json!({
            "deploy_id": deploy_id, "model_id": model_id, "phase": phase.as_str(),
            "progress": self::progress(progress),
        }),
        Event::DeploymentCompleted {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            reference,
        } => json!({
            "deploy_id": deploy_id, "model_id": model_id, "deployer": deployer,
            "duration_ms": duration_ms, "ref": reference,
        }),
        Event::DeploymentFailed {
            deploy_id,
            model_id,
            deployer,
            duration_ms,
            error,
        } => json!({
            "deploy_id": deploy_id, "model_id": model_id, "deployer": deployer,
            "duration_ms": duration_ms, "error": error,
        }),
        Event::PluginLoaded { name } | Event::PluginRemoved { name } => json!({ "name": name }),
        Event::PluginRejected { file, reason } => json!({ "file": file, "reason": reason }),
    }
}
