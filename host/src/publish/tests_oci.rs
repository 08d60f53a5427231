//! OCI registry targets against the CNCF registry (`tests/registry`),
//! anonymous and behind a login: puts push blobs and `finish` writes the
//! manifest that lists them, read back with berth's own registry client;
//! a blob the repository has is not uploaded again, one the model's own
//! repository has is mounted, a large one goes in chunks; a refused login
//! names where it came from, never the secret; a key of another shape is
//! refused before anything is sent; a file that is not the verified one
//! never lands as a blob. What the registry did is read from its access
//! log; the conformance suite's run is `tests_oci_conforms`.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::testing::{assert_not_the_verified_one, file, file_body, key};
use super::{ARTIFACT_TYPE, Body, Error, ObjectInfo, Pending, Publisher, Publishers};
use crate::oci::manifest::{EMPTY_CONFIG, OCI_MANIFEST, TITLE};
use crate::oci::{Login, Manifest};
use crate::targets::Targets;
use crate::trust::Trust;

// The oci module's tests include the harness too.
#[allow(clippy::duplicate_mod)]
#[path = "../../../tests/registry/registry.rs"]
pub(super) mod registry;
use registry::Registry;

const CHUNK: u64 = 5 << 20;

/// The target "registry" at `oci://HOST/team/`, with `login` as its
/// options (`password` from `${REGISTRY_PASSWORD}`), in chunks of 5 MiB.
pub(super) fn target(registry: &Registry, login: Option<(&str, &str)>) -> Publisher {
    let mut text = format!(
        "[[target]]\nname = \"registry\"\nurl = \"oci://{}/team/\"\n",
        registry.host
    );
    if let Some((user, _)) = login {
        text.push_str(&format!(
            "options = {{ username = \"{user}\", password = \"${{REGISTRY_PASSWORD}}\" }}\n"
        ));
    }
    let password = login.map(|(_, p)| p.to_string());
    let targets = Targets::parse(&text, "sources.toml", |var| {
        (var == "REGISTRY_PASSWORD")
            .then(|| password.clone())
            .flatten()
    })
    .unwrap();
    Publishers::new(Arc::new(targets), &Trust::default())
        .with_part_bytes(CHUNK)
        .get("registry")
        .unwrap()
}

/// berth's own client of `registry`, as a fetch would read it.
pub(super) fn reader(registry: &Registry) -> crate::oci::Registry {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = registry.basic_auth.then(|| Login {
        username: registry::USER.into(),
        password: registry::PASSWORD.into(),
    });
    crate::oci::Registry::new(http, &registry.host, login, None)
}

fn bytes(contents: &[u8], content_type: &str) -> Body {
    Body::Bytes {
        bytes: bytes::Bytes::copy_from_slice(contents),
        content_type: content_type.into(),
    }
}

fn sha256(contents: &[u8]) -> String {
    hex::encode(Sha256::digest(contents))
}

/// The requests among `requests` whose `METHOD PATH` starts with `start`.
fn counted(requests: &[String], start: &str) -> usize {
    requests.iter().filter(|r| r.starts_with(start)).count()
}

