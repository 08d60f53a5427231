//! `berth models push DIR`: a training run's folder read as a registration
//! (`run_folder`: the same choice of files, hashes and fields as
//! `register`), its files uploaded through the server into its blob store,
//! then registered with the source `upload:`. A file is read once: sent
//! under an id from the file's identity (`PUT /v1/blobs/uploads/ID`), it
//! becomes the blob of the sha256 the server computes as it arrives. The
//! transfer is checked end to end: sent whole in one request, by the
//! CRC-32 of its bytes (the answer's `Upload-Checksum`), as object stores
//! check uploads; resumed, by a sha256 hashed here as it is sent (its first
//! bytes read from the file), which must be the server's. A folder the
//! server has registered already (same job
//! id, paths and sizes) is hashed first instead, and only what the server
//! lacks is sent (`PUT /v1/blobs/sha256:…`). A cut upload is resumed at its
//! offset, a few times in one run, and again by running the command again.

use std::io::{Read, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use futures::TryStreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncSeekExt;
use tokio::sync::mpsc;

use super::api::{Api, Error};
use super::progress::Meter;
use super::run_folder::{self, FolderArgs};
use super::{Common, print_json};
use crate::cli::folder::{Changed, Listed};
use crate::http::json::{self, FileBody};
use crate::model::UPLOADED;

#[derive(Debug, Args)]
pub struct PushArgs {
    #[command(flatten)]
    folder: FolderArgs,
    #[command(flatten)]
    pub common: Common,
}

pub async fn run(args: PushArgs) -> Result<(), Error> {
    // A bad --server is said before the files are hashed.
    let api = (!args.folder.dry_run)
        .then(|| Api::new(&args.common.server, args.common.token.as_deref()))
        .transpose()?;
    let source = |_: &Path, _: &[Listed]| Ok(UPLOADED.to_string());
    let digests = async |dir: &Path, files: &[Listed], registered: Option<i64>| match &api {
        Some(api) if registered.is_none() => send_all(api, dir, files).await,
        _ => run_folder::hashed(dir, files).await,
    };
    let read = run_folder::complete(&args.folder, api.as_ref(), &source, &digests).await?;
    let Some(api) = api else {
        print_json(&serde_json::to_value(&read.body).unwrap_or_default());
        return Ok(());
    };
    if read.registered.is_some() {
        let files = read.body.files.as_deref().unwrap_or_default();
        let blobs = files.iter().filter_map(|file| {
            Some(Blob {
                path: file.path.as_deref()?,
                size: file.size_bytes?,
                sha256: Some(file.sha256.as_deref()?),
            })
        });
        send(&api, &read.dir, blobs.collect()).await?;
    }
    let answer = api.post::<json::Model>("/v1/models", &read.body).await?;
    run_folder::report(answer, read.registered, args.common.json);
    Ok(())
}

/// One file to upload: its path in the folder, its size, and its sha256
/// if it was hashed before (`None`: hashed as it is sent).
struct Blob<'a> {
    path: &'a str,
    size: u64,
    sha256: Option<&'a str>,
}

/// Sends each of `files` hashed as it goes: their sizes and digests.
async fn send_all(api: &Api, dir: &Path, files: &[Listed]) -> Result<Vec<FileBody>, Error> {
    let blobs = files.iter().map(|file| Blob {
        path: &file.path,
        size: file.size,
        sha256: None,
    });
    let digests = send(api, dir, blobs.collect()).await?;
    Ok(files
        .iter()
        .zip(digests)
        .map(|(file, sha256)| FileBody {
            path: Some(file.path.clone()),
            size_bytes: Some(file.size),
            sha256: Some(sha256),
        })
        .collect())
}

