//! Formats through the real server: each file's format told at fetch from
//! its bytes and shown in the API; a safetensors file whose header does
//! not hold fails the deployment with berth's sentence before the deployer
//! runs, and again next time (its copy is not vouched for); `--pickle
//! warn` says which files are pickles in the deployment's log, `--pickle
//! refuse` refuses them to a deployer whose manifest does not say
//! `accepts_pickle = true`, once at the fetch, then at admission.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{model, on_both_backends, plugins};

on_both_backends!(
    a_malformed_safetensors_fails_the_deployment_before_the_deployer,
    formats_are_shown_and_pickles_are_named_in_the_log,
    refuse_keeps_pickles_from_deployers_that_do_not_accept_them,
);

/// A file written by real torch, transformers and peft.
fn real(path: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/training/lora-run")
            .join(path),
    )
    .unwrap()
}

/// A safetensors file of `header` and `data` bytes of zeros.
fn safetensors(header: &str, data: usize) -> Vec<u8> {
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend(vec![0u8; data]);
    file
}

/// The recorded format of each of model `id`'s files, by path.
async fn formats(berth: &Berth, id: i64) -> Value {
    let (status, model) = berth.get(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{model}");
    let mut by_path = serde_json::Map::new();
    for file in model["files"].as_array().unwrap() {
        by_path.insert(
            file["path"].as_str().unwrap().into(),
            file["format"].clone(),
        );
    }
    Value::Object(by_path)
}

#[track_caller]
fn assert_failed_with(deployment: &Value, mentions: &str) {
    assert_eq!(deployment["status"], "failed", "{deployment}");
    let error = deployment["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(mentions),
        "expected {mentions:?} in {error:?}"
    );
}

async fn a_malformed_safetensors_fails_the_deployment_before_the_deployer(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let overlapping = safetensors(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        12,
    );
    let mut huge_header = (8u64 << 30).to_le_bytes().to_vec();
    huge_header.extend_from_slice(br#"{"a": {"dtype": "F32"}}"#);
    for (job, weights, fault) in [
        (
            "job-overlap",
            overlapping,
            "fetching model {id}: file adapter_model.safetensors: is not a valid safetensors file: \
             tensors \"a\" and \"b\" overlap; export it again",
        ),
        (
            "job-8gib-header",
            huge_header,
            "file adapter_model.safetensors: is not a valid safetensors file: its header length \
             says 8589934592 bytes, more than the 100000000 safetensors allows",
        ),
    ] {
        let contents = [
            ("adapter_config.json", br#"{"r": 8}"#.to_vec()),
            ("adapter_model.safetensors", weights),
        ];
        let id = berth.register(&model(&files, job, &contents)).await;
        let fault = fault.replace("{id}", &id.to_string());
        for attempt in ["first", "again"] {
            let (status, deployment) = berth.deploy(id, "archive", json!({})).await;
            assert_eq!(
                status,
                StatusCode::BAD_GATEWAY,
                "{job} {attempt}: {deployment}"
            );
            assert_failed_with(&deployment, &fault);
            // The deployer never ran: nothing of it in the log.
            let log = berth.deployment_log(&deployment["id"]).await;
            assert!(!log.contains("archive"), "{job}: {log}");
        }
        // A fetch that failed records no format.
        assert_eq!(
            formats(&berth, id).await,
            json!({ "adapter_config.json": null, "adapter_model.safetensors": null })
        );
    }
}

async fn formats_are_shown_and_pickles_are_named_in_the_log(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = [
        ("adapter_config.json", real("adapter_config.json")),
        (
            "adapter_model.safetensors",
            real("adapter_model.safetensors"),
        ),
        ("training_args.bin", real("training_args.bin")),
        ("optimizer.pt", real("checkpoint-2/optimizer.pt")),
        ("README.md", real("README.md")),
    ];
    let id = berth
        .register(&model(&files, "job-formats", &contents))
        .await;
    let unknown = formats(&berth, id).await;
    assert!(
        unknown.as_object().unwrap().values().all(Value::is_null),
        "registration reads no byte: {unknown}"
    );
    let (status, deployment) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "warn deploys: {deployment}");
    assert_eq!(
        formats(&berth, id).await,
        json!({
            "adapter_config.json": "json",
            "adapter_model.safetensors": "safetensors",
            "training_args.bin": "zip-pickle",
            "optimizer.pt": "zip-pickle",
            "README.md": "other",
        })
    );
    let log = berth.deployment_log(&deployment["id"]).await;
    assert!(
        log.contains(&format!(
            "berth model {id} holds pickle files, which run code when loaded: training_args.bin, \
             optimizer.pt; deployer archive is handed them (--pickle warn)"
        )),
        "{log}"
    );
    // Again, from the verified copy and the recorded formats: still said.
    let (status, again) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    let log = berth.deployment_log(&again["id"]).await;
    assert!(log.contains("holds pickle files"), "{log}");
}

async fn refuse_keeps_pickles_from_deployers_that_do_not_accept_them(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::bare(backend)
        .plugin("archive", plugins::example("archive"))
        .plugin("trusting", plugins::example("archive"))
        .plugins_file("trusting.toml", "accepts_pickle = true\n")
        .arg("--pickle=refuse")
        .start()
        .await;
    let contents = [
        (
            "adapter_model.safetensors",
            real("adapter_model.safetensors"),
        ),
        ("training_args.bin", real("training_args.bin")),
    ];
    let id = berth
        .register(&model(&files, "job-pickled", &contents))
        .await;
    let sentence = format!(
        "model {id} (job-pickled) holds pickle files, which run code when loaded: \
         training_args.bin; this server refuses them to deployers whose manifest does not say \
         accepts_pickle = true (--pickle refuse), and deployer archive's does not. Register the \
         model without them"
    );

    // Unknown at admission: the fetch tells, and the deployer never runs.
    let (status, failed) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_failed_with(&failed, &sentence);
    assert_eq!(
        formats(&berth, id).await,
        json!({ "adapter_model.safetensors": "safetensors", "training_args.bin": "zip-pickle" })
    );

    // Known now: refused at the gate, nothing recorded.
    let (_, before) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    let (status, refused) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(error.contains(&sentence), "{error}");
    let (_, after) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    assert_eq!(before, after, "a refusal records nothing");

    // A deployer that says it accepts them deploys them.
    let (status, deployed) = berth.deploy(id, "trusting", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployed}");
    assert_eq!(deployed["status"], "completed", "{deployed}");
}
