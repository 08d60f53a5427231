//! Blobs that arrive by upload: hashed as they come, stored and pinned only
//! when the digest matches, resumed at their offset after a cut, one at a
//! time per digest; a pinned blob outlives sweeps and dropped copies until
//! it is unpinned; a model of uploaded files is filled by links alone.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use futures::stream;

use super::*;
use crate::fetch::{Held, Upload, UploadError, UploadName, Uploaded};
use crate::model::UPLOADED;

/// A fetcher on a fresh models dir, with no source.
fn store() -> (tempfile::TempDir, Fetcher) {
    let models = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(models.path().to_path_buf(), Duration::from_secs(60)).unwrap();
    (models, fetcher)
}

/// `bytes` as a body of 64 KiB chunks, cut off (an error) after `cut`
/// bytes if given.
fn body(
    bytes: &[u8],
    cut: Option<usize>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + use<> {
    let sent = &bytes[..cut.unwrap_or(bytes.len())];
    let mut chunks: Vec<Result<Bytes, std::io::Error>> = sent
        .chunks(64 << 10)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    if cut.is_some() {
        chunks.push(Err(std::io::Error::other("connection reset")));
    }
    stream::iter(chunks)
}

/// Uploads `sent`, the bytes of `whole` from `offset` on, cut off after
/// `cut` of them if given.
async fn send(
    fetcher: &Fetcher,
    whole: &[u8],
    offset: usize,
    sent: &[u8],
    cut: Option<usize>,
) -> Result<Uploaded, UploadError> {
    let upload = Upload {
        name: named(whole),
        size: whole.len() as u64,
        offset: offset as u64,
    };
    fetcher.upload(&upload, &mut body(sent, cut)).await
}

/// The upload of `bytes` named by their digest.
fn named(bytes: &[u8]) -> UploadName {
    UploadName::Sha256(sha(bytes))
}

/// How the upload of `bytes` ends once the last one came.
fn stored(bytes: &[u8]) -> Uploaded {
    Uploaded::Stored { sha256: sha(bytes) }
}

fn uploaded_model(job_id: &str, files: &[(&str, &[u8])]) -> TrainedModel {
    let files = files
        .iter()
        .map(|(path, bytes)| ModelFile {
            path: path.to_string(),
            size_bytes: bytes.len() as u64,
            sha256: Some(sha(bytes)),
            format: None,
        })
        .collect();
    TrainedModel::from_files(job_id, UPLOADED.to_string(), files)
}

async fn fill(fetcher: &Fetcher, model: &TrainedModel) -> Result<PathBuf, Error> {
    fetcher
        .fetch(model, Arc::new(Quiet), &CancellationToken::new())
        .await
}

#[tokio::test]
async fn a_cut_upload_resumes_at_its_offset_and_ends_a_pinned_read_only_blob() {
    let (_models, fetcher) = store();
    let weights = bytes(3, 3 << 20);
    let cut = (1 << 20) + 12_345;
    let first = send(&fetcher, &weights, 0, &weights, Some(cut));
    assert!(matches!(
        first.await,
        Err(UploadError::Cut { offset, .. }) if offset == cut as u64
    ));
    let (hex, name) = (sha(&weights), named(&weights));
    assert_eq!(
        fetcher.held(&name).await,
        Held::Partial { offset: cut as u64 }
    );
    assert!(
        fetcher.upload_books(&name, "json").exists(),
        "the cut left a checkpoint of the hash"
    );

    // Another offset than the one held is refused, naming the held one.
    let wrong = send(&fetcher, &weights, 0, &weights, None);
    assert_eq!(
        wrong.await,
        Err(UploadError::Offset {
            upload: name.clone(),
            held: cut as u64,
            asked: 0
        })
    );

    let rest = send(&fetcher, &weights, cut, &weights[cut..], None);
    assert_eq!(rest.await, Ok(stored(&weights)));
    assert_eq!(
        fetcher.held(&name).await,
        Held::Stored {
            size: weights.len() as u64
        }
    );
    let blob = fetcher.blobs.path(&hex);
    assert_eq!(std::fs::read(&blob).unwrap(), weights);
    let meta = std::fs::metadata(&blob).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o444);
    assert_eq!(meta.nlink(), 2, "the blob and its pin");
    assert!(!fetcher.upload_path(&name).exists());
    assert!(!fetcher.upload_books(&name, "json").exists());

    let usage = fetcher.usage().await.unwrap();
    assert_eq!(
        (usage.pinned_blobs, usage.pinned_bytes),
        (1, weights.len() as u64)
    );
    assert_eq!(usage.unreferenced_blob_bytes, 0);

    // Again: nothing is read, it is stored.
    let again = send(&fetcher, &weights, 0, &weights, None);
    assert_eq!(again.await, Ok(Uploaded::AlreadyStored { sha256: hex }));
}