/// Uploads `blobs` (a known digest once) one at a time, with a meter on
/// stderr: the sha256 of each.
async fn send(api: &Api, dir: &Path, mut blobs: Vec<Blob<'_>>) -> Result<Vec<String>, Error> {
    let mut seen = std::collections::HashSet::new();
    blobs.retain(|b| b.sha256.is_none_or(|sha256| seen.insert(sha256)));
    let total = blobs.iter().map(|b| b.size).sum();
    let meter = Meter::start(format!("uploading {} files", blobs.len()), total, true);
    let done = meter.done();
    let mut digests = Vec::with_capacity(blobs.len());
    let mut result = Ok(());
    for blob in &blobs {
        match upload(api, dir, blob, &done).await {
            Ok(sha256) => digests.push(sha256),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    meter.finish().await;
    result.map(|()| digests)
}

/// How many times one run resumes a blob whose upload was cut.
const ATTEMPTS: usize = 5;
/// The pause before resuming.
const PAUSE: Duration = Duration::from_secs(1);

/// Uploads `blob` from the offset the server holds; resumes it there after
/// a cut, up to `ATTEMPTS` times: the sha256 the server stored it as. Adds
/// the bytes sent (and those the server held already) to `done`.
async fn upload(
    api: &Api,
    dir: &Path,
    blob: &Blob<'_>,
    done: &Arc<AtomicU64>,
) -> Result<String, Error> {
    let path = dir.join(blob.path);
    let cannot = |e: std::io::Error| Error::Invalid(format!("cannot read {}: {e}", path.display()));
    let before = std::fs::metadata(&path).map_err(cannot)?;
    let url = match blob.sha256 {
        Some(sha256) => format!("/v1/blobs/sha256:{sha256}"),
        None => format!("/v1/blobs/uploads/{}", upload_id(&path, &before)),
    };
    let start = done.load(Ordering::Relaxed);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (stored, held) = api.upload_offset(&url).await?;
        if let (true, Some(sha256)) = (stored, blob.sha256) {
            done.store(start + blob.size, Ordering::Relaxed);
            return Ok(sha256.to_string());
        }
        // Bytes held past the size are no prefix of this file: the server
        // starts such an upload over.
        let offset = if held > blob.size { 0 } else { held };
        if attempt == 1 && offset > 0 {
            eprintln!(
                "{}: resuming its upload after the {} the server holds",
                blob.path,
                crate::human::size(offset)
            );
        }
        done.store(start + offset, Ordering::Relaxed);
        let (body, check) = from_offset(&path, blob, offset, done.clone()).await?;
        let range = (blob.size, offset, blob.size - offset);
        match api.upload(&url, range, body).await {
            Ok((status, checksum, answer)) if status != reqwest::StatusCode::ACCEPTED => {
                let Some(check) = check else {
                    return Ok(blob.sha256.unwrap_or_default().to_string());
                };
                let said = Said {
                    checksum: checksum.as_deref(),
                    answer: &answer,
                };
                return checked(blob, &path, &before, check, said).await;
            }
            // The body ended early, or was cut (the server keeps what came
            // and says where to go on), or another upload of the same bytes
            // moved the offset: ask again.
            Ok(_) => {}
            Err(Error::Unreachable { .. }) if attempt < ATTEMPTS => {
                refusal(api, &url, blob, offset).await?;
                tokio::time::sleep(PAUSE).await;
            }
            Err(Error::Refused { status, .. })
                if status == reqwest::StatusCode::CONFLICT && attempt < ATTEMPTS => {}
            Err(e) => return Err(e),
        }
        if attempt >= ATTEMPTS {
            return Err(Error::Invalid(format!(
                "{}: the upload did not finish after {ATTEMPTS} attempts; run the command again \
                 to resume it",
                blob.path
            )));
        }
    }
}

/// What the server answered a finished upload with.
struct Said<'a> {
    /// `Upload-Checksum`: `crc32 HEX` of the request's bytes.
    checksum: Option<&'a str>,
    /// The stored blob (`json::Blob`), as JSON.
    answer: &'a str,
}

