//! Blobs that arrive by upload (`PUT /v1/blobs/sha256:…`, or
//! `/v1/blobs/uploads/ID` when the client has not hashed the bytes yet)
//! rather than from a source: the body is written to `.blobs/uploads/` on
//! the models
//! volume by the same two threads a download uses (`partial::Writer`: one
//! writes, one hashes, as the bytes arrive), and becomes the blob, pinned
//! (`Blobs::commit`), only once every byte is there and its sha256 is the
//! one named (an upload named by an id becomes the blob of the sha256 its
//! bytes have). A cut keeps the partial and a checkpoint of the hash, so the
//! next attempt continues at its offset without reading back what came.
//! One upload of a name at a time on the volume: a second waits for the
//! first, then finds the blob or the first's offset. Knows nothing of
//! HTTP or models' records.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::partial::{Checkpoint, Resumable, Writer};
use super::store::blobs::UPLOADS;
use super::store::lock::DirLock;
use super::{BLOBS_DIR, Error, Fetcher, META_DIR, disk};
use crate::model::ModelFile;

/// One request's part of an upload: its name, the blob's size, and where
/// in it this request's bytes start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub name: UploadName,
    pub size: u64,
    pub offset: u64,
}

/// What names an upload, and so where its bytes wait between requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadName {
    /// The sha256 (hex) the bytes must have: a client that hashed them
    /// first, and whose upload any other client of the same bytes meets.
    Sha256(String),
    /// An id the client chose (`ID_RULE`), for bytes it hashes as it sends
    /// them: they become the blob of whatever sha256 they have.
    Id(String),
}

/// What an upload id may be: long enough not to be guessed or met by
/// chance, short and plain enough to be a file name.
pub const ID_RULE: &str = "16 to 64 letters, digits, '-' or '_'";

impl UploadName {
    /// The id `id`, if it keeps `ID_RULE`.
    pub fn id(id: &str) -> Option<Self> {
        ((16..=64).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        .then(|| Self::Id(id.to_string()))
    }

    /// The name of its partial file, lock and checkpoint: the hex of a
    /// digest, `id-` and the id for an id (never 64 hex digits).
    fn key(&self) -> Cow<'_, str> {
        match self {
            Self::Sha256(hex) => Cow::Borrowed(hex),
            Self::Id(id) => Cow::Owned(format!("id-{id}")),
        }
    }
}

impl fmt::Display for UploadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sha256(hex) => write!(f, "sha256 {hex}"),
            Self::Id(id) => write!(f, "upload {id}"),
        }
    }
}

/// What the store holds of a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The whole blob, verified.
    Stored { size: u64 },
    /// The first `offset` bytes of an upload (0: nothing).
    Partial { offset: u64 },
}

/// How an upload request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uploaded {
    /// Its last byte came, the sha256 matched (or, for an id, was taken):
    /// the blob of `sha256` is stored, pinned.
    Stored { sha256: String },
    /// The store had the blob of the digest named already; it is pinned,
    /// no byte was read.
    AlreadyStored { sha256: String },
    /// Its body ended before the blob's last byte: `offset` bytes are held.
    Partial { offset: u64 },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UploadError {
    #[error(
        "{upload}: the server holds {held} bytes of this upload, not {asked}; send the rest from Upload-Offset {held}"
    )]
    Offset {
        upload: UploadName,
        held: u64,
        asked: u64,
    },
    #[error("{upload}: the body goes past Upload-Length {size}")]
    TooLong { upload: UploadName, size: u64 },
    #[error("{upload}: the store holds it with {stored} bytes, not the {size} of Upload-Length")]
    OtherSize {
        upload: UploadName,
        stored: u64,
        size: u64,
    },
    #[error(
        "the {size} bytes received hash to sha256 {actual}, not {sha256}: nothing was kept; check the file did not change since it was hashed, and upload it again"
    )]
    Mismatch {
        sha256: String,
        actual: String,
        size: u64,
    },
    #[error(
        "{upload}: the body was cut after byte {offset}; the upload resumes from Upload-Offset {offset}"
    )]
    Cut { upload: UploadName, offset: u64 },
    #[error(
        "{upload}: {} is more than the models dir's whole budget of {} (--models-max-gib)",
        crate::human::size(*.size), crate::human::size(*.budget)
    )]
    LargerThanBudget {
        upload: UploadName,
        size: u64,
        budget: u64,
    },
    #[error(
        "{upload}: the upload needs {} more, but the models dir holds {} of its budget of {} (--models-max-gib) and no model's copy can be dropped; raise --models-max-gib, or delete models",
        crate::human::size(*.needed), crate::human::size(*.used), crate::human::size(*.budget)
    )]
    OverBudget {
        upload: UploadName,
        needed: u64,
        used: u64,
        budget: u64,
    },
    #[error(
        "{upload}: the upload needs {} more, but the models volume has {} free and berth keeps {} of it (--min-free-mib); free some space",
        crate::human::size(*.needed), crate::human::size(*.free), crate::human::size(*.reserve)
    )]
    NoRoom {
        upload: UploadName,
        needed: u64,
        free: u64,
        reserve: u64,
    },
    #[error("{upload}: {reason}")]
    Disk { upload: UploadName, reason: String },
}

