//! Adopting a models dir filled before the blob store, or by a server
//! that could not link: each model's files that its verification record
//! still vouches for (no byte read) are put in the store, and a copy of a
//! file the store already holds is replaced by a link, freeing its bytes.
//! Files the record does not vouch for are left for their next fetch,
//! which verifies them. Run in the background when the server starts; a
//! model directory being filled meanwhile is passed over until next time.
//! What an interrupted drop of a copy left renamed aside is removed first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::blobs::{Blobs, same_inode};
use super::copy::DROPPING;
use super::lock::DirLock;
use super::stamp::{Stamp, Stamps};
use crate::fetch::disk;
use crate::fetch::{Fetcher, META_DIR};
use crate::model::ModelFile;

/// What one adoption did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Model directories gone through.
    pub models: usize,
    /// Files now held by the store (already or newly).
    pub files: usize,
    /// Of those, the ones this adoption put there.
    pub newly: usize,
    /// Bytes of copies replaced by links.
    pub freed_bytes: u64,
    /// Model directories passed over because a fetch held them.
    pub busy: usize,
}

/// How long adoption waits for a model directory's lock.
const LOCK_WAIT: Duration = Duration::from_millis(200);

/// Files of one model put in the store at once: each is a few metadata
/// writes, and their waits overlap.
const ADOPTING: usize = 8;

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
            let (blobs, stamps, dir) = (
                self.blobs.clone(),
                books.stamps.clone(),
                self.dir_of(&job_id),
            );
            let (mut record, todo, done) =
                disk::blocking(move || to_adopt(&blobs, &stamps, &dir)).await;
            adopted.files += done;
            let adopting = futures::stream::iter(todo)
                .map(|(path, hex, file)| async move {
                    let digest =
                        DirLock::acquire(&self.blobs.lock_path(&hex), self.shared_locks.as_deref())
                            .await
                            .ok()?;
                    let blobs = self.blobs.clone();
                    let done = disk::blocking(move || {
                        let _digest = digest;
                        blobs.adopt(&hex, &file)
                    })
                    .await;
                    done.map(|(stamp, freed)| (path, stamp, freed))
                })
                .buffer_unordered(ADOPTING);
            let mut adopting = std::pin::pin!(adopting);
            while let Some(done) = adopting.next().await {
                if let Some((path, stamp, freed)) = done {
                    record.insert(&path, stamp);
                    adopted.files += 1;
                    adopted.newly += 1;
                    adopted.freed_bytes += freed;
                }
            }
            if record.changed() {
                let stamps = books.stamps.clone();
                let _ = disk::blocking(move || record.save(&stamps)).await;
            }
            drop(lock);
        }
        if adopted.newly > 0 || adopted.busy > 0 {
            tracing::info!(
                models = adopted.models,
                files = adopted.newly,
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

/// The model directory's record, the files to put in the store (path,
/// sha256, where), and how many are in it already: of the files with a
/// sha256, those the record (or the blob's stamp) still vouches for and
/// that are not the blob's inode yet. One `lstat` or two per file.
fn to_adopt(
    blobs: &Blobs,
    stamps: &Path,
    dir: &Path,
) -> (Stamps, Vec<(String, String, PathBuf)>, usize) {
    let record = Stamps::load(stamps);
    let mut todo = Vec::new();
    let mut done = 0;
    for (path, hex) in record.hashed() {
        let file = dir.join(path);
        let Ok(meta) = std::fs::symlink_metadata(&file) else {
            continue;
        };
        let linked =
            std::fs::symlink_metadata(blobs.path(hex)).is_ok_and(|blob| same_inode(&blob, &meta));
        if linked {
            done += 1;
        } else if vouched_for(&meta, path, hex, record.get(path), blobs) {
            todo.push((path.to_string(), hex.to_string(), file));
        }
    }
    (record, todo, done)
}

/// Whether the file is as its record (or its blob's stamp) last saw it.
fn vouched_for(
    meta: &std::fs::Metadata,
    path: &str,
    hex: &str,
    stamp: Option<&Stamp>,
    blobs: &Blobs,
) -> bool {
    let recorded = ModelFile {
        path: path.to_string(),
        size_bytes: meta.len(),
        sha256: Some(hex.to_string()),
        format: None,
    };
    meta.is_file() && blobs.vouched(stamp, meta, &recorded)
}
