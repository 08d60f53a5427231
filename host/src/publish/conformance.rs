//! The contract every kind of target meets, written once and run against
//! each (`tests_file`, `tests_http`, `tests_s3`, `tests_oci` call
//! `conforms`), as object_store runs one set of checks against every
//! store: a put lands whole under its key with its size and sha256, told
//! as it goes, and again replaces it; `stat` sees it and nothing else; an
//! empty file is an empty object; a file that is not the verified one, a
//! put cancelled before or while it sends, a content type that is no
//! header and a key of a shape the target refuses leave nothing behind
//! (no object, no partial, no unfinished upload, no pending layer); a
//! refused login names the target; no error carries the target's secret.
//! What is specific to one kind (multipart parts, manifests and tags,
//! headers, retries) stays in its own file.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::testing::{assert_not_the_verified_one, file};
use super::{Body, Error, Key, ObjectInfo, Pending, Publisher, Receipt};

/// A target under test, and what the suite needs to see behind it.
pub(super) struct Target {
    pub(super) publisher: Publisher,
    /// The key of `path` for the check `check` (each check puts under its
    /// own, so checks never see each other's objects): an oci target's
    /// keys are `REPO:TAG/PATH`.
    pub(super) key: fn(check: &str, path: &str) -> Key,
    /// The bytes at `key`, read by other means than the publisher; `None`
    /// if there is no object.
    pub(super) read_back: Box<dyn Fn(Key) -> BoxFuture<'static, Option<Vec<u8>>>>,
    /// What puts left that is no object: partial files, unfinished
    /// multipart uploads, upload sessions.
    pub(super) leftovers: Box<dyn Fn() -> BoxFuture<'static, Vec<String>>>,
    /// The secret the target is configured with, never in an error.
    pub(super) secret: Option<String>,
    /// The same target configured with a wrong secret (that secret).
    pub(super) stranger: Option<(Publisher, String)>,
    /// A key of a shape the target refuses, and the start of the reason.
    pub(super) refused_key: Option<(&'static str, &'static str)>,
    /// Whether `progress` is told while a large file is still being sent
    /// (an HTTP mirror's is told on a timer, so a loopback put may be
    /// done before a cancel on the first tell could land).
    pub(super) told_while_sending: bool,
}

/// Runs every check against `target`.
pub(super) async fn conforms(target: &Target) {
    lands_whole_and_is_replaced(target).await;
    stat_sees_what_is_there(target).await;
    an_empty_file_is_an_empty_object(target).await;
    a_file_not_the_verified_one_leaves_nothing(target).await;
    a_cancelled_put_leaves_nothing(target).await;
    a_content_type_that_is_no_header_is_refused(target).await;
    a_key_the_target_refuses_is_refused_with_its_shape(target).await;
    a_refused_login_names_the_target_and_never_the_secret(target).await;
}

impl Target {
    fn name(&self) -> &str {
        self.publisher.name()
    }

    /// Puts `body` at `key` with its own `Pending`, and finishes it: on
    /// an oci target an object is visible only then. The receipt and the
    /// bytes told to `progress`.
    async fn put(&self, key: &Key, body: Body) -> Result<(Receipt, u64), String> {
        let told = std::sync::atomic::AtomicU64::new(0);
        let progress = |n: u64| {
            told.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        };
        let (pending, never) = (Pending::default(), CancellationToken::new());
        let put = self
            .publisher
            .put_into(&pending, key, body, &progress, &never)
            .await;
        let receipt = match put {
            Ok(receipt) => receipt,
            Err(e) => {
                assert!(pending.is_empty(), "{key}: a failed put left a layer");
                return Err(self.words(&e));
            }
        };
        self.publisher.finish(&pending, &never).await.unwrap();
        Ok((receipt, told.into_inner()))
    }

    /// `e` in words, asserted free of the target's secret.
    #[track_caller]
    fn words(&self, e: &Error) -> String {
        let words = e.to_string();
        if let Some(secret) = &self.secret {
            assert!(!words.contains(secret.as_str()), "{words}");
        }
        words
    }

