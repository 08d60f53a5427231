//! A download in progress: the `.fetch-<name>` file beside its target,
//! written by one thread and hashed by another so that hashing, disk writes
//! and the network all overlap (`Threads`: the life cycle both writers
//! share; `Writer`: the one-stream writer), pushed towards the disk as it
//! grows so the final fsync has little left to do, and kept when the
//! download is interrupted so that the next fetch continues where this one
//! stopped. An interruption the process lives through also leaves a
//! checkpoint: the hash state and a stamp of the file, so the next fetch
//! need not read the kept bytes back as long as the file is untouched
//! since. Knows nothing of where the bytes come from.

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio::sync::mpsc;

use super::ranges::Ranges;
use super::sha::Sha256;
use super::store::stamp::Stamp;

pub(crate) const TEMP_PREFIX: &str = ".fetch-";

/// Chunks in flight to each of the two threads: enough to ride out a slow
/// write or a slow hash, few enough that memory stays flat (hyper hands
/// over at most ~400 KiB per chunk, so this is a few MiB per file).
pub(crate) const QUEUE: usize = 16;
/// Written bytes are handed to the disk in windows of this size, so the
/// disk works while the network does.
pub(crate) const WRITEBACK_WINDOW: u64 = 8 << 20;
/// Read size when hashing a resumed file's earlier bytes.
pub(crate) const READ_BUF: usize = 1 << 20;

/// The longest file name berth's own names keep whole: with `.fetch-`
/// before it and a link's `.<pid>-<n>.link` after, a name stays within the
/// 255 bytes filesystems allow in one name.
const KEPT_WHOLE: usize = 200;

/// `name` as berth's own names for it hold it: itself, or, when it is too
/// long to carry a prefix and a suffix within the 255-byte limit, the
/// sha256 of it in hex. The same for every attempt, so that an attempt
/// finds what the one before it left; a name that already looks like such
/// a digest is hashed too, so that two names never share one.
pub(crate) fn short_name(name: &str) -> Cow<'_, str> {
    let digest_like =
        name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if name.len() <= KEPT_WHOLE && !digest_like {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(hex::encode(sha2::Sha256::digest(name.as_bytes())))
    }
}

/// Where the download of `target` is kept until it is verified: beside it,
/// under a name registration refuses, the same for every attempt so that
/// an attempt finds what the one before it left.
pub(crate) fn partial_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    target.with_file_name(format!("{TEMP_PREFIX}{}", short_name(&name)))
}

/// Where an interrupted download of the model file `path` leaves its
/// checkpoint, under the model's `resume` folder.
pub(crate) fn checkpoint_path(resume: &Path, path: &str) -> PathBuf {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    resume.join(dir).join(format!("{}.json", short_name(name)))
}

/// Opens (or creates) a partial file for reading and writing, keeping what
/// it holds, at length `len`: the writer's handle, and one for the hash
/// thread to read it back through.
fn open_partial(path: &Path, len: u64) -> Result<(File, File), String> {
    let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(failed)?;
    file.set_len(len).map_err(failed)?;
    let kept = file.try_clone().map_err(failed)?;
    Ok((file, kept))
}

/// The layout checkpoints are written in. A checkpoint in any other one
/// is used up unread and the kept bytes are hashed again: those without a
/// `format` were written before berth saved sha2's own hash state, format 2
/// before downloads in pieces. Change it whenever `Checkpoint` or the saved
/// hash state (`sha::Saved`) changes.
pub(crate) const CHECKPOINT_FORMAT: u32 = 3;

/// What an interrupted download left besides its bytes: how far the hash
/// got and what the file looked like then. Trusted only while the file
/// still matches the stamp (ctime changes with any write, as for the
/// verification record); otherwise the kept bytes are hashed again.
#[derive(Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    format: u32,
    stamp: Stamp,
    hash: Sha256,
    /// Which bytes the file holds: one run from the start for a download
    /// read in one stream, any pieces for one read over several
    /// connections. The hash covers a prefix of them.
    have: Ranges,
}

