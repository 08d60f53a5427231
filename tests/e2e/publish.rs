//! Publishing through the host (`berth:deployer@0.2.0`), in-process: the
//! `publish-probe` test plugin opens targets and puts model files, out
//! files and bytes, and tries what a hostile deployer would; each outcome
//! comes back in its details. A `file://` target is a real folder, so what
//! landed is read back byte for byte. 0.1.0 plugins run beside it.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};

use berth::targets::Targets;

use crate::support::catalog::{push_in_process, served};
use crate::support::files::FileServer;
use crate::support::plugins::{example, test_plugin};
use crate::support::router::App;
use crate::support::server::Backend;
use crate::support::{adapter_files, model, sha256_hex};

const SECRET: &str = "mirror-secret-61c0";

/// A folder target `shelf`, a mirror `mirror` whose header is a secret, and
/// the app serving `publish-probe` granted `grants` (with `archive`).
async fn app_with_probe(shelf: &Path, grants: &str) -> App {
    let sources = format!(
        r#"
[[target]]
name = "shelf"
url = "file://{}/"

[[target]]
name = "mirror"
url = "http://127.0.0.1:9/base/"
headers = {{ Authorization = "Bearer ${{TEST_MIRROR_SECRET}}" }}
"#,
        shelf.display()
    );
    let targets = Targets::parse(&sources, "sources.toml", |var| {
        (var == "TEST_MIRROR_SECRET").then(|| SECRET.to_string())
    })
    .unwrap();
    let app = App::start_with_targets(Backend::Sqlite, targets).await;
    let probe = std::fs::read(test_plugin("publish-probe")).unwrap();
    let manifest = format!("targets = {grants}\n");
    let (status, pushed) = push_in_process(
        &app,
        "probe",
        &[("wasm", &probe), ("manifest", manifest.as_bytes())],
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    assert_eq!(pushed["wit_version"], "0.2.0", "{pushed}");
    app
}

/// Deploys `probe` with `options`; the answer.
async fn probe(app: &App, model_id: i64, options: Value) -> (StatusCode, Value) {
    app.post(
        &format!("/v1/models/{model_id}/deployments"),
        &json!({ "deployer": "probe", "options": options }),
    )
    .await
}

/// The outcome of each step of a completed probe deployment.
#[track_caller]
fn steps(deployment: &Value) -> Vec<Value> {
    assert_eq!(deployment["status"], "completed", "{deployment}");
    deployment["details"]["steps"].as_array().unwrap().clone()
}

#[track_caller]
fn refused(step: &Value, words: &str) {
    let error = step["err"]
        .as_str()
        .unwrap_or_else(|| panic!("not refused: {step}"));
    assert!(error.contains(words), "{words:?} not in {error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployer_puts_model_files_out_files_and_bytes_and_each_put_is_recorded() {
    let files = FileServer::start().await;
    let shelf = tempfile::tempdir().unwrap();
    let app = app_with_probe(shelf.path(), r#"["shelf"]"#).await;
    let contents = adapter_files();
    let id = app.register(&model(&files, "job-pub", &contents)).await;

    let mut steps_asked: Vec<Value> = contents
        .iter()
        .map(|(path, _)| json!({ "put_model_file": path, "key": format!("job-pub/{path}") }))
        .collect();
    steps_asked.extend([
        json!({ "put_out_file": "card.md", "write": "# card\n", "key": "job-pub/card.md" }),
        json!({ "put_bytes": "job-pub/manifest.json", "text": "{\"files\":3}", "content_type": "application/json" }),
        json!({ "stat": "job-pub/card.md" }),
        json!({ "stat": "job-pub/missing" }),
        json!({ "url": "job-pub/card.md" }),
    ]);
    // One target granted: the `target` option may be left out.
    let (status, deployment) = probe(&app, id, json!({ "steps": steps_asked })).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["options"]["target"], "shelf", "{deployment}");
    let outcomes = steps(&deployment);

    for (i, (path, bytes)) in contents.iter().enumerate() {
        let landed = std::fs::read(shelf.path().join("job-pub").join(path)).unwrap();
        assert!(landed == *bytes, "{path} differs at the target");
        let receipt = &outcomes[i]["ok"];
        assert_eq!(receipt["sha256"], sha256_hex(bytes), "{receipt}");
        assert_eq!(receipt["bytes"], bytes.len(), "{receipt}");
    }
    assert_eq!(
        std::fs::read_to_string(shelf.path().join("job-pub/card.md")).unwrap(),
        "# card\n"
    );
    assert_eq!(
        std::fs::read_to_string(shelf.path().join("job-pub/manifest.json")).unwrap(),
        "{\"files\":3}"
    );
    assert_eq!(outcomes[5]["ok"]["bytes"], 7, "{}", outcomes[5]);
    assert_eq!(outcomes[6]["ok"], Value::Null, "{}", outcomes[6]);
    let url = outcomes[7]["ok"].as_str().unwrap();
    assert_eq!(
        url,
        format!("file://{}/job-pub/card.md", shelf.path().display())
    );

    // Recorded on the deployment, in the order of the puts.
    let (_, stored) = app
        .get(&format!("/v1/deployments/{}", deployment["id"]))
        .await;
    let published = stored["published"].as_array().unwrap();
    let keys: Vec<&str> = published
        .iter()
        .map(|p| p["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "job-pub/adapter_config.json",
            "job-pub/adapter_model.safetensors",
            "job-pub/tokenizer/tokenizer.json",
            "job-pub/card.md",
            "job-pub/manifest.json"
        ]
    );
    assert!(published.iter().all(|p| p["target"] == "shelf"), "{stored}");
    let total: u64 = published.iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
    assert_eq!(stored["progress"]["published"]["bytes"], total, "{stored}");
    assert_eq!(stored["progress"]["published"]["files"], 5, "{stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_model_files_puts_every_pair_it_can_and_answers_each_in_order() {
    let files = FileServer::start().await;
    let shelf = tempfile::tempdir().unwrap();
    let app = app_with_probe(shelf.path(), r#"["shelf"]"#).await;
    let contents = adapter_files();
    let id = app.register(&model(&files, "job-batch", &contents)).await;
    let (status, deployment) = probe(
        &app,
        id,
        json!({ "steps": [{ "put_model_files": [
            ["adapter_config.json", "b/config.json"],
            ["missing.bin", "b/missing.bin"],
            ["tokenizer/tokenizer.json", "b/config.json"],
            ["adapter_model.safetensors", "b/weights"],
            ["tokenizer/tokenizer.json", "../b"],
            ["tokenizer/tokenizer.json", "b/tok.json"],
        ]}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let outcomes = steps(&deployment);
    let answers = outcomes[0]["ok"].as_array().unwrap();
    assert_eq!(answers.len(), 6, "{deployment}");
    refused(&answers[1], "the model has no file recorded at that path");
    refused(&answers[2], "the key \"b/config.json\" is given twice");
    refused(&answers[4], "key");
    for (answer, (path, key)) in [
        (&answers[0], ("adapter_config.json", "b/config.json")),
        (&answers[3], ("adapter_model.safetensors", "b/weights")),
        (&answers[5], ("tokenizer/tokenizer.json", "b/tok.json")),
    ] {
        let bytes = &contents.iter().find(|(p, _)| *p == path).unwrap().1;
        assert_eq!(answer["ok"]["sha256"], sha256_hex(bytes), "{answer}");
        let landed = std::fs::read(shelf.path().join(key)).unwrap();
        assert!(landed == *bytes, "{path} differs at {key}");
    }
    // The first key's file is the first pair's, not the refused one's.
    assert_eq!(
        std::fs::read(shelf.path().join("b/config.json")).unwrap(),
        contents[0].1
    );

    let (_, stored) = app
        .get(&format!("/v1/deployments/{}", deployment["id"]))
        .await;
    let mut keys: Vec<&str> = stored["published"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["key"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["b/config.json", "b/tok.json", "b/weights"],
        "{stored}"
    );
    let total: usize = [0, 1, 2].iter().map(|&i| contents[i].1.len()).sum();
    assert_eq!(stored["progress"]["published"]["bytes"], total, "{stored}");
    assert_eq!(stored["progress"]["published"]["files"], 3, "{stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_deployment_still_lists_what_it_put() {
    let files = FileServer::start().await;
    let shelf = tempfile::tempdir().unwrap();
    let app = app_with_probe(shelf.path(), r#"["shelf"]"#).await;
    let id = app
        .register(&model(&files, "job-half", &adapter_files()))
        .await;
    let (status, answer) = probe(
        &app,
        id,
        json!({ "target": "shelf", "fail": true, "steps": [
            { "put_model_file": "adapter_config.json", "key": "half/adapter_config.json" },
        ]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    assert_eq!(answer["status"], "failed", "{answer}");
    assert_eq!(
        answer["published"][0]["key"], "half/adapter_config.json",
        "{answer}"
    );
    assert!(shelf.path().join("half/adapter_config.json").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_deployer_is_refused_with_sentences_and_reaches_nothing() {
    let files = FileServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let shelf = root.path().join("shelf");
    std::fs::create_dir_all(&shelf).unwrap();
    let app = app_with_probe(&shelf, r#"["shelf", "mirror", "elsewhere"]"#).await;
    let id = app
        .register(&model(&files, "job-evil", &adapter_files()))
        .await;
    let long_key = "k".repeat(2048);
    let (status, deployment) = probe(
        &app,
        id,
        json!({ "target": "shelf", "steps": [
            { "open": "nope" },
            { "open": "elsewhere" },
            { "put_bytes": "../escape", "text": "x" },
            { "put_bytes": "/abs", "text": "x" },
            { "put_bytes": "a//b", "text": "x" },
            { "put_bytes": "a/./b", "text": "x" },
            { "put_bytes": long_key, "text": "x" },
            { "put_model_file": "../../../etc/passwd", "key": "p" },
            { "put_model_file": "adapter_config.json", "key": "" },
            { "put_out_file": "/etc/passwd", "key": "p" },
            { "put_out_file": "../../outside", "key": "p" },
            { "put_bytes": "big", "size": 9 * 1024 * 1024 },
            { "env": "*" },
            { "env": "TEST_MIRROR_SECRET" },
            { "read": "/proc/self/environ" },
            { "open": "mirror" },
            { "url": "k" },
        ]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let outcomes = steps(&deployment);
    refused(&outcomes[0], "target \"nope\" is not granted to it");
    refused(
        &outcomes[1],
        "target \"elsewhere\" is granted but this server does not configure it",
    );
    for step in &outcomes[2..7] {
        refused(step, "key");
    }
    refused(&outcomes[7], "the model has no file recorded at that path");
    refused(&outcomes[8], "key");
    refused(&outcomes[9], "no other absolute path");
    refused(&outcomes[10], "no ..");
    refused(&outcomes[11], "more than put-bytes takes");
    assert_eq!(outcomes[12]["ok"], json!({}), "the environment is empty");
    assert!(outcomes[13]["err"].is_string(), "{}", outcomes[13]);
    assert!(outcomes[14]["err"].is_string(), "{}", outcomes[14]);
    assert_eq!(outcomes[15]["ok"], "mirror");
    assert_eq!(outcomes[16]["ok"], "http://127.0.0.1:9/base/k");

    // Nothing landed anywhere: the shelf is empty, nothing beside it.
    let listed = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(listed(&shelf), Vec::<String>::new());
    assert_eq!(listed(root.path()), ["shelf"]);
    let (_, stored) = app
        .get(&format!("/v1/deployments/{}", deployment["id"]))
        .await;
    assert_eq!(stored["published"], json!([]), "{stored}");
    let (_, logs) = app
        .get(&format!("/v1/deployments/{}/logs", deployment["id"]))
        .await;
    for text in [stored.to_string(), logs.to_string()] {
        assert!(!text.contains(SECRET), "the secret leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_bytes_the_guest_cannot_hold_fails_the_deployment_on_memory() {
    let files = FileServer::start().await;
    let shelf = tempfile::tempdir().unwrap();
    let app = app_with_probe(shelf.path(), r#"["shelf"]"#).await;
    let id = app
        .register(&model(&files, "job-huge", &adapter_files()))
        .await;
    let (status, answer) = probe(
        &app,
        id,
        json!({ "steps": [{ "put_bytes": "huge", "size": 1536u64 << 20 }] }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    assert_eq!(answer["status"], "failed", "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("memory"), "{error}");
    assert!(!shelf.path().join("huge").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_of_both_contract_versions_load_and_deploy_side_by_side() {
    let files = FileServer::start().await;
    let shelf = tempfile::tempdir().unwrap();
    let served_plugins = [
        ("archive", example("archive")),
        ("model-card", example("model-card")),
        ("safetensors-check", example("safetensors-check")),
        ("http-publish-0-1", test_plugin("http-publish-0-1")),
        ("probe", test_plugin("publish-probe")),
    ];
    let targets = Targets::parse(
        &format!(
            "[[target]]\nname = \"shelf\"\nurl = \"file://{}/\"\n",
            shelf.path().display()
        ),
        "sources.toml",
        |_| None,
    )
    .unwrap();
    let app = App::start_with_plugins(Backend::Sqlite, None, targets, &served_plugins).await;
    let (_, deployers) = app.get("/v1/deployers").await;
    for (name, version) in [
        ("archive", "0.1.0"),
        ("model-card", "0.1.0"),
        ("safetensors-check", "0.1.0"),
        ("http-publish-0-1", "0.1.0"),
        ("probe", "0.2.0"),
    ] {
        let deployer = served(&deployers, name).unwrap_or_else(|| panic!("{name}: {deployers}"));
        assert_eq!(deployer["wit_version"], version, "{deployer}");
    }
    let id = app
        .register(&model(&files, "job-both", &adapter_files()))
        .await;
    for deployer in ["archive", "model-card", "safetensors-check", "probe"] {
        let (status, answer) = app
            .post(
                &format!("/v1/models/{id}/deployments"),
                &json!({ "deployer": deployer }),
            )
            .await;
        if deployer == "safetensors-check" {
            // The test model's weights are random bytes: it ran and said so.
            assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
            let error = answer["error"].as_str().unwrap_or_default();
            assert!(
                error.starts_with(
                    "deployer safetensors-check: adapter_model.safetensors: header length"
                ),
                "{answer}"
            );
        } else {
            assert_eq!(status, StatusCode::OK, "{deployer}: {answer}");
            assert_eq!(answer["status"], "completed", "{deployer}: {answer}");
        }
    }
}
