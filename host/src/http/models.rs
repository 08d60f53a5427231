//! `/v1/models`: register, list, show and delete trained models.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::extract::{Body, Id};
use super::json::{self, ErrorBody, ProblemsBody, RegisterBody};
use crate::auth::Caller;
use crate::db;
use crate::events::Event;
use crate::fetch::source::Discovered;
use crate::model::TrainedModel;
use crate::pipeline::copies::DropError;
use crate::validate::{self, FileDraft, ModelDraft, Problem, Problems};

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(list, register))
        .routes(routes!(show, remove))
        .routes(routes!(drop_files))
}

/// Registers a model: its files and where they come from.
///
/// With the source `upload:` (`berth models push`), every file's blob must
/// have been uploaded (`PUT /v1/blobs/sha256:…`); the registration pins
/// them. A body without `files` has them listed at its source: an `s3://`
/// prefix (each object's size, and its sha256 where the store keeps one,
/// `x-amz-checksum-sha256`), an `oci://` manifest (its layers, by
/// digest) or an `mlflow://` registry's version (its files' sizes, and
/// where it came from in `params`: `mlflow_name`, `mlflow_version`,
/// `mlflow_alias`, `mlflow_run_id`, `mlflow_run_url`); no file is read. Given `files` are each looked for at the
/// source first (one byte each, for its size), unless `check_source` is
/// `false`.
#[utoipa::path(post, path = "/v1/models", operation_id = "register_model", tag = "models",
    request_body = RegisterBody,
    responses(
        (status = CREATED, description = "The stored model", body = json::Model),
        (status = OK, description = "The same files from the same source are registered already under this job id: that model", body = json::Model),
        (status = BAD_REQUEST, description = "The body is not a registration (then `error` alone says why), or every problem of the registration, each also with its field in `problems`; or the source does not answer for a given file with its size (then `error` names the first such file); or, with the source `upload:`, a file whose blob was not uploaded (then `error` alone names it); or, without `files`, its source could not be listed (then `error` alone says why: a scheme that cannot be listed, no objects or more than 10000 under the prefix, no bucket, refused credentials, an unreachable store)", body = ProblemsBody),
        (status = CONFLICT, description = "The job id is registered already, with other files or another source: `error` names the model and what differs", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be written", body = ErrorBody),
    ))]
async fn register(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Body(body): Body<RegisterBody>,
) -> Result<(StatusCode, Json<json::Model>), Error> {
    let listed = body.files.is_none();
    let signature = body.signature.clone();
    // Files found by listing the source are there by definition.
    let check = !listed && body.check_source != Some(false);
    let mut draft = draft(body);
    if listed {
        draft = discovered(&ctx, draft).await?;
    }
    let created_by = caller.map(|Extension(c)| c.name);
    record(&ctx, draft, created_by, signature, check).await
}

/// Checks a registration whose files are known and records it with its
/// event (which fires the rules), or answers the model already registered
/// under its job id with the same files (200, nothing written). Shared by
/// the API and what registers by itself (MLflow's webhook and catch-up).
pub(super) async fn record(
    ctx: &ApiContext,
    draft: ModelDraft,
    created_by: Option<String>,
    signature: Option<serde_json::Value>,
    check: bool,
) -> Result<(StatusCode, Json<json::Model>), Error> {
    let mut model = validate::model(draft).map_err(Error::InvalidModel)?;
    if model.uploaded() {
        pin_uploaded(ctx, &model).await?;
    }
    model.created_by = created_by;
    if let Some(signature) = signature {
        let bytes = match signature {
            serde_json::Value::String(text) => text.into_bytes(),
            bundle => bundle.to_string().into_bytes(),
        };
        model.signature = ctx
            .pipeline
            .trust_in_models()
            .examine(&bytes, &model.files, &db::now());
    }
    // An uploaded model's blobs were checked by `pin_uploaded`.
    if check && !model.uploaded() {
        // A repeat is answered by `repeated` below, source unasked.
        if ctx.db.model_by_job_id(&model.job_id).await?.is_none() {
            ctx.fetcher
                .sources()
                .answer_for(&model)
                .await
                .map_err(|why| {
                    Error::BadRequest(format!("the source does not hold the files: {why}"))
                })?;
        }
    }
    // The event is the registration's own record, in its transaction:
    // rules fire from it, so a crash cannot keep one from them.
    let report = ctx.events.report_model(|row| {
        vec![Event::ModelRegistered {
            model_id: row.id,
            name: row.name.clone(),
            job_id: row.job_id.clone(),
            signed_by: row.signed_by().map(str::to_string),
            by: row.created_by.clone(),
        }]
    });
    let stored = match ctx.db.insert_model_reported(&model, report).await {
        Err(db::Error::DuplicateJob(_)) => return repeated(ctx, &model).await,
        stored => stored?,
    };
    tracing::debug!(
        model_id = stored.id,
        files = stored.files.len(),
        "model recorded"
    );
    Ok((StatusCode::CREATED, Json(stored.into())))
}

