//! `GET /v1/storage`: the models dir as a scan of it finds it now, with
//! each model's local copy and when it was last deployed. Only reads;
//! dropping a copy is `DELETE /v1/models/{id}/files` (`models`).

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::json::{self, ErrorBody};
use crate::pipeline::copies::DropError;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(show))
}

/// What the models dir holds: bytes on disk, bytes saved by sharing, the
/// blobs pinned by upload, the budget, and each model's local copy (least
/// recently deployed first).
///
/// Scans the models dir (one `lstat` per file, no byte read) at each call.
#[utoipa::path(get, path = "/v1/storage", operation_id = "show_storage", tag = "models",
    responses(
        (status = OK, description = "The models dir and every model's copy", body = json::Storage),
        (status = INTERNAL_SERVER_ERROR, description = "The records or the models dir could not be read", body = ErrorBody),
    ))]
async fn show(State(ctx): State<ApiContext>) -> Result<Json<json::Storage>, Error> {
    let storage = ctx.pipeline.storage().await.map_err(|e| match e {
        DropError::Db(e) => e.into(),
        e => Error::Internal(e.to_string()),
    })?;
    let models = storage
        .models
        .into_iter()
        .map(|copy| json::ModelStorage {
            bytes: copy.dir.bytes,
            id: copy.model.id,
            job_id: copy.model.job_id,
            last_deployed: copy.last_deployed,
            local: copy.local,
            name: copy.model.name,
            shared_bytes: copy.dir.shared_bytes,
        })
        .collect();
    let usage = storage.usage;
    Ok(Json(json::Storage {
        budget_bytes: ctx.models_max_bytes,
        bytes_on_disk: usage.bytes_on_disk,
        bytes_saved: usage.bytes_saved,
        models,
        models_dir: ctx.fetcher.models_dir().display().to_string(),
        pinned_blobs: usage.pinned_blobs,
        pinned_bytes: usage.pinned_bytes,
        unreferenced_blob_bytes: usage.unreferenced_blob_bytes,
    }))
}
