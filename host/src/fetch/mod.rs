//! Fetch and verify: puts every recorded file of a model into
//! `<models dir>/<job id>/`, checked against its recorded size and sha256.
//! Bytes are streamed to a `.fetch-*` file beside the target, hashed as they
//! arrive (on threads of their own, overlapping the network), fsynced, and
//! renamed only when verified: a real name never holds unverified bytes,
//! even after `kill -9`. An interrupted download keeps its `.fetch-*` file
//! and the next fetch continues it with a range request; the hash continues
//! from the checkpoint the interruption left if the file is untouched since,
//! else the kept bytes are hashed again. A model whose verification record
//! vouches for every file is ready without reading a byte or taking the
//! lock. Never deletes a model file; knows nothing of deployers or the
//! database.

mod access;
mod local;
mod lock;
mod partial;
mod pieces;
mod ranges;
mod sha;
mod source;
mod stamp;
mod store;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::model::{ModelFile, TrainedModel};
use crate::trust::Trust;
pub use access::Access;
pub use local::check_local;
use lock::DirLock;
pub use lock::SharedLocks;
use partial::{Checkpoint, Kept, Resumable, TEMP_PREFIX, Writer, Written, partial_path};
use pieces::PieceWriter;
use ranges::Ranges;
use sha::Sha256 as ResumableSha256;
use stamp::{Stamp, Stamps};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("the trained model has no recorded files")]
    NoFiles,
    #[error("file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("fetching the model's files took longer than the limit of {} (--fetch-timeout-s)", crate::human::duration(*.0))]
    TimedOut(Duration),
    #[error("cancelled")]
    Cancelled,
    #[error("model directory {dir}: {reason}")]
    Disk { dir: String, reason: String },
    #[error(
        "model directory {dir}: the missing files need {}, but the volume has {} free and berth keeps {} of it for its records (--min-free-mib); free some space, or move --models-dir to a larger volume",
        crate::human::size(*.needed), crate::human::size(*.free), crate::human::size(*.reserve)
    )]
    NoRoom {
        dir: String,
        needed: u64,
        free: u64,
        reserve: u64,
    },
}

/// Told how far a fetch has come. Called often (every chunk): implementations
/// throttle what they pass on.
pub trait Observer: Send + Sync {
    fn fetched(&self, bytes_done: u64, bytes_total: u64, files_done: usize, files_total: usize);
}

/// For callers that do not watch.
pub struct Quiet;

impl Observer for Quiet {
    fn fetched(&self, _: u64, _: u64, _: usize, _: usize) {}
}

/// How a large file is read over several connections at once, each asking
/// for one piece (a range) at a time; the pieces are written in place.
/// Object stores and CDNs cap each connection's rate, so this is what
/// makes a large file arrive at the speed of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Connections per file (1: every file in one stream).
    pub connections: usize,
    /// The size of one piece. A file with less than two pieces' worth to
    /// download is read in one stream.
    pub piece_bytes: u64,
}

impl Default for Split {
    fn default() -> Self {
        Self {
            connections: 8,
            piece_bytes: 16 << 20,
        }
    }
}

#[derive(Clone)]
pub struct Fetcher {
    sources: source::Sources,
    models_dir: PathBuf,
    timeout: Duration,
    /// How many files of one model download at once.
    parallel: usize,
    split: Split,
    /// Bytes of the models volume a fetch leaves free.
    reserve: u64,
    /// Taken with each model directory's file lock, by servers on several
    /// machines.
    shared_locks: Option<Arc<dyn SharedLocks>>,
}

/// Where berth keeps its own bookkeeping of the models dir: locks,
/// verification records and resume checkpoints. Job ids cannot start with a
/// dot, so no model directory can be called this.
const META_DIR: &str = ".berth";

