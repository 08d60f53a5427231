//! What the bucket targets share (`s3`, `azure`; `gcs` sends its chunks
//! one after another): a large file sent in parts, several at once, as a
//! reading yields them, each holding one of the bucket's part permits so
//! what they hold in memory stays bounded; a small file read whole; and
//! an object's name in its bucket.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::read::{Piece, Reading};
use super::{Error, Key, Subject, Tally, Tuning};
use crate::fetch::Stamp;

/// Sends every part `reading` yields with `send(index, bytes)`, each
/// holding one of `permits` until it is sent; returns what each send
/// returned, in the parts' order, and the file's digest (the reading
/// yields its `End` only once the file hashed as expected). The sends
/// still in flight when it returns early are dropped, which cancels their
/// requests.
pub(super) async fn send_parts<P, F, Fut>(
    subject: &Subject,
    key: &Key,
    mut reading: Reading,
    permits: &Arc<Semaphore>,
    tally: &Tally<'_>,
    cancel: &CancellationToken,
    send: F,
) -> Result<(Vec<P>, String), Error>
where
    F: Fn(usize, Bytes) -> Fut,
    Fut: Future<Output = Result<P, Error>>,
{
    let mut in_flight = FuturesUnordered::new();
    let mut parts: Vec<Option<P>> = Vec::new();
    let mut sha256 = None;
    // A permit for the next part, taken before its bytes are.
    let mut permit: Option<OwnedSemaphorePermit> = None;
    loop {
        if sha256.is_some() && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            Some((index, len, sent)) = in_flight.next(), if !in_flight.is_empty() => {
                let sent: Result<P, Error> = sent;
                parts[index] = Some(sent?);
                tally.add(len);
            }
            taken = permits.clone().acquire_owned(), if sha256.is_none() && permit.is_none() => {
                permit = Some(taken.expect("the part permits are never closed"));
            }
            piece = reading.next(), if sha256.is_none() && permit.is_some() => match piece {
                Some(Ok(Piece::Data(chunk))) => {
                    let index = parts.len();
                    parts.push(None);
                    let held = permit.take().expect("taken before the piece");
                    let len = chunk.len() as u64;
                    let sending = send(index, chunk);
                    in_flight.push(async move {
                        let sent = sending.await;
                        drop(held);
                        (index, len, sent)
                    });
                }
                Some(Ok(Piece::End { sha256: digest })) => sha256 = Some(digest),
                Some(Err(e)) => return Err(subject.source(key, e)),
                None if cancel.is_cancelled() => return Err(Error::Cancelled),
                None => return Err(subject.source(key, "reading the file stopped unexpectedly")),
            },
        }
    }
    let parts = parts
        .into_iter()
        .map(|p| p.expect("every part was sent before the loop ends"))
        .collect();
    Ok((parts, sha256.expect("the loop ends after the digest")))
}

/// How a bucket target reads a file: in parts of the tuning's size for
/// it, the last not held back (nothing is an object until the upload is
/// completed, after the reading's end); and whether the file fits in one
/// part, which then goes in one request (`read_whole`).
pub(super) fn reading(
    tuning: &Tuning,
    (path, bytes, sha256, vouched): (PathBuf, u64, Option<String>, Option<Stamp>),
    cancel: &CancellationToken,
) -> (Reading, bool) {
    let part_bytes = tuning.part_bytes_for(bytes);
    let reading = Reading::start(
        path,
        bytes,
        sha256,
        vouched,
        part_bytes as usize,
        false,
        cancel.clone(),
    );
    (reading, bytes <= part_bytes)
}

/// Every chunk of a small file, and its digest.
pub(super) async fn read_whole(
    reading: &mut Reading,
    subject: &Subject,
    key: &Key,
    cancel: &CancellationToken,
) -> Result<(Vec<Bytes>, String), Error> {
    let mut chunks = Vec::new();
    loop {
        let piece = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            piece = reading.next() => piece,
        };
        match piece {
            Some(Ok(Piece::Data(chunk))) => chunks.push(chunk),
            Some(Ok(Piece::End { sha256 })) => return Ok((chunks, sha256)),
            Some(Err(e)) => return Err(subject.source(key, e)),
            None if cancel.is_cancelled() => return Err(Error::Cancelled),
            None => return Err(subject.source(key, "reading the file stopped unexpectedly")),
        }
    }
}

/// The object's name in its bucket: `url`'s path unescaped, without its
/// leading `/` and the first `skip` segments (an Azure url's container).
/// The url is the target's joined with a checked key.
pub(super) fn object_name(url: &url::Url, skip: usize) -> Result<String, String> {
    let decoded = percent_encoding::percent_decode_str(url.path())
        .decode_utf8()
        .map_err(|_| format!("{url} does not name an object (not UTF-8)"))?;
    let relative = decoded.strip_prefix('/').unwrap_or(&decoded);
    let name = relative.splitn(skip + 1, '/').nth(skip).unwrap_or_default();
    if name.is_empty() {
        return Err(format!("{url} does not name an object"));
    }
    Ok(name.to_string())
}
