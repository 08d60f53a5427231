//! Models' local copies, dropped only when no deployment uses them: asked
//! to (`DELETE /v1/models/{id}/files`, deleting a model) or to keep the
//! models dir under its budget (`Evict`, the least recently deployed
//! first). A queued or running deployment pins its model's copy; the
//! database is asked before the copy's verification record is forgotten and
//! again after, under the directory's lock, so a deployment that started
//! between the two either is seen or cannot trust the record and waits for
//! the lock. On PostgreSQL the pins of every server are seen. Deleting an
//! uploaded model unpins its blobs that no other uploaded model records.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::db::{self, Db};
use crate::fetch::usage::{DirUsage, Usage};
use crate::fetch::{Fetcher, HeldCopy, Reclaim};
use crate::model::TrainedModel;

use super::Pipeline;

/// The models dir as a scan of it finds it now, with each model's copy,
/// least recently deployed first.
pub struct Storage {
    pub usage: Usage,
    pub models: Vec<ModelCopy>,
}

/// A model, when it was last deployed, whether its copy is whole and
/// verified here, and what its directory holds.
pub struct ModelCopy {
    pub model: TrainedModel,
    /// RFC 3339; none if never deployed.
    pub last_deployed: Option<String>,
    pub local: bool,
    pub dir: DirUsage,
}

impl Pipeline {
    /// Deletes model `id`, its deployments' records and its local copy,
    /// once no deployment of it is queued or running; answers the bytes
    /// freed. The copy is held first, so no fetch fills it meanwhile.
    pub async fn delete_model(&self, id: i64) -> Result<u64, DropError> {
        let (model, held) = self.held_copy(id).await?;
        if !self.db.delete_model(id).await? {
            return Err(DropError::UnknownModel(id));
        }
        let freed = remove(held, id, &model.job_id).await?;
        if model.uploaded() {
            self.unpin_unused(&model).await?;
        }
        tracing::info!(
            model_id = id,
            freed_bytes = freed,
            "model deleted, with its local copy"
        );
        Ok(freed)
    }

    /// Unpins the blobs of `deleted`, an uploaded model, that no other
    /// uploaded model records: the next sweep may take them.
    async fn unpin_unused(&self, deleted: &TrainedModel) -> Result<(), DropError> {
        let kept: HashSet<String> = self
            .db
            .models()
            .await?
            .into_iter()
            .filter(TrainedModel::uploaded)
            .flat_map(|m| m.files.into_iter().filter_map(|f| f.sha256))
            .collect();
        let unused: HashSet<String> = deleted
            .files
            .iter()
            .filter_map(|f| f.sha256.clone())
            .filter(|sha256| !kept.contains(sha256))
            .collect();
        self.fetcher.unpin(unused).await.map_err(|e| {
            DropError::Disk(format!(
                "unpinning the uploaded files of model {}: {e}",
                deleted.id
            ))
        })
    }

    /// Model `id` and its copy, held once no deployment uses it.
    async fn held_copy(&self, id: i64) -> Result<(TrainedModel, HeldCopy), DropError> {
        let model = self
            .db
            .model(id)
            .await?
            .ok_or(DropError::UnknownModel(id))?;
        let held = hold_unused(&self.db, &self.fetcher, id, &model.job_id).await?;
        Ok((model, held))
    }

    /// The models dir and every model's copy, least recently deployed
    /// first (one `lstat` per file, no byte read).
    pub async fn storage(&self) -> Result<Storage, DropError> {
        let fetcher = self.fetcher.as_ref().clone();
        let (models, order, usage) = tokio::try_join!(
            async { self.db.models().await.map_err(DropError::from) },
            async {
                self.db
                    .models_by_last_deployed()
                    .await
                    .map_err(DropError::from)
            },
            async {
                fetcher
                    .usage()
                    .await
                    .map_err(|e| DropError::Disk(format!("scanning the models dir: {e}")))
            },
        )?;
        // Reads each model's verification record and lstats its files:
        // off the runtime's threads.
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
        .map_err(|e| DropError::Disk(format!("checking the models' copies: {e}")))?;
        let models = order
            .into_iter()
            .filter_map(|last| {
                // A model registered between the two reads is in one only.
                let (model, local) = local.get(&last.model_id)?;
                Some(ModelCopy {
                    dir: usage.dirs.get(&model.job_id).copied().unwrap_or_default(),
                    model: model.clone(),
                    last_deployed: last.last_deployed,
                    local: *local,
                })
            })
            .collect();
        Ok(Storage { usage, models })
    }

