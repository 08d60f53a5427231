//! Azure Blob targets against Azurite, started once for this test binary
//! (`tests/azurite/serve.js`), with its development account's key: the
//! conformance suite (`azure_conforms`, with a wrong key Azurite refuses),
//! a large file in blocks each sent with its MD5 (which Azurite does not
//! check: the proxy in front of it sees what berth sent), a dropped put's
//! blocks dropped, a missing container named, and a cancel in the middle
//! of a multi-GiB file leaving nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use object_store::azure::{AzureAccessKey, AzureAuthorizer, AzureCredential};
use tokio_util::sync::CancellationToken;

use super::conformance::{Target, conforms};
use super::testing::{Proxy, file, file_body, key, put_cancelled};
use super::{Body, Error, Publisher, Publishers};
use crate::targets::Targets;
use crate::trust::Trust;

#[allow(clippy::duplicate_mod)]
#[path = "../../../tests/azurite/azurite.rs"]
mod azurite;
use azurite::Azurite;

const CONTAINER: &str = "berth-publish";
const PART: u64 = 5 << 20;

fn azurite() -> &'static Azurite {
    static AZURITE: OnceLock<Azurite> = OnceLock::new();
    AZURITE.get_or_init(|| Azurite::start(&[CONTAINER]))
}

/// A publisher for target "releases" at `az://ACCOUNT/container/prefix/`
/// through `endpoint` (the account's, as `http://HOST:PORT/ACCOUNT`), with
/// the account key `key`, in blocks of 5 MiB.
fn releases(container: &str, prefix: &str, endpoint: &str, key: &str) -> Publisher {
    let account = &azurite().account;
    let text = format!(
        "[[target]]\nname = \"releases\"\nurl = \"az://{account}/{container}/{prefix}/\"\n\
         options = {{ endpoint = \"{endpoint}\", account_key = \"${{KEY}}\" }}\n"
    );
    let key = key.to_string();
    let targets = Targets::parse(&text, "sources.toml", |var| {
        (var == "KEY").then(|| key.clone())
    })
    .unwrap();
    Publishers::new(Arc::new(targets), &Trust::default())
        .with_part_bytes(PART)
        .get("releases")
        .unwrap()
}

fn good(prefix: &str, endpoint: &str) -> Publisher {
    releases(CONTAINER, prefix, endpoint, &azurite().key)
}

/// `GET` of the blob `name` (the container if empty) with `query`, signed
/// with the account key.
async fn get(name: &str, query: &str) -> reqwest::Response {
    let az = azurite();
    let mut url = url::Url::parse(&format!("{}/{CONTAINER}", az.endpoint)).unwrap();
    if !name.is_empty() {
        url.path_segments_mut().unwrap().extend(name.split('/'));
    }
    url.set_query(Some(query).filter(|q| !q.is_empty()));
    let url = url.to_string();
    let credential = AzureCredential::AccessKey(AzureAccessKey::try_new(&az.key).unwrap());
    let mut request = http::Request::builder()
        .uri(&url)
        .body(object_store::client::HttpRequestBody::empty())
        .unwrap();
    AzureAuthorizer::new(&credential, &az.account).authorize(&mut request);
    reqwest::Client::new()
        .get(&url)
        .headers(request.headers().clone())
        .send()
        .await
        .unwrap()
}

/// The blob `name`, if any.
async fn blob(name: &str) -> Option<Vec<u8>> {
    let answer = get(name, "").await;
    match answer.status() {
        reqwest::StatusCode::NOT_FOUND => None,
        status if status.is_success() => Some(answer.bytes().await.unwrap().to_vec()),
        status => panic!("Azurite answered {status}"),
    }
}

/// The blobs under `prefix` that hold uncommitted blocks, whether or not
/// they have committed ones.
async fn uncommitted(prefix: &str) -> Vec<String> {
    let query = format!("restype=container&comp=list&include=uncommittedblobs&prefix={prefix}");
    let listed = get("", &query).await.text().await.unwrap();
    let mut left = Vec::new();
    for name in listed
        .split("<Name>")
        .skip(1)
        .filter_map(|n| n.split("</Name>").next())
    {
        let blocks = get(name, "comp=blocklist&blocklisttype=uncommitted")
            .await
            .text()
            .await
            .unwrap();
        if blocks.contains("<Block>") {
            left.push(name.to_string());
        }
    }
    left
}

/// `uncommitted(prefix)` once it is empty, or after 10 s: a stopped put's
/// blocks are dropped on a task of its own once its requests ended.
async fn settled_uncommitted(prefix: &str) -> Vec<String> {
    let mut left = uncommitted(prefix).await;
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = uncommitted(prefix).await;
    }
    left
}

/// The `Content-MD5` of `bytes`.
fn md5(bytes: &[u8]) -> String {
    BASE64.encode(<md5::Md5 as md5::Digest>::digest(bytes))
}

