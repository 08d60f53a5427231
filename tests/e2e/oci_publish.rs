//! The `oci-publish` example through the real server, into the CNCF
//! registry behind a login, through an `oci://` target its manifest
//! grants: the deployment's `ref` is the manifest by digest, whose layers
//! are the model's files (titles, sizes, sha256, in order) and readable
//! as a model's files by berth's registry client; every put and the
//! manifest are recorded; registered from the pushed reference, the model
//! deploys with the bytes pushed; the same model pushed again uploads no blob; the
//! login appears in no answer and no log line.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::files::FileServer;
use crate::support::registry;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, model, plugins, sha256_hex};

/// berth's own registry client, logged in.
fn reader(registry: &registry::Registry) -> berth::oci::Registry {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = berth::oci::Login {
        username: registry::USER.into(),
        password: registry::PASSWORD.into(),
    };
    berth::oci::Registry::new(http, &registry.host, Some(login), None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_publish_pushes_a_model_as_one_artifact_and_no_blob_twice() {
    let registry = registry::Registry::with_login();
    let temp = tempfile::tempdir().unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"registry\"\nurl = \"oci://{0}/models/\"\n\
             options = {{ username = \"{1}\", password = \"${{REGISTRY_PASSWORD}}\" }}\n\
             [[source]]\nprefix = \"oci://{0}/models/\"\n\
             options = {{ username = \"{1}\", password = \"${{REGISTRY_PASSWORD}}\" }}\n",
            registry.host,
            registry::USER
        ),
    )
    .unwrap();
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .plugin("oci-publish", plugins::example("oci-publish"))
        .plugins_file("oci-publish.toml", "targets = [\"registry\"]\n")
        .arg("--sources-file")
        .arg(sources.to_str().unwrap())
        .env("REGISTRY_PASSWORD", registry::PASSWORD)
        .start()
        .await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-oci", &contents)).await;

    // The one granted target is filled in; repo and tag from the model.
    let (status, first) = berth.deploy(id, "oci-publish", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "completed", "{first}");
    let reference = first["ref"].as_str().unwrap().to_string();
    let artifact = format!(
        "oci://{}/models/job-oci-adapter:job-oci@sha256:",
        registry.host
    );
    assert!(reference.starts_with(&artifact), "{reference}");
    let digest = reference[artifact.len()..].to_string();
    let details = &first["details"];
    assert_eq!(details["reference"], reference);
    assert_eq!(
        (
            &details["repo"],
            &details["tag"],
            &details["manifest_sha256"]
        ),
        (&json!("job-oci-adapter"), &json!("job-oci"), &json!(digest))
    );

    // The manifest, by the digest the deployment answered: a layer per
    // file, in the model's order, read back as its files.
    let client = reader(&registry);
    let (read, manifest, _) = client
        .manifest("models/job-oci-adapter", &format!("sha256:{digest}"))
        .await
        .unwrap();
    assert_eq!(read, digest);
    assert_eq!(
        manifest.artifact_type.as_deref(),
        Some(berth::publish::ARTIFACT_TYPE)
    );
    let layers: Vec<(String, u64, String)> = manifest
        .files()
        .unwrap()
        .into_iter()
        .map(|f| (f.path, f.size, f.sha256))
        .collect();
    let expected: Vec<(String, u64, String)> = contents
        .iter()
        .map(|(path, bytes)| (path.to_string(), bytes.len() as u64, sha256_hex(bytes)))
        .collect();
    assert_eq!(layers, expected);
    let (by_tag, _, _) = client
        .manifest("models/job-oci-adapter", "job-oci")
        .await
        .unwrap();
    assert_eq!(by_tag, digest);
    for (path, bytes) in &contents {
        let blob = client
            .blob("models/job-oci-adapter", &sha256_hex(bytes), None)
            .await
            .unwrap();
        assert!(blob.bytes().await.unwrap() == *bytes, "{path}: other bytes");
    }

    // The record: a put per file (url oci://…:TAG#PATH), then the manifest.
    let (_, deployment) = berth.get(&format!("/v1/deployments/{}", first["id"])).await;
    let puts = deployment["published"].as_array().unwrap();
    assert_eq!(puts.len(), contents.len() + 1, "{deployment}");
    let mut keys: Vec<&str> = puts[..contents.len()]
        .iter()
        .map(|p| p["key"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "job-oci-adapter:job-oci/adapter_config.json",
            "job-oci-adapter:job-oci/adapter_model.safetensors",
            "job-oci-adapter:job-oci/tokenizer/tokenizer.json"
        ]
    );
    for put in &puts[..contents.len()] {
        let key = put["key"].as_str().unwrap();
        let path = key.split_once('/').unwrap().1;
        assert_eq!(
            put["url"],
            format!(
                "oci://{}/models/job-oci-adapter:job-oci#{path}",
                registry.host
            )
        );
        assert_eq!(
            put["etag"],
            format!("sha256:{}", put["sha256"].as_str().unwrap())
        );
    }
    let manifest_put = &puts[contents.len()];
    assert_eq!(
        (
            &manifest_put["key"],
            &manifest_put["url"],
            &manifest_put["sha256"]
        ),
        (
            &json!("job-oci-adapter:job-oci"),
            &json!(reference),
            &json!(digest)
        )
    );

    // The round trip: the pushed reference registered by tag, its files
    // read from the manifest, deployed with the very bytes pushed.
    let pulled = berth
        .register(&json!({
            "name": "pulled", "job_id": "job-oci-pulled", "base_model": "b",
            "source": format!("oci://{}/models/job-oci-adapter:job-oci", registry.host),
        }))
        .await;
    let (_, registered) = berth.get(&format!("/v1/models/{pulled}")).await;
    assert_eq!(
        registered["source"],
        format!(
            "oci://{}/models/job-oci-adapter@sha256:{digest}",
            registry.host
        )
    );
    let listed: Vec<(String, u64, String)> = registered["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["size_bytes"].as_u64().unwrap(),
                f["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(listed, expected);
    let (status, body) = berth.deploy(pulled, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (path, bytes) in &contents {
        assert!(
            std::fs::read(berth.model_dir("job-oci-pulled").join(path)).unwrap() == *bytes,
            "{path} came back with other bytes"
        );
    }

    // Again, under another tag and repository path: the blobs are there,
    // so none is uploaded; only the manifest is written. Into another
    // repository, each blob goes up once.
    let before = registry.requests().await.len();
    let (status, again) = berth
        .deploy(
            id,
            "oci-publish",
            json!({ "target": "registry", "tag": "again" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    let requests = registry.requests().await.split_off(before);
    let uploads = |requests: &[String]| {
        requests
            .iter()
            .filter(|r| r.starts_with("POST ") || r.starts_with("PATCH "))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(uploads(&requests), Vec::<String>::new(), "{requests:#?}");
    let written: Vec<&String> = requests
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.ends_with(" 201"))
        .collect();
    assert_eq!(
        written,
        ["PUT /v2/models/job-oci-adapter/manifests/again 201"],
        "{requests:#?}"
    );
    let before = registry.requests().await.len();
    let (status, elsewhere) = berth
        .deploy(id, "oci-publish", json!({ "repo": "team/copy" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{elsewhere}");
    let requests = registry.requests().await.split_off(before);
    // Three files and the config `{}`: one upload session each.
    let started: Vec<&String> = requests
        .iter()
        .filter(|r| {
            r.starts_with("POST /v2/models/team/copy/blobs/uploads/") && r.ends_with(" 202")
        })
        .collect();
    assert_eq!(started.len(), contents.len() + 1, "{requests:#?}");

    // A bad option is refused before anything is fetched or pushed.
    let before = registry.requests().await.len();
    let refused = berth
        .deploy(id, "oci-publish", json!({ "repo": "Team/X" }))
        .await;
    assert_error(
        &refused,
        StatusCode::BAD_REQUEST,
        "option \"repo\" \"Team/X\" is not a repository name",
    );
    assert_eq!(registry.requests().await.len(), before);

    let (_, deployments) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    for (what, text) in [
        ("the deployments", deployments.to_string()),
        ("the log", berth.log()),
    ] {
        assert!(
            !text.contains(registry::PASSWORD),
            "{what} show the password"
        );
    }
}