    /// Drops model `id`'s local copy once no deployment of it is queued
    /// or running; it stays registered, and its next deployment fetches
    /// the files again. Answers the bytes freed.
    pub async fn drop_files(&self, id: i64) -> Result<u64, DropError> {
        let (model, held) = self.held_copy(id).await?;
        let freed = remove(held, id, &model.job_id).await?;
        tracing::info!(
            model_id = id,
            freed_bytes = freed,
            "model's local copy dropped"
        );
        Ok(freed)
    }
}

/// Why a copy (or a model) was not dropped.
#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error("model {0} does not exist")]
    UnknownModel(i64),
    /// The queued or running deployments that use it.
    #[error("in use by deployments {0:?}")]
    InUse(Vec<i64>),
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error("{0}")]
    Disk(String),
}

/// The model's copy, held so that no fetch fills it, once no deployment
/// of it is queued or running.
async fn hold_unused(
    db: &Db,
    fetcher: &Fetcher,
    model_id: i64,
    job_id: &str,
) -> Result<HeldCopy, DropError> {
    let held = fetcher
        .hold_copy(job_id)
        .await
        .map_err(|e| DropError::Disk(format!("locking the files of model {model_id}: {e}")))?;
    in_use(db, model_id).await?;
    held.forget().await.map_err(|e| {
        DropError::Disk(format!(
            "forgetting the verification record of model {model_id}: {e}"
        ))
    })?;
    in_use(db, model_id).await?;
    Ok(held)
}

async fn in_use(db: &Db, model_id: i64) -> Result<(), DropError> {
    let users = db.unfinished_of(model_id).await?;
    match users.is_empty() {
        true => Ok(()),
        false => Err(DropError::InUse(users)),
    }
}

/// Removes a held copy; answers the bytes freed.
async fn remove(held: HeldCopy, model_id: i64, job_id: &str) -> Result<u64, DropError> {
    held.remove().await.map_err(|e| {
        DropError::Disk(format!(
            "deleting the files of model {model_id} ({job_id}): {e}"
        ))
    })
}

/// Drops copies to keep the models dir under its budget.
pub struct Evict {
    db: Db,
    /// The fetcher without a budget: the one that evicts does not hold
    /// itself.
    fetcher: Fetcher,
}

impl Evict {
    pub fn new(db: Db, fetcher: Fetcher) -> Self {
        Self { db, fetcher }
    }

    /// Drops the copy of `model_id` if nothing pins it; answers the bytes
    /// freed. A directory whose lock is not free soon is being filled or
    /// dropped by someone else: it is passed over, never waited for, so
    /// two fetches making room never wait on each other.
    async fn drop_if_unused(&self, model_id: i64, job_id: &str) -> Option<u64> {
        let held = tokio::time::timeout(
            LOCK_WAIT,
            hold_unused(&self.db, &self.fetcher, model_id, job_id),
        )
        .await
        .ok()?
        .ok()?;
        match remove(held, model_id, job_id).await {
            Ok(freed) => Some(freed),
            Err(e) => {
                tracing::warn!(
                    model_id,
                    job_id,
                    "could not drop a model's copy to keep the budget: {e}"
                );
                None
            }
        }
    }
}

/// How long eviction waits for a model directory's lock.
const LOCK_WAIT: Duration = Duration::from_secs(2);

impl Reclaim for Evict {
    fn drop_one<'a>(&'a self, keep: &'a str) -> BoxFuture<'a, Option<u64>> {
        Box::pin(async move {
            let order = match self.db.models_by_last_deployed().await {
                Ok(order) => order,
                Err(e) => {
                    tracing::warn!(
                        "cannot read which models were deployed last, so none is dropped to keep the budget: {e}"
                    );
                    return None;
                }
            };
            for model in order {
                if model.job_id == keep || !self.fetcher.dir_of(&model.job_id).exists() {
                    continue;
                }
                if let Some(freed) = self.drop_if_unused(model.model_id, &model.job_id).await {
                    crate::metrics::model_copy_evicted();
                    tracing::info!(
                        model_id = model.model_id,
                        job_id = model.job_id,
                        last_deployed = ?model.last_deployed,
                        freed_bytes = freed,
                        "dropped the local copy of the model deployed least recently, to keep the models dir under --models-max-gib"
                    );
                    return Some(freed);
                }
            }
            None
        })
    }
}