impl Fetcher {
    pub fn new(models_dir: PathBuf, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            sources: source::Sources::new(Trust::default())?,
            models_dir,
            timeout,
            parallel: 4,
            split: Split::default(),
            reserve: 0,
            shared_locks: None,
        })
    }

    /// Refuses a fetch that would leave less than `bytes` free on the
    /// models volume.
    pub fn reserve(mut self, bytes: u64) -> Self {
        self.reserve = bytes;
        self
    }

    /// Also takes `locks`' lock of a model directory while filling it, for
    /// servers on several machines sharing the models volume.
    pub fn shared_locks(mut self, locks: Arc<dyn SharedLocks>) -> Self {
        self.shared_locks = Some(locks);
        self
    }

    /// Reads large files over `split.connections` connections at once.
    pub fn split(mut self, split: Split) -> Self {
        self.split = split;
        self
    }

    /// HTTPS sources also trust the certificates of `trust` (`--ca-file`).
    pub fn trust(mut self, trust: Trust) -> anyhow::Result<Self> {
        self.sources = self.sources.with_trust(trust)?;
        Ok(self)
    }

    /// Gives the sources the credentials of the sources file.
    pub fn access(mut self, access: Access) -> Self {
        self.sources = self.sources.with_access(access);
        self
    }

    /// The host directory a model's files go to.
    pub fn dir_of(&self, job_id: &str) -> PathBuf {
        self.models_dir.join(job_id)
    }

    /// The model's directory, if its verification record vouches for every
    /// file as it is now: a re-deployment of an unchanged model, which
    /// needs no fetch. Reads no byte of the files and takes no lock, as
    /// `fetch` does in that case.
    pub fn verified(&self, model: &TrainedModel) -> Option<PathBuf> {
        let dir = self.dir_of(&model.job_id);
        let books = self.bookkeeping(&model.job_id);
        if model.files.is_empty() || !Stamps::load(&books.stamps).vouch_for_all(&dir, &model.files)
        {
            return None;
        }
        for file in &model.files {
            crate::metrics::stamp_verified_bytes(file.size_bytes);
        }
        Some(dir)
    }

    /// Makes the model's directory hold exactly-verified copies of all its
    /// files, downloading only what is missing or damaged.
    pub async fn fetch(
        &self,
        model: &TrainedModel,
        progress: Arc<dyn Observer>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, Error> {
        if model.files.is_empty() {
            return Err(Error::NoFiles);
        }
        let work = self.fill(model, progress);
        tokio::select! {
            filled = tokio::time::timeout(self.timeout, work) => {
                filled.map_err(|_| Error::TimedOut(self.timeout))?
            }
            _ = cancel.cancelled() => Err(Error::Cancelled),
        }
    }

    async fn fill(
        &self,
        model: &TrainedModel,
        progress: Arc<dyn Observer>,
    ) -> Result<PathBuf, Error> {
        let dir = self.dir_of(&model.job_id);
        let books = self.bookkeeping(&model.job_id);
        let total_bytes: u64 = model.files.iter().map(|f| f.size_bytes).sum();
        let tally = Arc::new(Tally::new(progress, total_bytes, model.files.len()));

        // A re-deployment of an unchanged model: real names are only ever
        // given verified files, so this needs neither the lock nor a read
        // of any byte.
        if let Some(dir) = self.verified(model) {
            for file in &model.files {
                tally.file_done(file.size_bytes);
            }
            return Ok(dir);
        }

        // Shared with the writer threads: a download that is dropped
        // (cancelled, timed out) keeps the directory locked until its
        // writer has stopped touching it.
        let lock = Arc::new(
            DirLock::acquire(&books.lock, self.shared_locks.as_deref())
                .await
                .map_err(disk_error(&dir))?,
        );
        std::fs::create_dir_all(&dir).map_err(disk_error(&dir))?;
        // Read again: the fetch we may have waited for has just written it.
        let mut stamps = Stamps::load(&books.stamps);
        let missing = self
            .check_in_place(&dir, &model.files, &mut stamps, &tally)
            .await;
        remove_leftovers(&dir, &missing);
        self.check_room(&dir, &missing)?;
        let downloaded = self
            .download_all(model, missing, &dir, &tally, &lock, &mut stamps)
            .await;
        settle(&dir, &books, &stamps, downloaded)
    }

    /// Refuses before downloading what would not fit: the missing files'
    /// bytes, less what their kept partials already hold, plus the reserve.
    fn check_room(&self, dir: &Path, missing: &[ModelFile]) -> Result<(), Error> {
        use std::os::unix::fs::MetadataExt;
        let needed: u64 = missing
            .iter()
            .map(|file| {
                // Blocks, not length: a download in pieces is sparse.
                let kept = std::fs::metadata(partial_path(&dir.join(&file.path)))
                    .map_or(0, |m| m.len().min(m.blocks() * 512));
                file.size_bytes.saturating_sub(kept)
            })
            .sum();
        if needed == 0 {
            return Ok(());
        }
        let free = crate::space::free_bytes(dir).map_err(disk_error(dir))?;
        if free >= needed.saturating_add(self.reserve) {
            return Ok(());
        }
        Err(Error::NoRoom {
            dir: dir.display().to_string(),
            needed,
            free,
            reserve: self.reserve,
        })
    }

    /// Where this fetcher keeps its bookkeeping of one model directory.
    fn bookkeeping(&self, job_id: &str) -> Bookkeeping {
        let meta = self.models_dir.join(META_DIR);
        Bookkeeping {
            stamps: meta.join(format!("{job_id}.stamps.json")),
            lock: meta.join(format!("{job_id}.lock")),
            resume: meta.join(format!("{job_id}.resume")),
        }
    }

    /// Records the files already right in `dir` and returns the others.
    async fn check_in_place(
        &self,
        dir: &Path,
        files: &[ModelFile],
        stamps: &mut Stamps,
        tally: &Tally,
    ) -> Vec<ModelFile> {
        // Owned values in the stream: futures that borrow their stream's
        // items are not `Send` enough for `tokio::spawn`.
        let checked: Vec<Option<Stamp>> = futures::stream::iter(files.to_vec())
            .map(|file| {
                let stamp = stamps.get(&file.path).cloned();
                verified_in_place(dir.join(&file.path), file, stamp)
            })
            .buffered(self.parallel)
            .collect()
            .await;
        let mut missing = Vec::new();
        for (file, checked) in files.iter().zip(checked) {
            match checked {
                Some(stamp) => {
                    stamps.insert(&file.path, stamp);
                    tally.file_done(file.size_bytes);
                }
                None => missing.push(file.clone()),
            }
        }
        missing
    }

    /// Downloads the `missing` files, a few at a time, recording each one
    /// that verifies; stops at the first that fails.
    async fn download_all(
        &self,
        model: &TrainedModel,
        missing: Vec<ModelFile>,
        dir: &Path,
        tally: &Arc<Tally>,
        lock: &Arc<DirLock>,
        stamps: &mut Stamps,
    ) -> Downloaded {
        let mut downloads = futures::stream::iter(missing)
            .map(|file| {
                let (tally, lock) = (tally.clone(), lock.clone());
                async move {
                    let stamp = self
                        .download(model, &file, dir, &tally, lock)
                        .await
                        .map_err(|reason| Error::File {
                            path: file.path.clone(),
                            reason,
                        })?;
                    tally.file_done(0);
                    Ok::<_, Error>((file, stamp))
                }
            })
            .buffer_unordered(self.parallel);
        let mut downloaded = Downloaded::default();
        while let Some(done) = downloads.next().await {
            match done {
                Ok((file, stamp)) => {
                    stamps.insert(&file.path, stamp);
                    let parent = dir.join(&file.path).parent().map(Path::to_path_buf);
                    downloaded.renamed_in.extend(parent);
                }
                Err(e) => {
                    downloaded.failed = Some(e);
                    break;
                }
            }
        }
        // Returning drops the other downloads; each keeps what it has for
        // next time.
        downloaded
    }

    /// Puts one file in place. A partial download left by an earlier
    /// attempt is continued; if the result then fails its hash, the file is
    /// downloaded whole once more, in case the kept bytes were the wrong ones.
    async fn download(
        &self,
        model: &TrainedModel,
        file: &ModelFile,
        dir: &Path,
        tally: &Tally,
        lock: Arc<DirLock>,
    ) -> Result<Stamp, String> {
        let target_path = dir.join(&file.path);
        let parent = target_path
            .parent()
            .expect("a model file has a parent directory");
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        let location = source::locate(&model.source, &model.job_id, &file.path)?;
        let partial = partial_path(&target_path);
        // The checkpoint an interrupted download of this file left, kept
        // beside the verification record, out of the deployers' sight.
        let record = self
            .bookkeeping(&model.job_id)
            .resume
            .join(format!("{}.json", file.path));
        let kept = match (&file.sha256, std::fs::metadata(&partial)) {
            (Some(sha256), Ok(meta)) if meta.len() <= file.size_bytes => {
                Checkpoint::take(&record, &partial, sha256).unwrap_or(Kept {
                    have: Ranges::prefix(meta.len()),
                    hash: None,
                })
            }
            _ => {
                let _ = std::fs::remove_file(&record);
                Kept::nothing()
            }
        };
        let resumable = file.sha256.as_ref().map(|sha256| Resumable {
            record: record.clone(),
            sha256: sha256.clone(),
        });
        let target = Target {
            file,
            location: &location,
            partial: &partial,
            resumable: &resumable,
            tally,
            lock: &lock,
        };
        let outcome = match self.attempt(&target, kept).await {
            Err(Failure::Rejected {
                counted,
                resumed: true,
                ..
            }) => {
                tally.rewind(counted);
                self.attempt(&target, Kept::nothing()).await
            }
            outcome => outcome,
        };
        let sha256 = outcome.map_err(|failure| match failure {
            Failure::Interrupted(reason) => reason,
            Failure::Rejected { reason, .. } => {
                // Known-bad bytes are not worth continuing.
                let _ = std::fs::remove_file(&partial);
                reason
            }
        })?;
        std::fs::rename(&partial, &target_path)
            .map_err(|e| format!("cannot move the verified file into place: {e}"))?;
        let meta = std::fs::metadata(&target_path).map_err(|e| e.to_string())?;
        Ok(Stamp::of(
            &meta,
            file.sha256.as_ref().map(|_| sha256.as_str()),
        ))
    }

    /// One try at filling the partial file, continuing what `kept` says
    /// it holds (if the source does ranges). A file with at least two
    /// pieces' worth missing is read over several connections; others, and
    /// sources that send whole files only, in one stream. Returns the
    /// verified hash.
    async fn attempt(&self, target: &Target<'_>, kept: Kept) -> Result<String, Failure> {
        let size = target.file.size_bytes;
        let missing = kept.have.missing(size);
        let missing_bytes: u64 = missing.iter().map(|(start, end)| end - start).sum();
        let in_pieces = self.split.connections > 1
            && !missing.is_empty()
            && (missing_bytes >= 2 * self.split.piece_bytes || !kept.have.is_prefix());
        if !in_pieces {
            let from = kept.have.contiguous();
            // An earlier attempt that got every byte but died before the
            // rename left nothing to ask the source for.
            let body = match from {
                from if from == size && from > 0 => None,
                from => Some(self.open(target, source::Span::from(from)).await?),
            };
            return self.stream(target, body, from, kept.hash).await;
        }
        let pieces = pieces::cut(&missing, self.split.piece_bytes);
        let first = pieces
            .clone()
            .next()
            .expect("a missing range makes a piece");
        let body = self.open(target, first.span()).await?;
        if !(body.ranged && body.start == first.start) {
            // The source sends whole files only: one stream from the start.
            return self.stream(target, Some(body), 0, None).await;
        }
        let resumed = !kept.have.is_empty();
        target.tally.bytes(kept.have.len());
        let writer = PieceWriter::start(
            target.partial,
            size,
            kept.have,
            kept.hash,
            target.resumable.clone(),
            target.lock.clone(),
        )
        .map_err(Failure::Interrupted)?;
        let written = pieces::download(
            &self.sources,
            target.location,
            pieces,
            body,
            self.split.connections,
            writer,
            target.tally,
        )
        .await
        .map_err(Failure::Interrupted)?;
        verified(target, written, resumed, size)
    }

    /// Opens the file at the source, refusing at once a file whose size
    /// the source tells and which is not the recorded one.
    async fn open(&self, target: &Target<'_>, span: source::Span) -> Result<source::Body, Failure> {
        let body = self
            .sources
            .open(target.location, span)
            .await
            .map_err(Failure::Interrupted)?;
        let size = target.file.size_bytes;
        match body.total {
            // Nothing proves the kept bytes wrong: they stay.
            Some(total) if total != size => Err(Failure::Interrupted(size_contradicts(
                total,
                size,
                target.location,
            ))),
            _ => Ok(body),
        }
    }

    /// Fills the partial file from one stream, which starts at byte
    /// `body.start` (the `from` asked for, or 0 if the source ignored the
    /// range); `hashed`, if known, is the hash of the bytes before `from`.
    /// No body: the file is complete on disk and is only hashed.
    async fn stream(
        &self,
        target: &Target<'_>,
        body: Option<source::Body>,
        from: u64,
        hashed: Option<ResumableSha256>,
    ) -> Result<String, Failure> {
        let Target {
            file,
            location,
            partial,
            tally,
            ..
        } = *target;
        let size = file.size_bytes;
        let start = body.as_ref().map_or(from, |body| body.start);
        let hashed = hashed.filter(|hashed| hashed.len() == start);
        let writer = Writer::start(
            partial,
            start,
            hashed,
            target.resumable.clone(),
            target.lock.clone(),
        )
        .map_err(Failure::Interrupted)?;
        tally.bytes(start);
        let mut received = start;
        let rejected = |reason, received| Failure::Rejected {
            reason,
            resumed: start > 0,
            counted: received,
        };
        if let Some(mut body) = body {
            while let Some(chunk) = body.stream.next().await {
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        let _ = writer.abandon().await;
                        return Err(Failure::Interrupted(format!(
                            "{e} after {received} of {size} bytes"
                        )));
                    }
                };
                let len = chunk.len() as u64;
                crate::metrics::fetched_bytes(len);
                received += len;
                if received > size {
                    let _ = writer.abandon().await;
                    let reason =
                        format!("the source sent more than the expected {size} bytes ({location})");
                    return Err(rejected(reason, received - len));
                }
                if writer.write(chunk).await.is_err() {
                    let reason = writer.abandon().await.err().unwrap_or_default();
                    return Err(Failure::Interrupted(reason));
                }
                tally.bytes(len);
            }
        }
        if received != size {
            let _ = writer.abandon().await;
            return Err(rejected(wrong_length(size, received, location), received));
        }
        let written = writer.finish().await.map_err(Failure::Interrupted)?;
        verified(target, written, start > 0, received)
    }
}