    /// Nothing is at `key`, by the publisher or otherwise, and no put
    /// left anything.
    async fn assert_nothing_at(&self, key: &Key) {
        assert_eq!((self.read_back)(key.clone()).await, None, "{key}");
        assert_eq!(self.publisher.stat(key).await.unwrap(), None, "{key}");
        let mut left = (self.leftovers)().await;
        // An abort may still be on its way when the put has returned.
        for _ in 0..20 {
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            left = (self.leftovers)().await;
        }
        assert_eq!(left, Vec::<String>::new(), "{key}: left behind");
    }
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn file_body(path: &std::path::Path, bytes: u64, sha256: Option<&str>) -> Body {
    Body::File {
        path: path.to_path_buf(),
        bytes,
        sha256: sha256.map(str::to_string),
        vouched: None,
    }
}

/// A file without its digest (computed), the same with it (upper case)
/// over the first, and bytes: each lands whole at a nested key, its
/// receipt says where, how much and which sha256, its bytes are told,
/// and a put of other bytes replaces the object.
async fn lands_whole_and_is_replaced(target: &Target) {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, digest) = file(dir.path(), (3 << 20) + 5);
    let len = contents.len() as u64;
    let k = (target.key)("whole", "job 1/a:b/model.bin");
    for given in [None, Some(digest.to_uppercase())] {
        let (receipt, told) = target
            .put(&k, file_body(&path, len, given.as_deref()))
            .await
            .unwrap();
        assert_eq!(receipt.target, target.name());
        assert_eq!(receipt.key, k.as_str());
        assert_eq!(receipt.url, target.publisher.url(&k).unwrap());
        assert_eq!((receipt.bytes, receipt.sha256.as_str()), (len, &*digest));
        assert_eq!(told, len, "every byte told once");
        let back = (target.read_back)(k.clone()).await;
        assert!(back.as_ref() == Some(&contents), "{k}: other bytes");
    }

    let manifest = b"{\"files\": 1}";
    let m = (target.key)("whole", "manifest.json");
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(manifest),
        content_type: "application/json".into(),
    };
    let (receipt, told) = target.put(&m, body).await.unwrap();
    assert_eq!(receipt.url, target.publisher.url(&m).unwrap());
    assert_eq!(
        (receipt.bytes, receipt.sha256.as_str()),
        (manifest.len() as u64, &*sha256(manifest))
    );
    assert_eq!(told, manifest.len() as u64);
    assert_eq!(
        (target.read_back)(m.clone()).await.as_deref(),
        Some(&manifest[..])
    );

    let other = b"{\"files\": 2, \"again\": true}";
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(other),
        content_type: "application/json".into(),
    };
    let (receipt, _) = target.put(&m, body).await.unwrap();
    assert_eq!(receipt.sha256, sha256(other));
    assert_eq!(
        (target.read_back)(m.clone()).await.as_deref(),
        Some(&other[..]),
        "the second put replaced the first"
    );
    assert_eq!((target.leftovers)().await, Vec::<String>::new());
}

/// `stat` of a key put is its size and the receipt's etag; of a key
/// never put, of a key's folder and of a key under a key's object, none.
async fn stat_sees_what_is_there(target: &Target) {
    let k = (target.key)("stat", "dir/model.bin");
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"twelve bytes"),
        content_type: "application/octet-stream".into(),
    };
    let (receipt, _) = target.put(&k, body).await.unwrap();
    assert_eq!(
        target.publisher.stat(&k).await.unwrap(),
        Some(ObjectInfo {
            bytes: 12,
            etag: receipt.etag
        })
    );
    for absent in ["absent.bin", "dir/absent.bin", "dir", "dir/model.bin/x"] {
        let absent = (target.key)("stat", absent);
        assert_eq!(
            target.publisher.stat(&absent).await.unwrap(),
            None,
            "{absent}"
        );
    }
}

async fn an_empty_file_is_an_empty_object(target: &Target) {
    let dir = tempfile::tempdir().unwrap();
    let (path, _, digest) = file(dir.path(), 0);
    let k = (target.key)("empty", "empty");
    for given in [Some(digest.as_str()), None] {
        let (receipt, told) = target.put(&k, file_body(&path, 0, given)).await.unwrap();
        assert_eq!(
            (receipt.bytes, receipt.sha256.as_str(), told),
            (0, &*digest, 0)
        );
        assert_eq!((target.read_back)(k.clone()).await, Some(Vec::new()));
        assert_eq!(target.publisher.stat(&k).await.unwrap().unwrap().bytes, 0);
    }
}