impl Fetcher {
    /// What the store holds of `name`: the blob of a digest, or how far an
    /// upload of it got.
    pub async fn held(&self, name: &UploadName) -> Held {
        let (blobs, partial) = (self.blobs.clone(), self.upload_path(name));
        let digest = match name {
            UploadName::Sha256(hex) => Some(hex.clone()),
            UploadName::Id(_) => None,
        };
        disk::blocking(move || {
            let stored = digest.and_then(|hex| std::fs::symlink_metadata(blobs.path(&hex)).ok());
            match stored {
                Some(meta) if meta.is_file() => Held::Stored { size: meta.len() },
                _ => Held::Partial {
                    offset: std::fs::metadata(partial).map_or(0, |m| m.len()),
                },
            }
        })
        .await
    }

    /// Takes `body`, the bytes of `upload` from its offset on, into the
    /// store: the blob, pinned, once the last byte came and verified. A
    /// body that ends early keeps what came for the next request; one cut
    /// off (an error of `body`) keeps it too, with a checkpoint of the hash.
    /// A refusal reads no byte of `body`: what is left of it is the
    /// caller's.
    pub async fn upload<E>(
        &self,
        upload: &Upload,
        body: &mut (impl Stream<Item = Result<Bytes, E>> + Unpin),
    ) -> Result<Uploaded, UploadError> {
        let name = upload.name.clone();
        let key = name.key().into_owned();
        let disk = |e: std::io::Error| UploadError::Disk {
            upload: name.clone(),
            reason: e.to_string(),
        };
        let turn = Arc::new(
            DirLock::acquire(
                &self.upload_books(&name, "upload.lock"),
                self.shared_locks.as_deref(),
            )
            .await
            .map_err(disk)?,
        );
        let (partial, record) = (self.upload_path(&name), self.upload_books(&name, "json"));
        let mut held = self.held(&name).await;
        if let Held::Partial { offset } = held
            && offset > upload.size
        {
            // Bytes sent under a larger Upload-Length than the blob has:
            // no prefix of it. Started over.
            let (partial, record) = (partial.clone(), record.clone());
            disk::blocking(move || {
                let _ = std::fs::remove_file(record);
                std::fs::remove_file(partial)
            })
            .await
            .map_err(disk)?;
            held = Held::Partial { offset: 0 };
        }
        match (held, &name) {
            (Held::Stored { size }, _) if size != upload.size => {
                return Err(UploadError::OtherSize {
                    upload: name,
                    stored: size,
                    size: upload.size,
                });
            }
            (Held::Stored { .. }, UploadName::Sha256(hex)) => {
                return match self.commit(hex, None, &record).await.map_err(disk)? {
                    true => Ok(Uploaded::AlreadyStored {
                        sha256: hex.clone(),
                    }),
                    // Found damaged and removed: this upload starts over.
                    false => Err(UploadError::Offset {
                        upload: name,
                        held: 0,
                        asked: upload.offset,
                    }),
                };
            }
            (Held::Partial { offset }, _) if offset != upload.offset => {
                return Err(UploadError::Offset {
                    upload: name,
                    held: offset,
                    asked: upload.offset,
                });
            }
            _ => {}
        }
        if upload.offset > upload.size {
            return Err(UploadError::TooLong {
                upload: name,
                size: upload.size,
            });
        }
        let _claim = self.room_for(upload).await?;
        let hashed = disk::blocking({
            let (partial, record, key) = (partial.clone(), record.clone(), key.clone());
            move || {
                std::fs::create_dir_all(partial.parent().expect("in .blobs/uploads"))?;
                // A checkpoint whose hash stops short of the offset is
                // no use: the kept bytes are read back and hashed.
                Ok::<_, std::io::Error>(
                    Checkpoint::take(&record, &partial, &key).and_then(|kept| kept.hash),
                )
            }
        })
        .await
        .map_err(disk)?;
        let resumable = Resumable {
            record: record.clone(),
            sha256: key,
        };
        let failed = |reason| UploadError::Disk {
            upload: name.clone(),
            reason,
        };
        let writer = Writer::start(
            &partial,
            upload.offset,
            hashed,
            Some(resumable),
            turn.clone(),
        )
        .map_err(failed)?;
        let mut at = upload.offset;
        while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else {
                let _ = writer.abandon().await;
                return Err(UploadError::Cut {
                    upload: name,
                    offset: at,
                });
            };
            at += chunk.len() as u64;
            if at > upload.size {
                let _ = writer.abandon().await;
                return Err(UploadError::TooLong {
                    upload: name,
                    size: upload.size,
                });
            }
            if writer.write(chunk).await.is_err() {
                let reason = writer.abandon().await.err().unwrap_or_default();
                return Err(UploadError::Disk {
                    upload: name,
                    reason,
                });
            }
        }
        if at < upload.size {
            let _ = writer.abandon().await;
            return Ok(Uploaded::Partial { offset: at });
        }
        let written = writer.finish().await.map_err(failed)?;
        if let UploadName::Sha256(hex) = &name
            && written.sha256 != *hex
        {
            disk::blocking(move || {
                let _ = std::fs::remove_file(partial);
            })
            .await;
            return Err(UploadError::Mismatch {
                sha256: hex.clone(),
                actual: written.sha256,
                size: upload.size,
            });
        }
        self.commit(&written.sha256, Some(partial), &record)
            .await
            .map_err(disk)?;
        drop(turn);
        Ok(Uploaded::Stored {
            sha256: written.sha256,
        })
    }

    /// Pins the blob of every file of a model registered as uploaded; the
    /// first file whose blob the store does not hold intact, if any.
    pub async fn pin_uploaded<'a>(
        &self,
        files: &'a [ModelFile],
    ) -> std::io::Result<Option<&'a ModelFile>> {
        for file in files {
            let Some(sha256) = file.sha256.clone() else {
                return Ok(Some(file));
            };
            let digest =
                DirLock::acquire(&self.blobs.lock_path(&sha256), self.shared_locks.as_deref())
                    .await?;
            let (blobs, size) = (self.blobs.clone(), file.size_bytes);
            let pinned = disk::blocking(move || {
                let _digest = digest;
                blobs.pin_intact(&sha256, size)
            })
            .await?;
            if !pinned {
                return Ok(Some(file));
            }
        }
        Ok(None)
    }

    /// Takes the pins of `digests` away (their uploaded models are
    /// deleted); each blob goes with the next sweep once no model links it.
    pub async fn unpin(&self, digests: impl IntoIterator<Item = String>) -> std::io::Result<()> {
        for sha256 in digests {
            let digest =
                DirLock::acquire(&self.blobs.lock_path(&sha256), self.shared_locks.as_deref())
                    .await?;
            let blobs = self.blobs.clone();
            disk::blocking(move || {
                let _digest = digest;
                blobs.unpin(&sha256)
            })
            .await?;
        }
        Ok(())
    }

    /// Under the digest's lock: `partial`, verified, becomes the blob,
    /// pinned; without one, the blob the store holds is pinned if intact
    /// (`false` if it was not). Either way the upload's hash checkpoint
    /// `record` is done with.
    async fn commit(
        &self,
        sha256: &str,
        partial: Option<PathBuf>,
        record: &Path,
    ) -> std::io::Result<bool> {
        let digest =
            DirLock::acquire(&self.blobs.lock_path(sha256), self.shared_locks.as_deref()).await?;
        let (blobs, sha256, record) = (self.blobs.clone(), sha256.to_string(), record.to_owned());
        disk::blocking(move || {
            let _digest = digest;
            let _ = std::fs::remove_file(record);
            match partial {
                Some(partial) => blobs.commit(&sha256, &partial).map(|()| true),
                None => {
                    let size = std::fs::metadata(blobs.path(&sha256))?.len();
                    blobs.pin_intact(&sha256, size)
                }
            }
        })
        .await
    }

    /// Room for the rest of `upload` under the budget and on the volume.
    async fn room_for(
        &self,
        upload: &Upload,
    ) -> Result<Option<super::store::budget::Claim>, UploadError> {
        let name = upload.name.clone();
        let needed = upload.size - upload.offset;
        // No model's copy is kept back: the upload is no model's yet.
        let claim = self.claim("", needed).await.map_err(|e| match e {
            Error::LargerThanBudget { budget, .. } => UploadError::LargerThanBudget {
                upload: name.clone(),
                size: upload.size,
                budget,
            },
            Error::OverBudget { used, budget, .. } => UploadError::OverBudget {
                upload: name.clone(),
                needed,
                used,
                budget,
            },
            e => UploadError::Disk {
                upload: name.clone(),
                reason: e.to_string(),
            },
        })?;
        let (dir, reserve) = (self.models_dir.clone(), self.reserve);
        disk::blocking(move || disk::check_room(&dir, needed, reserve))
            .await
            .map_err(|e| match e {
                Error::NoRoom {
                    needed,
                    free,
                    reserve,
                    ..
                } => UploadError::NoRoom {
                    upload: name,
                    needed,
                    free,
                    reserve,
                },
                e => UploadError::Disk {
                    upload: name,
                    reason: e.to_string(),
                },
            })?;
        Ok(claim)
    }

    /// Where the bytes of an upload wait: on the blobs' own filesystem, so
    /// that the blob is the same inode.
    pub(in crate::fetch) fn upload_path(&self, name: &UploadName) -> PathBuf {
        self.models_dir
            .join(BLOBS_DIR)
            .join(UPLOADS)
            .join(name.key().as_ref())
    }

    /// An upload's lock (`upload.lock`: not the digest's own lock's name,
    /// which names a `SharedLocks` lock too) and hash checkpoint (`json`).
    pub(in crate::fetch) fn upload_books(&self, name: &UploadName, kind: &str) -> PathBuf {
        self.models_dir
            .join(META_DIR)
            .join(UPLOADS)
            .join(format!("{}.{kind}", name.key()))
    }
}
