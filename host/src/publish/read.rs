//! A file read for publishing: from disk in chunks on a blocking thread,
//! hashed as it is read, a few chunks ahead of the upload and never more
//! (a bounded channel), so memory stays a few chunks whatever the file's
//! size. When a digest is expected, the last chunk is held back until the
//! whole file has hashed to it: a destination never receives every byte of
//! a file that is not the one verified. Knows nothing of destinations.

use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What a reading yields, in order: the file's bytes, then its digest.
#[derive(Debug)]
pub(super) enum Piece {
    Data(Bytes),
    /// Every byte was read; `sha256` (lowercase hex) is theirs, and the
    /// expected one if one was given.
    End {
        sha256: String,
    },
}

/// Why a file cannot be published as it is; the words name the file.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ReadError {
    Io(String),
    /// Not as many bytes as recorded: the file changed.
    Size(String),
    /// The bytes read are not the expected ones.
    Digest(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(s) | ReadError::Size(s) | ReadError::Digest(s) => f.write_str(s),
        }
    }
}

/// A file being read, chunk after chunk.
pub(super) struct Reading {
    rx: mpsc::Receiver<Result<Piece, ReadError>>,
}

impl Reading {
    /// Starts reading `bytes` bytes of `path` in chunks of `chunk` bytes
    /// (the last may be shorter), checking they hash to `expected` when
    /// given. The thread stops when `cancel` is cancelled or this reading
    /// is dropped.
    pub(super) fn start(
        path: PathBuf,
        bytes: u64,
        expected: Option<String>,
        chunk: usize,
        cancel: CancellationToken,
    ) -> Self {
        // One chunk waits in the channel while the next is read.
        let (tx, rx) = mpsc::channel(1);
        tokio::task::spawn_blocking(move || {
            let outcome = read(&path, bytes, expected.as_deref(), chunk, &cancel, &tx);
            if let Err(e) = outcome {
                let _ = tx.blocking_send(Err(e));
            }
        });
        Self { rx }
    }

    /// The next piece; `None` once the reading ended (after `End`, an
    /// error, or a cancel).
    pub(super) async fn next(&mut self) -> Option<Result<Piece, ReadError>> {
        self.rx.recv().await
    }
}

/// The thread's loop. Returns `Ok` also when it stops early because
/// nobody is listening any more or the put was cancelled.
fn read(
    path: &Path,
    bytes: u64,
    expected: Option<&str>,
    chunk: usize,
    cancel: &CancellationToken,
    tx: &mpsc::Sender<Result<Piece, ReadError>>,
) -> Result<(), ReadError> {
    let mut file = open(path, bytes)?;
    let mut hasher = Sha256::new();
    let mut remaining = bytes;
    let mut held: Option<Bytes> = None;
    while remaining > 0 {
        if cancel.is_cancelled() {
            return Ok(());
        }
        let n = remaining.min(chunk as u64) as usize;
        let mut buf = vec![0u8; n];
        file.read_exact(&mut buf)
            .map_err(|e| short_or_io(path, bytes, bytes - remaining, e))?;
        hasher.update(&buf);
        remaining -= n as u64;
        if let Some(previous) = held.replace(Bytes::from(buf))
            && tx.blocking_send(Ok(Piece::Data(previous))).is_err()
        {
            return Ok(());
        }
    }
    ends_here(&mut file, path, bytes)?;
    let sha256 = hex::encode(hasher.finalize());
    check(path, &sha256, expected)?;
    if let Some(last) = held
        && tx.blocking_send(Ok(Piece::Data(last))).is_err()
    {
        return Ok(());
    }
    let _ = tx.blocking_send(Ok(Piece::End { sha256 }));
    Ok(())
}

/// The sha256 of `bytes` bytes of `path`, read once on a blocking thread;
/// `None` when cancelled first. For destinations that must be told the
/// digest before the bytes (an HTTP mirror's `Content-Digest`).
pub(super) async fn digest_of(
    path: PathBuf,
    bytes: u64,
    cancel: CancellationToken,
) -> Result<Option<String>, ReadError> {
    // Stopped also when this future is dropped.
    let stop = cancel.child_token();
    let _stop_on_drop = stop.clone().drop_guard();
    tokio::task::spawn_blocking(move || {
        let mut file = open(&path, bytes)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut read = 0u64;
        while read < bytes {
            if stop.is_cancelled() {
                return Ok(None);
            }
            let n = (bytes - read).min(buf.len() as u64) as usize;
            file.read_exact(&mut buf[..n])
                .map_err(|e| short_or_io(&path, bytes, read, e))?;
            hasher.update(&buf[..n]);
            read += n as u64;
        }
        ends_here(&mut file, &path, bytes)?;
        Ok(Some(hex::encode(hasher.finalize())))
    })
    .await
    .map_err(|e| ReadError::Io(format!("hashing the file stopped: {e}")))?
}

/// Whether `sha256` is the `expected` digest (hex, either case).
pub(super) fn check(path: &Path, sha256: &str, expected: Option<&str>) -> Result<(), ReadError> {
    match expected {
        Some(expected) if !expected.eq_ignore_ascii_case(sha256) => {
            Err(ReadError::Digest(format!(
                "{}: its bytes' sha256 is {sha256}, not the expected {expected} \
             (the file changed after it was verified?); nothing was published",
                path.display()
            )))
        }
        _ => Ok(()),
    }
}

/// Opens `path`, which must be a regular file of `bytes` bytes.
fn open(path: &Path, bytes: u64) -> Result<std::fs::File, ReadError> {
    let file = std::fs::File::open(path)
        .map_err(|e| ReadError::Io(format!("cannot open {}: {e}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| ReadError::Io(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(ReadError::Io(format!("{} is not a file", path.display())));
    }
    if meta.len() != bytes {
        return Err(size(path, bytes, meta.len()));
    }
    Ok(file)
}

/// After the last expected byte: the file must end there.
fn ends_here(file: &mut std::fs::File, path: &Path, bytes: u64) -> Result<(), ReadError> {
    let mut one = [0u8; 1];
    match file.read(&mut one) {
        Ok(0) => Ok(()),
        Ok(_) => Err(ReadError::Size(format!(
            "{} grew beyond its {bytes} bytes while it was read; nothing was published",
            path.display()
        ))),
        Err(e) => Err(ReadError::Io(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

fn short_or_io(path: &Path, bytes: u64, at: u64, e: std::io::Error) -> ReadError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        ReadError::Size(format!(
            "{} ended before its {bytes} bytes (after at least {at}) while it was read; \
             nothing was published",
            path.display()
        ))
    } else {
        ReadError::Io(format!("cannot read {}: {e}", path.display()))
    }
}

fn size(path: &Path, expected: u64, actual: u64) -> ReadError {
    ReadError::Size(format!(
        "{} is {actual} bytes, not the {expected} expected (it changed after it was recorded?)",
        path.display()
    ))
}
