//! The blob store: files shared by models are downloaded and stored once,
//! linked into each model; the verification record stays O(1) on links; a
//! damaged blob is removed everywhere; a models dir that cannot hard-link
//! keeps a copy per model.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::*;
use crate::fetch::Adopted;

impl Setup {
    /// Another model in the same models dir, its files served by the same
    /// source under `job_id/`.
    fn another(&self, job_id: &str, files: &[(&str, &[u8])]) -> TrainedModel {
        let mut model_files = Vec::new();
        for (path, contents) in files {
            let key = format!("{job_id}/{path}");
            self.source.with(|s| s.files.insert(key, contents.to_vec()));
            model_files.push(ModelFile {
                path: path.to_string(),
                size_bytes: contents.len() as u64,
                sha256: Some(sha(contents)),
                format: None,
            });
        }
        TrainedModel::from_files(
            job_id,
            format!("{}/{{job_id}}/{{path}}", self.source.base),
            model_files,
        )
    }

    async fn fetch_model(&self, model: &TrainedModel) -> Result<PathBuf, Error> {
        self.fetcher
            .fetch(model, Arc::new(Quiet), &CancellationToken::new())
            .await
    }

    /// Requests so far for any file of `job_id`.
    fn requests_of(&self, job_id: &str) -> Vec<String> {
        let prefix = format!("{job_id}/");
        self.source.with(|s| {
            s.requests
                .iter()
                .filter(|(p, _)| p.starts_with(&prefix))
                .map(|(p, _)| p.clone())
                .collect()
        })
    }

    fn blob(&self, contents: &[u8]) -> PathBuf {
        self.fetcher.blobs.path(&sha(contents))
    }
}

fn inode(path: &Path) -> (u64, u64) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.dev(), meta.ino())
}

#[tokio::test]
async fn a_second_model_downloads_only_the_file_no_model_holds_and_links_the_others() {
    let (weights, tokenizer, adapter) = (bytes(1, BIG), bytes(2, 5000), bytes(3, 7000));
    let setup = Setup::new(&[
        ("weights.bin", weights.clone()),
        ("tokenizer.json", tokenizer.clone()),
    ])
    .await;
    setup.fetch().await.unwrap();
    // Other paths, same bytes, plus one file of its own.
    let second = setup.another(
        "second",
        &[
            ("model/w.bin", &weights),
            ("tok.json", &tokenizer),
            ("adapter.bin", &adapter),
        ],
    );

    let dir = setup.fetch_model(&second).await.unwrap();

    assert_eq!(setup.requests_of("second"), ["second/adapter.bin"]);
    for (path, contents) in [
        ("model/w.bin", &weights),
        ("tok.json", &tokenizer),
        ("adapter.bin", &adapter),
    ] {
        assert_eq!(std::fs::read(dir.join(path)).unwrap(), *contents, "{path}");
    }
    let shared = inode(&setup.path("weights.bin"));
    assert_eq!(inode(&dir.join("model/w.bin")), shared);
    assert_eq!(inode(&setup.blob(&weights)), shared);
    assert_eq!(std::fs::metadata(setup.blob(&weights)).unwrap().nlink(), 3);
    // Read-only, every name of it: one model's file edited in place would
    // be every model's.
    for file in [dir.join("adapter.bin"), dir.join("model/w.bin")] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o444, "{}", file.display());
    }
    // The first model's record still vouches for its files although the
    // second link changed their ctime: no byte is read to deploy it again.
    assert!(setup.fetcher.verified(&setup.model).is_some());
    assert!(setup.fetcher.verified(&second).is_some());
}

#[tokio::test]
async fn the_same_weights_under_a_new_job_id_are_linked_with_no_download() {
    let weights = bytes(4, BIG);
    let setup = Setup::new(&[("weights.bin", weights.clone())]).await;
    setup.fetch().await.unwrap();
    let again = setup.another("retry", &[("weights.bin", &weights)]);

    let dir = setup.fetch_model(&again).await.unwrap();

    assert!(setup.requests_of("retry").is_empty());
    assert_eq!(std::fs::read(dir.join("weights.bin")).unwrap(), weights);
    assert!(setup.fetcher.verified(&again).is_some());
}

#[tokio::test]
async fn a_damaged_blob_is_removed_from_every_model_and_fetched_again() {
    let (weights, own) = (bytes(5, BIG), bytes(6, 3000));
    let setup = Setup::new(&[("weights.bin", weights.clone())]).await;
    setup.fetch().await.unwrap();
    let second = setup.another("second", &[("w.bin", &weights), ("own.bin", &own)]);
    let dir = setup.fetch_model(&second).await.unwrap();
    // Flipped on disk through the second model's link: the first model's
    // name and the blob's are the same inode.
    let mut damaged = weights.clone();
    damaged[1000] ^= 0xff;
    std::fs::write(dir.join("w.bin"), &damaged).unwrap();

    assert!(setup.fetcher.verified(&second).is_none());
    assert!(setup.fetcher.verified(&setup.model).is_none());
    setup.fetch_model(&second).await.unwrap();

    assert_eq!(
        setup.requests_of("second"),
        ["second/own.bin", "second/w.bin"],
        "the damaged file is fetched again"
    );
    assert_eq!(std::fs::read(dir.join("w.bin")).unwrap(), weights);
    assert!(
        !setup.path("weights.bin").exists(),
        "the first model's link of the damaged inode is removed too"
    );
    assert_eq!(std::fs::read(setup.blob(&weights)).unwrap(), weights);
    // The first model's next fetch links the fresh blob.
    let before = setup.requests_of("job").len();
    setup.fetch().await.unwrap();
    assert_eq!(setup.requests_of("job").len(), before);
    assert_file(&setup, "weights.bin", &weights);
}