#[tokio::test]
async fn a_body_that_ends_early_is_held_and_one_past_the_length_is_refused() {
    let (_models, fetcher) = store();
    let weights = bytes(4, 200_000);
    let part = send(&fetcher, &weights, 0, &weights[..70_000], None);
    assert_eq!(part.await, Ok(Uploaded::Partial { offset: 70_000 }));
    let mut longer = weights[70_000..].to_vec();
    longer.push(0);
    let past = send(&fetcher, &weights, 70_000, &longer, None);
    assert!(matches!(past.await, Err(UploadError::TooLong { .. })));
}

#[tokio::test]
async fn bytes_of_another_digest_are_refused_and_nothing_is_kept() {
    let (_models, fetcher) = store();
    let weights = bytes(5, 300_000);
    let mut other = weights.clone();
    other[299_999] ^= 1;
    let refused = send(&fetcher, &weights, 0, &other, None);
    let Err(UploadError::Mismatch { actual, .. }) = refused.await else {
        panic!("bytes of another digest were taken");
    };
    assert_eq!(actual, sha(&other));
    let name = named(&weights);
    assert_eq!(fetcher.held(&name).await, Held::Partial { offset: 0 });
    assert!(!fetcher.blobs.path(&sha(&weights)).exists());
    assert!(!fetcher.upload_path(&name).exists());
}

#[tokio::test]
async fn two_uploads_of_one_digest_store_it_once() {
    let (_models, fetcher) = store();
    let weights = bytes(6, 2 << 20);
    let (a, b) = tokio::join!(
        send(&fetcher, &weights, 0, &weights, None),
        send(&fetcher, &weights, 0, &weights, None),
    );
    let mut ends = [a.unwrap(), b.unwrap()];
    ends.sort_by_key(|u| format!("{u:?}"));
    let already = Uploaded::AlreadyStored {
        sha256: sha(&weights),
    };
    assert_eq!(ends, [already, stored(&weights)]);
    assert_eq!(
        std::fs::read(fetcher.blobs.path(&sha(&weights))).unwrap(),
        weights
    );
}

#[tokio::test]
async fn a_pinned_blob_outlives_sweeps_and_dropped_copies_until_unpinned() {
    let (_models, fetcher) = store();
    let weights = bytes(7, 500_000);
    let ended = send(&fetcher, &weights, 0, &weights, None);
    assert_eq!(ended.await, Ok(stored(&weights)));
    let model = uploaded_model("pushed", &[("model.safetensors", &weights)]);
    assert_eq!(fetcher.pin_uploaded(&model.files).await.unwrap(), None);

    // Filled by a link alone: the source names nowhere to fetch from.
    let dir = fill(&fetcher, &model).await.unwrap();
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        weights
    );
    assert_eq!(fetcher.sweep().await, 0);
    let held = fetcher.hold_copy("pushed").await.unwrap();
    held.forget().await.unwrap();
    held.remove().await.unwrap();
    assert_eq!(fetcher.sweep().await, 0, "pinned: not swept");
    let hex = sha(&weights);
    assert!(fetcher.blobs.path(&hex).exists());
    fill(&fetcher, &model).await.unwrap();

    let held = fetcher.hold_copy("pushed").await.unwrap();
    held.forget().await.unwrap();
    held.remove().await.unwrap();
    fetcher.unpin([hex.clone()]).await.unwrap();
    assert_eq!(fetcher.sweep().await, weights.len() as u64);
    assert!(!fetcher.blobs.path(&hex).exists());
}

#[tokio::test]
async fn an_uploaded_model_whose_blob_is_missing_is_refused_with_a_sentence() {
    let (_models, fetcher) = store();
    let weights = bytes(8, 1000);
    let model = uploaded_model("pushed", &[("adapter.bin", &weights)]);
    assert_eq!(
        fetcher.pin_uploaded(&model.files).await.unwrap(),
        Some(&model.files[0])
    );
    let Err(Error::File { path, reason }) = fill(&fetcher, &model).await else {
        panic!("a model with no blob was filled");
    };
    assert_eq!(path, "adapter.bin");
    assert!(reason.contains("push the model again"), "{reason}");
}

/// A budget that has nothing to drop.
struct NothingToDrop;

impl crate::fetch::Reclaim for NothingToDrop {
    fn drop_one<'a>(&'a self, _: &'a str) -> futures::future::BoxFuture<'a, Option<u64>> {
        Box::pin(async { None })
    }
}

#[tokio::test]
async fn an_upload_the_budget_cannot_hold_is_refused_before_a_byte_is_written() {
    let (_models, fetcher) = store();
    let fetcher = fetcher.budget(1 << 20, Arc::new(NothingToDrop));
    let big = bytes(9, (1 << 20) + 1);
    let refused = send(&fetcher, &big, 0, &big, None);
    assert!(matches!(
        refused.await,
        Err(UploadError::LargerThanBudget { .. })
    ));
    let first = bytes(10, 700_000);
    let ended = send(&fetcher, &first, 0, &first, None);
    assert_eq!(ended.await, Ok(stored(&first)));
    let second = bytes(11, 700_000);
    let refused = send(&fetcher, &second, 0, &second, None);
    assert!(matches!(refused.await, Err(UploadError::OverBudget { .. })));
    assert!(!fetcher.upload_path(&named(&second)).exists());
}

