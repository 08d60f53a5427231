//! Dropping a model's local copy: its directory, verification record and
//! interrupted downloads, under the directory's lock (`DirLock`, shared
//! with every server on the volume) so no fetch fills it meanwhile. The
//! caller decides whether any deployment still uses the copy (the database
//! knows); this module only removes, and in an order that never leaves a
//! record vouching for files that are gone: the record first, then the
//! files, renamed out of sight before they are deleted.

use std::path::{Path, PathBuf};

use super::lock::DirLock;
use super::{Bookkeeping, Fetcher, disk};

/// A model directory held for dropping.
pub struct HeldCopy {
    _lock: DirLock,
    dir: PathBuf,
    books: Bookkeeping,
}

impl Fetcher {
    /// Waits for `job_id`'s directory lock: while held, no fetch on any
    /// server sharing the volume fills or checks that directory.
    pub async fn hold_copy(&self, job_id: &str) -> std::io::Result<HeldCopy> {
        let books = self.bookkeeping(job_id);
        let lock = DirLock::acquire(&books.lock, self.shared_locks.as_deref()).await?;
        Ok(HeldCopy {
            _lock: lock,
            dir: self.dir_of(job_id),
            books,
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
        let (dir, resume) = (self.dir.clone(), self.books.resume.clone());
        let freed = disk::blocking(move || {
            let mut freed = 0;
            for path in [dir, resume] {
                freed += remove_tree(&path)?;
            }
            Ok::<_, std::io::Error>(freed)
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

/// Renames `path` to a hidden name beside it and deletes that tree;
/// answers the bytes of the regular files it held (0 if it was absent).
fn remove_tree(path: &Path) -> std::io::Result<u64> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let aside = path.with_file_name(format!(".dropping-{name}-{}", std::process::id()));
    match std::fs::rename(path, &aside) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        other => other?,
    }
    let bytes = size_of_tree(&aside);
    std::fs::remove_dir_all(&aside)?;
    Ok(bytes)
}

/// The bytes of the regular files under `path`, links not followed.
fn size_of_tree(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0;
    }
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| size_of_tree(&e.path())).sum())
        .unwrap_or_default()
}
