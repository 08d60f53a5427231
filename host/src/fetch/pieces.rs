//! A large file read over several connections at once, as object stores and
//! CDNs cap each connection's rate; how many is chosen as the bytes arrive
//! (`pace`) and the shared `allowance` has. The bytes still missing are cut
//! into pieces (`cut`) that the connections claim in file order, each written in place
//! in the `.fetch-*` file by one disk thread; a hash thread follows the run
//! of written bytes from the start, so the SHA-256 (one sequential chain)
//! ends moments after the last byte arrives. It hashes a chunk from memory
//! when the chunk extended the run as it was written (always, on one
//! connection, while the hash keeps up), and reads the run back from the
//! file otherwise.
//! An interruption leaves the written pieces and a checkpoint of the hash
//! and of which bytes are written, and the next fetch asks only for the
//! rest. Memory stays bounded: chunks go to disk as they come, and the hash
//! reads back through one buffer. Knows nothing of verification records.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::allowance::Allowance;
use super::cut::{Piece, Pieces};
use super::pace::{Pace, Step, WINDOW};
use super::partial::{
    Checkpoint, LastHash, QUEUE, READ_BUF, Resumable, StopHash, Threads, WRITEBACK_WINDOW, Written,
    start_writeback,
};
use super::ranges::Ranges;
use super::sha::Sha256;
use super::source::{Body, Location, Sources};
use super::store::stamp::Stamp;
use super::tally::Tally;

/// Reads `pieces` into `writer` over as many connections as pay (`Pace`)
/// and `allowance` has; `first` is the already opened answer for the first
/// piece. A connection that fails while others still read gives its
/// piece back to them. Returns the hash of the whole file, or why the
/// download stopped (the writer then leaves what it has, with a
/// checkpoint).
pub(crate) async fn download(
    sources: &Sources,
    location: &Location,
    mut pieces: Pieces,
    first: Body,
    allowance: &Allowance,
    writer: PieceWriter,
    tally: &Tally,
) -> Result<Written, String> {
    let Some(first_piece) = pieces.next() else {
        return writer.finish().await;
    };
    let claims = Claims {
        sources,
        location,
        queue: Mutex::new(pieces),
        writer: &writer,
        tally,
        received: AtomicU64::new(0),
        retiring: AtomicUsize::new(0),
    };
    let read = claims.read_all(first_piece, first, allowance).await;
    drop(claims);
    match read {
        Ok(()) => writer.finish().await,
        Err(Stop::Source(reason)) => {
            let _ = writer.abandon().await;
            Err(reason)
        }
        // The disk thread's own error says what went wrong.
        Err(Stop::Disk) => Err(writer
            .abandon()
            .await
            .err()
            .unwrap_or_else(|| "the writer stopped".to_string())),
    }
}

/// Why a connection stopped before the pieces ran out.
enum Stop {
    Source(String),
    Disk,
}

/// What the connections of one file share: the pieces nobody claimed yet.
struct Claims<'a> {
    sources: &'a Sources,
    location: &'a Location,
    queue: Mutex<Pieces>,
    writer: &'a PieceWriter,
    tally: &'a Tally,
    /// Bytes received by every connection, for `Pace`.
    received: AtomicU64,
    /// Connections asked to stop after their piece.
    retiring: AtomicUsize,
}

