//! Google Cloud Storage targets against fake-gcs-server, started once for
//! this test binary (`tests/fake-gcs/serve.py`), through a proxy that sees
//! every request: the conformance suite (`gcs_conforms`; the emulator
//! takes any credential, so there is no wrong one to try), a large file in
//! chunks with the CRC32C of the whole sent for the store to check, a
//! dropped put's session deleted, a missing bucket named, and a cancel in
//! the middle of a multi-GiB file leaving nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio_util::sync::CancellationToken;

use super::conformance::{Target, conforms};
use super::testing::{Proxy, file, file_body, key, put_cancelled};
use super::{Body, Error, Publisher, Publishers};
use crate::targets::Targets;
use crate::trust::Trust;

#[allow(clippy::duplicate_mod)]
#[path = "../../../tests/fake-gcs/fake_gcs.rs"]
mod fake_gcs;
use fake_gcs::FakeGcs;

const BUCKET: &str = "berth-publish";
const PART: u64 = 5 << 20;

fn gcs() -> &'static (FakeGcs, String) {
    static GCS: OnceLock<(FakeGcs, String)> = OnceLock::new();
    GCS.get_or_init(|| (FakeGcs::start(&[BUCKET]), fake_gcs::service_account_key()))
}

/// A publisher for target "releases" at `gs://bucket/prefix/` through
/// `base_url`, signing with the service-account key, in chunks of 5 MiB.
fn releases(bucket: &str, prefix: &str, base_url: &str) -> Publisher {
    publishers(bucket, prefix, base_url)
        .with_part_bytes(PART)
        .get("releases")
        .unwrap()
}

fn publishers(bucket: &str, prefix: &str, base_url: &str) -> Publishers {
    let text = format!(
        "[[target]]\nname = \"releases\"\nurl = \"gs://{bucket}/{prefix}/\"\n\
         options = {{ base_url = \"{base_url}\", service_account_key = \"${{KEY}}\" }}\n"
    );
    let targets = Targets::parse(&text, "sources.toml", |var| {
        (var == "KEY").then(|| gcs().1.clone())
    })
    .unwrap();
    Publishers::new(Arc::new(targets), &Trust::default())
}

/// The object `name` of the bucket, if any, read from the emulator
/// directly.
async fn object(name: &str) -> Option<Vec<u8>> {
    let mut url = url::Url::parse(&gcs().0.endpoint).unwrap();
    url.path_segments_mut()
        .unwrap()
        .pop_if_empty()
        .extend(["storage", "v1", "b", BUCKET, "o", name]);
    url.query_pairs_mut().append_pair("alt", "media");
    let answer = reqwest::get(url).await.unwrap();
    match answer.status() {
        reqwest::StatusCode::NOT_FOUND => None,
        status if status.is_success() => Some(answer.bytes().await.unwrap().to_vec()),
        status => panic!("fake-gcs-server answered {status}"),
    }
}

/// The upload sessions `proxy` saw opened (a `Location` answered with an
/// `upload_id`) and neither completed (a `PUT` with the whole's CRC32C)
/// nor deleted.
fn open_sessions(proxy: &Proxy) -> Vec<String> {
    let answered = String::from_utf8_lossy(&proxy.answered.lock().unwrap()).into_owned();
    let sent = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).into_owned();
    let id_in = |text: &str| {
        let (_, rest) = text.split_once("upload_id=")?;
        Some(rest.split(['&', ' ', '\r']).next()?.to_string())
    };
    let opened = answered
        .split("\r\n")
        .filter(|line| line.to_ascii_lowercase().starts_with("location:"))
        .filter_map(id_in);
    // Each request's head: from its request line to its blank line (a
    // request follows the body before it with no separator).
    let heads: Vec<&str> = ["PUT /upload/", "DELETE /upload/"]
        .iter()
        .flat_map(|start| sent.match_indices(start))
        .map(|(at, _)| sent[at..].split("\r\n\r\n").next().unwrap_or_default())
        .collect();
    let closed = |id: &String| {
        heads.iter().any(|head| {
            id_in(head).as_ref() == Some(id)
                && (head.starts_with("DELETE ") || head.contains("\r\nx-goog-hash: crc32c="))
        })
    };
    opened.filter(|id| !closed(id)).collect()
}

/// The CRC32C of `bytes` as `X-Goog-Hash` says it.
fn crc32c(bytes: &[u8]) -> String {
    BASE64.encode(crc32c::crc32c(bytes).to_be_bytes())
}