/// The sha256 the server stored a blob sent by id as, once the transfer
/// checks out (`check`) and the file did not change while it was read.
async fn checked(
    blob: &Blob<'_>,
    path: &Path,
    before: &std::fs::Metadata,
    check: Check,
    said: Said<'_>,
) -> Result<String, Error> {
    let cannot = |e: std::io::Error| Error::Invalid(format!("cannot read {}: {e}", path.display()));
    let theirs: json::Blob = serde_json::from_str(said.answer).map_err(|_| {
        Error::Invalid(format!(
            "{}: the server's answer to its upload names no sha256 (is it a berth server of this \
             version?)",
            blob.path
        ))
    })?;
    let changed = |what: &str, ours: &str, theirs: &str| {
        Error::Invalid(format!(
            "{}: the server received {what} {theirs}, but what was sent is {ours}: bytes were \
             changed on the way; push again",
            blob.path
        ))
    };
    let read = match check {
        Check::Sha256(hashing) => {
            let ours = hashing
                .await
                .map_err(|e| Error::Invalid(e.to_string()))?
                .map_err(cannot)?;
            if ours.sha256 != theirs.sha256 {
                return Err(changed("sha256", &ours.sha256, &theirs.sha256));
            }
            ours.read
        }
        Check::Crc32(sent) => {
            let (crc, read) = {
                let sent = sent.lock().unwrap_or_else(|e| e.into_inner());
                (format!("crc32 {:08x}", sent.0.clone().finalize()), sent.1)
            };
            let Some(checksum) = said.checksum else {
                return Err(Error::Invalid(format!(
                    "{}: the server's answer to its upload has no Upload-Checksum (is it a berth \
                     server of this version?)",
                    blob.path
                )));
            };
            if checksum != crc {
                return Err(changed("bytes of", &crc, checksum));
            }
            read
        }
    };
    let after = std::fs::metadata(path).map_err(cannot)?;
    let listed = Listed {
        path: blob.path.to_string(),
        size: blob.size,
    };
    Changed::check(&listed, before, read, &after).map_err(|e| Error::Unfinished(e.to_string()))?;
    Ok(theirs.sha256)
}

/// The id of the upload of the file at `path`: the same while the file is,
/// so that a run again resumes what a cut left, and another for a file
/// changed or replaced.
fn upload_id(path: &Path, meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let identity = format!(
        "{}\0{}\0{}\0{}\0{}.{}",
        path.display(),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    );
    let digest = hex::encode(Sha256::digest(identity.as_bytes()));
    format!("push-{}", &digest[..32])
}

/// After an upload from `offset` broke off: the server's refusal, if it
/// took no byte and closed the connection on a body too large to read to
/// its end before answering (a full budget, say). An empty body is
/// answered with the same checks, so it hears why; a real cut is `Ok`.
async fn refusal(api: &Api, url: &str, blob: &Blob<'_>, offset: u64) -> Result<(), Error> {
    match api.upload_offset(url).await {
        Ok((false, now)) if now == offset => api
            .upload(url, (blob.size, offset, 0), reqwest::Body::from(Vec::new()))
            .await
            .map(drop),
        _ => Ok(()),
    }
}

/// How the bytes of a blob sent by id are checked against what the server
/// stored.
enum Check {
    /// A resumed upload, hashed here as it was sent (its first bytes read
    /// from the file): the server's sha256 must be this one.
    Sha256(tokio::task::JoinHandle<std::io::Result<Hashed>>),
    /// A whole file in one request: the CRC-32 of the bytes sent and how
    /// many, which the server's `Upload-Checksum` must match.
    Crc32(Arc<Mutex<(crc32fast::Hasher, u64)>>),
}

/// What the hashing of a sent file came to.
struct Hashed {
    sha256: String,
    /// The bytes hashed: the file's size unless it changed.
    read: u64,
}

/// The file at `path` as a request body from `offset` on, counting what is
/// read into `done`; and, for a blob not hashed before, the check of what
/// it sends (`Check`).
async fn from_offset(
    path: &Path,
    blob: &Blob<'_>,
    offset: u64,
    done: Arc<AtomicU64>,
) -> Result<(reqwest::Body, Option<Check>), Error> {
    let cannot = |e: std::io::Error| Error::Invalid(format!("cannot read {}: {e}", path.display()));
    let mut file = tokio::fs::File::open(path).await.map_err(cannot)?;
    file.seek(SeekFrom::Start(offset)).await.map_err(cannot)?;
    let chunks =
        tokio_util::io::ReaderStream::with_capacity(file, READ_CHUNK).inspect_ok(move |chunk| {
            done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        });
    if blob.sha256.is_some() {
        return Ok((reqwest::Body::wrap_stream(chunks), None));
    }
    if offset == 0 {
        let sent = Arc::new(Mutex::new((crc32fast::Hasher::new(), 0u64)));
        let counted = sent.clone();
        let chunks = chunks.inspect_ok(move |chunk| {
            let mut sent = counted.lock().unwrap_or_else(|e| e.into_inner());
            sent.0.update(chunk);
            sent.1 += chunk.len() as u64;
        });
        return Ok((reqwest::Body::wrap_stream(chunks), Some(Check::Crc32(sent))));
    }
    let (to_hash, chunks_sent) = mpsc::channel::<Bytes>(HASH_QUEUE);
    let hashing = tokio::task::spawn_blocking({
        let (path, size) = (path.to_path_buf(), blob.size);
        move || hash_sent(&path, offset, size, chunks_sent)
    });
    let chunks = chunks.and_then(move |chunk| {
        let to_hash = to_hash.clone();
        async move {
            // A hash that stopped (the file unreadable) is said by its end.
            let _ = to_hash.send(chunk.clone()).await;
            Ok(chunk)
        }
    });
    Ok((
        reqwest::Body::wrap_stream(chunks),
        Some(Check::Sha256(hashing)),
    ))
}