/// A file whose bytes are not its verified digest, or not its recorded
/// size, is refused with the file named, and nothing of it lands: large
/// enough to be sent in parts or chunks.
async fn a_file_not_the_verified_one_leaves_nothing(target: &Target) {
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, _) = file(dir.path(), (11 << 20) + 1);
    let len = contents.len() as u64;
    let k = (target.key)("mismatch", "model.bin");
    let wrong = "ab".repeat(32);
    let error = target
        .put(&k, file_body(&path, len, Some(&wrong)))
        .await
        .unwrap_err();
    assert_not_the_verified_one(&error, target.name(), k.as_str(), &path, &wrong);
    target.assert_nothing_at(&k).await;

    let error = target
        .put(&k, file_body(&path, len + 1, None))
        .await
        .unwrap_err();
    assert_eq!(
        error,
        format!(
            "target \"{}\": {k} was not published: {} is {len} bytes, not the {} expected (it \
             changed after it was recorded?)",
            target.name(),
            path.display(),
            len + 1
        )
    );
    target.assert_nothing_at(&k).await;
}

/// A put cancelled before it starts, and one cancelled once its first
/// bytes are told (stopping within a second), are `Cancelled` and leave
/// nothing.
async fn a_cancelled_put_leaves_nothing(target: &Target) {
    let k = (target.key)("cancelled", "a/model.bin");
    let pending = Pending::default();
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    let e = target
        .publisher
        .put_into(&pending, &k, body, &|_| {}, &cancelled)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert!(pending.is_empty());
    target.assert_nothing_at(&k).await;

    if !target.told_while_sending {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, digest) = file(dir.path(), 21 << 20);
    let cancel = CancellationToken::new();
    let cancelled_at = std::sync::Mutex::new(None);
    let progress = |_: u64| {
        cancelled_at
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        cancel.cancel();
    };
    let body = file_body(&path, contents.len() as u64, Some(&digest));
    let e = target
        .publisher
        .put_into(&pending, &k, body, &progress, &cancel)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Cancelled), "{e}");
    let took = cancelled_at.lock().unwrap().expect("told").elapsed();
    assert!(took < Duration::from_secs(1), "stopped {took:?} after");
    assert!(pending.is_empty());
    target.assert_nothing_at(&k).await;
}

async fn a_content_type_that_is_no_header_is_refused(target: &Target) {
    let k = (target.key)("typed", "c");
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain\r\nX-Injected: 1".into(),
    };
    let error = target.put(&k, body).await.unwrap_err();
    assert_eq!(
        error,
        format!(
            "target \"{}\": {k} was not published: the content type \"text/plain\\r\\nX-Injected: \
             1\" is not a valid header value",
            target.name()
        )
    );
    target.assert_nothing_at(&k).await;
}

/// A key the target cannot hold is refused by a put, `stat` and `url`
/// alike, naming the target and why.
async fn a_key_the_target_refuses_is_refused_with_its_shape(target: &Target) {
    let Some((text, why)) = target.refused_key else {
        return;
    };
    let k = super::testing::key(text);
    let expected = format!("target \"{}\": {why}", target.name());
    let pending = Pending::default();
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    let e = target
        .publisher
        .put_into(&pending, &k, body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Key { .. }), "{e:?}");
    assert!(target.words(&e).starts_with(&expected), "{e}");
    assert!(pending.is_empty());
    let e = target.publisher.stat(&k).await.unwrap_err();
    assert!(target.words(&e).starts_with(&expected), "{e}");
    let e = target.publisher.url(&k).unwrap_err();
    assert!(target.words(&e).starts_with(&expected), "{e}");
}

/// With a wrong secret, a put and a look-up are refused naming the
/// target, and neither the wrong secret nor the right one is said.
async fn a_refused_login_names_the_target_and_never_the_secret(target: &Target) {
    let Some((stranger, wrong)) = &target.stranger else {
        return;
    };
    let k = (target.key)("stranger", "x.json");
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
    };
    let never = CancellationToken::new();
    let e = stranger.put(&k, body, &|_| {}, &never).await.unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e:?}");
    let said = target.words(&e);
    assert!(
        said.starts_with(&format!("target \"{}\" (", stranger.name())),
        "{said}"
    );
    assert!(!said.contains(wrong.as_str()), "{said}");
    let e = stranger.stat(&k).await.unwrap_err();
    let said = target.words(&e);
    assert!(
        said.starts_with(&format!("target \"{}\" (", stranger.name()))
            && said.contains(&format!("refused the look-up of {k}")),
        "{said}"
    );
    assert!(!said.contains(wrong.as_str()), "{said}");
    target.assert_nothing_at(&k).await;
}
