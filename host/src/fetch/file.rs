//! One file of a model put in place: its partial download continued or
//! begun (`download`), each attempt read in one stream or in pieces
//! (`attempt`), checked against the file's recorded size and hash as it
//! arrives, and renamed into place once verified; bytes that prove wrong
//! are thrown away and downloaded whole once more. Also the sentences that
//! say how bytes contradict their record, shared with `local`. Knows
//! nothing of the other files of the model.

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;

use super::cut;
use super::partial::{Checkpoint, Kept, Resumable, Writer, Written, checkpoint_path, partial_path};
use super::pieces::{self, PieceWriter};
use super::ranges::Ranges;
use super::sha::Sha256;
use super::source::{self, Location};
use super::store::lock::DirLock;
use super::store::stamp::Stamp;
use super::tally::Tally;
use super::{Fetcher, disk};
use crate::model::{ModelFile, TrainedModel};

impl Fetcher {
    /// Puts one file in place. A partial download left by an earlier
    /// attempt is continued; if the result then fails its hash, the file is
    /// downloaded whole once more, in case the kept bytes were the wrong ones.
    pub(super) async fn download(
        &self,
        model: &TrainedModel,
        file: &ModelFile,
        dir: &Path,
        tally: &Tally,
        lock: Arc<DirLock>,
    ) -> Result<Stamp, String> {
        let target_path = dir.join(&file.path);
        let location = source::locate(&model.source, &model.job_id, file)?;
        let partial = partial_path(&target_path);
        // The checkpoint an interrupted download of this file left, kept
        // beside the verification record, out of the deployers' sight.
        let record = checkpoint_path(&self.bookkeeping(&model.job_id).resume, &file.path);
        let kept = disk::holding(&lock, {
            let (target_path, partial, record) =
                (target_path.clone(), partial.clone(), record.clone());
            let file = file.clone();
            move || left_over(&target_path, &partial, &record, &file)
        })
        .await?;
        let resumable = file.sha256.as_ref().map(|sha256| Resumable {
            record,
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
        let recorded = file.sha256.is_some();
        disk::holding(&lock, move || {
            put_in_place(outcome, &partial, &target_path, recorded)
        })
        .await
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
        let pieces = cut::pieces(&missing, self.split.piece_bytes);
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
            &self.allowance,
        )
        .map_err(Failure::Interrupted)?;
        let written = pieces::download(
            &self.sources,
            target.location,
            pieces,
            body,
            &self.allowance,
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
        hashed: Option<Sha256>,
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
    location: &'a Location,
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

pub(super) fn size_contradicts(total: u64, size: u64, location: &Location) -> String {
    format!("the source has {total} bytes for this file, but the record says {size} ({location})")
}

pub(super) fn wrong_length(size: u64, received: u64, location: &Location) -> String {
    format!("expected {size} bytes, got {received} ({location})")
}

pub(super) fn sha256_mismatch(expected: &str, got: &str, location: &Location) -> String {
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

/// Makes the directory of the file at `target` and reads what an earlier
/// attempt left in its `partial`: what the checkpoint at `record` vouches
/// for, else the bytes it holds from the start, to be hashed again. A
/// partial longer than the file, or of a file without a recorded hash, is
/// not continued.
fn left_over(
    target: &Path,
    partial: &Path,
    record: &Path,
    file: &ModelFile,
) -> Result<Kept, String> {
    let parent = target
        .parent()
        .expect("a model file has a parent directory");
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    Ok(match (&file.sha256, std::fs::metadata(partial)) {
        (Some(sha256), Ok(meta)) if meta.len() <= file.size_bytes => {
            Checkpoint::take(record, partial, sha256).unwrap_or(Kept {
                have: Ranges::prefix(meta.len()),
                hash: None,
            })
        }
        _ => {
            let _ = std::fs::remove_file(record);
            Kept::nothing()
        }
    })
}

/// Ends the download of the file at `target`: a verified `partial` takes
/// its name (its stamp records the hash if the file has a `recorded` one);
/// known-bad bytes are removed, an interrupted download's are kept.
fn put_in_place(
    outcome: Result<String, Failure>,
    partial: &Path,
    target: &Path,
    recorded: bool,
) -> Result<Stamp, String> {
    let sha256 = outcome.map_err(|failure| match failure {
        Failure::Interrupted(reason) => reason,
        Failure::Rejected { reason, .. } => {
            // Known-bad bytes are not worth continuing.
            let _ = std::fs::remove_file(partial);
            reason
        }
    })?;
    std::fs::rename(partial, target)
        .map_err(|e| format!("cannot move the verified file into place: {e}"))?;
    let meta = std::fs::metadata(target).map_err(|e| e.to_string())?;
    Ok(Stamp::of(&meta, recorded.then_some(sha256.as_str())))
}
