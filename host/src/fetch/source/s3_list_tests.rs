//! Listing a prefix for a registration that leaves its files out,
//! against moto's server (`s3_tests`' own): nested keys with their sizes, a
//! sha256 the store keeps or none, folder markers left out, and what is
//! refused (no objects, too many, no bucket, refused credentials, no
//! store), each in a sentence naming the prefix.

use std::time::Duration;

use object_store::path::Path as Key;
use sha2::{Digest, Sha256};

use super::discover::Found;
use super::s3_tests::{BUCKET, contents, fetch, moto};
use crate::fetch::{Access, Fetcher};
use crate::model::{ModelFile, TrainedModel};

/// Puts `contents` at `key` with boto3 (a folder marker; a kept sha256).
fn put_by_boto3(key: &str, contents: &[u8], sha256: bool) {
    moto().put_by_boto3(BUCKET, key, contents, sha256);
}

/// The server's sources, with the credentials of `access`.
fn sources(access: Access) -> super::Sources {
    super::Sources::new(crate::trust::Trust::default())
        .unwrap()
        .with_access(access)
}

#[tokio::test]
async fn a_prefix_is_listed_with_sizes_and_the_sha256_the_store_keeps() {
    let moto = moto();
    let kept = [
        ("weights/kept.bin", contents(10, 70_000)),
        ("w x+y.json", contents(11, 5)),
    ];
    let unkept = [
        ("weights/deeper/unkept.bin", contents(12, 1000)),
        ("empty.txt", Vec::new()),
    ];
    for (path, contents) in &kept {
        put_by_boto3(&format!("listed/{path}"), contents, true);
    }
    moto.put("listed", &unkept).await;
    for marker in ["listed/", "listed/weights/", "listed/markers-only/"] {
        put_by_boto3(marker, b"", false);
    }
    moto.put("listed-beside", &[("x.bin", contents(13, 3))])
        .await;
    let sources = sources(moto.good_access());

    let discovered = sources
        .discover(&format!("s3://{BUCKET}/{{job_id}}/"), "listed")
        .await
        .unwrap();

    assert_eq!(
        discovered.source,
        format!("s3://{BUCKET}/{{job_id}}/{{path}}")
    );
    let found = |(path, bytes): &(&str, Vec<u8>), sha256: bool| Found {
        path: path.to_string(),
        size_bytes: bytes.len() as u64,
        sha256: sha256.then(|| hex::encode(Sha256::digest(bytes))),
    };
    assert_eq!(
        discovered.files,
        [
            found(&unkept[1], false),
            found(&kept[1], true),
            found(&unkept[0], false),
            found(&kept[0], true),
        ],
        "sorted by path, the markers left out"
    );
    let template = sources
        .discover(&format!("s3://{BUCKET}/listed/{{path}}"), "j")
        .await
        .unwrap();
    assert_eq!(
        (template.source.as_str(), &template.files),
        (
            format!("s3://{BUCKET}/listed/{{path}}").as_str(),
            &discovered.files
        ),
        "a template lists its prefix alike"
    );

    // What was found is what a deployment fetches and verifies.
    let models = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(models.path().to_path_buf(), Duration::from_secs(120))
        .unwrap()
        .access(moto.good_access());
    let model = TrainedModel::from_files(
        "listed",
        discovered.source,
        discovered
            .files
            .into_iter()
            .map(|f| ModelFile {
                path: f.path,
                size_bytes: f.size_bytes,
                sha256: f.sha256,
                format: None,
            })
            .collect(),
    );
    let dir = fetch(&fetcher, &model).await.unwrap();
    for (path, contents) in kept.iter().chain(&unkept) {
        assert!(
            std::fs::read(dir.join(path)).unwrap() == *contents,
            "{path} holds other bytes than the store's"
        );
    }
}

#[tokio::test]
async fn a_prefix_without_objects_is_refused() {
    let moto = moto();
    put_by_boto3("hollow/", b"", false);
    put_by_boto3("hollow/sub/", b"", false);
    let sources = sources(moto.good_access());
    for prefix in ["nothing-here", "hollow"] {
        let error = sources
            .discover(&format!("s3://{BUCKET}/{prefix}/"), "j")
            .await
            .unwrap_err();
        assert_eq!(
            error,
            format!(
                "the store has no objects under s3://{BUCKET}/{prefix}/: check the prefix, \
                 or give the files in the registration"
            )
        );
    }
}

#[tokio::test]
async fn a_prefix_with_more_objects_than_the_limit_is_refused() {
    let moto = moto();
    let files: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("f{i}.bin"), contents(i, 10)))
        .collect();
    let files: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, c)| (p.as_str(), c.clone())).collect();
    moto.put("crowded", &files).await;
    let sources = sources(moto.good_access());
    let url = url::Url::parse(&format!("s3://{BUCKET}/crowded/")).unwrap();
    let key = Key::from("crowded");
    let bucket = crate::cloud::Bucket::S3(BUCKET.into());
    let list = |limit| {
        sources
            .stores
            .list_at_most(&url, &bucket, &key, sources.access.covering(&url), limit)
    };

    assert_eq!(
        list(2).await.unwrap_err(),
        format!(
            "the store holds more than 2 objects under s3://{BUCKET}/crowded/: berth lists at \
             most 2; register a narrower prefix, or give the files in the registration"
        )
    );
    assert_eq!(list(3).await.unwrap().len(), 3, "as many as the limit");
}

#[tokio::test]
async fn a_listing_that_cannot_be_read_says_why() {
    let moto = moto();
    moto.put("unlisted", &[("a.bin", contents(14, 10))]).await;
    let prefix = format!("s3://{BUCKET}/unlisted/");

    let text = format!(
        "[[source]]\nprefix = \"s3://no-such-bucket/\"\noptions = {{ endpoint = \"{}\", \
         region = \"{}\", access_key_id = \"{}\", secret_access_key = \"{}\" }}",
        moto.endpoint, moto.region, moto.access_key_id, moto.secret_access_key
    );
    let error = sources(Access::parse(&text, |_| None).unwrap())
        .discover("s3://no-such-bucket/unlisted/", "j")
        .await
        .unwrap_err();
    assert_eq!(
        error,
        format!(
            "the store at {} has no bucket no-such-bucket (s3://no-such-bucket/unlisted/)",
            moto.endpoint
        )
    );

    let wrong_secret = moto.access(&moto.endpoint, &moto.access_key_id, "not-the-secret");
    let unknown_key = moto.access(&moto.endpoint, "AKIAUNKNOWNUNKNOWN00", "whatever");
    for (access, code) in [
        (wrong_secret, "SignatureDoesNotMatch"),
        (unknown_key, "InvalidAccessKeyId"),
    ] {
        let error = sources(access).discover(&prefix, "j").await.unwrap_err();
        assert!(
            error.starts_with(&format!(
                "the store refused the credentials for {prefix} ({code}: "
            )),
            "{error}"
        );
        assert!(
            error.ends_with(&format!(
                "); they are the access key of s3://{BUCKET}/ in the sources file"
            )),
            "{error}"
        );
        assert!(!error.contains("not-the-secret"), "{error}");
    }

    let unreachable = moto.access(
        "http://127.0.0.1:9",
        &moto.access_key_id,
        &moto.secret_access_key,
    );
    let error = tokio::time::timeout(
        Duration::from_secs(60),
        sources(unreachable).discover(&prefix, "j"),
    )
    .await
    .expect("the listing gave up in time")
    .unwrap_err();
    assert!(
        error.starts_with(&format!(
            "cannot reach the store at http://127.0.0.1:9 ({prefix}): "
        )),
        "{error}"
    );
}
