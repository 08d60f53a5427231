//! `berth models push DIR`: a training run's folder read as a registration
//! (`run_folder`: the same choice of files, hashes and fields as
//! `register`), its files uploaded through the server into its blob store
//! (`PUT /v1/blobs/sha256:…`, each file the server lacks, from the offset
//! the server holds), then registered with the source `upload:`. A cut
//! upload is resumed at its offset, a few times in one run, and again by
//! running the command again.

use std::io::SeekFrom;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use futures::TryStreamExt;
use tokio::io::AsyncSeekExt;

use super::api::{Api, Error};
use super::progress::Meter;
use super::run_folder::{self, FolderArgs};
use super::{Common, print_json};
use crate::cli::folder::Listed;
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
    let read = run_folder::complete(&args.folder, api.as_ref(), &source).await?;
    let Some(api) = api else {
        print_json(&serde_json::to_value(&read.body).unwrap_or_default());
        return Ok(());
    };
    let files = read.body.files.as_deref().unwrap_or_default();
    upload_all(&api, &read.dir, files).await?;
    let answer = api.post::<json::Model>("/v1/models", &read.body).await?;
    run_folder::report(answer, read.registered, args.common.json);
    Ok(())
}

/// One blob to upload: a file of the folder, by its digest.
struct Blob<'a> {
    path: &'a str,
    size: u64,
    sha256: &'a str,
}

/// Uploads each blob of `files` (a digest once) the server does not store,
/// one at a time, with a meter on stderr.
async fn upload_all(api: &Api, dir: &Path, files: &[FileBody]) -> Result<(), Error> {
    let mut blobs: Vec<Blob> = Vec::new();
    for file in files {
        let (Some(path), Some(size), Some(sha256)) = (&file.path, file.size_bytes, &file.sha256)
        else {
            continue;
        };
        if !blobs.iter().any(|b| b.sha256 == sha256) {
            blobs.push(Blob { path, size, sha256 });
        }
    }
    let total = blobs.iter().map(|b| b.size).sum();
    let meter = Meter::start(format!("uploading {} files", blobs.len()), total, true);
    let done = meter.done();
    let mut result = Ok(());
    for blob in &blobs {
        result = upload(api, dir, blob, &done).await;
        if result.is_err() {
            break;
        }
    }
    meter.finish().await;
    result
}

/// How many times one run resumes a blob whose upload was cut.
const ATTEMPTS: usize = 5;
/// The pause before resuming.
const PAUSE: Duration = Duration::from_secs(1);

/// Uploads `blob` from the offset the server holds; resumes it there after
/// a cut, up to `ATTEMPTS` times. Adds the bytes sent (and those the server
/// held already) to `done`.
async fn upload(
    api: &Api,
    dir: &Path,
    blob: &Blob<'_>,
    done: &Arc<AtomicU64>,
) -> Result<(), Error> {
    let url = format!("/v1/blobs/sha256:{}", blob.sha256);
    let before = done.load(Ordering::Relaxed);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (stored, offset) = api.upload_offset(&url).await?;
        done.store(before + offset.min(blob.size), Ordering::Relaxed);
        if stored {
            return Ok(());
        }
        let body = from_offset(dir, blob, offset, done.clone()).await?;
        let range = (blob.size, offset, blob.size - offset);
        match api.upload(&url, range, body).await {
            Ok(status) if status != reqwest::StatusCode::ACCEPTED => return Ok(()),
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

/// The file of `blob` as a request body from `offset` on, counting what is
/// read into `done`.
async fn from_offset(
    dir: &Path,
    blob: &Blob<'_>,
    offset: u64,
    done: Arc<AtomicU64>,
) -> Result<reqwest::Body, Error> {
    let path = dir.join(blob.path);
    let cannot = |e: std::io::Error| Error::Invalid(format!("cannot read {}: {e}", path.display()));
    let mut file = tokio::fs::File::open(&path).await.map_err(cannot)?;
    file.seek(SeekFrom::Start(offset)).await.map_err(cannot)?;
    let chunks =
        tokio_util::io::ReaderStream::with_capacity(file, READ_CHUNK).inspect_ok(move |chunk| {
            done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        });
    Ok(reqwest::Body::wrap_stream(chunks))
}

/// Bytes read from a file per chunk of the body: large enough that reads
/// and writes are few, small enough that memory stays flat.
const READ_CHUNK: usize = 1 << 20;