/// One file being put in place, as every attempt at it sees it.
struct Target<'a> {
    file: &'a ModelFile,
    location: &'a source::Location,
    /// The `.fetch-*` file the bytes go to.
    partial: &'a Path,
    /// Where an interruption leaves its checkpoint.
    resumable: &'a Option<Resumable>,
    tally: &'a Tally,
    lock: &'a Arc<DirLock>,
}

/// The written file's hash if it is the recorded one. `counted`: the bytes
/// reported as progress, taken back if the file is downloaded again.
fn verified(
    target: &Target<'_>,
    written: Written,
    resumed: bool,
    counted: u64,
) -> Result<String, Failure> {
    match &target.file.sha256 {
        Some(expected) if *expected != written.sha256 => Err(Failure::Rejected {
            reason: sha256_mismatch(expected, &written.sha256, target.location),
            resumed,
            counted,
        }),
        _ => Ok(written.sha256),
    }
}

// The sentences for bytes that contradict their record, shared with the
// check of files already in place (`local`).

fn size_contradicts(total: u64, size: u64, location: &source::Location) -> String {
    format!("the source has {total} bytes for this file, but the record says {size} ({location})")
}

fn wrong_length(size: u64, received: u64, location: &source::Location) -> String {
    format!("expected {size} bytes, got {received} ({location})")
}