/// What an earlier attempt left in a partial file: the bytes written, and
/// the hash of the first of them when a checkpoint vouches for it.
pub(crate) struct Kept {
    pub(crate) have: Ranges,
    pub(crate) hash: Option<Sha256>,
}

impl Kept {
    pub(crate) fn nothing() -> Self {
        Self {
            have: Ranges::default(),
            hash: None,
        }
    }
}

impl Checkpoint {
    pub(crate) fn new(stamp: Stamp, hash: Sha256, have: Ranges) -> Self {
        Self {
            format: CHECKPOINT_FORMAT,
            stamp,
            hash,
            have,
        }
    }

    /// What `partial` holds, if `record` vouches for it. The record is
    /// used up either way: the next writes outdate it.
    pub(crate) fn take(record: &Path, partial: &Path, sha256: &str) -> Option<Kept> {
        let bytes = std::fs::read(record).ok();
        let _ = std::fs::remove_file(record);
        let checkpoint: Checkpoint = serde_json::from_slice(&bytes?).ok()?;
        let meta = std::fs::symlink_metadata(partial).ok()?;
        (checkpoint.format == CHECKPOINT_FORMAT
            && checkpoint.stamp.vouches_for(&meta, Some(sha256))
            && checkpoint.have.end() <= meta.len()
            && checkpoint.hash.len() <= checkpoint.have.contiguous())
        .then_some(Kept {
            have: checkpoint.have,
            hash: Some(checkpoint.hash),
        })
    }

    pub(crate) fn save(&self, record: &Path) -> std::io::Result<()> {
        if let Some(parent) = record.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Replaced whole; not fsynced: a lost record only costs a re-hash.
        let tmp = record.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, record)
    }
}

/// Where an interrupted download writes its checkpoint, and the hash the
/// finished file must have (the checkpoint is only good for that file).
#[derive(Clone)]
pub(crate) struct Resumable {
    pub(crate) record: PathBuf,
    pub(crate) sha256: String,
}

/// What the writer hands back once every byte is on disk.
pub(crate) struct Written {
    pub(crate) sha256: String,
}

/// What tells the hash thread of a partial file to give up: the download
/// it serves is gone, and reading on (gigabytes, perhaps) serves nobody.
pub(crate) trait StopHash: Send + Sync + 'static {
    fn stop_hash(&self);
}

impl StopHash for AtomicBool {
    fn stop_hash(&self) {
        self.store(true, Ordering::Relaxed);
    }
}

/// How the hash thread hands its last state to the disk thread when the
/// download stops, for the checkpoint.
pub(crate) type LastHash = std::sync::mpsc::Receiver<Sha256>;

/// The disk thread and the hash thread behind one partial file, as both
/// writers run them (`Writer` for one stream, `pieces::PieceWriter` for
/// pieces): each at its own pace, holding the directory lock until it ends.
/// Dropped before the download is finished, they tell the hash to stop
/// (`StopHash`). The writer closes their queues, then `end` waits for both.
pub(crate) struct Threads<S: StopHash> {
    disk: tokio::task::JoinHandle<std::io::Result<()>>,
    hash: tokio::task::JoinHandle<std::io::Result<Sha256>>,
    path: PathBuf,
    stop: Arc<S>,
    /// Whether dropping stops the hash: until every byte is queued.
    armed: bool,
}

