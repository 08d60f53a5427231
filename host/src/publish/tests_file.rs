//! Folder targets: puts of files and bytes land whole under the folder,
//! a cancelled or refused put leaves nothing, and stat sees what is there.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::testing::{assert_not_the_verified_one, file, file_body, key};
use super::{Body, Error, ObjectInfo, Publisher, Publishers};
use crate::targets::Targets;
use crate::trust::Trust;

/// A publisher for a `file://` target named "local" on `dir`.
fn local(dir: &Path) -> Publisher {
    let text = format!(
        "[[target]]\nname = \"local\"\nurl = \"file://{}/\"\n",
        dir.display()
    );
    let targets = Targets::parse(&text, "sources.toml", |_| None).unwrap();
    Publishers::new(Arc::new(targets), &Trust::default())
        .get("local")
        .unwrap()
}

/// Every entry under `dir`, hidden ones included, as relative paths.
fn entries(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            found.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

#[tokio::test]
async fn a_file_and_bytes_land_whole_under_the_folder() {
    let (source, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let root = target.path().join("out");
    let publisher = local(&root);
    let (path, contents, sha256) = file(source.path(), 3 << 20);
    let sent = AtomicU64::new(0);
    let progress = |n: u64| {
        sent.fetch_add(n, Ordering::Relaxed);
    };
    let never = CancellationToken::new();

    // Without a digest given, it is computed while copying.
    let k = key("job-1/deploy-2/model.bin");
    let body = file_body(&path, &contents, None);
    let receipt = publisher.put(&k, body, &progress, &never).await.unwrap();
    assert_eq!(
        std::fs::read(root.join("job-1/deploy-2/model.bin")).unwrap(),
        contents
    );
    assert_eq!(receipt.target, "local");
    assert_eq!(receipt.key, "job-1/deploy-2/model.bin");
    assert_eq!(
        receipt.url,
        format!("file://{}/job-1/deploy-2/model.bin", root.display())
    );
    assert_eq!(receipt.url, publisher.url(&k).unwrap());
    // The folder the key is in: where the keys under it land, ending in /.
    assert_eq!(
        publisher.folder_url(&key("job-1/deploy-2")).unwrap(),
        format!("file://{}/job-1/deploy-2/", root.display())
    );
    assert_eq!(
        (receipt.bytes, receipt.sha256.as_str()),
        (contents.len() as u64, sha256.as_str())
    );
    assert_eq!(receipt.etag, None);
    assert_eq!(sent.load(Ordering::Relaxed), contents.len() as u64);

    // With the recorded digest, over an existing object.
    let body = Body::File {
        path,
        bytes: contents.len() as u64,
        sha256: Some(sha256.to_uppercase()),
        vouched: None,
    };
    let again = publisher.put(&k, body, &progress, &never).await.unwrap();
    assert_eq!(again.sha256, sha256);

    let manifest = bytes::Bytes::from_static(b"{\"files\": 1}");
    let receipt = publisher
        .put(
            &key("job-1/deploy-2/manifest.json"),
            Body::Bytes {
                bytes: manifest.clone(),
                content_type: "application/json".into(),
            },
            &progress,
            &never,
        )
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(root.join("job-1/deploy-2/manifest.json")).unwrap(),
        manifest
    );
    assert_eq!(receipt.sha256, hex::encode(Sha256::digest(&manifest)));
    assert_eq!(
        entries(&root),
        [
            "job-1",
            "job-1/deploy-2",
            "job-1/deploy-2/manifest.json",
            "job-1/deploy-2/model.bin"
        ],
        "no partial file is left beside them"
    );

    assert_eq!(
        publisher.stat(&k).await.unwrap(),
        Some(ObjectInfo {
            bytes: contents.len() as u64,
            etag: None
        })
    );
    assert_eq!(
        publisher.stat(&key("job-1/absent.bin")).await.unwrap(),
        None
    );
    assert_eq!(
        publisher.stat(&key("job-1")).await.unwrap(),
        None,
        "a folder is no object"
    );
    assert_eq!(
        publisher
            .stat(&key("job-1/deploy-2/model.bin/x"))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_cancelled_put_leaves_no_file() {
    let (source, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let publisher = local(target.path());
    let (path, contents, sha256) = file(source.path(), 4 << 20);
    let cancel = CancellationToken::new();
    // Cancelled once the first chunk is written.
    let progress = |_: u64| cancel.cancel();
    let body = Body::File {
        path,
        bytes: contents.len() as u64,
        sha256: Some(sha256),
        vouched: None,
    };
    let error = publisher
        .put(&key("a/model.bin"), body, &progress, &cancel)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Cancelled), "{error}");
    assert_eq!(entries(target.path()), ["a"], "no partial, no object");

    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain\r\nX-Injected: 1".into(),
    };
    let error = publisher
        .put(&key("c"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "target \"local\": c was not published: the content type \"text/plain\\r\\nX-Injected: 1\" \
         is not a valid header value"
    );

    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    let error = publisher
        .put(&key("b"), body, &|_| {}, &cancelled)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Cancelled));
    assert_eq!(entries(target.path()), ["a"]);
}

#[tokio::test]
async fn a_file_that_is_not_the_verified_one_is_refused_and_leaves_nothing() {
    let (source, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let publisher = local(target.path());
    let (path, contents, _) = file(source.path(), (2 << 20) + 17);
    let never = CancellationToken::new();
    let wrong = "0".repeat(64);
    let body = file_body(&path, &contents, Some(&wrong));
    let error = publisher
        .put(&key("model.bin"), body, &|_| {}, &never)
        .await
        .unwrap_err()
        .to_string();
    assert_not_the_verified_one(&error, "local", "model.bin", &path, &wrong);

    let body = Body::File {
        path: path.clone(),
        bytes: contents.len() as u64 + 1,
        sha256: None,
        vouched: None,
    };
    let error = publisher
        .put(&key("model.bin"), body, &|_| {}, &never)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "target \"local\": model.bin was not published: {} is {} bytes, not the {} expected \
             (it changed after it was recorded?)",
            path.display(),
            contents.len(),
            contents.len() + 1
        )
    );
    assert_eq!(entries(target.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_key_never_goes_through_a_link_out_of_the_folder() {
    let (outside, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::os::unix::fs::symlink(outside.path(), target.path().join("link")).unwrap();
    let publisher = local(target.path());
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    let error = publisher
        .put(
            &key("link/escaped"),
            body,
            &|_| {},
            &CancellationToken::new(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "target \"local\" (file://{root}/) refused the upload of link/escaped: {root}/link is \
             in the way: not a folder (a key's folders are never files or links)",
            root = target.path().display()
        )
    );
    assert_eq!(entries(outside.path()), Vec::<String>::new());
}

#[tokio::test]
async fn an_empty_file_is_an_empty_object() {
    let (source, target) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let publisher = local(target.path());
    let (path, contents, sha256) = file(source.path(), 0);
    let body = Body::File {
        path,
        bytes: 0,
        sha256: Some(sha256.clone()),
        vouched: None,
    };
    let receipt = publisher
        .put(&key("empty"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((receipt.bytes, receipt.sha256), (0, sha256));
    assert_eq!(
        std::fs::read(target.path().join("empty")).unwrap(),
        contents
    );
}
