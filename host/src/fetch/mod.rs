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
//! lock. A file with a recorded sha256 is kept once for every model, in the
//! blob store (`blobs`), and linked in rather than downloaded when any
//! model already holds it. Deletes a model's file only when its bytes are
//! found wrong, or when asked to drop a copy (`copy`); knows nothing of
//! deployers or the database.
//!
//! This file is the whole model's order: vouched for, locked, checked in
//! place, room, linked or downloaded, settled. One file's download is
//! `file`; the disk work around the downloads, run off the runtime's
//! threads, `disk`; the bytes' way in, `source` (with the sources file's
//! credentials, `source::access`), `partial` and `pieces`; what the volume
//! keeps (blobs, budget, verification records, locks), `store`; blobs that
//! arrive by upload instead of from a source, `upload`. Each file's format
//! is told from the verified file's head before the record vouches for it
//! (`examine`; `crate::formats` says why there).

mod allowance;
mod cut;
mod disk;
mod examine;
mod file;
mod local;
mod pace;
mod partial;
mod pieces;
mod ranges;
mod sha;
pub(crate) mod source;
mod store;
mod tally;
#[cfg(test)]
mod tests;
mod upload;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::model::{Format, ModelFile, TrainedModel};
use crate::trust::Trust;
use disk::disk_error;
pub use local::check_local;
pub use source::access::Access;
pub use store::adopt::Adopted;
pub use store::budget::Reclaim;
pub use store::copy::HeldCopy;
use store::lock::DirLock;
pub use store::lock::SharedLocks;
pub use store::stamp::{Stamp, Stamps};
pub use store::usage;
use store::{blobs, budget};
use tally::Tally;
pub use upload::{Held, ID_RULE, Upload, UploadError, UploadName, Uploaded};

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
    #[error(
        "model directory {dir}: the missing files need {}, but the models dir holds {} of its budget of {} (--models-max-gib), and no other model's copy can be dropped: each is in use by a queued or running deployment; raise --models-max-gib, or deploy this model when those end",
        crate::human::size(*.needed), crate::human::size(*.used), crate::human::size(*.budget)
    )]
    OverBudget {
        dir: String,
        needed: u64,
        used: u64,
        budget: u64,
    },
    #[error(
        "model directory {dir}: the missing files need {}, more than the models dir's whole budget of {} (--models-max-gib); raise it to deploy this model",
        crate::human::size(*.needed), crate::human::size(*.budget)
    )]
    LargerThanBudget {
        dir: String,
        needed: u64,
        budget: u64,
    },
}

/// A fetched model: its directory, and each file's format in the order of
/// the model's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub dir: PathBuf,
    pub formats: Vec<Format>,
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
/// makes a large file arrive at the speed of the link. How many of them
/// is measured as the bytes arrive (`pace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// The most connections per file (1: every file in one stream); all
    /// files fetched at once share `connections - 1` beyond their first.
    pub connections: usize,
    /// The size of one piece. A file with less than two pieces' worth to
    /// download is read in one stream.
    pub piece_bytes: u64,
}

