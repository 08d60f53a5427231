//! The fetcher against a real S3-compatible server: moto's, started once
//! for this test binary by `tests/moto/serve.py` on a free loopback port.
//! Ranged reads, a verified fetch, a missing object or bucket, refused
//! credentials, an unreachable endpoint, and a download cut short and
//! continued. The listing of a prefix has its own tests
//! (`s3_list_tests`), on the same server.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::Span;
use crate::fetch::store::lock::DirLock;
use crate::fetch::{Access, Error, Fetcher, Observer, Quiet, Split};
use crate::model::{ModelFile, TrainedModel};

#[path = "../../../../tests/moto/moto.rs"]
mod moto;
use moto::Moto;

/// The bucket `tests/moto/serve.py` creates; each test has its own job id.
pub(super) const BUCKET: &str = "berth-test";

pub(super) fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| Moto::start(&[BUCKET]))
}

impl Moto {
    /// A sources file giving the bucket this endpoint and these keys.
    pub(super) fn access(
        &self,
        endpoint: &str,
        access_key_id: &str,
        secret_access_key: &str,
    ) -> Access {
        let text = format!(
            "[[source]]\nprefix = \"s3://{BUCKET}/\"\noptions = {{ endpoint = \"{endpoint}\", \
             region = \"{}\", access_key_id = \"{access_key_id}\", \
             secret_access_key = \"{secret_access_key}\" }}",
            self.region
        );
        Access::parse(&text, |_| None).unwrap()
    }

    pub(super) fn good_access(&self) -> Access {
        self.access(&self.endpoint, &self.access_key_id, &self.secret_access_key)
    }

    /// Puts `files` under `job/` in the bucket.
    pub(super) async fn put(&self, job: &str, files: &[(&str, Vec<u8>)]) {
        let store = AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region(&self.region)
            .with_access_key_id(&self.access_key_id)
            .with_secret_access_key(&self.secret_access_key)
            .with_bucket_name(BUCKET)
            .build()
            .unwrap();
        for (path, contents) in files {
            store
                .put(&Key::from(format!("{job}/{path}")), contents.clone().into())
                .await
                .unwrap();
        }
    }
}

/// A fetcher into a fresh models dir, and model `job` of `files` in the
/// bucket.
async fn setup(
    job: &str,
    files: &[(&str, Vec<u8>)],
    access: Access,
) -> (tempfile::TempDir, Fetcher, TrainedModel) {
    moto().put(job, files).await;
    let (models, fetcher) = fetcher(access);
    let model = model(job, format!("s3://{BUCKET}/{{job_id}}/{{path}}"), files);
    (models, fetcher, model)
}

/// A fetcher into a fresh models dir, with the credentials of `access`.
pub(super) fn fetcher(access: Access) -> (tempfile::TempDir, Fetcher) {
    let models = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(models.path().to_path_buf(), Duration::from_secs(120))
        .unwrap()
        .access(access);
    (models, fetcher)
}

/// Model `job` of `files`, as recorded, at `source`.
pub(super) fn model(job: &str, source: String, files: &[(&str, Vec<u8>)]) -> TrainedModel {
    TrainedModel::from_files(
        job,
        source,
        files
            .iter()
            .map(|(path, contents)| ModelFile {
                path: path.to_string(),
                size_bytes: contents.len() as u64,
                sha256: Some(hex::encode(Sha256::digest(contents))),
                format: None,
            })
            .collect(),
    )
}

pub(super) async fn fetch(fetcher: &Fetcher, model: &TrainedModel) -> Result<PathBuf, Error> {
    fetcher
        .fetch(model, Arc::new(Quiet), &CancellationToken::new())
        .await
}

