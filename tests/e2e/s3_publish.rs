//! `s3-publish` through the real server when the bucket refuses the
//! target's credentials (moto checks them: `tests/moto/serve.py`): an
//! unknown access key and a known key with the wrong secret each fail the
//! deployment with a sentence that names the target, what the store said
//! and where the credentials came from, and the secret is in no answer,
//! record or log line; nothing lands in the bucket. (The happy path, the receipts and re-runs are in
//! `publish_examples.rs`.)

use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::files::FileServer;
use crate::support::moto;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model, plugins};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_fail_the_deployment_naming_the_target_and_not_the_secret() {
    let moto = moto::Moto::start(&["releases"]);
    let unknown_secret = "wR0ng/s3cret+unknown-key-7d1c";
    let wrong_secret = "wR0ng/s3cret+known-key-93ab";
    let temp = tempfile::tempdir().unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"unknown-key\"\nurl = \"s3://releases/a/\"\n\
             options = {{ endpoint = \"{endpoint}\", region = \"{region}\", \
             access_key_id = \"AKIANOBODYHASTHIS00\", secret_access_key = \"${{UNKNOWN_SECRET}}\" }}\n\n\
             [[target]]\nname = \"wrong-secret\"\nurl = \"s3://releases/b/\"\n\
             options = {{ endpoint = \"{endpoint}\", region = \"{region}\", \
             access_key_id = \"{key}\", secret_access_key = \"${{WRONG_SECRET}}\" }}\n",
            endpoint = moto.endpoint,
            region = moto.region,
            key = moto.access_key_id,
        ),
    )
    .unwrap();
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .plugin("s3-publish", plugins::example("s3-publish"))
        .plugins_file(
            "s3-publish.toml",
            "targets = [\"unknown-key\", \"wrong-secret\"]\n",
        )
        .arg("--sources-file")
        .arg(sources.to_str().unwrap())
        .env("UNKNOWN_SECRET", unknown_secret)
        .env("WRONG_SECRET", wrong_secret)
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-denied", &adapter_files()))
        .await;

    for (target, url) in [
        ("unknown-key", "s3://releases/a/"),
        ("wrong-secret", "s3://releases/b/"),
    ] {
        let (status, failed) = berth
            .deploy(id, "s3-publish", json!({ "target": target }))
            .await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
        assert_eq!(failed["status"], "failed", "{failed}");
        let error = failed["error"].as_str().unwrap_or_default();
        // s3-publish looks before it puts: the look-up is what is refused.
        // A HEAD's refusal has no body, so the store's code is not known;
        // the sentence points at the credentials instead.
        assert!(
            error.starts_with(&format!(
                "deployer s3-publish: target \"{target}\" ({url}) refused the look-up of \
                 job-denied/deploy-"
            )) && error.contains("403 Forbidden")
                && error.ends_with("(the credentials are the access key in the target's options)"),
            "{target}: {error}"
        );
        assert_eq!(failed["published"], json!([]), "{failed}");
    }

    // Nothing landed (the files are small: no multipart upload was begun).
    let store = AmazonS3Builder::new()
        .with_endpoint(&moto.endpoint)
        .with_allow_http(true)
        .with_region(&moto.region)
        .with_access_key_id(&moto.access_key_id)
        .with_secret_access_key(&moto.secret_access_key)
        .with_bucket_name("releases")
        .build()
        .unwrap();
    let objects: Vec<_> = store.list(None).try_collect().await.unwrap();
    assert!(objects.is_empty(), "{objects:?}");

    let (_, deployments) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    let (_, deployers) = berth.get("/v1/deployers").await;
    for (what, text) in [
        ("the deployments", deployments.to_string()),
        ("the deployers", deployers.to_string()),
        ("the log", berth.log()),
    ] {
        for secret in [unknown_secret, wrong_secret, &moto.secret_access_key] {
            assert!(!text.contains(secret), "{what} show a secret");
        }
    }
}
