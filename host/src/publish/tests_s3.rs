//! S3 targets against a real S3-compatible server: moto's, started once
//! for this test binary by `tests/moto/serve.py`: the conformance suite
//! (`s3_conforms`), and what is S3's own: a multipart upload for a large
//! file (parts of the 5 MiB minimum), no unfinished upload left by a
//! dropped put, wrong credentials named as S3 says them, and a part whose
//! connection breaks sent again with its checksum.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::conformance::{Target, conforms};
use super::testing::{Proxy, file, file_body, key};
use super::{Body, Error, Publisher, Publishers};
use crate::targets::Targets;
use crate::trust::Trust;

// The fetch's S3 tests include the harness too: each module starts its own
// server, with its own bucket, so neither depends on the other's tests.
#[allow(clippy::duplicate_mod)]
#[path = "../../../tests/moto/moto.rs"]
mod moto;
use moto::Moto;

const BUCKET: &str = "berth-publish";
const PART: u64 = 5 << 20;

fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| Moto::start(&[BUCKET]))
}

/// A publisher for target "releases" at `s3://BUCKET/prefix/` through
/// `endpoint`, with these keys, in parts of 5 MiB.
fn releases(prefix: &str, endpoint: &str, access_key_id: &str, secret: &str) -> Publisher {
    let moto = moto();
    let text = format!(
        "[[target]]\nname = \"releases\"\nurl = \"s3://{BUCKET}/{prefix}/\"\n\
         options = {{ endpoint = \"{endpoint}\", region = \"{}\", access_key_id = \"{access_key_id}\", \
         secret_access_key = \"${{SECRET}}\" }}\n",
        moto.region
    );
    let secret = secret.to_string();
    let targets = Targets::parse(&text, "sources.toml", |var| {
        (var == "SECRET").then(|| secret.clone())
    })
    .unwrap();
    Publishers::new(Arc::new(targets), &Trust::default())
        .with_part_bytes(PART)
        .get("releases")
        .unwrap()
}

fn good(prefix: &str) -> Publisher {
    let moto = moto();
    releases(
        prefix,
        &moto.endpoint,
        &moto.access_key_id,
        &moto.secret_access_key,
    )
}

/// The object at `path` of the bucket, if any.
async fn object(path: &str) -> Option<Vec<u8>> {
    let moto = moto();
    let store = AmazonS3Builder::new()
        .with_endpoint(&moto.endpoint)
        .with_allow_http(true)
        .with_region(&moto.region)
        .with_access_key_id(&moto.access_key_id)
        .with_secret_access_key(&moto.secret_access_key)
        .with_bucket_name(BUCKET)
        .build()
        .unwrap();
    match store.get(&object_store::path::Path::from(path)).await {
        Ok(got) => Some(got.bytes().await.unwrap().to_vec()),
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => panic!("{e}"),
    }
}

/// The keys of the bucket's unfinished multipart uploads under `prefix`,
/// asked with boto3 (object_store lists no uploads).
async fn unfinished(prefix: &str) -> Vec<String> {
    let moto = moto();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let script = "import boto3, json, sys\n\
        s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id=sys.argv[3], aws_secret_access_key=sys.argv[4])\n\
        found = s3.list_multipart_uploads(Bucket=sys.argv[5], Prefix=sys.argv[6])\n\
        print(json.dumps([u['Key'] for u in found.get('Uploads', [])]))\n";
    let output = tokio::process::Command::new(python)
        .args(["-c", script])
        .args([
            &moto.endpoint,
            &moto.region,
            &moto.access_key_id,
            &moto.secret_access_key,
        ])
        .args([BUCKET, prefix])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test]
async fn a_large_file_goes_up_in_parts_and_lands_whole() {
    let publisher = good("large");
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), (21 << 20) + 11);
    let sent = AtomicU64::new(0);
    let progress = |n: u64| {
        sent.fetch_add(n, Ordering::Relaxed);
    };
    // No digest given: computed as the parts are read.
    let body = Body::File {
        path,
        bytes: contents.len() as u64,
        sha256: None,
        vouched: None,
    };
    let receipt = publisher
        .put(
            &key("model.bin"),
            body,
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(receipt.sha256, sha256);
    assert_eq!(sent.load(Ordering::Relaxed), contents.len() as u64);
    let stored = object("large/model.bin").await.unwrap();
    assert!(stored == contents, "the object's bytes are the file's");
    // A multipart object's etag says its part count.
    assert!(
        receipt.etag.as_deref().unwrap().ends_with("-5\""),
        "{:?}",
        receipt.etag
    );
    assert_eq!(unfinished("large/").await, Vec::<String>::new());
}

