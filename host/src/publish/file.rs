//! Folders on this server as targets (`file:///abs/dir/`), for trials and
//! tests: a put writes a hidden partial file beside the destination,
//! syncs it and renames it into place, so a reader sees the whole object
//! or none; a failed or cancelled put removes its partial (also when its
//! future is dropped). The key's folders are made as needed and never
//! through a symbolic link: a key stays inside the target's folder.

use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::destination::Destination;
use super::oci::pending::Slot;
use super::read::{Piece, Reading};
use super::{Body, Error, Key, ObjectInfo, Put, Subject, Tally, look_up_of, upload_of};

/// Bytes copied at a time.
const CHUNK: usize = 1 << 20;

/// One target's folder.
pub(super) struct Folder {
    root: PathBuf,
}

impl Folder {
    pub(super) fn new(url: &url::Url) -> Result<Self, String> {
        let root = url
            .to_file_path()
            .map_err(|()| format!("{url} is not a folder of this server"))?;
        Ok(Self { root })
    }

    /// The file of `key`: the root with each of its segments (none is
    /// empty, `.` or `..`, or holds a `/` or `\`).
    fn file_of(&self, key: &Key) -> PathBuf {
        let mut path = self.root.clone();
        path.extend(key.segments());
        path
    }

    /// Writes `body` into the partial file and syncs it.
    async fn write(
        &self,
        subject: &Subject,
        key: &Key,
        partial: &Partial,
        body: Body,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<Put, Error> {
        let what = upload_of(key);
        let cannot = |e: std::io::Error| {
            subject.refused(
                &what,
                format!("cannot write {}: {e}", partial.path.display()),
            )
        };
        let mut out = tokio::fs::OpenOptions::new()
            .write(true)
            .open(&partial.path)
            .await
            .map_err(cannot)?;
        let (bytes, sha256) = match body {
            Body::Bytes { bytes, .. } => {
                out.write_all(&bytes).await.map_err(cannot)?;
                (bytes.len() as u64, super::sha256_hex(&bytes))
            }
            Body::File {
                path,
                bytes,
                sha256,
                vouched,
            } => {
                let mut reading =
                    Reading::start(path, bytes, sha256, vouched, CHUNK, true, cancel.clone());
                let sha256 = loop {
                    let piece = tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return Err(Error::Cancelled),
                        piece = reading.next() => piece,
                    };
                    match piece {
                        Some(Ok(Piece::Data(chunk))) => {
                            out.write_all(&chunk).await.map_err(cannot)?;
                            tally.add(chunk.len() as u64);
                        }
                        Some(Ok(Piece::End { sha256 })) => break sha256,
                        Some(Err(e)) => return Err(subject.source(key, e)),
                        None if cancel.is_cancelled() => return Err(Error::Cancelled),
                        None => {
                            return Err(
                                subject.source(key, "reading the file stopped unexpectedly")
                            );
                        }
                    }
                };
                (bytes, sha256)
            }
        };
        out.sync_all().await.map_err(cannot)?;
        Ok(Put {
            bytes,
            sha256,
            etag: None,
        })
    }
}

impl Destination for Folder {
    async fn put(
        &self,
        subject: &Subject,
        key: &Key,
        _layer: Option<Slot<'_>>,
        body: Body,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Put), Error> {
        let what = upload_of(key);
        let refused = |e: String| subject.refused(&what, e);
        let destination = self.file_of(key);
        let (root, folders) = (self.root.clone(), folders_of(key));
        let folder = tokio::task::spawn_blocking(move || make_folders(&root, &folders))
            .await
            .map_err(|e| refused(e.to_string()))?
            .map_err(refused)?;
        let partial = Partial::create(&folder).await.map_err(refused)?;
        let written = self
            .write(subject, key, &partial, body, tally, cancel)
            .await?;
        partial.place(&destination).await.map_err(refused)?;
        Ok((subject.join(key).to_string(), written))
    }

    async fn stat(&self, subject: &Subject, key: &Key) -> Result<Option<ObjectInfo>, Error> {
        let path = self.file_of(key);
        match tokio::fs::symlink_metadata(&path).await {
            Ok(meta) if meta.is_file() => Ok(Some(ObjectInfo {
                bytes: meta.len(),
                etag: None,
            })),
            // A folder or a link is no object put here.
            Ok(_) => Ok(None),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(subject.refused(
                &look_up_of(key),
                format!("cannot look at {}: {e}", path.display()),
            )),
        }
    }
}

/// The key's folders, in order: its segments but the last.
fn folders_of(key: &Key) -> Vec<String> {
    let segments: Vec<&str> = key.segments().collect();
    segments[..segments.len() - 1]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Makes the root (the operator's folder, links allowed) and then each of
/// `folders` under it, refusing anything in the way that is not a folder,
/// a symbolic link included; returns the innermost.
fn make_folders(root: &Path, folders: &[String]) -> Result<PathBuf, String> {
    std::fs::create_dir_all(root)
        .map_err(|e| format!("cannot make the target's folder {}: {e}", root.display()))?;
    let mut folder = root.to_path_buf();
    for name in folders {
        folder.push(name);
        match std::fs::symlink_metadata(&folder) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "{} is in the way: not a folder (a key's folders are never files or links)",
                    folder.display()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match std::fs::create_dir(&folder) {
                    Ok(()) => {}
                    // Another put made it meanwhile.
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AlreadyExists
                            && std::fs::symlink_metadata(&folder).is_ok_and(|m| m.is_dir()) => {}
                    Err(e) => {
                        return Err(format!("cannot make the folder {}: {e}", folder.display()));
                    }
                }
            }
            Err(e) => return Err(format!("cannot look at {}: {e}", folder.display())),
        }
    }
    Ok(folder)
}

/// A partial file beside its destination; removed on drop unless placed.
struct Partial {
    path: PathBuf,
    placed: bool,
}

impl Partial {
    /// A new, empty, hidden file of a name no other put uses.
    async fn create(folder: &Path) -> Result<Self, String> {
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| format!("cannot get random bytes: {e}"))?;
        let path = folder.join(format!(".publish-{}.partial", hex::encode(nonce)));
        tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(Self {
            path,
            placed: false,
        })
    }

    /// Renames it to `destination` and syncs the folder, so the rename
    /// survives a crash.
    async fn place(mut self, destination: &Path) -> Result<(), String> {
        tokio::fs::rename(&self.path, destination)
            .await
            .map_err(|e| {
                format!(
                    "cannot put the file in place at {}: {e}",
                    destination.display()
                )
            })?;
        self.placed = true;
        let folder = destination.parent().map(Path::to_path_buf);
        if let Some(folder) = folder {
            // Best effort: the file is in place and whole either way.
            let _ =
                tokio::task::spawn_blocking(move || std::fs::File::open(folder)?.sync_all()).await;
        }
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