#[tokio::test]
async fn gcs_conforms() {
    let proxy = Arc::new(Proxy::start(&gcs().0.endpoint, None).await);
    let seen = proxy.clone();
    let target = Target {
        publisher: releases(BUCKET, "conforms", &proxy.url),
        key: |check, path| key(&format!("{check}/{path}")),
        read_back: Box::new(|k| Box::pin(async move { object(&format!("conforms/{k}")).await })),
        leftovers: Box::new(move || {
            let proxy = seen.clone();
            Box::pin(async move {
                // A dropped session's deletion runs on a task of its own.
                tokio::time::sleep(Duration::from_millis(200)).await;
                open_sessions(&proxy)
            })
        }),
        secret: Some(gcs().1.clone()),
        stranger: None,
        refused_key: None,
        told_while_sending: true,
    };
    conforms(&target).await;
}

#[tokio::test]
async fn a_large_file_goes_up_in_chunks_with_the_crc32c_of_the_whole() {
    let proxy = Proxy::start(&gcs().0.endpoint, None).await;
    let publisher = releases(BUCKET, "large", &proxy.url);
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), (16 << 20) + 11);
    let told = AtomicU64::new(0);
    let progress = |n: u64| {
        told.fetch_add(n, Ordering::Relaxed);
    };
    let receipt = publisher
        .put(
            &key("model.bin"),
            file_body(&path, &contents, None),
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(receipt.sha256, sha256);
    assert_eq!(receipt.url, format!("gs://{BUCKET}/large/model.bin"));
    assert_eq!(told.load(Ordering::Relaxed), contents.len() as u64);
    assert!(object("large/model.bin").await.unwrap() == contents);
    // Four chunks (5, 5, 5 and 1 MiB and 11 bytes), the last with the
    // CRC32C of the whole, which the emulator does not check: berth
    // compared it with the one the emulator computed.
    let sent = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).into_owned();
    let total = contents.len();
    for range in [
        format!("bytes 0-{}/{total}", PART - 1),
        format!("bytes {}-{}/{total}", 3 * PART, total - 1),
    ] {
        assert!(
            sent.contains(&format!("\r\ncontent-range: {range}\r\n")),
            "{range}"
        );
    }
    assert!(proxy.saw_header("x-goog-hash", &format!("crc32c={}", crc32c(&contents))));
    assert_eq!(open_sessions(&proxy), Vec::<String>::new());
}

#[tokio::test]
async fn a_dropped_put_deletes_its_session() {
    let proxy = Proxy::start(&gcs().0.endpoint, None).await;
    let publisher = releases(BUCKET, "dropped", &proxy.url);
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), 16 << 20);
    let first = tokio::sync::Notify::new();
    let progress = |_: u64| first.notify_one();
    let never = CancellationToken::new();
    let (body, k) = (file_body(&path, &contents, Some(&sha256)), key("model.bin"));
    tokio::select! {
        _ = publisher.put(&k, body, &progress, &never) => panic!("the put ended"),
        _ = first.notified() => {}
    }
    let mut left = open_sessions(&proxy);
    for _ in 0..20 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = open_sessions(&proxy);
    }
    assert_eq!(left, Vec::<String>::new());
    assert_eq!(object("dropped/model.bin").await, None);
}

#[tokio::test]
async fn a_missing_bucket_is_named() {
    let publisher = releases("no-such-bucket", "x", &gcs().0.endpoint);
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
    };
    let error = publisher
        .put(&key("a.json"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Refused { .. }), "{error:?}");
    let error = error.to_string();
    assert!(
        error.starts_with(
            "target \"releases\" (gs://no-such-bucket/x/) refused the upload of a.json: 404 "
        ) && error.contains("is there a bucket no-such-bucket at http://127.0.0.1:"),
        "{error}"
    );
}

/// A multi-GiB file (sparse: its bytes cost no disk) cancelled once 256
/// MiB went up (fake-gcs-server takes each chunk in a time that grows with
/// what the session holds: a GiB is a minute): no object, no open session.
#[tokio::test]
async fn a_multi_gib_put_cancelled_in_the_middle_leaves_nothing() {
    let proxy = Proxy::start(&gcs().0.endpoint, None).await;
    // In the host's chunks, not the tests' small ones.
    let publisher = publishers(BUCKET, "huge", &proxy.url)
        .get("releases")
        .unwrap();
    let error = put_cancelled(&publisher, &key("huge.bin"), 2 << 30, 256 << 20).await;
    assert!(matches!(error, Error::Cancelled), "{error:?}");
    assert_eq!(open_sessions(&proxy), Vec::<String>::new());
    assert_eq!(object("huge/huge.bin").await, None);
}