/// Hashes the first `offset` bytes of `path`, then the chunks sent, until
/// `size` bytes or the end of the chunks.
fn hash_sent(
    path: &Path,
    offset: u64,
    size: u64,
    mut sent: mpsc::Receiver<Bytes>,
) -> std::io::Result<Hashed> {
    let mut hasher = Sha256::new();
    let mut prefix = std::fs::File::open(path)?.take(offset);
    let mut buffer = vec![0; READ_CHUNK];
    let mut read = 0;
    loop {
        match prefix.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buffer[..n]);
                read += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    while read < size
        && let Some(chunk) = sent.blocking_recv()
    {
        hasher.update(&chunk);
        read += chunk.len() as u64;
    }
    Ok(Hashed {
        sha256: hex::encode(hasher.finalize()),
        read,
    })
}

/// Chunks sent but not yet hashed: a few MiB, so the send never waits on
/// the hash unless the hash is the slower.
const HASH_QUEUE: usize = 8;

/// Bytes read from a file per chunk of the body: large enough that reads
/// and writes are few, small enough that memory stays flat.
const READ_CHUNK: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `bytes`, its metadata, and the blob it is to push.
    fn sent(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, std::fs::Metadata) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        std::fs::write(&path, bytes).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        (dir, path, meta)
    }

    fn crc_of(bytes: &[u8]) -> Check {
        let mut crc = crc32fast::Hasher::new();
        crc.update(bytes);
        Check::Crc32(Arc::new(Mutex::new((crc, bytes.len() as u64))))
    }

    #[tokio::test]
    async fn the_server_s_digest_is_taken_only_when_the_transfer_checks_out() {
        let bytes = b"weights".repeat(1000);
        let (_dir, path, before) = sent(&bytes);
        let blob = Blob {
            path: "w.bin",
            size: bytes.len() as u64,
            sha256: None,
        };
        let answer = format!(r#"{{"sha256":"{}","size_bytes":7000}}"#, "ab".repeat(32));
        let crc = format!("crc32 {:08x}", crc32fast::hash(&bytes));
        let said = |checksum| Said {
            checksum,
            answer: &answer,
        };
        let taken = checked(&blob, &path, &before, crc_of(&bytes), said(Some(&crc))).await;
        assert_eq!(taken.unwrap(), "ab".repeat(32));

        let other = checked(&blob, &path, &before, crc_of(b"other"), said(Some(&crc))).await;
        let e = other.unwrap_err().to_string();
        assert!(e.contains("bytes were changed on the way"), "{e}");
        let none = checked(&blob, &path, &before, crc_of(&bytes), said(None)).await;
        assert!(none.unwrap_err().to_string().contains("no Upload-Checksum"));

        // Resumed: the sha256 hashed here must be the server's.
        let hashing = tokio::task::spawn(async {
            Ok(Hashed {
                sha256: "cd".repeat(32),
                read: 7000,
            })
        });
        let resumed = checked(
            &blob,
            &path,
            &before,
            Check::Sha256(hashing),
            said(Some(&crc)),
        );
        let e = resumed.await.unwrap_err().to_string();
        assert!(e.contains(&format!("sha256 {}", "ab".repeat(32))), "{e}");

        // A file that changed while it was sent is a run still writing.
        std::fs::write(&path, b"grown".repeat(2000)).unwrap();
        let grown = checked(&blob, &path, &before, crc_of(&bytes), said(Some(&crc))).await;
        assert!(matches!(grown, Err(Error::Unfinished(_))), "{grown:?}");
    }
}
