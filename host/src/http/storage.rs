//! `GET /v1/storage`: the models dir as a scan of it finds it now, with
//! each model's local copy and when it was last deployed. Only reads;
//! dropping a copy is `DELETE /v1/models/{id}/files` (`models`).

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::json::{self, ErrorBody};
use crate::model::TrainedModel;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(show))
}

/// What the models dir holds: bytes on disk, bytes saved by sharing, the
/// budget, and each model's local copy (least recently deployed first).
///
/// Scans the models dir (one `lstat` per file, no byte read) at each call.
#[utoipa::path(get, path = "/v1/storage", operation_id = "show_storage", tag = "models",
    responses(
        (status = OK, description = "The models dir and every model's copy", body = json::Storage),
        (status = INTERNAL_SERVER_ERROR, description = "The records or the models dir could not be read", body = ErrorBody),
    ))]
async fn show(State(ctx): State<ApiContext>) -> Result<Json<json::Storage>, Error> {
    let fetcher = ctx.pipeline.fetcher().clone();
    let (models, order, usage) = tokio::try_join!(
        async { ctx.db.models().await.map_err(Error::from) },
        async { ctx.db.models_by_last_deployed().await.map_err(Error::from) },
        async {
            fetcher
                .usage()
                .await
                .map_err(|e| Error::Internal(format!("scanning the models dir: {e}")))
        },
    )?;
    // Reads each model's verification record and lstats its files: off the
    // runtime's threads.
    let models_dir = fetcher.models_dir().display().to_string();
    let local: HashMap<i64, (TrainedModel, bool)> = tokio::task::spawn_blocking(move || {
        models
            .into_iter()
            .map(|m| {
                let local = fetcher.verified(&m).is_some();
                (m.id, (m, local))
            })
            .collect()
    })
    .await
    .map_err(|e| Error::Internal(format!("checking the models' copies: {e}")))?;
    let models = order
        .into_iter()
        .filter_map(|last| {
            // A model registered between the two reads is in one only.
            let (model, local) = local.get(&last.model_id)?;
            let dir = usage.dirs.get(&model.job_id).copied().unwrap_or_default();
            Some(json::ModelStorage {
                bytes: dir.bytes,
                id: model.id,
                job_id: model.job_id.clone(),
                last_deployed: last.last_deployed,
                local: *local,
                name: model.name.clone(),
                shared_bytes: dir.shared_bytes,
            })
        })
        .collect();
    Ok(Json(json::Storage {
        budget_bytes: ctx.models_max_bytes,
        bytes_on_disk: usage.bytes_on_disk,
        bytes_saved: usage.bytes_saved,
        models,
        models_dir,
        unreferenced_blob_bytes: usage.unreferenced_blob_bytes,
    }))
}
