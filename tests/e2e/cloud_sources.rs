//! Google Cloud Storage and Azure Blob sources through the real server,
//! against the emulators (`tests/fake-gcs/`, `tests/azurite/`): models
//! registered without files, listed at their prefixes and deployed with
//! the credentials of the server's sources file, which appear in no
//! answer, event or log line; and a bucket no credential covers, refused
//! with a sentence naming where berth looked, never read anonymously.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::azurite::Azurite;
use crate::support::events::ended;
use crate::support::fake_gcs::{FakeGcs, service_account_key};
use crate::support::server::{Backend, Berth};
use crate::support::{bytes, sha256_hex};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_in_gcs_and_azure_are_listed_and_deployed_with_the_servers_credentials() {
    let gcs = FakeGcs::start(&["e2e-gcs"]);
    let azurite = Azurite::start(&["e2e-azure"]);
    let files = [
        ("adapter_model.safetensors", bytes(51, 2 * 1024 * 1024 + 5)),
        ("config/adapter_config.json", bytes(52, 300)),
    ];
    let store = azurite.client("e2e-azure");
    for (path, contents) in &files {
        gcs.put("e2e-gcs", &format!("runs/job-gcs/{path}"), contents.clone())
            .await;
        object_store::ObjectStoreExt::put(
            &store,
            &object_store::path::Path::from(format!("runs/job-az/{path}")),
            contents.clone().into(),
        )
        .await
        .unwrap();
    }
    let temp = tempfile::tempdir().unwrap();
    let key = temp.path().join("service-account.json");
    std::fs::write(&key, service_account_key()).unwrap();
    let sources_file = temp.path().join("sources.toml");
    std::fs::write(
        &sources_file,
        format!(
            "[[source]]\nprefix = \"gs://e2e-gcs/\"\noptions = {{ base_url = \"{}\", \
             service_account = \"{}\" }}\n\n\
             [[source]]\nprefix = \"az://{}/e2e-azure/\"\noptions = {{ endpoint = \"{}\", \
             account_key = \"${{AZURE_KEY}}\" }}\n",
            gcs.endpoint,
            key.display(),
            azurite.account,
            azurite.endpoint,
        ),
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(sources_file.to_str().unwrap())
        .env("AZURE_KEY", &azurite.key)
        .start()
        .await;
    let mut events = berth.events().await;

    let expected = json!([
        { "path": files[0].0, "sha256": null, "size_bytes": files[0].1.len(), "format": null },
        { "path": files[1].0, "sha256": null, "size_bytes": files[1].1.len(), "format": null },
    ]);
    let sources = [
        ("job-gcs", "gs://e2e-gcs/runs/{job_id}/".to_string()),
        (
            "job-az",
            format!(
                "https://{}.blob.core.windows.net/e2e-azure/runs/{{job_id}}/",
                azurite.account
            ),
        ),
    ];
    let mut answers = Vec::new();
    for (job, source) in sources {
        let (status, model) = berth
            .post(
                "/v1/models",
                &json!({ "name": job, "job_id": job, "source": source }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{model}");
        assert_eq!(
            model["files"], expected,
            "{source}: sizes as listed, no sha256: neither store keeps one"
        );
        let (status, body) = berth
            .deploy(model["id"].as_i64().unwrap(), "archive", json!({}))
            .await;
        assert_eq!(status, StatusCode::OK, "{source}: {body}");
        for (path, contents) in &files {
            assert_eq!(
                sha256_hex(&std::fs::read(berth.model_dir(job).join(path)).unwrap()),
                sha256_hex(contents),
                "{job}: {path} is the store's"
            );
        }
        let done = body["id"].clone();
        events.until(|seen| ended(seen, &done)).await;
        answers.push(model.to_string());
        answers.push(body.to_string());
    }
    let (_, listed) = berth.get("/v1/models").await;
    answers.push(listed.to_string());
    answers.push(format!("{:?}", events.until(|_| true).await));
    answers.push(berth.log());
    let private_key = key_line(&std::fs::read_to_string(&key).unwrap());
    for text in answers {
        assert!(
            !text.contains(&azurite.key),
            "the account key shown: {text}"
        );
        assert!(
            !text.contains(&private_key),
            "the service account's key shown"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_no_credential_covers_is_refused_naming_where_berth_looked() {
    let gcs = FakeGcs::start(&["e2e-nokey"]);
    gcs.put("e2e-nokey", "job-nokey/a.bin", bytes(53, 100))
        .await;
    let temp = tempfile::tempdir().unwrap();
    // An entry for the bucket's endpoint that names no credential and does
    // not say anonymous: the metadata server is asked (here a closed
    // loopback port), as on GKE, and its silence is the refusal.
    let sources_file = temp.path().join("sources.toml");
    std::fs::write(
        &sources_file,
        format!(
            "[[source]]\nprefix = \"gs://e2e-nokey/\"\noptions = {{ base_url = \"{}\" }}\n",
            gcs.endpoint
        ),
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(sources_file.to_str().unwrap())
        .env("GCE_METADATA_HOST", "127.0.0.1:1")
        .env("GCE_METADATA_IP", "127.0.0.1:1")
        // No application default credentials file of gcloud's either.
        .env("HOME", temp.path().to_str().unwrap())
        .start()
        .await;
    let contents = bytes(53, 100);
    // The registration asks the source whether it holds the files: the
    // refusal comes there, before anything is recorded.
    let (status, body) = berth
        .post(
            "/v1/models",
            &json!({
                "name": "nokey", "job_id": "job-nokey",
                "source": "gs://e2e-nokey/{job_id}/{path}",
                "files": [{ "path": "a.bin", "size_bytes": 100, "sha256": sha256_hex(&contents) }],
            }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("no credential for gs://e2e-nokey/job-nokey/a.bin")
            && error.contains("the sources file's entry gs://e2e-nokey/ names none")
            && error.contains("metadata server")
            && error.contains("anonymous = true"),
        "{error}"
    );
    let (_, models) = berth.get("/v1/models").await;
    assert_eq!(models["models"], json!([]), "nothing recorded");
}

/// A line of the key's body, which no answer may hold.
fn key_line(file: &str) -> String {
    let key: serde_json::Value = serde_json::from_str(file).unwrap();
    key["private_key"]
        .as_str()
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .to_string()
}
