//! Dropping a model's local copy: its directory, verification record and
//! interrupted downloads, under the directory's lock (`DirLock`, shared
//! with every server on the volume) so no fetch fills it meanwhile. The
//! caller decides whether any deployment still uses the copy (the database
//! knows); this module only removes, and in an order that never leaves a
//! record vouching for files that are gone: the record first, then the
//! files, renamed out of sight before they are deleted. A file linked from
//! the blob store is unlinked under its digest's lock, and the blob goes
//! too once no other model links it.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::blobs::Blobs;
use super::lock::{DirLock, SharedLocks};
use super::stamp::Stamps;
use crate::fetch::{Bookkeeping, Fetcher, disk};

/// A model directory held for dropping.
pub struct HeldCopy {
    _lock: DirLock,
    dir: PathBuf,
    books: Bookkeeping,
    /// The verification record as it was when the lock was taken: which
    /// files are links of which blobs.
    record: Stamps,
    blobs: Blobs,
    shared_locks: Option<Arc<dyn SharedLocks>>,
}

impl Fetcher {
    /// Waits for `job_id`'s directory lock: while held, no fetch on any
    /// server sharing the volume fills or checks that directory.
    pub async fn hold_copy(&self, job_id: &str) -> std::io::Result<HeldCopy> {
        let books = self.bookkeeping(job_id);
        let lock = DirLock::acquire(&books.lock, self.shared_locks.as_deref()).await?;
        let record = disk::blocking({
            let stamps = books.stamps.clone();
            move || Stamps::load(&stamps)
        })
        .await;
        Ok(HeldCopy {
            _lock: lock,
            dir: self.dir_of(job_id),
            books,
            record,
            blobs: self.blobs.clone(),
            shared_locks: self.shared_locks.clone(),
        })
    }
}

impl HeldCopy {
    /// Forgets the verification record: a deployment starting now checks
    /// the files (and, once they are gone, fetches them) instead of trusting
    /// the record without the lock.
    pub async fn forget(&self) -> std::io::Result<()> {
        let stamps = self.books.stamps.clone();
        disk::blocking(move || remove_file_if_any(&stamps)).await
    }

    /// Removes the files and the checkpoints of interrupted downloads;
    /// answers the bytes freed. The directory is renamed aside first, so a
    /// removal that stops halfway leaves no half model under its name.
    pub async fn remove(self) -> std::io::Result<u64> {
        let dir = self.dir.clone();
        let mut freed = 0;
        if let Some(aside) = disk::blocking(move || rename_aside(&dir)).await? {
            for (path, hex) in self.record.hashed() {
                let digest =
                    DirLock::acquire(&self.blobs.lock_path(hex), self.shared_locks.as_deref())
                        .await?;
                let (blobs, hex, path) = (self.blobs.clone(), hex.to_string(), aside.join(path));
                freed += disk::blocking(move || {
                    let _digest = digest;
                    // Already gone: nothing to free.
                    blobs.unlink(&hex, &path).unwrap_or(0)
                })
                .await;
            }
            freed += disk::blocking(move || remove_aside(&aside)).await?;
        }
        let resume = self.books.resume.clone();
        freed += disk::blocking(move || {
            rename_aside(&resume)?.map_or(Ok(0), |aside| remove_aside(&aside))
        })
        .await?;
        drop(self);
        Ok(freed)
    }
}

fn remove_file_if_any(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The start of the name a copy being dropped is renamed to.
pub(in crate::fetch) const DROPPING: &str = ".dropping-";

/// Renames `path` to a hidden name beside it, where no fetch or
/// deployment looks; `None` if it was absent.
fn rename_aside(path: &Path) -> std::io::Result<Option<PathBuf>> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let aside = path.with_file_name(format!("{DROPPING}{name}-{}", std::process::id()));
    match std::fs::rename(path, &aside) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        other => other.map(|()| Some(aside)),
    }
}

/// Deletes the tree renamed aside; answers the bytes this frees.
fn remove_aside(aside: &Path) -> std::io::Result<u64> {
    let bytes = size_of_tree(aside);
    std::fs::remove_dir_all(aside)?;
    Ok(bytes)
}

/// The bytes of the regular files under `path` that no other name links,
/// links not followed.
fn size_of_tree(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return if meta.nlink() == 1 { meta.len() } else { 0 };
    }
    if !meta.is_dir() {
        return 0;
    }
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| size_of_tree(&e.path())).sum())
        .unwrap_or_default()
}