/// A file and bytes put under one tag, with and without a login: `finish`
/// writes one manifest whose layers are the puts, in order, titled with
/// their paths; berth's client reads it back as the model's files, `stat`
/// finds each, and a second `finish` writes nothing.
#[tokio::test]
async fn puts_and_finish_write_a_manifest_of_the_files_put() {
    for registry in [Registry::start(), Registry::with_login()] {
        let login = registry
            .basic_auth
            .then_some((registry::USER, registry::PASSWORD));
        let publisher = target(&registry, login);
        let dir = tempfile::tempdir().unwrap();
        let (path, contents, digest) = file(dir.path(), 300_000);
        let pending = Pending::default();
        let never = CancellationToken::new();
        let (weights, card) = (
            key("llama/ft:job-7/w/model.bin"),
            key("llama/ft:job-7/README.md"),
        );

        let receipt = publisher
            .put_into(
                &pending,
                &weights,
                file_body(&path, &contents, Some(&digest)),
                &|_| {},
                &never,
            )
            .await
            .unwrap();
        let url = format!("oci://{}/team/llama/ft:job-7#w/model.bin", registry.host);
        assert_eq!(receipt.url, url);
        assert_eq!(publisher.url(&weights).unwrap(), url);
        // Folders: the artifact itself, and a folder in it.
        let artifact = format!("oci://{}/team/llama/ft:job-7", registry.host);
        assert_eq!(
            publisher.folder_url(&key("llama/ft:job-7")).unwrap(),
            artifact
        );
        assert_eq!(
            publisher.folder_url(&key("llama/ft:job-7/w")).unwrap(),
            format!("{artifact}#w/")
        );
        assert_eq!(
            (receipt.bytes, receipt.sha256.as_str()),
            (300_000, digest.as_str())
        );
        assert_eq!(receipt.etag, Some(format!("sha256:{digest}")));
        let card_bytes = b"# a card\n";
        let carded = publisher
            .put_into(
                &pending,
                &card,
                bytes(card_bytes, "text/markdown; charset=utf-8"),
                &|_| {},
                &never,
            )
            .await
            .unwrap();
        assert_eq!(carded.sha256, sha256(card_bytes));
        // Nothing is a manifest before `finish`.
        assert_eq!(publisher.stat(&weights).await.unwrap(), None);
        assert!(!pending.is_empty());

        let written = publisher.finish(&pending, &never).await.unwrap();
        assert_eq!(written.len(), 1, "{written:?}");
        let manifest_receipt = &written[0];
        assert_eq!(manifest_receipt.key, "llama/ft:job-7");
        assert_eq!(
            manifest_receipt.url,
            format!(
                "oci://{}/team/llama/ft:job-7@sha256:{}",
                registry.host, manifest_receipt.sha256
            )
        );
        assert!(pending.is_empty());

        let client = reader(&registry);
        let (by_tag, manifest, body) = client.manifest("team/llama/ft", "job-7").await.unwrap();
        assert_eq!(by_tag, manifest_receipt.sha256);
        assert_eq!(body.len() as u64, manifest_receipt.bytes);
        assert_eq!(manifest.media_type.as_deref(), Some(OCI_MANIFEST));
        assert_eq!(manifest.artifact_type.as_deref(), Some(ARTIFACT_TYPE));
        assert_eq!(manifest.config.media_type, EMPTY_CONFIG);
        assert_eq!(manifest.config.size, 2);
        assert!(
            manifest
                .annotations
                .contains_key("org.opencontainers.image.created"),
            "{manifest:?}"
        );
        let layers: Vec<_> = manifest
            .layers
            .iter()
            .map(|l| {
                (
                    l.annotations[TITLE].as_str(),
                    l.media_type.as_str(),
                    l.size,
                    l.digest.clone(),
                )
            })
            .collect();
        assert_eq!(
            layers,
            [
                (
                    "w/model.bin",
                    "application/octet-stream",
                    300_000,
                    format!("sha256:{digest}")
                ),
                (
                    "README.md",
                    "text/markdown",
                    card_bytes.len() as u64,
                    format!("sha256:{}", sha256(card_bytes))
                ),
            ]
        );
        let files: Vec<_> = manifest
            .files()
            .unwrap()
            .into_iter()
            .map(|f| (f.path, f.size, f.sha256))
            .collect();
        assert_eq!(
            files,
            [
                ("w/model.bin".to_string(), 300_000, digest.clone()),
                (
                    "README.md".to_string(),
                    card_bytes.len() as u64,
                    sha256(card_bytes)
                ),
            ]
        );
        // The blobs are the bytes put; the config is `{}`.
        let blob = client.blob("team/llama/ft", &digest, None).await.unwrap();
        assert!(blob.bytes().await.unwrap() == contents);
        let config = manifest.config.sha256().unwrap().to_string();
        let config = client.blob("team/llama/ft", &config, None).await.unwrap();
        assert_eq!(config.bytes().await.unwrap().as_ref(), b"{}");

        assert_eq!(
            publisher.stat(&weights).await.unwrap(),
            Some(ObjectInfo {
                bytes: 300_000,
                etag: Some(format!("sha256:{digest}"))
            })
        );
        assert_eq!(
            publisher
                .stat(&key("llama/ft:job-7/other.bin"))
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            publisher
                .stat(&key("llama/ft:job-8/w/model.bin"))
                .await
                .unwrap(),
            None
        );
        assert!(publisher.finish(&pending, &never).await.unwrap().is_empty());
    }
}