/// Pins the blob of every file of `model`, registered as uploaded: each
/// must be in the store, put there by `PUT /v1/blobs/sha256:…`.
async fn pin_uploaded(ctx: &ApiContext, model: &TrainedModel) -> Result<(), Error> {
    let missing = ctx
        .fetcher
        .pin_uploaded(&model.files)
        .await
        .map_err(|e| Error::Internal(format!("pinning uploaded blobs: {e}")))?;
    match missing {
        None => Ok(()),
        Some(file) => Err(Error::BadRequest(format!(
            "file {}: the server's blob store does not hold sha256 {} of {} bytes, and the source \
             upload: has nowhere else to fetch it from; upload it first (berth models push, or \
             PUT /v1/blobs/sha256:…)",
            file.path,
            file.sha256.as_deref().unwrap_or("(none)"),
            file.size_bytes
        ))),
    }
}

/// A registration whose job id is taken: the same files from the same
/// source are the model already there (200, nothing written); anything
/// else is a 409 that names the model and the first difference.
async fn repeated(
    ctx: &ApiContext,
    model: &TrainedModel,
) -> Result<(StatusCode, Json<json::Model>), Error> {
    let Some(existing) = ctx.db.model_by_job_id(&model.job_id).await? else {
        // Deleted since the insert was refused: say so rather than guess.
        return Err(db::Error::DuplicateJob(model.job_id.clone()).into());
    };
    match difference(&existing, model) {
        None => Ok((StatusCode::OK, Json(existing.into()))),
        Some(differs) => Err(Error::Conflict(format!(
            "job id {:?} is registered already as model {} and {differs}; register this one \
             under another job id (--job-id), or delete model {} first",
            model.job_id, existing.id, existing.id
        ))),
    }
}

/// How `new` differs from `existing` in what a model is (its files and
/// source), said for a person; `None` when it does not.
fn difference(existing: &TrainedModel, new: &TrainedModel) -> Option<String> {
    if existing.source != new.source {
        return Some(format!(
            "its source is {:?}, not {:?}",
            existing.source, new.source
        ));
    }
    for file in &new.files {
        match existing.files.iter().find(|f| f.path == file.path) {
            None => return Some(format!("has no file {}", file.path)),
            Some(old) if old.size_bytes != file.size_bytes => {
                return Some(format!(
                    "its {} is {} bytes, not {}",
                    file.path, old.size_bytes, file.size_bytes
                ));
            }
            Some(old) if old.sha256 != file.sha256 => {
                return Some(format!("its {} has other bytes (sha256)", file.path));
            }
            Some(_) => {}
        }
    }
    existing
        .files
        .iter()
        .find(|old| !new.files.iter().any(|f| f.path == old.path))
        .map(|old| format!("has a file {} this one does not", old.path))
}

/// A registration that left its files out, with the files its source
/// holds and the template that finds each. Its other fields are checked
/// first, so that only a valid job id fills in a prefix; what is wrong
/// with a source is said by discovery, and the whole registration is
/// checked again once the files are in.
async fn discovered(ctx: &ApiContext, draft: ModelDraft) -> Result<ModelDraft, Error> {
    let source = draft.source.clone().unwrap_or_default();
    if let Err(Problems(problems)) = validate::model(draft.clone()) {
        let others: Vec<Problem> = problems
            .into_iter()
            .filter(|p| p.field != "source" || source.is_empty())
            .collect();
        if !others.is_empty() {
            return Err(Error::InvalidModel(Problems(others)));
        }
    }
    let job_id = draft.job_id.as_deref().unwrap_or_default();
    let found = ctx
        .fetcher
        .sources()
        .discover(&source, job_id)
        .await
        .map_err(Error::BadRequest)?;
    Ok(fill(draft, found))
}

/// `draft` with the files found at its source, and, for a version of an
/// MLflow registry, where it came from among its params.
pub(super) fn fill(mut draft: ModelDraft, found: Discovered) -> ModelDraft {
    // Params that are no object are refused by the registration rules.
    if let Some(origin) = &found.origin {
        match &mut draft.params {
            None => draft.params = Some(serde_json::Value::Object(origin.params())),
            Some(serde_json::Value::Object(given)) => given.extend(origin.params()),
            Some(_) => {}
        }
    }
    draft.source = Some(found.source);
    draft.files = found
        .files
        .into_iter()
        .map(|f| FileDraft {
            path: Some(f.path),
            size_bytes: Some(f.size_bytes),
            sha256: f.sha256,
        })
        .collect();
    draft
}