#[tokio::test]
async fn a_dropped_multipart_put_leaves_no_unfinished_upload() {
    // A cancelled one is the conformance suite's.
    let publisher = good("dropped");
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), 21 << 20);
    let body = || file_body(&path, &contents, Some(&sha256));

    // Dropped once a part is in: the abort runs on a task of its own.
    let first = tokio::sync::Notify::new();
    let progress = |_: u64| first.notify_one();
    let never = CancellationToken::new();
    let b = key("b/model.bin");
    tokio::select! {
        _ = publisher.put(&b, body(), &progress, &never) => panic!("the put ended"),
        _ = first.notified() => {}
    }
    let mut left = unfinished("dropped/").await;
    for _ in 0..20 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = unfinished("dropped/").await;
    }
    assert_eq!(left, Vec::<String>::new());
    assert_eq!(object("dropped/b/model.bin").await, None);
}

#[tokio::test]
async fn wrong_credentials_name_the_target_and_never_the_secret() {
    let secret = "wR0ng/s3cret+Key-nobody-has";
    let publisher = releases("denied", &moto().endpoint, "AKIAWRONGKEY0000", secret);
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
    };
    let error = publisher
        .put(&key("x.json"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Refused { .. }), "{error:?}");
    let error = error.to_string();
    assert!(
        error.starts_with(&format!(
            "target \"releases\" (s3://{BUCKET}/denied/) refused the upload of x.json: InvalidAccessKeyId: "
        )) && error.ends_with("(the credentials are the access key in the target's options)"),
        "{error}"
    );
    assert!(!error.contains(secret), "{error}");

    let error = publisher
        .stat(&key("x.json"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!(
            "target \"releases\" (s3://{BUCKET}/denied/) refused the look-up of x.json: "
        )),
        "{error}"
    );
    assert!(!error.contains(secret), "{error}");
}

/// The value of `x-amz-checksum-sha256` for `bytes`.
fn checksum(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(bytes))
}

#[tokio::test]
async fn a_part_whose_connection_breaks_is_sent_again_with_its_checksum() {
    let moto = moto();
    let proxy = Proxy::start(&moto.endpoint, Some(2 << 20)).await;
    let publisher = releases(
        "flaky",
        &proxy.url,
        &moto.access_key_id,
        &moto.secret_access_key,
    );
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), (16 << 20) + 3);
    let sent = AtomicU64::new(0);
    let progress = |n: u64| {
        sent.fetch_add(n, Ordering::Relaxed);
    };
    let body = Body::File {
        path,
        bytes: contents.len() as u64,
        sha256: Some(sha256),
        vouched: None,
    };
    publisher
        .put(
            &key("model.bin"),
            body,
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(
        proxy.cut.load(Ordering::SeqCst),
        "the proxy cut a connection"
    );
    let stored = object("flaky/model.bin").await.unwrap();
    assert!(stored == contents, "the object is whole");
    assert_eq!(sent.load(Ordering::Relaxed), contents.len() as u64);
    assert_eq!(unfinished("flaky/").await, Vec::<String>::new());
    // Every part went with its own checksum for the store to check.
    for part in contents.chunks(PART as usize) {
        assert!(proxy.saw_header("x-amz-checksum-sha256", &checksum(part)));
    }
    assert!(proxy.saw_header("x-amz-checksum-algorithm", "SHA256"));
    // (moto neither checks these values nor answers a part with its
    // checksum, so the completion lists none here; S3 does both.)
}

#[tokio::test]
async fn s3_conforms() {
    let wrong = "wR0ng/s3cret+Key-nobody-has";
    let target = Target {
        publisher: good("conforms"),
        key: |check, path| key(&format!("{check}/{path}")),
        read_back: Box::new(|k| Box::pin(async move { object(&format!("conforms/{k}")).await })),
        leftovers: Box::new(|| Box::pin(unfinished("conforms/"))),
        secret: Some(moto().secret_access_key.clone()),
        stranger: Some((
            releases("conforms", &moto().endpoint, "AKIAWRONGKEY0000", wrong),
            wrong.to_string(),
        )),
        refused_key: None,
        told_while_sending: true,
    };
    conforms(&target).await;
}
