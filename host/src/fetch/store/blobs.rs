//! The blob store: every verified file with a recorded sha256 is kept once,
//! at `<models dir>/.blobs/sha256/<2 hex>/<hex>`, and each model directory
//! holds it by hard link. A file any model holds is linked into the next
//! model instead of downloaded, and shared bytes are on disk once.
//!
//! A blob's name is only ever given an inode whose bytes were verified, by
//! link or rename, never written in place. Making or removing a link
//! changes the inode's ctime, which every verification stamp includes, so
//! each blob has a stamp of its own (`.berth/blobs/<hex>.stamp`), taken
//! again after each link berth makes or removes: a model's file is vouched
//! for by its own stamp or by its blob's. A blob whose stamp does not match
//! is hashed before it is linked anywhere; one whose bytes are wrong is
//! removed with every model's link of it (`condemn`). A blob is read-only
//! (0444), so no model's file of it is edited in place by mistake.
//!
//! Every change to a blob's links is made under the digest's lock
//! (`.berth/blobs/<hex>.lock`, a `DirLock`, shared with every server on the
//! volume), taken while a model directory's lock is held, never the other
//! way round. The functions here run under it, on the blocking pool.
//!
//! A models dir that cannot hard-link (`.blobs` on another filesystem, a
//! filesystem without hard links, an inode at its link limit) keeps one
//! copy per model, as before the store: berth says so once in its log.
//!
//! A blob that came by upload (`upload`) has no source to fetch it again
//! from, so it is *pinned*: one more link of its inode at
//! `.blobs/pins/<hex>`. A pinned blob is never unreferenced (its links are
//! at least two), so neither a sweep nor the unlink of a model's last copy
//! removes it; only `unpin` (its models deleted) or damage (`condemn`) do.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::stamp::{Stamp, Stamps};
use crate::fetch::partial::{TEMP_PREFIX, short_name};
use crate::fetch::sha::hash_file;
use crate::fetch::{BLOBS_DIR, META_DIR};
use crate::model::ModelFile;

/// Where the blobs of one models dir live.
#[derive(Clone, Debug)]
pub(in crate::fetch) struct Blobs {
    models_dir: PathBuf,
    /// `.blobs/sha256`: the blobs, by digest.
    files: PathBuf,
    /// `.berth/blobs`: their stamps and locks.
    books: PathBuf,
    /// `.blobs/pins`: a second link of each pinned blob.
    pins: PathBuf,
}

impl Blobs {
    pub(in crate::fetch) fn new(models_dir: &Path) -> Self {
        Self {
            models_dir: models_dir.to_path_buf(),
            files: models_dir.join(BLOBS_DIR).join("sha256"),
            books: models_dir.join(META_DIR).join("blobs"),
            pins: models_dir.join(BLOBS_DIR).join(PINS),
        }
    }

    fn pin_path(&self, hex: &str) -> PathBuf {
        self.pins.join(hex)
    }

    pub(in crate::fetch) fn path(&self, hex: &str) -> PathBuf {
        self.files.join(hex.get(..2).unwrap_or("__")).join(hex)
    }

    fn stamp_path(&self, hex: &str) -> PathBuf {
        self.books.join(format!("{hex}.stamp"))
    }

    /// The digest's lock file.
    pub(in crate::fetch) fn lock_path(&self, hex: &str) -> PathBuf {
        self.books.join(format!("{hex}.lock"))
    }

