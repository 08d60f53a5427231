//! Fetch and verify: puts every recorded file of a model into
//! `<models dir>/<job id>/`, checked against its recorded size and sha256.
//! Bytes are streamed to a `.fetch-*` file beside the target, hashed as they
//! arrive, fsynced, and renamed only when verified: a real name never holds
//! unverified bytes, even after `kill -9`. Never deletes a model file; knows
//! nothing of deployers or the database.

mod lock;
mod source;
mod stamp;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::model::{ModelFile, TrainedModel};
use lock::DirLock;
use stamp::{Stamp, Stamps};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("the trained model has no recorded files")]
    NoFiles,
    #[error("file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("fetching the model's files took longer than the limit of {}s (--fetch-timeout-s)", .0.as_secs())]
    TimedOut(Duration),
    #[error("cancelled")]
    Cancelled,
    #[error("model directory {dir}: {reason}")]
    Disk { dir: String, reason: String },
}

/// Told how far a fetch has come. Called often (every chunk): implementations
/// throttle what they pass on.
pub trait Progress: Send + Sync {
    fn fetched(&self, bytes_done: u64, bytes_total: u64, files_done: usize, files_total: usize);
}

/// For callers that do not watch.
pub struct Quiet;

impl Progress for Quiet {
    fn fetched(&self, _: u64, _: u64, _: usize, _: usize) {}
}

#[derive(Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    models_dir: PathBuf,
    timeout: Duration,
    /// How many files of one model download at once.
    parallel: usize,
}

/// Where berth keeps its own bookkeeping of the models dir: locks and
/// verification records. Job ids cannot start with a dot, so no model
/// directory can be called this.
const META_DIR: &str = ".berth";
const TEMP_PREFIX: &str = ".fetch-";

impl Fetcher {
    pub fn new(models_dir: PathBuf, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .build()?;
        Ok(Self {
            client,
            models_dir,
            timeout,
            parallel: 4,
        })
    }

    /// The host directory a model's files go to.
    pub fn dir_of(&self, job_id: &str) -> PathBuf {
        self.models_dir.join(job_id)
    }

