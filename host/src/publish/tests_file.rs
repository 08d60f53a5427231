//! Folder targets: the conformance suite (`file_conforms`: the object is
//! the file under the folder, a partial is a hidden `.publish-*` file), and
//! a key never goes through a link out of the folder.

use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::conformance::{Target, conforms};
use super::testing::key;
use super::{Body, Publisher, Publishers};
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
async fn a_folder_key_answers_where_the_keys_under_it_land() {
    let target = tempfile::tempdir().unwrap();
    let root = target.path().join("out");
    let publisher = local(&root);
    assert_eq!(
        publisher.folder_url(&key("job-1/deploy-2")).unwrap(),
        format!("file://{}/job-1/deploy-2/", root.display())
    );
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
async fn file_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("out");
    let (at, partials) = (root.clone(), root.clone());
    let target = Target {
        publisher: local(&root),
        key: |check, path| key(&format!("{check}/{path}")),
        read_back: Box::new(move |k| {
            let file = k.segments().fold(at.clone(), |p, s| p.join(s));
            Box::pin(async move { std::fs::read(&file).ok().filter(|_| file.is_file()) })
        }),
        leftovers: Box::new(move || {
            let found = if partials.exists() {
                entries(&partials)
            } else {
                Vec::new()
            };
            let partial = |e: &String| e.rsplit('/').next().unwrap().starts_with(".publish-");
            Box::pin(async move { found.into_iter().filter(partial).collect() })
        }),
        secret: None,
        stranger: None,
        refused_key: None,
        told_while_sending: true,
    };
    conforms(&target).await;
}
