//! Models' local copies, dropped only when no deployment uses them: asked
//! to (`DELETE /v1/models/{id}/files`, deleting a model) or to keep the
//! models dir under its budget (`Evict`, the least recently deployed
//! first). A queued or running deployment pins its model's copy; the
//! database is asked before the copy's verification record is forgotten and
//! again after, under the directory's lock, so a deployment that started
//! between the two either is seen or cannot trust the record and waits for
//! the lock. On PostgreSQL the pins of every server are seen.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::db::{self, Db};
use crate::fetch::{Fetcher, HeldCopy, Reclaim};

/// Why a copy was not dropped.
#[derive(Debug, thiserror::Error)]
pub enum DropError {
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
pub async fn hold_unused(
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
pub async fn remove(held: HeldCopy, model_id: i64, job_id: &str) -> Result<u64, DropError> {
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