#[tokio::test]
async fn azure_conforms() {
    let az = azurite();
    let wrong = BASE64.encode(b"not the account key, nobody has it");
    let target = Target {
        publisher: good("conforms", &az.endpoint),
        key: |check, path| key(&format!("{check}/{path}")),
        read_back: Box::new(|k| Box::pin(async move { blob(&format!("conforms/{k}")).await })),
        leftovers: Box::new(|| Box::pin(settled_uncommitted("conforms/"))),
        secret: Some(az.key.clone()),
        stranger: Some((
            releases(CONTAINER, "conforms", &az.endpoint, &wrong),
            wrong.clone(),
        )),
        refused_key: None,
        told_while_sending: true,
    };
    conforms(&target).await;
}

#[tokio::test]
async fn a_large_file_goes_up_in_blocks_each_with_its_md5() {
    let proxy = Proxy::start(&azurite().endpoint, None).await;
    let endpoint = format!("{}/{}", proxy.url, azurite().account);
    let publisher = good("large", &endpoint);
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), (16 << 20) + 11);
    let told = AtomicU64::new(0);
    let progress = |n: u64| {
        told.fetch_add(n, Ordering::Relaxed);
    };
    let receipt = publisher
        .put(
            &key("model.bin"),
            file_body(&path, &contents, Some(&sha256)),
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(receipt.sha256, sha256);
    let account = &azurite().account;
    assert_eq!(
        receipt.url,
        format!("az://{account}/{CONTAINER}/large/model.bin")
    );
    assert_eq!(told.load(Ordering::Relaxed), contents.len() as u64);
    assert!(blob("large/model.bin").await.unwrap() == contents);
    for block in contents.chunks(PART as usize) {
        assert!(proxy.saw_header("content-md5", &md5(block)));
    }
    let sent = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).into_owned();
    assert_eq!(
        sent.matches("comp=block&blockid=").count(),
        4,
        "four blocks"
    );
    assert_eq!(uncommitted("large/").await, Vec::<String>::new());
}

#[tokio::test]
async fn a_small_body_is_one_put_with_its_md5_and_type() {
    let proxy = Proxy::start(&azurite().endpoint, None).await;
    let endpoint = format!("{}/{}", proxy.url, azurite().account);
    let publisher = good("small", &endpoint);
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"{\"a\":1}"),
        content_type: "application/json".into(),
    };
    publisher
        .put(&key("card.json"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert!(proxy.saw_header("content-md5", &md5(b"{\"a\":1}")));
    assert!(proxy.saw_header("x-ms-blob-content-type", "application/json"));
    assert!(proxy.saw_header("x-ms-blob-type", "BlockBlob"));
    let answer = get("small/card.json", "").await;
    assert_eq!(answer.headers()["content-type"], "application/json");
}

#[tokio::test]
async fn a_dropped_put_drops_its_blocks() {
    let publisher = good("dropped", &azurite().endpoint);
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), 21 << 20);
    let first = tokio::sync::Notify::new();
    let progress = |_: u64| first.notify_one();
    let never = CancellationToken::new();
    let (body, k) = (file_body(&path, &contents, Some(&sha256)), key("model.bin"));
    tokio::select! {
        _ = publisher.put(&k, body, &progress, &never) => panic!("the put ended"),
        _ = first.notified() => {}
    }
    assert_eq!(settled_uncommitted("dropped/").await, Vec::<String>::new());
    assert_eq!(blob("dropped/model.bin").await, None);
}

#[tokio::test]
async fn a_missing_container_and_a_wrong_key_are_named_never_the_key() {
    let az = azurite();
    let body = || Body::Bytes {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
    };
    let publisher = releases("no-such-container", "x", &az.endpoint, &az.key);
    let error = publisher
        .put(&key("a.json"), body(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.ends_with("refused the upload of a.json: the account at http://127.0.0.1:")
            || error.contains("has no container no-such-container"),
        "{error}"
    );
    let wrong = BASE64.encode(b"a key nobody has, and never said");
    let publisher = releases(CONTAINER, "x", &az.endpoint, &wrong);
    let error = publisher
        .put(&key("a.json"), body(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Refused { .. }), "{error:?}");
    let error = error.to_string();
    assert!(
        error.contains("refused the upload of a.json: 403 Forbidden ")
            && error.ends_with(
                "(the credentials are the account key of target \"releases\" in the sources file)"
            ),
        "{error}"
    );
    assert!(
        !error.contains(&wrong) && !error.contains("MAC signature"),
        "{error}"
    );
}

/// A multi-GiB file (sparse: its bytes cost no disk) cancelled once a GiB
/// went up: no blob, no uncommitted block.
#[tokio::test]
async fn a_multi_gib_put_cancelled_in_the_middle_leaves_nothing() {
    let publisher = good("huge", &azurite().endpoint);
    let error = put_cancelled(&publisher, &key("huge.bin"), 2 << 30, 1 << 30).await;
    assert!(matches!(error, Error::Cancelled), "{error:?}");
    assert_eq!(settled_uncommitted("huge/").await, Vec::<String>::new());
    assert_eq!(blob("huge/huge.bin").await, None);
}
