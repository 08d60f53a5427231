//! The fetch's own work on the models volume around the downloads: what is
//! already in place (`verified_in_place`, `vouched`), what is left over
//! (`remove_leftovers`), whether the rest fits (`check_room`), and making
//! it durable (`settle`). These calls wait on the disk, so the fetch runs
//! them on the blocking pool (`blocking`, `holding`), never on the
//! runtime's threads. Never downloads a byte.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::partial::{TEMP_PREFIX, partial_path};
use super::sha::hash_file;
use super::store::blobs::Blobs;
use super::store::lock::DirLock;
use super::store::stamp::{Stamp, Stamps};
use super::{Bookkeeping, Downloaded, Error};
use crate::model::ModelFile;

/// Runs `work`, which waits on the disk, on the blocking pool and waits for
/// it without holding up a runtime thread. A blocking task is cancelled
/// only when the runtime shuts down, which has dropped every fetch by then;
/// a panic goes on unwinding here.
pub(super) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// `blocking`, for work that changes the model directory: the work holds
/// `lock` until it ends, even if the fetch that waits for it is dropped
/// meanwhile (cancelled, timed out), as the writer threads do.
pub(super) async fn holding<T: Send + 'static>(
    lock: &Arc<DirLock>,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let lock = lock.clone();
    blocking(move || {
        let _lock = lock;
        work()
    })
    .await
}

/// A failure of the disk under `dir`, as the fetch reports it.
pub(super) fn disk_error(dir: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Disk {
        dir: dir.display().to_string(),
        reason: e.to_string(),
    }
}

/// Whether the verification record at `stamps` vouches for every file in
/// `dir` as it is now (one `lstat` per file, no byte read); their bytes are
/// then counted as verified by the record.
pub(super) fn vouched(stamps: &Path, dir: &Path, files: &[ModelFile], blobs: &Blobs) -> bool {
    if files.is_empty() {
        return false;
    }
    let record = Stamps::load(stamps);
    let all = files.iter().all(|file| {
        let Some(stamp) = record.get(&file.path) else {
            return false;
        };
        std::fs::symlink_metadata(dir.join(&file.path)).is_ok_and(|meta| {
            meta.is_file()
                && meta.len() == file.size_bytes
                && blobs.vouched(Some(stamp), &meta, file)
        })
    });
    if !all {
        return false;
    }
    for file in files {
        crate::metrics::stamp_verified_bytes(file.size_bytes);
    }
    true
}

/// The bytes downloading the `missing` files adds to the disk: their
/// sizes, less what their kept partials already hold.
pub(super) fn needed(dir: &Path, missing: &[ModelFile]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    missing
        .iter()
        .map(|file| {
            // Blocks, not length: a download in pieces is sparse.
            let kept = std::fs::metadata(partial_path(&dir.join(&file.path)))
                .map_or(0, |m| m.len().min(m.blocks() * 512));
            file.size_bytes.saturating_sub(kept)
        })
        .sum()
}

/// Refuses before downloading what would not fit: the `needed` bytes
/// plus `reserve`.
pub(super) fn check_room(dir: &Path, needed: u64, reserve: u64) -> Result<(), Error> {
    if needed == 0 {
        return Ok(());
    }
    let free = crate::space::free_bytes(dir).map_err(disk_error(dir))?;
    if free >= needed.saturating_add(reserve) {
        return Ok(());
    }
    Err(Error::NoRoom {
        dir: dir.display().to_string(),
        needed,
        free,
        reserve,
    })
}

/// Makes the renames durable and records what verified, then answers for
/// the whole fetch.
pub(super) fn settle(
    dir: &Path,
    books: &Bookkeeping,
    stamps: &Stamps,
    downloaded: Downloaded,
) -> Result<PathBuf, Error> {
    // Once per directory, not once per file.
    for parent in &downloaded.renamed_in {
        sync_dir(parent).map_err(disk_error(dir))?;
    }
    // Also after a failure: the files that did verify need not be hashed
    // again next time.
    if stamps.changed() {
        stamps.save(&books.stamps).map_err(disk_error(dir))?;
    }
    match downloaded.failed {
        Some(e) => Err(e),
        None => {
            // Every file is in place: no checkpoint is worth keeping.
            let _ = std::fs::remove_dir_all(&books.resume);
            Ok(dir.to_path_buf())
        }
    }
}

/// The file's stamp if the copy on disk is already right: trusted from its
/// verification record when that still matches, hashed again otherwise.
pub(super) fn verified_in_place(
    path: &Path,
    file: &ModelFile,
    stamp: Option<Stamp>,
    blobs: &Blobs,
) -> Option<Stamp> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() != file.size_bytes {
        return None;
    }
    let expected = file.sha256.as_deref();
    let vouched = blobs.vouched(stamp.as_ref(), &meta, file);
    if vouched {
        crate::metrics::stamp_verified_bytes(file.size_bytes);
    }
    if vouched || expected.is_none() {
        return Some(Stamp::of(&meta, expected));
    }
    let actual = hash_file(path).ok()?;
    // A file that changed while it was read proves nothing.
    let before = Stamp::of(&meta, expected);
    let after = Stamp::of(&std::fs::symlink_metadata(path).ok()?, expected);
    (Some(actual.as_str()) == expected && before == after).then_some(after)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Removes the `.fetch-*` files under `dir` that no download will continue.
/// Called under the lock, so no other fetch writes here: a `.fetch-*` file
/// is either a missing file's partial download, kept to be continued, or a
/// leftover with nothing to continue.
pub(super) fn remove_leftovers(dir: &Path, missing: &[ModelFile]) {
    let keep: BTreeSet<PathBuf> = missing
        .iter()
        .filter(|file| resumable(file))
        .map(|file| partial_path(&dir.join(&file.path)))
        .collect();
    remove_temp_files(dir, &keep);
}

/// Only a file with a recorded hash is continued: the hash is what catches
/// kept bytes that belong to another version of the file.
fn resumable(file: &ModelFile) -> bool {
    file.sha256.is_some()
}

/// Removes every `.fetch-*` file under `dir` but those in `keep`.
fn remove_temp_files(dir: &Path, keep: &BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_temp_files(&path, keep);
        } else if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX)
            && !keep.contains(&path)
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}