    /// Makes the model's directory hold exactly-verified copies of all its
    /// files, downloading only what is missing or damaged.
    pub async fn fetch(
        &self,
        model: &TrainedModel,
        progress: Arc<dyn Progress>,
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

    async fn fill(&self, model: &TrainedModel, progress: Arc<dyn Progress>) -> Result<PathBuf, Error> {
        let dir = self.dir_of(&model.job_id);
        let meta = self.models_dir.join(META_DIR);
        let disk = |e: std::io::Error| Error::Disk {
            dir: dir.display().to_string(),
            reason: e.to_string(),
        };
        let _lock = DirLock::acquire(&meta.join(format!("{}.lock", model.job_id)))
            .await
            .map_err(disk)?;
        std::fs::create_dir_all(&dir).map_err(disk)?;
        // We hold the lock, so any temp file is the leftover of a fetch that
        // died; its bytes were never verified.
        remove_temp_files(&dir);

        let stamps_path = meta.join(format!("{}.stamps.json", model.job_id));
        let mut stamps = Stamps::load(&stamps_path);
        let total_bytes: u64 = model.files.iter().map(|f| f.size_bytes).sum();
        let tally = Arc::new(Tally::new(progress, total_bytes, model.files.len()));

        let mut missing = Vec::new();
        for file in &model.files {
            match self.verified_in_place(&dir, file, stamps.get(&file.path).cloned()).await {
                Some(stamp) => {
                    stamps.insert(&file.path, stamp);
                    tally.file_done(file.size_bytes);
                }
                None => missing.push(file.clone()),
            }
        }

        let fetched: Vec<(String, Stamp)> = futures::stream::iter(missing)
            .map(|file| {
                let tally = tally.clone();
                let dir = &dir;
                async move {
                    let stamp = self
                        .download(model, &file, dir, &tally)
                        .await
                        .map_err(|reason| Error::File { path: file.path.clone(), reason })?;
                    tally.file_done(0);
                    Ok::<_, Error>((file.path.clone(), stamp))
                }
            })
            .buffer_unordered(self.parallel)
            .try_collect()
            .await?;
        for (path, stamp) in fetched {
            stamps.insert(&path, stamp);
        }
        stamps.save(&stamps_path).map_err(disk)?;
        Ok(dir)
    }

    /// The file's stamp if the copy on disk is already right: trusted from
    /// its verification record when that still matches, re-hashed otherwise.
    async fn verified_in_place(&self, dir: &Path, file: &ModelFile, stamp: Option<Stamp>) -> Option<Stamp> {
        let path = dir.join(&file.path);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.is_file() || meta.len() != file.size_bytes {
            return None;
        }
        let expected = file.sha256.as_deref();
        if stamp.is_some_and(|s| s.vouches_for(&meta, expected)) || expected.is_none() {
            return Some(Stamp::of(&meta, expected));
        }
        let expected = expected?.to_string();
        tokio::task::spawn_blocking(move || {
            let mut hasher = Sha256::new();
            std::io::copy(&mut std::fs::File::open(&path).ok()?, &mut hasher).ok()?;
            let meta_after = std::fs::symlink_metadata(&path).ok()?;
            (hex::encode(hasher.finalize()) == expected && meta_after.len() == meta.len())
                .then(|| Stamp::of(&meta_after, Some(&expected)))
        })
        .await
        .ok()?
    }

    async fn download(&self, model: &TrainedModel, file: &ModelFile, dir: &Path, tally: &Tally) -> Result<Stamp, String> {
        let target = dir.join(&file.path);
        let parent = target.parent().expect("a model file has a parent directory");
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        let location = source::locate(&model.source, &model.job_id, &file.path)?;
        let mut stream = source::open(&self.client, &location).await?;

        let temp = TempFile::new(parent, &file.path);
        // Created synchronously: an async create still running on the
        // blocking pool when a cancelled download drops `temp` would leave
        // the file behind.
        let mut out = std::fs::File::create(&temp.path)
            .map(tokio::fs::File::from_std)
            .map_err(|e| format!("cannot write {}: {e}", temp.path.display()))?;
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("{e} after {received} of {} bytes", file.size_bytes))?;
            received += chunk.len() as u64;
            if received > file.size_bytes {
                return Err(format!(
                    "the source sent more than the expected {} bytes ({location})",
                    file.size_bytes
                ));
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(|e| format!("cannot write {}: {e}", temp.path.display()))?;
            tally.bytes(chunk.len() as u64);
        }
        if received != file.size_bytes {
            return Err(format!("expected {} bytes, got {received} ({location})", file.size_bytes));
        }
        let actual = hex::encode(hasher.finalize());
        if let Some(expected) = &file.sha256
            && *expected != actual
        {
            return Err(format!("sha256 mismatch: expected {expected}, got {actual} ({location})"));
        }
        out.sync_all().await.map_err(|e| format!("cannot sync {}: {e}", temp.path.display()))?;
        drop(out);
        temp.commit(&target).map_err(|e| format!("cannot move the verified file into place: {e}"))?;
        let meta = std::fs::metadata(&target).map_err(|e| e.to_string())?;
        Ok(Stamp::of(&meta, file.sha256.as_ref().map(|_| actual.as_str())))
    }
}

/// A `.fetch-*` file that is removed unless committed — also when the
/// download's future is dropped by a cancellation or timeout.
struct TempFile {
    path: PathBuf,
    committed: bool,
}

impl TempFile {
    fn new(parent: &Path, file: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let base = file.rsplit('/').next().unwrap_or(file);
        let unique = format!("{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        Self {
            path: parent.join(format!("{TEMP_PREFIX}{base}-{unique}")),
            committed: false,
        }
    }

    /// Renames into place and makes the rename durable.
    fn commit(mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.committed = true;
        if let Some(parent) = target.parent() {
            std::fs::File::open(parent)?.sync_all()?;
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn remove_temp_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_temp_files(&path);
        } else if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Counts a fetch's progress across its parallel downloads.
struct Tally {
    progress: Arc<dyn Progress>,
    total_bytes: u64,
    total_files: usize,
    bytes: AtomicU64,
    files: AtomicUsize,
}

impl Tally {
    fn new(progress: Arc<dyn Progress>, total_bytes: u64, total_files: usize) -> Self {
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
        self.progress.fetched(done, self.total_bytes, files, self.total_files);
    }

    fn file_done(&self, bytes: u64) {
        let files = self.files.fetch_add(1, Ordering::Relaxed) + 1;
        let done = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.progress.fetched(done, self.total_bytes, files, self.total_files);
    }
}