/// Several tags at once: a manifest each, in the order first put to, each
/// with its layers in the order the puts were made (not the order they
/// landed); a path put again is the last put's.
#[tokio::test]
async fn layers_keep_the_order_of_the_puts_and_a_path_put_again_is_replaced() {
    let registry = Registry::start();
    let publisher = target(&registry, None);
    let pending = Pending::default();
    let never = CancellationToken::new();
    let dir = tempfile::tempdir().unwrap();
    // The first put is the largest: it lands last.
    let (big, big_contents, big_digest) = file(dir.path(), 3 << 20);
    let keys = [
        key("m:a/big.bin"),
        key("m:a/small.txt"),
        key("m:b/one.txt"),
        key("m:a/last.txt"),
    ];
    let puts = vec![
        publisher.put_into(
            &pending,
            &keys[0],
            file_body(&big, &big_contents, Some(&big_digest)),
            &|_| {},
            &never,
        ),
        publisher.put_into(&pending, &keys[1], bytes(b"small", ""), &|_| {}, &never),
        publisher.put_into(&pending, &keys[2], bytes(b"one", ""), &|_| {}, &never),
        publisher.put_into(&pending, &keys[3], bytes(b"last", ""), &|_| {}, &never),
    ];
    for put in futures::future::join_all(puts).await {
        put.unwrap();
    }
    // `small.txt` again, with other bytes.
    publisher
        .put_into(
            &pending,
            &keys[1],
            bytes(b"small, again", ""),
            &|_| {},
            &never,
        )
        .await
        .unwrap();
    let written = publisher.finish(&pending, &never).await.unwrap();
    let keys: Vec<&str> = written.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["m:a", "m:b"]);
    let client = reader(&registry);
    let titles = |manifest: &Manifest| -> Vec<(String, u64)> {
        manifest
            .layers
            .iter()
            .map(|l| (l.annotations[TITLE].clone(), l.size))
            .collect()
    };
    let (_, a, _) = client.manifest("team/m", "a").await.unwrap();
    assert_eq!(
        titles(&a),
        [
            ("big.bin".to_string(), 3 << 20),
            ("last.txt".to_string(), 4),
            ("small.txt".to_string(), 12)
        ]
    );
    let (_, b, _) = client.manifest("team/m", "b").await.unwrap();
    assert_eq!(titles(&b), [("one.txt".to_string(), 3)]);
}