    /// Whether `meta`, read from a link of the blob `hex`, is the inode as
    /// berth left it after its last link or check. One small read, no byte
    /// of the blob.
    pub(in crate::fetch) fn vouches(&self, hex: &str, meta: &std::fs::Metadata) -> bool {
        std::fs::read(self.stamp_path(hex))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Stamp>(&bytes).ok())
            .is_some_and(|stamp| stamp.vouches_for(meta, Some(hex)))
    }

    /// Whether `meta`, the file at `file`'s path, holds the bytes last
    /// verified: its own `stamp` says so, or, when berth has since linked
    /// the inode elsewhere (changing its ctime), its blob's stamp does.
    pub(in crate::fetch) fn vouched(
        &self,
        stamp: Option<&Stamp>,
        meta: &std::fs::Metadata,
        file: &ModelFile,
    ) -> bool {
        let sha256 = file.sha256.as_deref();
        stamp.is_some_and(|s| s.vouches_for(meta, sha256))
            || sha256.is_some_and(|hex| self.vouches(hex, meta))
    }

    /// Whether a blob of `hex` exists at all (one `lstat`).
    pub(in crate::fetch) fn has(&self, hex: &str) -> bool {
        std::fs::symlink_metadata(self.path(hex)).is_ok_and(|m| m.is_file())
    }

    /// Under the digest's lock: links the blob `hex` in at `target`,
    /// replacing whatever the name held in one rename, and answers the
    /// file's stamp. `None` when there is no intact blob of `size` bytes
    /// or it cannot be linked there; then the file is downloaded.
    pub(in crate::fetch) fn link_into(&self, hex: &str, size: u64, target: &Path) -> Option<Stamp> {
        let blob = self.path(hex);
        let meta = self.intact(hex)?;
        if meta.len() != size {
            return None;
        }
        let parent = target.parent()?;
        std::fs::create_dir_all(parent).ok()?;
        let name = target.file_name()?.to_string_lossy();
        let tmp = parent.join(format!(
            "{TEMP_PREFIX}{}.{}.link",
            short_name(&name),
            unique()
        ));
        if let Err(e) = std::fs::hard_link(&blob, &tmp) {
            cannot_link(&blob, parent, &e);
            return None;
        }
        if std::fs::rename(&tmp, target).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return None;
        }
        // A blob an older berth kept writable.
        read_only(&blob);
        self.restamp(hex)
    }

    /// Under the digest's lock: makes `file`, verified as `hex` just now,
    /// the blob (or leaves it alone if it already is), and answers the
    /// file's stamp after the link. A name holding another inode is
    /// replaced in one rename: the verified bytes win.
    pub(in crate::fetch) fn keep(&self, hex: &str, file: &Path) -> Option<Stamp> {
        let blob = self.path(hex);
        let ours = std::fs::symlink_metadata(file).ok()?;
        let linked = match std::fs::symlink_metadata(&blob) {
            Ok(theirs) if same_inode(&ours, &theirs) => Ok(()),
            Ok(_) => {
                let tmp = blob.with_file_name(format!(".{hex}.{}", unique()));
                std::fs::hard_link(file, &tmp).and_then(|()| {
                    std::fs::rename(&tmp, &blob).inspect_err(|_| {
                        let _ = std::fs::remove_file(&tmp);
                    })
                })
            }
            Err(_) => std::fs::create_dir_all(blob.parent()?)
                .and_then(|()| std::fs::hard_link(file, &blob)),
        };
        if let Err(e) = linked {
            cannot_link(file, &self.files, &e);
            return None;
        }
        read_only(&blob);
        self.restamp(hex)
    }

    /// Under the digest's lock: puts `file`, verified as `hex`, in the
    /// store: when the store has the digest already, the blob's link
    /// replaces the file (freeing its bytes), else the file becomes the
    /// blob. Answers the file's stamp after and the bytes freed.
    pub(in crate::fetch) fn adopt(&self, hex: &str, file: &Path) -> Option<(Stamp, u64)> {
        let ours = std::fs::symlink_metadata(file).ok()?;
        match std::fs::symlink_metadata(self.path(hex)) {
            Ok(theirs) if same_inode(&ours, &theirs) => {
                return Some((Stamp::of(&ours, Some(hex)), 0));
            }
            Ok(_) => {
                if let Some(stamp) = self.link_into(hex, ours.len(), file) {
                    let freed = if ours.nlink() == 1 { ours.len() } else { 0 };
                    return Some((stamp, freed));
                }
            }
            Err(_) => {}
        }
        self.keep(hex, file).map(|stamp| (stamp, 0))
    }

    /// Under the digest's lock: removes `path`, a model's file recorded as
    /// `hex`, keeping the blob's stamp true, and the blob itself once no
    /// model links it. Answers the bytes this frees on disk.
    pub(in crate::fetch) fn unlink(&self, hex: &str, path: &Path) -> std::io::Result<u64> {
        let meta = std::fs::symlink_metadata(path)?;
        let blob = self.path(hex);
        let blob_meta = std::fs::symlink_metadata(&blob)
            .ok()
            .filter(|b| same_inode(b, &meta));
        let Some(blob_meta) = blob_meta else {
            std::fs::remove_file(path)?;
            return Ok(if meta.nlink() == 1 { meta.len() } else { 0 });
        };
        let vouched = self.vouches(hex, &blob_meta);
        std::fs::remove_file(path)?;
        if blob_meta.nlink() == 2 {
            // Only the store held it besides this model.
            self.remove(hex)?;
            return Ok(meta.len());
        }
        if vouched {
            self.restamp(hex);
        }
        Ok(0)
    }

    /// The blobs no model links (the store's name is their only one): what
    /// `sweep` may remove.
    pub(in crate::fetch) fn unreferenced(&self) -> Vec<String> {
        let mut found = Vec::new();
        for prefix in read_dir(&self.files) {
            for entry in read_dir(&prefix.path()) {
                let Ok(meta) = entry.path().symlink_metadata() else {
                    continue;
                };
                let name = entry.file_name().to_string_lossy().to_string();
                if meta.is_file() && meta.nlink() == 1 && !name.starts_with('.') {
                    found.push(name);
                }
            }
        }
        found
    }

    /// Under the digest's lock: removes the blob `hex` if still no model
    /// links it; answers the bytes freed.
    pub(in crate::fetch) fn sweep(&self, hex: &str) -> u64 {
        match std::fs::symlink_metadata(self.path(hex)) {
            Ok(meta) if meta.nlink() == 1 && self.remove(hex).is_ok() => meta.len(),
            _ => 0,
        }
    }

    /// Under the digest's lock: makes `partial`, an upload whose bytes were
    /// just verified as `hex` and synced, the blob, pinned. A blob of the
    /// digest the store has already (a fetch got there first) wins and is
    /// pinned instead. The partial's inode gets the blob's name first and
    /// the pin's by rename, so a crash in between leaves an unpinned blob,
    /// never an unverified one.
    pub(in crate::fetch) fn commit(&self, hex: &str, partial: &Path) -> std::io::Result<()> {
        if self.intact(hex).is_some() {
            remove_if_any(partial)?;
            return self.pin(hex);
        }
        read_only(partial);
        let blob = self.path(hex);
        if let Some(parent) = blob.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = blob.with_file_name(format!(".{hex}.{}", unique()));
        std::fs::hard_link(partial, &tmp)?;
        std::fs::rename(&tmp, &blob).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        std::fs::create_dir_all(&self.pins)?;
        std::fs::rename(partial, self.pin_path(hex))?;
        for dir in [blob.parent(), Some(self.pins.as_path())]
            .into_iter()
            .flatten()
        {
            std::fs::File::open(dir)?.sync_all()?;
        }
        self.restamp(hex);
        Ok(())
    }

    /// Under the digest's lock, once its bytes were found intact: pins the
    /// blob `hex` (a second link of its inode among the pins), replacing a
    /// pin of another inode.
    fn pin(&self, hex: &str) -> std::io::Result<()> {
        let blob = self.path(hex);
        let pin = self.pin_path(hex);
        let theirs = std::fs::symlink_metadata(&blob)?;
        if std::fs::symlink_metadata(&pin).is_ok_and(|ours| same_inode(&ours, &theirs)) {
            return Ok(());
        }
        std::fs::create_dir_all(&self.pins)?;
        let tmp = self.pins.join(format!(".{hex}.{}", unique()));
        std::fs::hard_link(&blob, &tmp)?;
        std::fs::rename(&tmp, &pin).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        self.restamp(hex);
        Ok(())
    }

    /// Under the digest's lock: takes the pin of `hex` away; the blob goes
    /// with the next sweep once no model links it. Its stamp is taken again
    /// only if it vouched before: an unpin launders no damage.
    pub(in crate::fetch) fn unpin(&self, hex: &str) -> std::io::Result<()> {
        let vouched =
            std::fs::symlink_metadata(self.path(hex)).is_ok_and(|meta| self.vouches(hex, &meta));
        remove_if_any(&self.pin_path(hex))?;
        if vouched {
            self.restamp(hex);
        }
        Ok(())
    }

    /// Under the digest's lock: pins the blob `hex` if the store holds it
    /// intact with `size` bytes, as a model registered as uploaded needs of
    /// each of its files; `false` if it does not.
    pub(in crate::fetch) fn pin_intact(&self, hex: &str, size: u64) -> std::io::Result<bool> {
        match self.intact(hex) {
            Some(meta) if meta.len() == size => self.pin(hex).map(|()| true),
            _ => Ok(false),
        }
    }

    /// The blob's metadata if its bytes are the digest's: vouched for by
    /// its stamp, else hashed (and stamped again if right). A blob whose
    /// bytes are wrong is condemned.
    fn intact(&self, hex: &str) -> Option<std::fs::Metadata> {
        let blob = self.path(hex);
        let before = std::fs::symlink_metadata(&blob).ok()?;
        if !before.is_file() {
            return None;
        }
        if self.vouches(hex, &before) {
            crate::metrics::stamp_verified_bytes(before.len());
            return Some(before);
        }
        // Changed since berth last looked at it: a link made behind its
        // back, or damage. The bytes decide.
        let actual = hash_file(&blob).ok();
        let after = std::fs::symlink_metadata(&blob).ok()?;
        if actual.as_deref() == Some(hex) && Stamp::of(&before, None) == Stamp::of(&after, None) {
            self.restamp(hex);
            return Some(after);
        }
        if actual.is_some() {
            self.condemn(hex, &before);
        }
        None
    }

    /// Removes the blob `hex`, whose bytes were found wrong, and every
    /// model's link of its inode (found through the models' verification
    /// records), so no deployment is ever given it again.
    fn condemn(&self, hex: &str, meta: &std::fs::Metadata) {
        let mut unlinked = 0;
        for record in read_dir(&self.models_dir.join(META_DIR)) {
            let name = record.file_name().to_string_lossy().to_string();
            let Some(job_id) = name.strip_suffix(".stamps.json") else {
                continue;
            };
            let dir = self.models_dir.join(job_id);
            let record = Stamps::load(&record.path());
            let paths = record.hashed().filter(|(_, sha256)| *sha256 == hex);
            for (path, _) in paths {
                let path = dir.join(path);
                let linked = std::fs::symlink_metadata(&path).is_ok_and(|m| same_inode(&m, meta));
                if linked && std::fs::remove_file(&path).is_ok() {
                    unlinked += 1;
                }
            }
        }
        let _ = self.remove(hex);
        tracing::warn!(
            sha256 = hex,
            unlinked,
            "a stored file's bytes no longer match their sha256 (damaged on disk): \
             removed from the store and from every model that linked it; it is fetched again when next needed"
        );
    }

    /// Takes the blob's name and stamp away; the stamp first, so no stamp
    /// outlives its blob's check. A pin goes too: only damage removes a
    /// pinned blob, and its bytes are of no use then.
    fn remove(&self, hex: &str) -> std::io::Result<()> {
        remove_if_any(&self.stamp_path(hex))?;
        remove_if_any(&self.pin_path(hex))?;
        remove_if_any(&self.path(hex))
    }

    /// Records the blob as it is now, after a link berth made or removed
    /// (which changed its ctime) or a full check. A stamp that cannot be
    /// saved only costs a hash later.
    fn restamp(&self, hex: &str) -> Option<Stamp> {
        let meta = std::fs::symlink_metadata(self.path(hex)).ok()?;
        let stamp = Stamp::of(&meta, Some(hex));
        let path = self.stamp_path(hex);
        let tmp = path.with_extension(format!("{}.tmp", unique()));
        let saved = std::fs::create_dir_all(&self.books)
            .and_then(|()| std::fs::write(&tmp, serde_json::to_vec(&stamp)?))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if saved.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        Some(stamp)
    }
}