pub(super) fn contents(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

#[tokio::test]
async fn a_model_in_the_store_is_fetched_and_verified() {
    let files = [
        ("adapter.bin", contents(1, 3 << 20)),
        ("sub/w x+y.json", contents(2, 1000)),
    ];
    let (_models, fetcher, model) = setup("fetched", &files, moto().good_access()).await;
    let dir = fetch(&fetcher, &model).await.unwrap();
    for (path, contents) in &files {
        assert!(
            std::fs::read(dir.join(path)).unwrap() == *contents,
            "{path} holds other bytes than the store's"
        );
    }
}

#[tokio::test]
async fn spans_are_read_with_ranges_at_once_from_one_store() {
    let data = contents(3, 100_000);
    let (_models, fetcher, _) =
        setup("spans", &[("a.bin", data.clone())], moto().good_access()).await;
    let location = super::fill(
        &format!("s3://{BUCKET}/{{job_id}}/{{path}}"),
        "spans",
        "a.bin",
    )
    .unwrap();
    let span = |start, end| Span { start, end };
    // Asked for, the bytes that come, and whether they are exactly the span.
    let cases = [
        (span(0, None), 0..100_000, false),
        (span(1000, None), 1000..100_000, true),
        (span(1000, Some(5000)), 1000..5000, true),
        (span(0, Some(10)), 0..10, true),
        (span(99_990, Some(100_000)), 99_990..100_000, true),
        // Past the end: what there is, but not the span.
        (span(99_000, Some(200_000)), 99_000..100_000, false),
        // Wholly past the end: the object from the start.
        (span(150_000, None), 0..100_000, false),
    ];
    // At once, as the pieces of one file are read.
    let opened = futures::future::join_all(
        cases
            .iter()
            .map(|(span, _, _)| fetcher.sources.open(&location, *span)),
    )
    .await;
    for ((span, expected, ranged), body) in cases.into_iter().zip(opened) {
        let body = body.unwrap();
        assert_eq!(
            (body.start, body.ranged, body.total),
            (expected.start as u64, ranged, Some(100_000)),
            "{span:?}"
        );
        let read: Vec<u8> = body.stream.try_collect::<Vec<_>>().await.unwrap().concat();
        assert!(
            read == data[expected.clone()],
            "{span:?}: other bytes than {expected:?}"
        );
    }
    assert_eq!(
        fetcher.sources.stores.built(),
        1,
        "one store for the bucket, shared"
    );
}

#[tokio::test]
async fn a_missing_object_is_named() {
    let (_models, fetcher, mut model) = setup(
        "missing",
        &[("here.bin", contents(4, 10))],
        moto().good_access(),
    )
    .await;
    model.files.push(ModelFile {
        path: "gone.bin".into(),
        size_bytes: 10,
        sha256: None,
        format: None,
    });
    let error = fetch(&fetcher, &model).await.unwrap_err().to_string();

    assert_eq!(
        error,
        format!("file gone.bin: the store has no object s3://{BUCKET}/missing/gone.bin")
    );
}

#[tokio::test]
async fn a_missing_bucket_is_named() {
    let moto = moto();
    let text = format!(
        "[[source]]\nprefix = \"s3://no-such-bucket/\"\noptions = {{ endpoint = \"{}\", \
         region = \"{}\", access_key_id = \"{}\", secret_access_key = \"{}\" }}",
        moto.endpoint, moto.region, moto.access_key_id, moto.secret_access_key
    );
    let (_models, fetcher, mut model) =
        setup("no-bucket", &[], Access::parse(&text, |_| None).unwrap()).await;
    model.source = "s3://no-such-bucket/{job_id}/{path}".into();
    model.files.push(ModelFile {
        path: "a.bin".into(),
        size_bytes: 10,
        sha256: None,
        format: None,
    });
    let error = fetch(&fetcher, &model).await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the store at {} has no bucket no-such-bucket \
             (s3://no-such-bucket/no-bucket/a.bin)",
            moto.endpoint
        )
    );
}

#[tokio::test]
async fn refused_credentials_say_where_they_came_from() {
    let moto = moto();
    let files = [("a.bin", contents(5, 10))];
    let wrong_secret = moto.access(&moto.endpoint, &moto.access_key_id, "not-the-secret");
    let unknown_key = moto.access(&moto.endpoint, "AKIAUNKNOWNUNKNOWN00", "whatever");
    for (access, code) in [
        (wrong_secret, "SignatureDoesNotMatch"),
        (unknown_key, "InvalidAccessKeyId"),
    ] {
        let (models, fetcher, model) = setup("refused", &files, access).await;
        let error = fetch(&fetcher, &model).await.unwrap_err().to_string();

        let refused = format!(
            "file a.bin: the store refused the credentials for s3://{BUCKET}/refused/a.bin ("
        );
        assert!(error.starts_with(&refused), "{error}");
        assert!(error.contains(code), "{error}");
        assert!(
            error.ends_with(&format!(
                "); they are the access key of s3://{BUCKET}/ in the sources file"
            )),
            "{error}"
        );
        assert!(!error.contains("not-the-secret"), "{error}");
        assert!(
            std::fs::read_dir(models.path().join("refused"))
                .unwrap()
                .next()
                .is_none(),
            "nothing is written"
        );
    }
}