impl Claims<'_> {
    /// Reads every piece over the connections `Pace` asks for, starting
    /// with one; each beyond the first holds a spare one while it reads.
    async fn read_all(
        &self,
        first_piece: Piece,
        first: Body,
        allowance: &Allowance,
    ) -> Result<(), Stop> {
        let mut pace = Pace::new(allowance.most, Instant::now());
        let mut readers = FuturesUnordered::new();
        readers.push(self.read(Some((first_piece, first)), None));
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + WINDOW, WINDOW);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                done = readers.next() => match done {
                    Some(Ok(())) => {}
                    // A source that allows fewer connections (429, 503,
                    // refused) or cut one: the others take its piece.
                    Some(Err(Stop::Source(reason))) if !readers.is_empty() => {
                        pace.refused(readers.len());
                        tracing::debug!(
                            location = %self.location,
                            connections = pace.connections(),
                            "one of the connections stopped, the others go on: {reason}"
                        );
                    }
                    Some(Err(stop)) => return Err(stop),
                    None if !self.queue.lock().expect("queue lock").is_empty() => {
                        readers.push(self.read(None, None));
                    }
                    None => return Ok(()),
                },
                _ = ticks.tick() => match pace.tick(self.received.load(Ordering::Relaxed), Instant::now()) {
                    Step::Add(n) => {
                        let permits: Vec<_> = (0..n)
                            .map_while(|_| allowance.spare.clone().try_acquire_owned().ok())
                            .collect();
                        pace.granted(n, permits.len());
                        tracing::debug!(location = %self.location, connections = pace.connections(), "more connections paid so far: opening {} more ({n} asked for)", permits.len());
                        for permit in permits {
                            readers.push(self.read(None, Some(permit)));
                        }
                    }
                    Step::Drop(n) => {
                        tracing::debug!(location = %self.location, connections = pace.connections(), "the last {n} connections did not pay: they stop after their piece");
                        self.retiring.fetch_add(n, Ordering::Relaxed);
                    }
                    Step::Hold => {}
                },
            }
        }
    }

    /// One connection: reads the pieces it claims, one after another,
    /// until none is left or it is asked to retire. A piece it does not
    /// get whole is given back. `_permit` is its place among the spare
    /// connections, given back when it ends.
    async fn read(
        &self,
        mut opened: Option<(Piece, Body)>,
        _permit: Option<OwnedSemaphorePermit>,
    ) -> Result<(), Stop> {
        loop {
            let (piece, body) = match opened.take() {
                Some(opened) => opened,
                None => {
                    if self.retire() {
                        return Ok(());
                    }
                    let Some(piece) = self.queue.lock().expect("queue lock").next() else {
                        return Ok(());
                    };
                    match self.open(piece).await {
                        Ok(body) => (piece, body),
                        Err(stop) => {
                            self.give_back(piece.start, piece.end);
                            return Err(stop);
                        }
                    }
                }
            };
            if let Err((stop, at)) = self.fill(piece, body).await {
                self.give_back(at, piece.end);
                return Err(stop);
            }
        }
    }

    /// Takes one of the retirements asked for, if any.
    fn retire(&self) -> bool {
        self.retiring
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    fn give_back(&self, start: u64, end: u64) {
        self.queue.lock().expect("queue lock").give_back(start, end);
    }

    async fn open(&self, piece: Piece) -> Result<Body, Stop> {
        let body = self
            .sources
            .open(self.location, piece.span())
            .await
            .map_err(Stop::Source)?;
        if !body.ranged || body.start != piece.start {
            return Err(Stop::Source(format!(
                "the source stopped answering range requests ({})",
                self.location
            )));
        }
        Ok(body)
    }

    /// Writes the piece as it arrives; on failure, says where it stopped.
    async fn fill(&self, piece: Piece, mut body: Body) -> Result<(), (Stop, u64)> {
        let mut at = piece.start;
        while let Some(chunk) = body.stream.next().await {
            let chunk = chunk.map_err(|e| (Stop::Source(format!("{e} at byte {at}")), at))?;
            let len = chunk.len() as u64;
            crate::metrics::fetched_bytes(len);
            if at + len > piece.end {
                let reason = format!(
                    "the source sent more than the bytes {}-{} asked for ({})",
                    piece.start,
                    piece.end - 1,
                    self.location
                );
                return Err((Stop::Source(reason), at));
            }
            self.writer
                .write(at, chunk)
                .await
                .map_err(|()| (Stop::Disk, at))?;
            self.tally.bytes(len);
            self.received.fetch_add(len, Ordering::Relaxed);
            at += len;
        }
        if at < piece.end {
            let reason = format!("the download broke off at byte {at} ({})", self.location);
            return Err((Stop::Source(reason), at));
        }
        Ok(())
    }
}

enum Message {
    Chunk {
        at: u64,
        bytes: Bytes,
        /// Its place in the `Allowance`'s queue, given back once written.
        _queued: OwnedSemaphorePermit,
    },
    /// Every piece is in: make the bytes durable.
    Finish,
}