/// Makes a blob (and so every model's name of it) read-only to everyone:
/// a person who edits one model's file in place would change every model
/// that shares it. Before its stamp is taken, as it changes the ctime; a
/// blob read-only already is left alone.
fn read_only(blob: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(blob) else {
        return;
    };
    if meta.permissions().mode() & 0o777 == BLOB_MODE {
        return;
    }
    if let Err(e) = std::fs::set_permissions(blob, std::fs::Permissions::from_mode(BLOB_MODE)) {
        tracing::warn!(
            "could not make the blob {} read-only: {e}; a model file edited in place would change \
             every model that shares it",
            blob.display()
        );
    }
}

/// A blob's mode: read-only, for everyone.
const BLOB_MODE: u32 = 0o444;

/// The folder of `.blobs` that holds the pins.
pub(in crate::fetch) const PINS: &str = "pins";

/// The folder of `.blobs` (and of `.berth`) uploads wait in
/// (`fetch::upload`): on the blobs' filesystem, so an upload becomes its
/// blob by link.
pub(in crate::fetch) const UPLOADS: &str = "uploads";

pub(in crate::fetch) fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

fn read_dir(dir: &Path) -> impl Iterator<Item = std::fs::DirEntry> {
    std::fs::read_dir(dir).into_iter().flatten().flatten()
}

fn remove_if_any(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A name part no other temporary file of this process or another has.
fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Says once per process that the models dir keeps a copy per model.
fn cannot_link(from: &Path, to: &Path, e: &std::io::Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            from = %from.display(),
            to = %to.display(),
            error = %e,
            "cannot hard-link in the models dir, so models that share files each keep their own copy \
             (put --models-dir, with its .blobs, on one filesystem that supports hard links to share them)"
        );
    }
}