impl<S: StopHash> Threads<S> {
    /// Opens (or creates) the partial file `path` at length `len`, keeping
    /// what it holds, and starts `disk` on its handle and `hash` on a second
    /// one to read it back through. Both keep `hold` until they end: the
    /// directory lock outlives a writer whose download was dropped. The
    /// state `hash` returns is handed to `disk` for a checkpoint; `stop` is
    /// what `hash` watches.
    pub(crate) fn start<H: Send + Sync + 'static>(
        path: &Path,
        len: u64,
        stop: Arc<S>,
        hold: Arc<H>,
        disk: impl FnOnce(File, LastHash) -> std::io::Result<()> + Send + 'static,
        hash: impl FnOnce(File) -> std::io::Result<Sha256> + Send + 'static,
    ) -> Result<Self, String> {
        // Opened here, synchronously: a download dropped before the threads
        // run must still find the file where it expects it.
        let (file, kept) = open_partial(path, len)?;
        let (last_hash, hash_at_stop) = std::sync::mpsc::sync_channel(1);
        let held = hold.clone();
        let disk = tokio::task::spawn_blocking(move || {
            let _hold = held;
            disk(file, hash_at_stop)
        });
        let hash = tokio::task::spawn_blocking(move || {
            let _hold = hold;
            let hashed = hash(kept)?;
            let _ = last_hash.try_send(hashed.clone());
            Ok(hashed)
        });
        Ok(Self {
            disk,
            hash,
            path: path.to_path_buf(),
            stop,
            armed: true,
        })
    }

    /// Every byte is queued: the hash is wanted to the end.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Tells the hash thread to give up now.
    pub(crate) fn stop(&self) {
        self.stop.stop_hash();
    }

    /// Waits for both threads, once the caller has closed their queues:
    /// the hash of what was written, or why the writing failed.
    pub(crate) async fn end(mut self) -> Result<Sha256, String> {
        let failed = |e: std::io::Error| format!("cannot write {}: {e}", self.path.display());
        let crashed = |e: tokio::task::JoinError| format!("the writer crashed: {e}");
        let disk = (&mut self.disk).await.map_err(crashed)?;
        let hash = (&mut self.hash).await.map_err(crashed)?;
        disk.map_err(failed)?;
        hash.map_err(failed)
    }
}

impl<S: StopHash> Drop for Threads<S> {
    fn drop(&mut self) {
        if self.armed {
            self.stop();
        }
    }
}

enum Message {
    Chunk(Bytes),
    /// No more bytes: make them durable.
    Finish,
}

/// The threads behind a partial file read in one stream: one hashes the
/// chunks, one writes them, each at its own pace within the queue, so
/// neither waits for the other's work. Dropping the writer without
/// `finish` (a cancelled or broken-off download) leaves the file for the
/// next attempt.
pub(crate) struct Writer {
    to_disk: mpsc::Sender<Message>,
    to_hash: mpsc::Sender<Bytes>,
    threads: Threads<AtomicBool>,
}

impl Writer {
    /// Writes `path` from byte `start` on. What is in the file before
    /// `start` (a resumed download) is covered by `hashed`, from a
    /// checkpoint, or else read back and hashed first while the rest
    /// arrives: the hash covers every byte. `resumable` says where to leave
    /// a checkpoint if the download is interrupted. `hold` is kept until
    /// both threads end (`Threads`).
    pub(crate) fn start<H: Send + Sync + 'static>(
        path: &Path,
        start: u64,
        hashed: Option<Sha256>,
        resumable: Option<Resumable>,
        hold: Arc<H>,
    ) -> Result<Self, String> {
        let (to_disk, disk_rx) = mpsc::channel(QUEUE);
        let (to_hash, hash_rx) = mpsc::channel(QUEUE);
        // Set when the download is gone, so the hash thread gives up on
        // reading the kept bytes back.
        let stopped = Arc::new(AtomicBool::new(false));
        let threads = Threads::start(
            path,
            start,
            stopped.clone(),
            hold,
            move |file, hash_at_stop| write(file, start, disk_rx, resumable, hash_at_stop),
            move |kept| hash(kept, start, hashed, hash_rx, &stopped),
        )?;
        Ok(Self {
            to_disk,
            to_hash,
            threads,
        })
    }

    /// Queues a chunk for both threads; waits while either is behind.
    pub(crate) async fn write(&self, chunk: Bytes) -> Result<(), ()> {
        self.to_hash.send(chunk.clone()).await.map_err(drop)?;
        self.to_disk.send(Message::Chunk(chunk)).await.map_err(drop)
    }

    /// Every byte is queued: waits until they are on disk and hashed.
    pub(crate) async fn finish(mut self) -> Result<Written, String> {
        self.threads.disarm();
        let _ = self.to_disk.send(Message::Finish).await;
        self.end().await
    }

    /// Stops after what is queued, keeping the file. The threads' own
    /// error, if one failed, explains a refused `write`.
    pub(crate) async fn abandon(self) -> Result<Written, String> {
        self.threads.stop();
        self.end().await
    }

    async fn end(self) -> Result<Written, String> {
        let Self {
            to_disk,
            to_hash,
            threads,
        } = self;
        drop((to_disk, to_hash));
        Ok(Written {
            sha256: threads.end().await?.finalize(),
        })
    }
}

