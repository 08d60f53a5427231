//! A file read for publishing: from disk in chunks on a blocking thread,
//! hashed as it is read, a few chunks ahead of the upload and never more
//! (a bounded channel), so memory stays a few chunks whatever the file's
//! size. When a digest is expected, the last chunk is held back until the
//! whole file is known to be the one verified: a destination never
//! receives every byte of a file that is not. A file the verification
//! record vouches for (a model file berth checked and nobody changed since:
//! same inode, size, mtime and ctime, before and after the read) is not
//! hashed again, as a deployment does not hash it again either; any other
//! is hashed as it is read. Knows nothing of destinations.

use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::fetch::Stamp;

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
    /// (the last may be shorter), checking they are the `expected` ones
    /// when given: by `vouched`, the file's stamp when it was verified,
    /// if it still holds, else by their hash. The thread stops when
    /// `cancel` is cancelled or this reading is dropped. With `hold_last`
    /// the last chunk comes only once the file is known to be the expected
    /// one (for a destination that takes whatever arrives whole); without
    /// it, as soon as it is read (a multipart upload, completed only after
    /// `End`).
    pub(super) fn start(
        path: PathBuf,
        bytes: u64,
        expected: Option<String>,
        vouched: Option<Stamp>,
        chunk: usize,
        hold_last: bool,
        cancel: CancellationToken,
    ) -> Self {
        // One chunk waits in the channel while the next is read.
        let (tx, rx) = mpsc::channel(1);
        tokio::task::spawn_blocking(move || {
            let expected = Expected {
                sha256: expected.as_deref(),
                vouched: vouched.as_ref(),
            };
            let outcome = read(&path, bytes, expected, (chunk, hold_last), &cancel, &tx);
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

/// What the bytes of a reading must be.
#[derive(Clone, Copy)]
struct Expected<'a> {
    sha256: Option<&'a str>,
    vouched: Option<&'a Stamp>,
}

/// How a reading learns its bytes are the expected ones.
enum Check<'a> {
    Hash(Sha256),
    /// By the stamp, checked again after the last byte.
    Vouched(&'a str, &'a Stamp),
}

/// The thread's loop. Returns `Ok` also when it stops early because
/// nobody is listening any more or the put was cancelled.
fn read(
    path: &Path,
    bytes: u64,
    expected: Expected<'_>,
    (chunk, hold_last): (usize, bool),
    cancel: &CancellationToken,
    tx: &mpsc::Sender<Result<Piece, ReadError>>,
) -> Result<(), ReadError> {
    let mut file = open(path, bytes)?;
    // Vouched for: the file is still the one verified, as long as its
    // stamp still holds once every byte is read.
    let mut proof = match (expected.sha256, expected.vouched) {
        (Some(sha256), Some(stamp)) if stamp_holds(&file, stamp, sha256) => {
            Check::Vouched(sha256, stamp)
        }
        _ => Check::Hash(Sha256::new()),
    };
    let mut remaining = bytes;
    let mut held: Option<Bytes> = None;
    while remaining > 0 {
        if cancel.is_cancelled() {
            return Ok(());
        }
        let n = remaining.min(chunk as u64) as usize;
        let buf =
            read_chunk(&mut file, n).map_err(|e| short_or_io(path, bytes, bytes - remaining, e))?;
        if let Check::Hash(hasher) = &mut proof {
            hasher.update(&buf);
        }
        remaining -= n as u64;
        let ready = if hold_last {
            held.replace(Bytes::from(buf))
        } else {
            Some(Bytes::from(buf))
        };
        if let Some(ready) = ready
            && tx.blocking_send(Ok(Piece::Data(ready))).is_err()
        {
            return Ok(());
        }
    }
    ends_here(&mut file, path, bytes)?;
    let sha256 = match proof {
        Check::Hash(hasher) => hex::encode(hasher.finalize()),
        Check::Vouched(sha256, stamp) => {
            if !stamp_holds(&file, stamp, sha256) {
                return Err(ReadError::Digest(format!(
                    "{} changed while it was read (its size, times or inode are not those \
                     it had when verified); nothing was published",
                    path.display()
                )));
            }
            sha256.to_ascii_lowercase()
        }
    };
    check(path, &sha256, expected.sha256)?;
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

/// The next `n` bytes of `file`, into a buffer that is not zeroed first.
fn read_chunk(file: &mut std::fs::File, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(n);
    file.by_ref().take(n as u64).read_to_end(&mut buf)?;
    if buf.len() < n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buf)
}

/// Whether the open `file` is still the one `stamp` recorded as having
/// `sha256`.
fn stamp_holds(file: &std::fs::File, stamp: &Stamp, sha256: &str) -> bool {
    file.metadata()
        .is_ok_and(|meta| stamp.vouches_for(&meta, Some(sha256)))
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

#[cfg(test)]
mod tests {
    use std::io::{Seek, Write};

    use super::*;

    /// Every piece of a reading of `path`: its bytes and how it ended.
    async fn drain(mut reading: Reading) -> (Vec<u8>, Result<String, ReadError>) {
        let mut read = Vec::new();
        while let Some(piece) = reading.next().await {
            match piece {
                Ok(Piece::Data(chunk)) => read.extend_from_slice(&chunk),
                Ok(Piece::End { sha256 }) => return (read, Ok(sha256)),
                Err(e) => return (read, Err(e)),
            }
        }
        (read, Err(ReadError::Io("the reading stopped".into())))
    }

    fn file_of(dir: &Path, contents: &[u8]) -> (PathBuf, Stamp, String) {
        let path = dir.join("weights.bin");
        std::fs::write(&path, contents).unwrap();
        let sha256 = hex::encode(Sha256::digest(contents));
        let stamp = Stamp::of(&std::fs::metadata(&path).unwrap(), Some(&sha256));
        (path, stamp, sha256)
    }

    fn start(path: &Path, bytes: u64, sha256: &str, stamp: Option<Stamp>) -> Reading {
        let cancel = CancellationToken::new();
        Reading::start(
            path.into(),
            bytes,
            Some(sha256.into()),
            stamp,
            4,
            true,
            cancel,
        )
    }

    #[tokio::test]
    async fn a_file_its_stamp_vouches_for_is_trusted_without_hashing_it_again() {
        let dir = tempfile::TempDir::new().unwrap();
        let (path, _, _) = file_of(dir.path(), b"0123456789");
        // The record says these bytes hash to this digest; they do not, so
        // only a reading that did not hash them ends with it.
        let recorded = "ab".repeat(32);
        let stamp = Stamp::of(&std::fs::metadata(&path).unwrap(), Some(&recorded));
        let (read, end) = drain(start(&path, 10, &recorded, Some(stamp))).await;
        assert_eq!(read, b"0123456789");
        assert_eq!(end, Ok(recorded.clone()));

        // Without the stamp the same reading hashes, and refuses.
        let (_, end) = drain(start(&path, 10, &recorded, None)).await;
        assert!(matches!(end, Err(ReadError::Digest(_))), "{end:?}");
    }

    #[tokio::test]
    async fn a_file_changed_since_its_stamp_is_hashed_and_refused_before_its_last_byte() {
        let dir = tempfile::TempDir::new().unwrap();
        let (path, stamp, sha256) = file_of(dir.path(), b"0123456789");
        // Same size, other bytes: its ctime moves, so the stamp no longer
        // holds and the bytes are hashed.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"0123456780").unwrap();
        let (read, end) = drain(start(&path, 10, &sha256, Some(stamp))).await;
        assert!(matches!(end, Err(ReadError::Digest(_))), "{end:?}");
        assert!(read.len() < 10, "every byte went out: {read:?}");
    }

    #[tokio::test]
    async fn a_file_written_while_it_is_read_is_refused_before_its_last_byte() {
        let dir = tempfile::TempDir::new().unwrap();
        let contents = vec![7u8; 64];
        let (path, stamp, sha256) = file_of(dir.path(), &contents);
        let mut reading = start(&path, 64, &sha256, Some(stamp));
        // The reader is at most a few 4-byte chunks ahead: the write lands
        // while it still reads.
        let Some(Ok(Piece::Data(first))) = reading.next().await else {
            panic!("no first chunk");
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(std::io::SeekFrom::Start(60)).unwrap();
        file.write_all(&[7]).unwrap();
        drop(file);
        let (rest, end) = drain(reading).await;
        let message = match end {
            Err(ReadError::Digest(message)) => message,
            other => panic!("{other:?}"),
        };
        assert!(message.contains("changed while it was read"), "{message}");
        assert!(first.len() + rest.len() < 64);
    }

    #[tokio::test]
    async fn a_stamp_of_another_digest_vouches_for_nothing() {
        let dir = tempfile::TempDir::new().unwrap();
        let (path, stamp, _) = file_of(dir.path(), b"0123456789");
        let other = "cd".repeat(32);
        let (_, end) = drain(start(&path, 10, &other, Some(stamp))).await;
        assert!(matches!(end, Err(ReadError::Digest(_))), "{end:?}");
    }
}