/// What the disk thread has written, watched by the hash thread.
#[derive(Default)]
struct Progress {
    have: Ranges,
    /// How far the hash has got.
    hashed: u64,
    /// Written chunks that extended the run from the start, by offset,
    /// kept for the hash so it need not read them back, each holding one
    /// of the `Allowance`'s kept chunks.
    fresh: std::collections::BTreeMap<u64, (Bytes, OwnedSemaphorePermit)>,
    /// The disk thread is done: the hash takes what is there and ends.
    ended: bool,
    /// The download is gone: the hash stops where it is.
    stopped: bool,
}

struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
    /// The `Allowance`'s kept chunks.
    kept: Arc<Semaphore>,
}

impl Shared {
    fn update(&self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.progress.lock().expect("progress lock"));
        self.changed.notify_all();
    }
}

impl StopHash for Shared {
    fn stop_hash(&self) {
        self.update(|p| p.stopped = true);
    }
}

/// The threads behind a partial file written in pieces (`Threads`): one
/// writes chunks where they belong, one hashes the written run from the
/// start. Dropping it without `finish` (a cancelled or broken-off
/// download) leaves the file and a checkpoint for the next attempt.
pub(crate) struct PieceWriter {
    to_disk: mpsc::Sender<Message>,
    /// The `Allowance`'s queued chunks.
    queued: Arc<Semaphore>,
    threads: Threads<Shared>,
    size: u64,
}

impl PieceWriter {
    /// Writes the missing bytes of `path`, a file of `size` bytes of which
    /// `have` are already written; `hashed`, if known, covers a prefix of
    /// them (else they are read back and hashed). `hold` is kept until both
    /// threads end (`Threads`); chunks are kept for the hash while
    /// `allowance` has room.
    pub(crate) fn start<H: Send + Sync + 'static>(
        path: &Path,
        size: u64,
        have: Ranges,
        hashed: Option<Sha256>,
        resumable: Option<Resumable>,
        hold: Arc<H>,
        allowance: &Allowance,
    ) -> Result<Self, String> {
        let hasher = hashed
            .filter(|h| h.len() <= have.contiguous())
            .unwrap_or_default();
        let shared = Arc::new(Shared {
            progress: Mutex::new(Progress {
                have,
                ..Progress::default()
            }),
            changed: Condvar::new(),
            kept: allowance.kept.clone(),
        });
        let (to_disk, rx) = mpsc::channel(QUEUE);
        let (disk_shared, hash_shared) = (shared.clone(), shared.clone());
        // Sparse until written: the pieces land at their own offsets.
        let threads = Threads::start(
            path,
            size,
            shared,
            hold,
            move |file, hash_at_stop| write(file, rx, &disk_shared, resumable, hash_at_stop),
            move |kept| hash(kept, hasher, size, &hash_shared),
        )?;
        Ok(Self {
            to_disk,
            queued: allowance.queued.clone(),
            threads,
            size,
        })
    }

    /// Queues a chunk for the disk; waits while the disks are behind.
    async fn write(&self, at: u64, bytes: Bytes) -> Result<(), ()> {
        let queued = self.queued.clone().acquire_owned().await.map_err(drop)?;
        self.to_disk
            .send(Message::Chunk {
                at,
                bytes,
                _queued: queued,
            })
            .await
            .map_err(drop)
    }

    /// Every piece is queued: waits until the bytes are on disk and hashed.
    async fn finish(mut self) -> Result<Written, String> {
        self.threads.disarm();
        let _ = self.to_disk.send(Message::Finish).await;
        let size = self.size;
        let hashed = self.end().await?;
        if hashed.len() != size {
            return Err(format!(
                "only the first {} of {size} bytes were written",
                hashed.len()
            ));
        }
        Ok(Written {
            sha256: hashed.finalize(),
        })
    }

    /// Stops after what is queued, keeping the file and a checkpoint.
    async fn abandon(self) -> Result<Written, String> {
        self.end().await.map(|hashed| Written {
            sha256: hashed.finalize(),
        })
    }

    /// Closing the queue without Finish tells the disk thread the download
    /// stopped; it stops the hash once what is queued is written.
    async fn end(self) -> Result<Sha256, String> {
        let Self {
            to_disk, threads, ..
        } = self;
        drop(to_disk);
        threads.end().await
    }
}