/// A blob the repository has is looked up and not sent again; the same
/// model pushed again uploads nothing but its manifest. A blob of the
/// repository the model came from is mounted, not uploaded. A large one
/// goes up in chunks, its last bytes with the digest.
#[tokio::test]
async fn a_blob_goes_up_once_mounted_when_it_can_be_and_in_chunks_when_large() {
    let registry = Registry::start();
    let publisher = target(&registry, None);
    let never = CancellationToken::new();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, digest) = file(dir.path(), 12 << 20);
    let push = |tag: &'static str, pending: Pending| {
        let (path, contents, digest) = (path.clone(), contents.clone(), digest.clone());
        let publisher = publisher.clone();
        let never = never.clone();
        async move {
            let k = key(&format!("big:{tag}/weights.bin"));
            let receipt = publisher
                .put_into(
                    &pending,
                    &k,
                    file_body(&path, &contents, Some(&digest)),
                    &|_| {},
                    &never,
                )
                .await
                .unwrap();
            assert_eq!(receipt.sha256, digest);
            publisher.finish(&pending, &never).await.unwrap()
        }
    };

    let before = registry.requests().await.len();
    push("one", Pending::default()).await;
    let requests = registry.requests().await.split_off(before);
    // 12 MiB in chunks of 5: two PATCHes, the rest with the final PUT.
    assert_eq!(
        counted(&requests, "PATCH /v2/team/big/blobs/uploads/"),
        2,
        "{requests:#?}"
    );
    assert_eq!(
        counted(&requests, "PUT /v2/team/big/blobs/uploads/"),
        2,
        "the blob's and the config's: {requests:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.contains(&format!("digest=sha256%3A{digest}"))
                || r.contains(&format!("digest=sha256:{digest}"))),
        "{requests:#?}"
    );
    let blob = reader(&registry)
        .blob("team/big", &digest, None)
        .await
        .unwrap();
    assert!(blob.bytes().await.unwrap() == contents, "other bytes");

    // Again, under another tag: nothing but the manifest is written.
    let before = registry.requests().await.len();
    let written = push("two", Pending::default()).await;
    assert_eq!(written.len(), 1);
    let requests = registry.requests().await.split_off(before);
    assert_eq!(counted(&requests, "POST "), 0, "{requests:#?}");
    assert_eq!(counted(&requests, "PATCH "), 0, "{requests:#?}");
    assert_eq!(
        requests
            .iter()
            .filter(|r| r.starts_with("PUT "))
            .map(|r| r.split(' ').nth(1).unwrap())
            .collect::<Vec<_>>(),
        ["/v2/team/big/manifests/two"],
        "{requests:#?}"
    );

    // Into another repository, from a model whose source is this one: mounted.
    let source = format!("oci://{}/team/big@sha256:{}", registry.host, "0".repeat(64));
    let before = registry.requests().await.len();
    let pending = Pending::new(&source);
    let k = key("copy:one/weights.bin");
    publisher
        .put_into(
            &pending,
            &k,
            file_body(&path, &contents, Some(&digest)),
            &|_| {},
            &never,
        )
        .await
        .unwrap();
    let requests = registry.requests().await.split_off(before);
    let mount = format!("mount=sha256%3A{digest}&from=team%2Fbig");
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("POST /v2/team/copy/blobs/uploads/?")
                && r.contains(&mount)
                && r.ends_with(" 201")),
        "{requests:#?}"
    );
    assert_eq!(counted(&requests, "PATCH "), 0, "{requests:#?}");
    assert_eq!(counted(&requests, "PUT "), 0, "{requests:#?}");
    publisher.finish(&pending, &never).await.unwrap();
    let (_, manifest, _) = reader(&registry)
        .manifest("team/copy", "one")
        .await
        .unwrap();
    assert_eq!(manifest.files().unwrap()[0].sha256, digest);
}

/// A wrong password is refused naming where the login came from (the
/// target), never the password; no login where one is needed says where
/// to give it.
#[tokio::test]
async fn a_refused_login_names_the_target_and_never_the_secret() {
    let registry = Registry::with_login();
    let never = CancellationToken::new();
    let k = key("m:t/a.txt");
    let wrong = target(&registry, Some((registry::USER, "not-the-password-9f2")));
    let e = wrong
        .put_into(&Pending::default(), &k, bytes(b"a", ""), &|_| {}, &never)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "target \"registry\" (oci://{host}/team/) refused the upload of m:t/a.txt: the \
             registry {host} refused the login of the target \"registry\" (its options username \
             and password) for team/m: check them",
            host = registry.host
        )
    );
    assert!(!e.contains("not-the-password-9f2"), "{e}");
    let e = wrong.stat(&k).await.unwrap_err().to_string();
    assert!(
        e.contains("refused the login of the target \"registry\""),
        "{e}"
    );

    let none = target(&registry, None);
    let e = none
        .put_into(&Pending::default(), &k, bytes(b"a", ""), &|_| {}, &never)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with(&format!(
            "the registry {} asks for a login for team/m and none is configured: give one in \
             the sources file: options username and password of the target \"registry\"",
            registry.host
        )),
        "{e}"
    );
}

