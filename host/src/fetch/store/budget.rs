//! The disk budget of the models dir (`--models-max-gib`): before a fetch
//! downloads, the bytes it needs must fit under the budget with everything
//! on disk (each inode once) and what other fetches of this process have
//! claimed. If they do not, blobs no model links are removed first, then
//! the local copies of other models, least recently deployed first, as the
//! `Reclaim` (which knows the database and its pins) chooses. A fetch that
//! cannot fit even then fails before downloading, with the numbers.
//!
//! One fetch of the process decides at a time (`turn`); servers sharing a
//! volume each keep their own budget of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use super::lock::DirLock;
use super::usage;
use crate::fetch::disk::{self, disk_error};
use crate::fetch::{Error, Fetcher};

/// Frees space by dropping one model's local copy: the one deployed least
/// recently that no queued or running deployment uses, never `keep`.
pub trait Reclaim: Send + Sync {
    /// The bytes freed, or `None` when no copy may be dropped.
    fn drop_one<'a>(&'a self, keep: &'a str) -> BoxFuture<'a, Option<u64>>;
}

/// The budget and what enforces it.
#[derive(Clone)]
pub(in crate::fetch) struct Budget {
    max_bytes: u64,
    reclaim: Arc<dyn Reclaim>,
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Bytes claimed by fetches of this process still downloading.
    claimed: Arc<AtomicU64>,
}

/// Bytes a fetch may download, held until it ends.
pub(in crate::fetch) struct Claim {
    bytes: u64,
    claimed: Arc<AtomicU64>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claimed.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Fetcher {
    /// Keeps the models dir under `max_bytes`, dropping copies that
    /// `reclaim` chooses to make room.
    pub fn budget(mut self, max_bytes: u64, reclaim: Arc<dyn Reclaim>) -> Self {
        self.budget = Some(Budget {
            max_bytes,
            reclaim,
            turn: Arc::default(),
            claimed: Arc::default(),
        });
        self
    }

    /// Makes room under the budget for `needed` more bytes of the model
    /// `job_id`, whose own copy is never dropped. `None` without a budget.
    pub(in crate::fetch) async fn claim(
        &self,
        job_id: &str,
        needed: u64,
    ) -> Result<Option<Claim>, Error> {
        let Some(budget) = &self.budget else {
            return Ok(None);
        };
        if needed == 0 {
            return Ok(None);
        }
        let dir = self.dir_of(job_id);
        if needed > budget.max_bytes {
            return Err(Error::LargerThanBudget {
                dir: dir.display().to_string(),
                needed,
                budget: budget.max_bytes,
            });
        }
        let _turn = budget.turn.lock().await;
        loop {
            let scan = disk::blocking({
                let models_dir = self.models_dir.clone();
                move || usage::scan(&models_dir)
            })
            .await
            .map_err(disk_error(&dir))?;
            let used = scan.bytes_on_disk + budget.claimed.load(Ordering::Relaxed);
            if used.saturating_add(needed) <= budget.max_bytes {
                budget.claimed.fetch_add(needed, Ordering::Relaxed);
                return Ok(Some(Claim {
                    bytes: needed,
                    claimed: budget.claimed.clone(),
                }));
            }
            if scan.unreferenced_blob_bytes > 0 && self.sweep().await > 0 {
                continue;
            }
            if budget.reclaim.drop_one(job_id).await.is_none() {
                return Err(Error::OverBudget {
                    dir: dir.display().to_string(),
                    needed,
                    used,
                    budget: budget.max_bytes,
                });
            }
        }
    }

    /// Removes the blobs no model links; answers the bytes freed. Each is
    /// checked again under its digest's lock, so a blob a fetch is linking
    /// meanwhile stays.
    pub async fn sweep(&self) -> u64 {
        let blobs = self.blobs.clone();
        let unreferenced = disk::blocking(move || blobs.unreferenced()).await;
        let mut freed = 0;
        for hex in unreferenced {
            let Ok(digest) =
                DirLock::acquire(&self.blobs.lock_path(&hex), self.shared_locks.as_deref()).await
            else {
                continue;
            };
            let blobs = self.blobs.clone();
            freed += disk::blocking(move || {
                let _digest = digest;
                blobs.sweep(&hex)
            })
            .await;
        }
        if freed > 0 {
            tracing::info!(freed_bytes = freed, "removed blobs no model links");
        }
        freed
    }
}