fn write(
    file: File,
    mut rx: mpsc::Receiver<Message>,
    shared: &Shared,
    resumable: Option<Resumable>,
    hash_at_stop: LastHash,
) -> std::io::Result<()> {
    let wrote = |file: &File, rx: &mut mpsc::Receiver<Message>| -> std::io::Result<bool> {
        // Handed to the kernel's writeback a window at a time, so the
        // final fsync has little left to do.
        let mut unflushed = Ranges::default();
        while let Some(message) = rx.blocking_recv() {
            match message {
                Message::Chunk { at, bytes, .. } => {
                    file.write_all_at(&bytes, at)?;
                    let end = at + bytes.len() as u64;
                    shared.update(|p| {
                        // Only a chunk that extends the run from the start
                        // is next for the hash; one written further on
                        // would wait in memory, pinning the connection's
                        // whole read buffer, until the run reaches it.
                        let next = p.have.contiguous() == at;
                        p.have.insert(at, end);
                        if next && let Ok(kept) = shared.kept.clone().try_acquire_owned() {
                            p.fresh.insert(at, (bytes, kept));
                        }
                    });
                    unflushed.insert(at, end);
                    if unflushed.len() >= WRITEBACK_WINDOW {
                        for (start, end) in std::mem::take(&mut unflushed).iter() {
                            start_writeback(file, start, end - start);
                        }
                    }
                }
                Message::Finish => {
                    file.sync_data()?;
                    return Ok(true);
                }
            }
        }
        Ok(false)
    };
    match wrote(&file, &mut rx) {
        Ok(true) => {
            shared.update(|p| p.ended = true);
            return Ok(());
        }
        Ok(false) => shared.stop_hash(),
        Err(e) => {
            shared.stop_hash();
            return Err(e);
        }
    }
    // Interrupted: the checkpoint is written after the bytes are durable,
    // and records exactly what the disk holds.
    if let Some(resumable) = resumable {
        file.sync_data()?;
        if let Ok(hash) = hash_at_stop.recv() {
            let have = shared.progress.lock().expect("progress lock").have.clone();
            let stamp = Stamp::of(&file.metadata()?, Some(&resumable.sha256));
            Checkpoint::new(stamp, hash, have).save(&resumable.record)?;
        }
    }
    Err(std::io::Error::other("the download stopped"))
}

/// Follows the written run from the start, hashing each chunk kept in
/// memory where one starts at the hash's end and reading the run back
/// otherwise, until the whole file is hashed, the disk thread ended, or
/// the download stopped.
fn hash(file: File, mut hasher: Sha256, size: u64, shared: &Shared) -> std::io::Result<Sha256> {
    let mut buf = vec![0; READ_BUF];
    loop {
        let next = {
            let mut progress = shared.progress.lock().expect("progress lock");
            loop {
                let written = progress.have.contiguous();
                if progress.stopped {
                    break None;
                }
                if written > hasher.len() {
                    break Some((written, progress.take_fresh(hasher.len())));
                }
                if progress.ended || hasher.len() >= size {
                    break None;
                }
                progress = shared.changed.wait(progress).expect("progress lock");
            }
        };
        let Some((upto, fresh)) = next else {
            return Ok(hasher);
        };
        match fresh {
            Some(chunk) => hasher.update(&chunk),
            None => {
                let want = usize::try_from(upto - hasher.len())
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                file.read_exact_at(&mut buf[..want], hasher.len())?;
                hasher.update(&buf[..want]);
            }
        }
        let hashed = hasher.len();
        shared.progress.lock().expect("progress lock").hashed = hashed;
    }
}

impl Progress {
    /// The kept chunk written at `at`, the hash's end, if there is one;
    /// forgets the chunks the hash has passed.
    fn take_fresh(&mut self, at: u64) -> Option<Bytes> {
        while let Some(entry) = self.fresh.first_entry() {
            if *entry.key() >= at {
                break;
            }
            drop(entry.remove());
        }
        self.fresh.remove(&at).map(|(chunk, _kept)| chunk)
    }
}