fn sha256_mismatch(expected: &str, got: &str, location: &source::Location) -> String {
    format!("sha256 mismatch: expected {expected}, got {got} ({location})")
}

/// Why an attempt at one file did not end with verified bytes.
enum Failure {
    /// Cut short (the connection, the disk, the source's answer): the bytes
    /// so far are kept to be continued.
    Interrupted(String),
    /// The bytes are wrong: they are thrown away.
    Rejected {
        reason: String,
        /// Whether the attempt continued bytes kept from an earlier one.
        resumed: bool,
        /// Bytes already reported as progress.
        counted: u64,
    },
}

/// berth's own files about one model directory, kept in `META_DIR`.
struct Bookkeeping {
    /// The verification record.
    stamps: PathBuf,
    /// Held while the directory is filled.
    lock: PathBuf,
    /// The checkpoints of interrupted downloads, one per file.
    resume: PathBuf,
}

/// What the downloads of one fetch leave to make durable.
#[derive(Default)]
struct Downloaded {
    /// The directories that gained a file by rename.
    renamed_in: BTreeSet<PathBuf>,
    /// The first download that failed; the others were stopped.
    failed: Option<Error>,
}

/// Makes the renames durable and records what verified, then answers for
/// the whole fetch.
fn settle(
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

fn disk_error(dir: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Disk {
        dir: dir.display().to_string(),
        reason: e.to_string(),
    }
}

/// Only a file with a recorded hash is continued: the hash is what catches
/// kept bytes that belong to another version of the file.
fn resumable(file: &ModelFile) -> bool {
    file.sha256.is_some()
}

/// The file's stamp if the copy on disk is already right: trusted from its
/// verification record when that still matches, re-hashed otherwise.
async fn verified_in_place(path: PathBuf, file: ModelFile, stamp: Option<Stamp>) -> Option<Stamp> {
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() || meta.len() != file.size_bytes {
        return None;
    }
    let expected = file.sha256.clone();
    let vouched = stamp.is_some_and(|s| s.vouches_for(&meta, expected.as_deref()));
    if vouched {
        crate::metrics::stamp_verified_bytes(file.size_bytes);
    }
    if vouched || expected.is_none() {
        return Some(Stamp::of(&meta, expected.as_deref()));
    }
    let expected = expected?;
    tokio::task::spawn_blocking(move || {
        let actual = hash_file(&path).ok()?;
        // A file that changed while it was read proves nothing.
        let before = Stamp::of(&meta, Some(&expected));
        let after = Stamp::of(&std::fs::symlink_metadata(&path).ok()?, Some(&expected));
        (actual == expected && before == after).then_some(after)
    })
    .await
    .ok()?
}

fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    loop {
        match std::io::Read::read(&mut file, &mut buf)? {
            0 => return Ok(hex::encode(hasher.finalize())),
            n => hasher.update(&buf[..n]),
        }
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Removes the `.fetch-*` files under `dir` that no download will continue.
/// Called under the lock, so no other fetch writes here: a `.fetch-*` file
/// is either a missing file's partial download, kept to be continued, or a
/// leftover with nothing to continue.
fn remove_leftovers(dir: &Path, missing: &[ModelFile]) {
    let keep: BTreeSet<PathBuf> = missing
        .iter()
        .filter(|file| resumable(file))
        .map(|file| partial_path(&dir.join(&file.path)))
        .collect();
    remove_temp_files(dir, &keep);
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

/// Counts a fetch's progress across its parallel downloads.
struct Tally {
    progress: Arc<dyn Observer>,
    total_bytes: u64,
    total_files: usize,
    bytes: AtomicU64,
    files: AtomicUsize,
}

impl Tally {
    fn new(progress: Arc<dyn Observer>, total_bytes: u64, total_files: usize) -> Self {
        Self {
            progress,
            total_bytes,
            total_files,
            bytes: AtomicU64::new(0),
            files: AtomicUsize::new(0),
        }
    }

    fn bytes(&self, n: u64) {
        let done = self.bytes.fetch_add(n, Ordering::Relaxed) + n;
        let files = self.files.load(Ordering::Relaxed);
        self.progress
            .fetched(done, self.total_bytes, files, self.total_files);
    }

    /// Takes back bytes reported for an attempt that is being redone.
    fn rewind(&self, n: u64) {
        self.bytes.fetch_sub(n, Ordering::Relaxed);
    }

    fn file_done(&self, bytes: u64) {
        let files = self.files.fetch_add(1, Ordering::Relaxed) + 1;
        let done = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.progress
            .fetched(done, self.total_bytes, files, self.total_files);
    }
}
