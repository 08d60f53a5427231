//! Adopting a models dir filled before the blob store, or by a server
//! that could not link: each model's files that its verification record
//! still vouches for (no byte read) are put in the store, and a copy of a
//! file the store already holds is replaced by a link, freeing its bytes.
//! Files the record does not vouch for are left for their next fetch,
//! which verifies them. Run in the background when the server starts; a
//! model directory being filled meanwhile is passed over until next time.
//! What an interrupted drop of a copy left renamed aside is removed first.

use std::path::Path;
use std::time::{Duration, Instant};

use super::copy::DROPPING;
use super::disk;
use super::lock::DirLock;
use super::stamp::{self, Stamps};
use super::{Fetcher, META_DIR};
use crate::model::ModelFile;

/// What one adoption did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Model directories gone through.
    pub models: usize,
    /// Files now held by the store (already or newly).
    pub files: usize,
    /// Bytes of copies replaced by links.
    pub freed_bytes: u64,
    /// Model directories passed over because a fetch held them.
    pub busy: usize,
}

/// How long adoption waits for a model directory's lock.
const LOCK_WAIT: Duration = Duration::from_millis(200);

impl Fetcher {
    /// Adopts every model directory that has a verification record, and
    /// logs what it saved.
    pub async fn adopt(&self) -> Adopted {
        let started = Instant::now();
        let models_dir = self.models_dir.clone();
        disk::blocking(move || remove_drops_left(&models_dir)).await;
        let meta = self.models_dir.join(META_DIR);
        let jobs = disk::blocking(move || records_in(&meta)).await;
        let mut adopted = Adopted::default();
        for job_id in jobs {
            let books = self.bookkeeping(&job_id);
            let lock = DirLock::acquire(&books.lock, self.shared_locks.as_deref());
            let Ok(Ok(lock)) = tokio::time::timeout(LOCK_WAIT, lock).await else {
                adopted.busy += 1;
                continue;
            };
            adopted.models += 1;
            let stamps = books.stamps.clone();
            let mut record = disk::blocking(move || Stamps::load(&stamps)).await;
            let dir = self.dir_of(&job_id);
            let hashed: Vec<(String, String)> = record
                .hashed()
                .map(|(path, hex)| (path.to_string(), hex.to_string()))
                .collect();
            for (path, hex) in hashed {
                let file = dir.join(&path);
                let kept = record.get(&path).cloned();
                let blobs = self.blobs.clone();
                let vouched = disk::blocking({
                    let (file, hex) = (file.clone(), hex.clone());
                    move || vouched_for(&file, &path, &hex, kept, &blobs).then_some(path)
                })
                .await;
                let Some(path) = vouched else { continue };
                let Ok(digest) =
                    DirLock::acquire(&self.blobs.lock_path(&hex), self.shared_locks.as_deref())
                        .await
                else {
                    continue;
                };
                let blobs = self.blobs.clone();
                let done = disk::blocking(move || {
                    let _digest = digest;
                    blobs.adopt(&hex, &file)
                })
                .await;
                if let Some((stamp, freed)) = done {
                    record.insert(&path, stamp);
                    adopted.files += 1;
                    adopted.freed_bytes += freed;
                }
            }
            if record.changed() {
                let stamps = books.stamps.clone();
                let _ = disk::blocking(move || record.save(&stamps)).await;
            }
            drop(lock);
        }
        if adopted.files > 0 || adopted.busy > 0 {
            tracing::info!(
                models = adopted.models,
                files = adopted.files,
                freed_bytes = adopted.freed_bytes,
                passed_over = adopted.busy,
                took = %crate::human::duration(started.elapsed()),
                "the models dir's verified files are in the blob store; copies of one file were replaced by links"
            );
        }
        adopted
    }
}

/// Removes what drops of a copy cut short left renamed aside (a kill
/// during an eviction): no record vouches for it, nothing reads it.
fn remove_drops_left(models_dir: &Path) {
    for dir in [models_dir.to_path_buf(), models_dir.join(META_DIR)] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(DROPPING) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// The job ids that have a verification record.
fn records_in(meta: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(meta) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().to_string();
            name.strip_suffix(".stamps.json").map(str::to_string)
        })
        .collect()
}

/// Whether the file is as its record (or its blob's stamp) last saw it.
fn vouched_for(
    file: &Path,
    path: &str,
    hex: &str,
    stamp: Option<stamp::Stamp>,
    blobs: &super::blobs::Blobs,
) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(file) else {
        return false;
    };
    let recorded = ModelFile {
        path: path.to_string(),
        size_bytes: meta.len(),
        sha256: Some(hex.to_string()),
    };
    meta.is_file() && stamp::vouched(stamp.as_ref(), &meta, &recorded, blobs)
}