/// Locks by name, as PostgreSQL's advisory locks are: a lock taken twice
/// under one name by one upload would never be granted.
#[derive(Default)]
struct NamedLocks(std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl crate::fetch::SharedLocks for NamedLocks {
    fn lock<'a>(
        &'a self,
        key: &'a str,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Box<dyn Send + Sync>>> {
        let lock = self
            .0
            .lock()
            .unwrap()
            .entry(key.into())
            .or_default()
            .clone();
        Box::pin(async move { Ok(Box::new(lock.lock_owned().await) as Box<dyn Send + Sync>) })
    }
}

#[tokio::test]
async fn an_upload_between_servers_of_one_volume_takes_locks_of_distinct_names() {
    let (_models, fetcher) = store();
    let fetcher = fetcher.shared_locks(Arc::new(NamedLocks::default()));
    let weights = bytes(12, 100_000);
    let ended = send(&fetcher, &weights, 0, &weights, None);
    let ended = tokio::time::timeout(Duration::from_secs(20), ended).await;
    assert_eq!(
        ended.expect("no lock waits for its own holder"),
        Ok(stored(&weights))
    );
}

#[tokio::test]
async fn bytes_held_past_the_blob_s_size_are_dropped_and_the_upload_starts_over() {
    let (_models, fetcher) = store();
    let weights = bytes(13, 100_000);
    let mut longer = weights.clone();
    longer.extend_from_slice(&bytes(14, 50_000));
    // Sent under a wrong, larger Upload-Length, and cut.
    let lied = Upload {
        name: named(&weights),
        size: longer.len() as u64,
        offset: 0,
    };
    let cut = fetcher
        .upload(&lied, &mut body(&longer, Some(120_000)))
        .await;
    assert!(matches!(cut, Err(UploadError::Cut { .. })));
    let ended = send(&fetcher, &weights, 0, &weights, None).await;
    assert_eq!(ended, Ok(stored(&weights)));
}

#[tokio::test]
async fn an_upload_by_id_resumes_and_becomes_the_blob_of_the_digest_its_bytes_have() {
    let (_models, fetcher) = store();
    let weights = bytes(15, 2 << 20);
    let id = UploadName::id("push-0123456789abcdef").unwrap();
    let upload = |offset: usize| Upload {
        name: id.clone(),
        size: weights.len() as u64,
        offset: offset as u64,
    };
    let cut = 700_001;
    let first = fetcher
        .upload(&upload(0), &mut body(&weights, Some(cut)))
        .await;
    assert!(matches!(first, Err(UploadError::Cut { offset, .. }) if offset == cut as u64));
    assert_eq!(
        fetcher.held(&id).await,
        Held::Partial { offset: cut as u64 }
    );
    let wrong = fetcher.upload(&upload(0), &mut body(&weights, None)).await;
    assert!(matches!(wrong, Err(UploadError::Offset { held, .. }) if held == cut as u64));
    let rest = fetcher
        .upload(&upload(cut), &mut body(&weights[cut..], None))
        .await;
    assert_eq!(rest, Ok(stored(&weights)));
    assert_eq!(
        std::fs::read(fetcher.blobs.path(&sha(&weights))).unwrap(),
        weights
    );
    assert!(!fetcher.upload_path(&id).exists());
    assert!(!fetcher.upload_books(&id, "json").exists());
    assert_eq!(fetcher.held(&id).await, Held::Partial { offset: 0 });

    // The same bytes again under another id: sent, and taken as the blob
    // already stored, still one inode with its pin.
    let again = Upload {
        name: UploadName::id("push-fedcba9876543210").unwrap(),
        ..upload(0)
    };
    let ended = fetcher.upload(&again, &mut body(&weights, None)).await;
    assert_eq!(ended, Ok(stored(&weights)));
    let meta = std::fs::metadata(fetcher.blobs.path(&sha(&weights))).unwrap();
    assert_eq!(meta.nlink(), 2, "the blob and its pin");
    assert!(!fetcher.upload_path(&again.name).exists());
}

#[test]
fn an_upload_id_is_16_to_64_plain_characters() {
    for (id, ok) in [
        ("0123456789abcdef", true),
        ("A-b_".repeat(16).as_str(), true),
        ("0123456789abcde", false),
        ("x".repeat(65).as_str(), false),
        ("0123456789abcdef/..", false),
        ("0123456789abcdef.tmp", false),
    ] {
        assert_eq!(UploadName::id(id).is_some(), ok, "{id}");
    }
}
