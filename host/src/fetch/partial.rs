//! A download in progress: the `.fetch-<name>` file beside its target,
//! written by one thread and hashed by another so that hashing, disk writes
//! and the network all overlap, pushed towards the disk as it grows so the
//! final fsync has little left to do, and kept when the download is interrupted
//! so that the next fetch continues where this one stopped. Knows nothing of
//! where the bytes come from or what they should hash to.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

pub(crate) const TEMP_PREFIX: &str = ".fetch-";

/// Chunks in flight to each of the two threads: enough to ride out a slow
/// write or a slow hash, few enough that memory stays flat (hyper hands
/// over at most ~400 KiB per chunk, so this is a few MiB per file).
const QUEUE: usize = 16;
/// Written bytes are handed to the disk in windows of this size, so the
/// disk works while the network does.
const WRITEBACK_WINDOW: u64 = 8 << 20;
/// Read size when hashing a resumed file's earlier bytes.
const READ_BUF: usize = 1 << 20;

/// Where the download of `target` is kept until it is verified: beside it,
/// under a name registration refuses, the same for every attempt so that
/// an attempt finds what the one before it left.
pub(crate) fn partial_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    target.with_file_name(format!("{TEMP_PREFIX}{name}"))
}

/// What the writer hands back once every byte is on disk.
pub(crate) struct Written {
    pub(crate) sha256: String,
}

enum Message {
    Chunk(Bytes),
    /// No more bytes: make them durable.
    Finish,
}

/// The two threads behind one partial file: one hashes, one writes, each
/// at its own pace within the queue, so neither waits for the other's
/// work. Dropping the writer without `finish` (a cancelled or broken-off
/// download) leaves the file for the next attempt.
pub(crate) struct Writer {
    to_disk: mpsc::Sender<Message>,
    to_hash: mpsc::Sender<Bytes>,
    disk: tokio::task::JoinHandle<std::io::Result<()>>,
    hash: tokio::task::JoinHandle<std::io::Result<String>>,
    path: PathBuf,
    stop: StopOnDrop,
}

/// Tells the hashing thread to give up on the kept bytes when the download
/// it serves is gone, instead of reading gigabytes for nobody.
struct StopOnDrop {
    flag: Arc<AtomicBool>,
    armed: bool,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
}

impl Writer {
    /// Writes `path` from byte `start` on; what is in the file before
    /// `start` (a resumed download) is read back and hashed first, while
    /// the rest arrives, so the hash covers every byte. `hold` is kept
    /// until both threads end: the directory lock outlives a writer whose
    /// download was dropped.
    pub(crate) fn start<H: Send + Sync + 'static>(
        path: &Path,
        start: u64,
        hold: Arc<H>,
    ) -> Result<Self, String> {
        let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
        // Opened here, synchronously: a download dropped before the threads
        // run must still find the file where it expects it.
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(failed)?;
        file.set_len(start).map_err(failed)?;
        let kept = file.try_clone().map_err(failed)?;
        let (to_disk, disk_rx) = mpsc::channel(QUEUE);
        let (to_hash, hash_rx) = mpsc::channel(QUEUE);
        let stop = StopOnDrop {
            flag: Arc::new(AtomicBool::new(false)),
            armed: true,
        };
        let (held, stopped) = (hold.clone(), stop.flag.clone());
        let disk = tokio::task::spawn_blocking(move || {
            let _hold = held;
            write(file, start, disk_rx)
        });
        let hash = tokio::task::spawn_blocking(move || {
            let _hold = hold;
            hash(kept, start, hash_rx, &stopped)
        });
        Ok(Self {
            to_disk,
            to_hash,
            disk,
            hash,
            path: path.to_path_buf(),
            stop,
        })
    }

    /// Queues a chunk for both threads; waits while either is behind.
    pub(crate) async fn write(&self, chunk: Bytes) -> Result<(), ()> {
        self.to_hash.send(chunk.clone()).await.map_err(drop)?;
        self.to_disk.send(Message::Chunk(chunk)).await.map_err(drop)
    }

    /// Every byte is queued: waits until they are on disk and hashed.
    pub(crate) async fn finish(mut self) -> Result<Written, String> {
        self.stop.armed = false;
        let _ = self.to_disk.send(Message::Finish).await;
        self.end().await
    }

    /// Stops after what is queued, keeping the file. The threads' own
    /// error, if one failed, explains a refused `write`.
    pub(crate) async fn abandon(self) -> Result<Written, String> {
        self.end().await
    }

    async fn end(self) -> Result<Written, String> {
        let Self {
            to_disk,
            to_hash,
            disk,
            hash,
            path,
            stop,
        } = self;
        drop((to_disk, to_hash, stop));
        let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
        let crashed = |e: tokio::task::JoinError| format!("the writer crashed: {e}");
        let (disk, hash) = (disk.await.map_err(crashed)?, hash.await.map_err(crashed)?);
        disk.map_err(failed)?;
        Ok(Written {
            sha256: hash.map_err(failed)?,
        })
    }
}

fn write(file: File, start: u64, mut rx: mpsc::Receiver<Message>) -> std::io::Result<()> {
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
    // written stays for the next attempt, which hashes it again.
    Err(std::io::Error::other("the download stopped"))
}

/// The hash of the kept bytes, then of every chunk, in order.
fn hash(
    kept: File,
    start: u64,
    mut rx: mpsc::Receiver<Bytes>,
    stopped: &AtomicBool,
) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    hash_prefix(&kept, start, &mut hasher, stopped)?;
    while let Some(chunk) = rx.blocking_recv() {
        hasher.update(&chunk);
    }
    Ok(hex::encode(hasher.finalize()))
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
fn start_writeback(file: &File, offset: u64, len: u64) {
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
fn start_writeback(_: &File, _: u64, _: u64) {}