/// Keys that are not `REPO:TAG/PATH` are refused with the shape, by puts,
/// `stat` and `url` alike, before anything is sent.
#[tokio::test]
async fn a_key_of_another_shape_is_refused_with_the_shape() {
    let registry = Registry::start();
    let publisher = target(&registry, None);
    let never = CancellationToken::new();
    let shape = "is not REPO:TAG/PATH, e.g. \"llama-ft:job-7/adapter_model.safetensors\", which \
                 an oci target's keys are";
    #[rustfmt::skip]
    let cases = [
        ("m/a.bin", "it has no :TAG"),
        ("m:t", "it names no /PATH after the tag"),
        ("M:t/a", "the repository \"team/M\" must be lowercase letters, digits and . _ - between /"),
        ("m/:t/a", "the repository \"team/m/\" must be lowercase"),
        (":t/a", "the repository \"team/\" must be lowercase"),
        ("m:-t/a", "the tag \"-t\" must be 1 to 128 letters"),
        ("m:t:u/a", "the tag \"t:u\" must be 1 to 128 letters"),
    ];
    let before = registry.requests().await.len();
    for (text, why) in cases {
        let k = key(text);
        let expected = format!("target \"registry\": key {text:?} {shape}: {why}");
        let pending = Pending::default();
        let e = publisher
            .put_into(&pending, &k, bytes(b"x", ""), &|_| {}, &never)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Key { .. }), "{e:?}");
        assert!(e.to_string().starts_with(&expected), "{text}: {e}");
        assert!(pending.is_empty());
        let e = publisher.stat(&k).await.unwrap_err().to_string();
        assert!(e.starts_with(&expected), "{text}: {e}");
        let e = publisher.url(&k).unwrap_err().to_string();
        assert!(e.starts_with(&expected), "{text}: {e}");
    }
    assert_eq!(
        registry.requests().await.len(),
        before,
        "a request was sent"
    );
}

/// A file that is not the verified one is refused before its last bytes
/// go: no blob at the registry, its session cancelled.
#[tokio::test]
async fn a_file_not_the_verified_one_never_lands_as_a_blob() {
    let registry = Registry::start();
    let publisher = target(&registry, None);
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, digest) = file(dir.path(), 11 << 20);
    let wrong = "ab".repeat(32);
    let pending = Pending::default();
    let never = CancellationToken::new();
    let e = publisher
        .put_into(
            &pending,
            &key("m:t/model.bin"),
            file_body(&path, &contents, Some(&wrong)),
            &|_| {},
            &never,
        )
        .await
        .unwrap_err()
        .to_string();
    assert_not_the_verified_one(&e, "registry", "m:t/model.bin", &path, &wrong);
    assert!(pending.is_empty());
    let client = reader(&registry);
    for hex in [&wrong, &digest] {
        assert_eq!(
            client
                .blob_size("team/m", hex, crate::oci::Access::Pull)
                .await
                .unwrap(),
            None
        );
    }
    let requests = registry.requests().await;
    // Two chunks went, then the file's end was refused: the session was cancelled.
    assert_eq!(counted(&requests, "PATCH "), 2, "{requests:#?}");
    assert_eq!(counted(&requests, "PUT "), 0, "{requests:#?}");
    assert_eq!(
        counted(&requests, "DELETE /v2/team/m/blobs/uploads/"),
        1,
        "{requests:#?}"
    );
}