#[tokio::test]
async fn a_models_dir_that_cannot_hard_link_keeps_a_copy_per_model() {
    let weights = bytes(7, 20_000);
    let setup = Setup::new(&[("weights.bin", weights.clone())]).await;
    // The store on another filesystem (tmpfs): every link is refused with
    // EXDEV, as on a filesystem without hard links.
    let elsewhere = tempfile::tempdir_in("/dev/shm").unwrap();
    let models = setup.fetcher.dir_of("x");
    std::os::unix::fs::symlink(elsewhere.path(), models.with_file_name(".blobs")).unwrap();

    setup.fetch().await.unwrap();
    let second = setup.another("second", &[("weights.bin", &weights)]);
    let dir = setup.fetch_model(&second).await.unwrap();

    assert_eq!(setup.requests_of("second"), ["second/weights.bin"]);
    assert_eq!(std::fs::read(dir.join("weights.bin")).unwrap(), weights);
    assert_ne!(
        inode(&dir.join("weights.bin")),
        inode(&setup.path("weights.bin"))
    );
    assert!(!setup.blob(&weights).exists());
    assert!(setup.fetcher.verified(&setup.model).is_some());
    assert!(setup.fetcher.verified(&second).is_some());
}

#[tokio::test]
async fn dropping_a_copy_keeps_the_blobs_other_models_link_and_removes_the_rest() {
    let (shared, own) = (bytes(8, 9000), bytes(9, 4000));
    let setup = Setup::new(&[("shared.bin", shared.clone()), ("own.bin", own.clone())]).await;
    setup.fetch().await.unwrap();
    let second = setup.another("second", &[("shared.bin", &shared)]);
    setup.fetch_model(&second).await.unwrap();

    let held = setup.fetcher.hold_copy("job").await.unwrap();
    held.forget().await.unwrap();
    let freed = held.remove().await.unwrap();

    assert_eq!(
        freed,
        own.len() as u64,
        "only the bytes no other model links"
    );
    assert!(!setup.blob(&own).exists());
    assert!(setup.blob(&shared).exists());
    assert!(
        setup.fetcher.verified(&second).is_some(),
        "the unlink kept the blob's stamp true"
    );

    let held = setup.fetcher.hold_copy("second").await.unwrap();
    held.forget().await.unwrap();
    assert_eq!(held.remove().await.unwrap(), shared.len() as u64);
    assert!(!setup.blob(&shared).exists());
}

#[tokio::test]
async fn adoption_links_the_verified_copies_of_a_models_dir_filled_without_the_store() {
    let (shared, own) = (bytes(10, 50_000), bytes(11, 3000));
    let setup = Setup::new(&[("shared.bin", shared.clone()), ("own.bin", own.clone())]).await;
    // Filled while the store could not link: a copy per model.
    let elsewhere = tempfile::tempdir_in("/dev/shm").unwrap();
    let store = setup.fetcher.dir_of(".blobs");
    std::os::unix::fs::symlink(elsewhere.path(), &store).unwrap();
    setup.fetch().await.unwrap();
    let second = setup.another("second", &[("copy.bin", &shared)]);
    let dir = setup.fetch_model(&second).await.unwrap();
    std::fs::remove_file(&store).unwrap();
    let requests = setup.source.with(|s| s.requests.len());

    let adopted = setup.fetcher.adopt().await;

    assert_eq!(
        adopted,
        Adopted {
            models: 2,
            files: 3,
            newly: 3,
            freed_bytes: shared.len() as u64,
            busy: 0
        }
    );
    assert_eq!(
        inode(&dir.join("copy.bin")),
        inode(&setup.path("shared.bin"))
    );
    assert_eq!(
        inode(&setup.blob(&shared)),
        inode(&setup.path("shared.bin"))
    );
    assert_eq!(inode(&setup.blob(&own)), inode(&setup.path("own.bin")));
    assert!(setup.fetcher.verified(&setup.model).is_some());
    assert!(setup.fetcher.verified(&second).is_some());
    assert_eq!(setup.source.with(|s| s.requests.len()), requests);
    // Done once: a second adoption finds everything in place.
    let again = setup.fetcher.adopt().await;
    assert_eq!((again.files, again.newly, again.freed_bytes), (3, 0, 0));
}