#[tokio::test]
async fn an_unreachable_store_is_named() {
    // Port 9 (discard) on loopback: nothing listens there.
    let moto = moto();
    let access = moto.access(
        "http://127.0.0.1:9",
        &moto.access_key_id,
        &moto.secret_access_key,
    );
    let (_models, fetcher, model) =
        setup("unreachable", &[("a.bin", contents(6, 10))], access).await;
    let error = tokio::time::timeout(Duration::from_secs(60), fetch(&fetcher, &model))
        .await
        .expect("the fetch gave up in time")
        .unwrap_err()
        .to_string();
    let expected = format!(
        "file a.bin: cannot reach the store at http://127.0.0.1:9 (s3://{BUCKET}/unreachable/a.bin): "
    );
    assert!(error.starts_with(&expected), "{error}");
}

#[tokio::test]
async fn settings_object_store_cannot_use_are_named() {
    let text =
        format!("[[source]]\nprefix = \"s3://{BUCKET}/\"\noptions = {{ allow_http = \"maybe\" }}");
    let access = Access::parse(&text, |_| None).unwrap();
    let (_models, fetcher, model) = setup("unusable", &[("a.bin", contents(8, 10))], access).await;
    let error = fetch(&fetcher, &model).await.unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "file a.bin: the store for s3://{BUCKET}/ cannot be set up: "
        )) && error.contains("maybe"),
        "{error}"
    );
}

/// Cancels a fetch once it has reported `at` bytes.
struct CancelAt {
    at: u64,
    cancel: CancellationToken,
}

impl Observer for CancelAt {
    fn fetched(&self, bytes_done: u64, _: u64, _: usize, _: usize) {
        if bytes_done >= self.at {
            self.cancel.cancel();
        }
    }
}

/// Remembers where a fetch started: its first report.
#[derive(Default)]
struct FirstReport(Mutex<Option<u64>>);

impl Observer for FirstReport {
    fn fetched(&self, bytes_done: u64, _: u64, _: usize, _: usize) {
        self.0.lock().unwrap().get_or_insert(bytes_done);
    }
}

#[tokio::test]
async fn a_download_cut_short_continues_with_a_range() {
    cut_short_and_continued("resumed", 1).await;
}

#[tokio::test]
async fn a_download_in_pieces_cut_short_continues_with_the_missing_pieces() {
    cut_short_and_continued("resumed-pieces", 4).await;
}

/// A 32 MiB object fetched over `connections`, cancelled after 2 MiB, then
/// fetched again: the second fetch starts from what the first kept.
async fn cut_short_and_continued(job: &str, connections: usize) {
    let data = contents(7, 32 << 20);
    let (models, fetcher, model) =
        setup(job, &[("big.bin", data.clone())], moto().good_access()).await;
    continued(models, fetcher, model, data, connections).await;
}

/// `model`'s one file `big.bin` (`data`) fetched over `connections`,
/// cancelled after 2 MiB, then fetched again: the second fetch starts from
/// what the first kept.
pub(super) async fn continued(
    models: tempfile::TempDir,
    fetcher: Fetcher,
    model: TrainedModel,
    data: Vec<u8>,
    connections: usize,
) {
    let job = model.job_id.clone();
    let fetcher = fetcher.split(Split {
        connections,
        piece_bytes: 2 << 20,
    });
    let cancel = CancellationToken::new();
    let cutter = Arc::new(CancelAt {
        at: 2 << 20,
        cancel: cancel.clone(),
    });
    assert_eq!(
        fetcher.fetch(&model, cutter, &cancel).await,
        Err(Error::Cancelled)
    );
    // The writer finishes what it was given, leaves its checkpoint, then
    // lets go of the lock.
    let lock = DirLock::acquire(&models.path().join(format!(".berth/{job}.lock")), None)
        .await
        .unwrap();
    let record = models
        .path()
        .join(format!(".berth/{job}.resume/big.bin.json"));
    let checkpoint: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("a checkpoint")).unwrap();
    drop(lock);
    let kept: u64 = checkpoint["have"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[1].as_u64().unwrap() - r[0].as_u64().unwrap())
        .sum();
    assert!(kept > 0 && kept < data.len() as u64, "kept {kept} bytes");

    let first = Arc::new(FirstReport::default());
    fetcher
        .fetch(&model, first.clone(), &CancellationToken::new())
        .await
        .unwrap();
    assert!(
        std::fs::read(models.path().join(format!("{job}/big.bin"))).unwrap() == data,
        "big.bin holds other bytes than the store's"
    );
    // The fetch counts what it continues from: the kept bytes.
    assert_eq!(
        *first.0.lock().unwrap(),
        Some(kept),
        "{connections} connections"
    );
}