/// A registration body checked by the registration rules: the model, or
/// the sentence a 400 answers with. Lists nothing: a body without `files`
/// has none here (`berth plugin run --model` finds its files in a folder,
/// with no server's credentials).
pub(super) fn checked(body: RegisterBody) -> Result<TrainedModel, String> {
    validate::model(draft(body)).map_err(|p| json::invalid_model(&p))
}

/// A registration body as the registration rules take it.
fn draft(body: RegisterBody) -> ModelDraft {
    ModelDraft {
        name: body.name,
        job_id: body.job_id,
        base_model: body.base_model,
        model_size: body.model_size,
        dataset: body.dataset,
        num_examples: body.num_examples,
        num_train_steps: body.num_train_steps,
        final_loss: body.final_loss,
        params: body.params,
        source: body.source,
        files: body
            .files
            .unwrap_or_default()
            .into_iter()
            .map(|f| FileDraft {
                path: f.path,
                size_bytes: f.size_bytes,
                sha256: f.sha256,
            })
            .collect(),
    }
}

/// Every registered model.
#[utoipa::path(get, path = "/v1/models", operation_id = "list_models", tag = "models",
    responses(
        (status = OK, description = "The models, oldest first", body = json::Models),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn list(State(ctx): State<ApiContext>) -> Result<Json<json::Models>, Error> {
    Ok(Json(ctx.db.models().await?.into()))
}

/// One model with its files.
#[utoipa::path(get, path = "/v1/models/{id}", operation_id = "show_model", tag = "models",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The model's id")),
    responses(
        (status = OK, description = "The model", body = json::Model),
        (status = BAD_REQUEST, description = "The id is not a positive integer", body = ErrorBody),
        (status = NOT_FOUND, description = "No such model", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records could not be read", body = ErrorBody),
    ))]
async fn show(State(ctx): State<ApiContext>, Id(id): Id) -> Result<Json<json::Model>, Error> {
    match ctx.db.model(id).await? {
        Some(model) => Ok(Json(model.into())),
        None => Err(Error::no_model(id)),
    }
}

/// Deletes a model: its record, its deployments' records and its local
/// copy of the files.
///
/// Refused (409) while a deployment of it is queued or running.
#[utoipa::path(delete, path = "/v1/models/{id}", operation_id = "delete_model", tag = "models",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The model's id")),
    responses(
        (status = NO_CONTENT, description = "The model, its deployments' records and its files are deleted"),
        (status = BAD_REQUEST, description = "The id is not a positive integer", body = ErrorBody),
        (status = NOT_FOUND, description = "No such model", body = ErrorBody),
        (status = CONFLICT, description = "A deployment of the model is queued or running: nothing is deleted", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records or the files could not be deleted", body = ErrorBody),
    ))]
async fn remove(State(ctx): State<ApiContext>, Id(id): Id) -> Result<StatusCode, Error> {
    ctx.pipeline
        .delete_model(id)
        .await
        .map_err(|e| drop_error(id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Drops a model's local copy of its files; the model stays registered
/// and its next deployment fetches them again.
#[utoipa::path(delete, path = "/v1/models/{id}/files", operation_id = "drop_model_files", tag = "models",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The model's id")),
    responses(
        (status = NO_CONTENT, description = "The local copy is gone (or there was none)"),
        (status = BAD_REQUEST, description = "The id is not a positive integer", body = ErrorBody),
        (status = NOT_FOUND, description = "No such model", body = ErrorBody),
        (status = CONFLICT, description = "A deployment of the model is queued or running: the files stay", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The files could not be deleted", body = ErrorBody),
    ))]
async fn drop_files(State(ctx): State<ApiContext>, Id(id): Id) -> Result<StatusCode, Error> {
    ctx.pipeline
        .drop_files(id)
        .await
        .map_err(|e| drop_error(id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

fn drop_error(id: i64, e: DropError) -> Error {
    match e {
        DropError::UnknownModel(_) => Error::no_model(id),
        DropError::InUse(users) => in_use(id, &users),
        DropError::Db(e) => e.into(),
        DropError::Disk(e) => Error::Internal(e),
    }
}

/// 409 naming the deployments that use the model's files.
fn in_use(id: i64, users: &[i64]) -> Error {
    let (noun, pronoun) = if users.len() == 1 {
        ("deployment", "it ends")
    } else {
        ("deployments", "they end")
    };
    let ids: Vec<String> = users.iter().map(i64::to_string).collect();
    Error::Conflict(format!(
        "model {id} is in use by {noun} {} (queued or running); its files stay until {pronoun}: \
         wait, or cancel (POST /v1/deployments/ID/cancel)",
        ids.join(", ")
    ))
}
