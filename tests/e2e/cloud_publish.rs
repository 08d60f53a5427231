//! Google Cloud Storage and Azure Blob targets through the real server,
//! against the emulators: the `s3-publish` example, unchanged, puts a
//! model and its manifest into a `gs://` and an `az://` target as it does
//! into S3, the objects are the model's bytes, and the credentials of the
//! sources file appear in no answer, event or log line; an Azure key the
//! service refuses fails the deployment with a sentence naming the target.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::azurite::Azurite;
use crate::support::events::ended;
use crate::support::fake_gcs::{FakeGcs, service_account_key};
use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model, plugins};

/// The object `name` of a fake-gcs-server bucket.
async fn gcs_object(gcs: &FakeGcs, bucket: &str, name: &str) -> Vec<u8> {
    let mut url = url::Url::parse(&gcs.endpoint).unwrap();
    url.path_segments_mut()
        .unwrap()
        .pop_if_empty()
        .extend(["storage", "v1", "b", bucket, "o", name]);
    url.query_pairs_mut().append_pair("alt", "media");
    let answer = reqwest::get(url).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK, "{name}");
    answer.bytes().await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_publish_puts_a_model_into_gcs_and_azure_targets_unchanged() {
    let gcs = FakeGcs::start(&["e2e-shelf"]);
    let azurite = Azurite::start(&["e2e-shelf"]);
    let gcs_key = service_account_key();
    let wrong_key = "bm90IHRoZSBhY2NvdW50IGtleSwgbm9ib2R5IGhhcyBpdA==";
    let temp = tempfile::tempdir().unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"gcs\"\nurl = \"gs://e2e-shelf/models/\"\n\
             options = {{ base_url = \"{}\", service_account_key = \"${{GCS_KEY}}\" }}\n\n\
             [[target]]\nname = \"azure\"\n\
             url = \"https://{account}.blob.core.windows.net/e2e-shelf/models/\"\n\
             options = {{ endpoint = \"{endpoint}\", account_key = \"${{AZURE_KEY}}\" }}\n\n\
             [[target]]\nname = \"stranger\"\nurl = \"az://{account}/e2e-shelf/other/\"\n\
             options = {{ endpoint = \"{endpoint}\", account_key = \"${{WRONG_KEY}}\" }}\n",
            gcs.endpoint,
            account = azurite.account,
            endpoint = azurite.endpoint,
        ),
    )
    .unwrap();
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .plugin("s3-publish", plugins::example("s3-publish"))
        .plugins_file(
            "s3-publish.toml",
            "targets = [\"gcs\", \"azure\", \"stranger\"]\n",
        )
        .arg("--sources-file")
        .arg(sources.to_str().unwrap())
        .env("GCS_KEY", &gcs_key)
        .env("AZURE_KEY", &azurite.key)
        .env("WRONG_KEY", wrong_key)
        .start()
        .await;
    let mut events = berth.events().await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-cloud", &contents)).await;
    let azure = azurite.client("e2e-shelf");

    let mut answers = Vec::new();
    for target in ["gcs", "azure"] {
        let (status, done) = berth
            .deploy(id, "s3-publish", json!({ "target": target }))
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        assert_eq!(done["status"], "completed", "{done}");
        let deploy_id = done["id"].as_i64().unwrap();
        let folder = format!("models/job-cloud/deploy-{deploy_id}");
        let manifest = match target {
            "gcs" => format!("gs://e2e-shelf/{folder}/manifest.json"),
            _ => format!("az://{}/e2e-shelf/{folder}/manifest.json", azurite.account),
        };
        assert_eq!(done["ref"], manifest, "{done}");
        for (path, bytes) in &contents {
            let name = format!("{folder}/{path}");
            let stored = match target {
                "gcs" => gcs_object(&gcs, "e2e-shelf", &name).await,
                _ => {
                    let got = object_store::ObjectStoreExt::get(
                        &azure,
                        &object_store::path::Path::from(name.as_str()),
                    )
                    .await
                    .unwrap();
                    got.bytes().await.unwrap().to_vec()
                }
            };
            assert!(stored == *bytes, "{target}: {name} holds other bytes");
        }
        let (status, record) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
        assert_eq!(status, StatusCode::OK, "{record}");
        let published = record["published"].as_array().unwrap();
        assert_eq!(published.len(), contents.len() + 1, "{record}");
        assert!(
            published
                .iter()
                .all(|p| p["target"] == target
                    && p["sha256"].as_str().is_some_and(|s| s.len() == 64)),
            "{record}"
        );
        let done_id = done["id"].clone();
        events.until(|seen| ended(seen, &done_id)).await;
        answers.push(done.to_string());
        answers.push(record.to_string());
    }

    let (status, refused) = berth
        .deploy(id, "s3-publish", json!({ "target": "stranger" }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{refused}");
    assert_eq!(refused["status"], "failed", "{refused}");
    let error = refused["error"].as_str().unwrap_or_default().to_string();
    assert!(
        error.contains(&format!(
            "target \"stranger\" (az://{}/e2e-shelf/other/) refused the look-up of",
            azurite.account
        )) && error.contains("403")
            && error.contains(
                "(the credentials are the account key of target \"stranger\" in the sources file)"
            ),
        "{error}"
    );
    answers.push(refused.to_string());
    answers.push(format!("{:?}", events.until(|_| true).await));
    answers.push(berth.log());
    let private_key: Value = serde_json::from_str(&gcs_key).unwrap();
    let key_line = private_key["private_key"]
        .as_str()
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    for text in answers {
        for secret in [azurite.key.as_str(), wrong_key, key_line.as_str()] {
            assert!(!text.contains(secret), "a credential shown: {text}");
        }
    }
}