impl Default for Split {
    fn default() -> Self {
        Self {
            connections: 16,
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
    /// What the files fetched in pieces at once share: four 1 GiB files
    /// read over at most 19 connections, not 64, and keep as many chunks
    /// for their hashes as one would.
    allowance: allowance::Allowance,
    /// Bytes of the models volume a fetch leaves free.
    reserve: u64,
    /// Taken with each model directory's file lock, by servers on several
    /// machines.
    shared_locks: Option<Arc<dyn SharedLocks>>,
    /// Where verified files are kept once, by digest.
    blobs: blobs::Blobs,
    /// The most the models dir may hold (`--models-max-gib`).
    budget: Option<budget::Budget>,
}

/// Where berth keeps its own bookkeeping of the models dir: locks,
/// verification records and resume checkpoints. Job ids cannot start with a
/// dot, so no model directory can be called this.
const META_DIR: &str = ".berth";

/// Where the blob store keeps files by digest (`blobs`), beside the model
/// directories.
const BLOBS_DIR: &str = ".blobs";

impl Fetcher {
    pub fn new(models_dir: PathBuf, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            sources: source::Sources::new(Trust::default())?,
            blobs: blobs::Blobs::new(&models_dir),
            budget: None,
            models_dir,
            timeout,
            parallel: 4,
            split: Split::default(),
            allowance: allowance::Allowance::new(Split::default().connections),
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
        self.allowance = allowance::Allowance::new(split.connections);
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

    /// The client of `reference`'s registry, with the sources file's login
    /// for its repository: what a deployer is pulled with.
    pub(crate) fn registry(&self, reference: &crate::oci::Reference) -> Arc<crate::oci::Registry> {
        self.sources.registry(reference)
    }

    /// Where files are read from, with the server's credentials.
    pub(crate) fn sources(&self) -> &source::Sources {
        &self.sources
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
        let stamps = self.bookkeeping(&model.job_id).stamps;
        disk::vouched(&stamps, &dir, &model.files, &self.blobs).then_some(dir)
    }

    /// Makes the model's directory hold exactly-verified copies of all its
    /// files, downloading only what is missing or damaged.
    pub async fn fetch(
        &self,
        model: &TrainedModel,
        progress: Arc<dyn Observer>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, Error> {
        self.fetch_known(model, progress, cancel)
            .await
            .map(|fetched| fetched.dir)
    }

    /// `fetch`, also saying each file's format.
    pub async fn fetch_known(
        &self,
        model: &TrainedModel,
        progress: Arc<dyn Observer>,
        cancel: &CancellationToken,
    ) -> Result<Fetched, Error> {
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
    ) -> Result<Fetched, Error> {
        let dir = self.dir_of(&model.job_id);
        let books = self.bookkeeping(&model.job_id);
        let files: Arc<[ModelFile]> = model.files.as_slice().into();
        let total_bytes: u64 = files.iter().map(|f| f.size_bytes).sum();
        let tally = Arc::new(Tally::new(progress, total_bytes, files.len()));

        // A re-deployment of an unchanged model: real names are only ever
        // given verified files, so this needs neither the lock nor a read
        // of any byte but each file's head (its format). A copy vouched
        // for by a berth that did not look at formats, whose file does not
        // hold, is examined again below, under the lock.
        let vouched = disk::blocking({
            let (stamps, dir, files) = (books.stamps.clone(), dir.clone(), files.clone());
            let blobs = self.blobs.clone();
            move || {
                disk::vouched(&stamps, &dir, &files, &blobs)
                    .then(|| examine::examine_all(&dir, &files, None).ok())
                    .flatten()
            }
        })
        .await;
        if let Some(formats) = vouched {
            for file in files.iter() {
                tally.file_done(file.size_bytes);
            }
            return Ok(Fetched { dir, formats });
        }

        // Shared with the writer threads and the disk work: a download that
        // is dropped (cancelled, timed out) keeps the directory locked until
        // nothing of it touches the directory any more.
        let lock = Arc::new(
            DirLock::acquire(&books.lock, self.shared_locks.as_deref())
                .await
                .map_err(disk_error(&dir))?,
        );
        let mut stamps = disk::holding(&lock, {
            let (dir, stamps) = (dir.clone(), books.stamps.clone());
            move || {
                std::fs::create_dir_all(&dir).map_err(disk_error(&dir))?;
                // Read again: the fetch we may have waited for has just
                // written it.
                Ok::<_, Error>(Stamps::load(&stamps))
            }
        })
        .await?;
        let missing = self.check_in_place(&dir, &files, &mut stamps, &tally).await;
        let (missing, needed) = disk::holding(&lock, {
            let (dir, blobs) = (dir.clone(), self.blobs.clone());
            move || {
                disk::remove_leftovers(&dir, &missing);
                // A file the store holds is linked in, not downloaded.
                let to_download: Vec<ModelFile> = missing
                    .iter()
                    .filter(|file| !file.sha256.as_deref().is_some_and(|hex| blobs.has(hex)))
                    .cloned()
                    .collect();
                let needed = disk::needed(&dir, &to_download);
                (missing, needed)
            }
        })
        .await;
        let _claim = self.claim(&model.job_id, needed).await?;
        disk::holding(&lock, {
            let (dir, reserve) = (dir.clone(), self.reserve);
            move || disk::check_room(&dir, needed, reserve)
        })
        .await?;
        let downloaded = self
            .download_all(model, missing, &dir, &tally, &lock, &mut stamps)
            .await;
        disk::holding(&lock, move || {
            let mut downloaded = downloaded;
            let mut formats = Vec::new();
            if downloaded.failed.is_none() {
                match examine::examine_all(&dir, &files, Some(&mut stamps)) {
                    Ok(known) => formats = known,
                    Err(e) => downloaded.failed = Some(e),
                }
            }
            disk::settle(&dir, &books, &stamps, downloaded).map(|dir| Fetched { dir, formats })
        })
        .await
    }

    /// The verification record of the model `job_id`'s directory: what
    /// berth knew of each file when it last checked every byte.
    pub fn record_of(&self, job_id: &str) -> PathBuf {
        self.bookkeeping(job_id).stamps
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
                let path = dir.join(&file.path);
                let blobs = self.blobs.clone();
                disk::blocking(move || disk::verified_in_place(&path, &file, stamp, &blobs))
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
                    let stamp =
                        self.put(model, &file, dir, &tally, lock)
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
}

impl Fetcher {
    /// Puts one missing file in place: linked from the blob store if it
    /// holds the file's digest, else downloaded and then kept there. Under
    /// the digest's lock, so no two fetches on the volume download one
    /// digest at once: the second finds the first's blob and links it.
    async fn put(
        &self,
        model: &TrainedModel,
        file: &ModelFile,
        dir: &Path,
        tally: &Tally,
        lock: Arc<DirLock>,
    ) -> Result<Stamp, String> {
        let Some(hex) = file.sha256.clone() else {
            return self.download(model, file, dir, tally, lock).await;
        };
        let digest = Arc::new(
            DirLock::acquire(&self.blobs.lock_path(&hex), self.shared_locks.as_deref())
                .await
                .map_err(|e| format!("cannot take the lock of sha256 {hex}: {e}"))?,
        );
        let target = dir.join(&file.path);
        let linked = disk::holding(&lock, {
            let (blobs, digest, hex, target) = (
                self.blobs.clone(),
                digest.clone(),
                hex.clone(),
                target.clone(),
            );
            let size = file.size_bytes;
            move || {
                let _digest = digest;
                blobs.link_into(&hex, size, &target)
            }
        })
        .await;
        if let Some(stamp) = linked {
            tally.bytes(file.size_bytes);
            return Ok(stamp);
        }
        let downloaded = self.download(model, file, dir, tally, lock.clone()).await?;
        let blobs = self.blobs.clone();
        let kept = disk::holding(&lock, move || {
            let _digest = digest;
            blobs.keep(&hex, &target)
        })
        .await;
        Ok(kept.unwrap_or(downloaded))
    }
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