fn write(
    file: File,
    start: u64,
    mut rx: mpsc::Receiver<Message>,
    resumable: Option<Resumable>,
    hash_at_stop: LastHash,
) -> std::io::Result<()> {
    let mut position = start;
    let mut handed_over = start;
    while let Some(message) = rx.blocking_recv() {
        match message {
            Message::Chunk(chunk) => {
                file.write_all_at(&chunk, position)?;
                position += chunk.len() as u64;
                if position - handed_over >= WRITEBACK_WINDOW {
                    start_writeback(&file, handed_over, position - handed_over);
                    handed_over = position;
                }
            }
            Message::Finish => return file.sync_data(),
        }
    }
    // Dropped without Finish: the download was interrupted; what was
    // written stays for the next attempt. The checkpoint is written after
    // the bytes are durable, and only if the hash covers exactly them (a
    // hash thread that gave up on re-reading kept bytes sends nothing).
    if let Some(resumable) = resumable {
        file.sync_data()?;
        if let Ok(hash) = hash_at_stop.recv()
            && hash.len() == position
        {
            let stamp = Stamp::of(&file.metadata()?, Some(&resumable.sha256));
            Checkpoint::new(stamp, hash, Ranges::prefix(position)).save(&resumable.record)?;
        }
    }
    Err(std::io::Error::other("the download stopped"))
}

/// The hash of the kept bytes, then of every chunk, in order.
fn hash(
    kept: File,
    start: u64,
    hashed: Option<Sha256>,
    mut rx: mpsc::Receiver<Bytes>,
    stopped: &AtomicBool,
) -> std::io::Result<Sha256> {
    let mut hasher = match hashed {
        Some(hashed) if hashed.len() == start => hashed,
        _ => {
            let mut hasher = Sha256::default();
            hash_prefix(&kept, start, &mut hasher, stopped)?;
            hasher
        }
    };
    while let Some(chunk) = rx.blocking_recv() {
        hasher.update(&chunk);
    }
    Ok(hasher)
}

/// Hashes the bytes a previous attempt left, reading them from disk: the
/// file is trusted for nothing but being the place to continue.
fn hash_prefix(
    file: &File,
    len: u64,
    hasher: &mut Sha256,
    stopped: &AtomicBool,
) -> std::io::Result<()> {
    let mut buf = vec![0; READ_BUF];
    let mut at = 0;
    while at < len {
        if stopped.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("the download stopped"));
        }
        let want = usize::try_from(len - at)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = file.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the partial file shrank",
            ));
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// Asks the kernel to start writing a range out now, without waiting for
/// it: otherwise nothing reaches the disk until the fsync at the end (or
/// until dirty memory hits the kernel's threshold), and the fsync then
/// costs a whole file's worth of disk time after the network is done.
#[cfg(target_os = "linux")]
// Neither nix nor rustix wraps sync_file_range; libc is the only way in.
#[allow(unsafe_code)]
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: a plain syscall on a file descriptor we own; failure only
    // means the writeback happens later, at the fsync.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn start_writeback(_: &File, _: u64, _: u64) {}
