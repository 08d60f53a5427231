//! The main job end to end: register, fetch and verify, run the deployer,
//! record — and every way the files' source can let it down.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::{Fault, FileServer};
use crate::support::server::{Backend, Berth};
use crate::support::{
    adapter_files, assert_error, bytes, eventually, files_under, model, on_both_backends,
    sha256_hex,
};

on_both_backends!(
    happy_path_fetches_verifies_deploys_and_records,
    a_second_deployment_downloads_nothing,
    concurrent_deployments_of_a_fresh_model_download_each_file_once,
    a_damaged_file_on_disk_is_fetched_again,
    bad_sources_fail_with_the_file_named_and_leave_no_unverified_bytes,
    a_deployer_failure_is_a_502_with_the_row_stored,
    a_client_that_disconnects_cancels_its_deployment,
    a_server_killed_during_a_fetch_recovers_on_restart,
    deleting_a_model_deletes_its_deployments_and_its_files,
    a_models_files_are_dropped_only_when_no_deployment_uses_them,
    a_fetch_that_takes_too_long_is_stopped,
);

async fn happy_path_fetches_verifies_deploys_and_records(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-happy", &contents)).await;

    let (status, deployment) = berth.deploy(id, "archive", json!({ "level": 1 })).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed");
    assert_eq!(deployment["model_id"], id);
    assert_eq!(deployment["deployer"], "archive");
    assert_eq!(deployment["options"], json!({ "level": 1 }));
    assert_eq!(deployment["error"], Value::Null);
    assert_eq!(deployment["details"]["files"], 3);
    assert!(deployment["completed_at"].is_string());
    assert!(deployment["duration_ms"].is_u64(), "{deployment}");
    let deploy_id = deployment["id"].as_i64().unwrap();
    assert_eq!(
        deployment["ref"],
        format!("/out/job-happy-{deploy_id}.tar.gz")
    );

    // The files on disk are byte-identical to the source, and nothing else is there.
    let dir = berth.model_dir("job-happy");
    assert_eq!(deployment["dir"], dir.display().to_string());
    let mut expected: Vec<_> = contents.iter().map(|(p, _)| p.to_string()).collect();
    expected.sort();
    assert_eq!(files_under(&dir), expected);
    for (path, bytes) in &contents {
        assert_eq!(&std::fs::read(dir.join(path)).unwrap(), bytes, "{path}");
    }
    // The deployer's output is where the row says, and matches its details.
    let archive = std::fs::read(
        std::path::Path::new(deployment["out_dir"].as_str().unwrap())
            .join(format!("job-happy-{deploy_id}.tar.gz")),
    )
    .unwrap();
    assert_eq!(deployment["details"]["sha256"], sha256_hex(&archive));
    assert_eq!(deployment["details"]["bytes"], archive.len());

    let (status, stored) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        stored, deployment,
        "GET returns the row the POST answered with"
    );
    let (status, listing) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing["deployments"], json!([deployment]));
}

async fn a_second_deployment_downloads_nothing(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-again", &adapter_files()))
        .await;
    let (status, first) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let hits = files.total_hits();
    assert_eq!(hits, 3);

    let (status, second) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(files.total_hits(), hits, "the verified files were reused");
    assert_ne!(first["id"], second["id"]);

    let (_, listing) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    let ids: Vec<_> = listing["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].clone())
        .collect();
    assert_eq!(
        ids,
        [second["id"].clone(), first["id"].clone()],
        "newest first"
    );
    let (_, limited) = berth
        .get(&format!("/v1/models/{id}/deployments?limit=1"))
        .await;
    assert_eq!(limited["deployments"].as_array().unwrap().len(), 1);
}

async fn concurrent_deployments_of_a_fresh_model_download_each_file_once(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-crowd", &contents)).await;
    // Slow enough that all ten requests arrive while the first fetch runs.
    files.fault(
        "job-crowd",
        "adapter_model.safetensors",
        Some(Fault::Slow(Duration::from_millis(5))),
    );

    let deployments = (0..10).map(|_| berth.deploy(id, "archive", json!({})));
    let results = futures::future::join_all(deployments).await;
    for (status, body) in &results {
        assert_eq!(*status, StatusCode::OK, "{body}");
    }
    for (path, _) in &contents {
        assert_eq!(
            files.hits("job-crowd", path),
            1,
            "{path} was downloaded once"
        );
    }
}

async fn a_damaged_file_on_disk_is_fetched_again(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = adapter_files();
    let id = berth
        .register(&model(&files, "job-damaged", &contents))
        .await;
    assert_eq!(
        berth.deploy(id, "archive", json!({})).await.0,
        StatusCode::OK
    );

    // Same size, different bytes, mtime put back: the verification record
    // must not vouch for it (its ctime changed).
    let path = berth
        .model_dir("job-damaged")
        .join("adapter_model.safetensors");
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let mut damaged = std::fs::read(&path).unwrap();
    damaged[1000] ^= 0xff;
    std::fs::write(&path, &damaged).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    // And one file deleted outright: the blob store still holds it.
    std::fs::remove_file(berth.model_dir("job-damaged").join("adapter_config.json")).unwrap();

    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(files.hits("job-damaged", "adapter_model.safetensors"), 2);
    assert_eq!(
        files.hits("job-damaged", "adapter_config.json"),
        1,
        "the deleted file is linked back from the blob store, not downloaded"
    );
    assert_eq!(
        files.hits("job-damaged", "tokenizer/tokenizer.json"),
        1,
        "the intact file was reused"
    );
    for (path, bytes) in &contents {
        assert_eq!(
            &std::fs::read(berth.model_dir("job-damaged").join(path)).unwrap(),
            bytes,
            "{path}"
        );
    }
}

async fn bad_sources_fail_with_the_file_named_and_leave_no_unverified_bytes(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let good = bytes(7, 300_000);
    let bad = "weights.bin";
    // A local source whose weights.bin is a FIFO: opening it once waited
    // for a writer, holding the deployment and its model directory's lock.
    let local = tempfile::tempdir().unwrap();
    let fifo_dir = local.path().join("job-fifo");
    std::fs::create_dir_all(&fifo_dir).unwrap();
    std::fs::write(fifo_dir.join("config.json"), b"{}").unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(fifo_dir.join(bad))
        .status()
        .unwrap();
    assert!(made.success());
    let local_source = format!("file://{}/{{job_id}}/{{path}}", local.path().display());

    // Each case: how the registration or the source lies, what the error says.
    type Case = (
        &'static str,
        Box<dyn Fn(&mut Value)>,
        Option<Fault>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "sha",
            Box::new(|m| m["files"][1]["sha256"] = json!("0".repeat(64))),
            None,
            "sha256 mismatch: expected 0000",
        ),
        (
            "short",
            Box::new(|m| m["files"][1]["size_bytes"] = json!(300_001)),
            None,
            "the source has 300000 bytes for this file, but the record says 300001",
        ),
        (
            "long",
            Box::new(|m| m["files"][1]["size_bytes"] = json!(299_999)),
            None,
            "the source has 300000 bytes for this file, but the record says 299999",
        ),
        (
            "cut",
            Box::new(|_| {}),
            Some(Fault::CutAfter(100_000)),
            "the download broke off",
        ),
        (
            "missing",
            Box::new(|_| {}),
            Some(Fault::Status(404)),
            "the source answered 404 Not Found",
        ),
        (
            "broken",
            Box::new(|_| {}),
            Some(Fault::Status(500)),
            "the source answered 500 Internal Server Error",
        ),
        (
            "down",
            Box::new(|m| m["source"] = json!("http://127.0.0.1:9/{job_id}/{path}")),
            None,
            "cannot reach the source (http://127.0.0.1:9/job-down/",
        ),
        (
            "fifo",
            Box::new(move |m| m["source"] = json!(local_source)),
            None,
            "/job-fifo/weights.bin is not a regular file",
        ),
    ];
    for (job, change, fault, expected) in cases {
        let job_id = format!("job-{job}");
        let mut registration = model(
            &files,
            &job_id,
            &[("config.json", b"{}".to_vec()), (bad, good.clone())],
        );
        change(&mut registration);
        files.fault(&job_id, bad, fault);
        let id = berth.register(&registration).await;

        let (status, deployment) = berth.deploy(id, "archive", json!({})).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{job}: {deployment}");
        assert_eq!(deployment["status"], "failed", "{job}");
        let error = deployment["error"].as_str().unwrap();
        // With the source down, whichever file is tried first is named.
        let named = error.contains(&format!("file {bad}: "))
            || (job == "down" && error.contains("file config.json: "));
        assert!(named, "{job}: the error names the file: {error}");
        assert!(error.contains(expected), "{job}: {error}");
        let (_, stored) = berth
            .get(&format!("/v1/deployments/{}", deployment["id"]))
            .await;
        assert_eq!(stored, deployment, "{job}: the failed row is stored");

        let on_disk = files_under(&berth.model_dir(&job_id));
        assert!(
            !on_disk.contains(&bad.to_string()),
            "{job}: unverified bytes under the real name: {on_disk:?}"
        );
        // A download that broke off keeps its bytes under the temp name for
        // the next fetch to continue (so may the other file's, stopped
        // midway by this failure); wrong bytes are never kept.
        let kept = on_disk.contains(&format!(".fetch-{bad}"));
        assert_eq!(kept, job == "cut", "{job}: temp files: {on_disk:?}");
    }
}

async fn a_deployer_failure_is_a_502_with_the_row_stored(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-panic", &adapter_files()))
        .await;
    let (status, deployment) = berth
        .deploy(id, "misbehave", json!({ "mode": "panic" }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{deployment}");
    let error = deployment["error"].as_str().unwrap();
    assert!(error.starts_with("deployer misbehave: crashed"), "{error}");
    assert!(
        error.contains("deliberate panic"),
        "the guest's stderr explains the crash: {error}"
    );

    let (status, deployment) = berth
        .deploy(id, "misbehave", json!({ "mode": "bad-details" }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        deployment["error"],
        "deployer misbehave: returned details-json that is not a JSON object: [1,2,3]"
    );
    // The server is fine and the model still deploys.
    let (status, body) = berth.deploy(id, "misbehave", json!({ "mode": "ok" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn a_client_that_disconnects_cancels_its_deployment(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-leave", &adapter_files()))
        .await;

    let request = berth
        .client()
        .post(format!("{}/v1/models/{id}/deployments", berth.url))
        .json(&json!({ "deployer": "misbehave", "options": { "mode": "loop" } }))
        .timeout(Duration::from_millis(1500))
        .send()
        .await;
    assert!(request.unwrap_err().is_timeout());

    let deployment = eventually(
        || format!("the end of the deployment; log:\n{}", berth.log()),
        async || {
            let (_, listing) = berth.get(&format!("/v1/models/{id}/deployments")).await;
            let newest = &listing["deployments"][0];
            (!newest.is_null() && newest["status"] != "running").then(|| newest.clone())
        },
    )
    .await;
    assert_eq!(deployment["status"], "failed");
    assert!(
        deployment["error"]
            .as_str()
            .unwrap()
            .starts_with("cancelled"),
        "{deployment}"
    );
}

async fn a_server_killed_during_a_fetch_recovers_on_restart(backend: Backend) {
    let files = FileServer::start().await;
    let mut berth = Berth::start(backend).await;
    let contents = vec![("big.bin", bytes(3, 4 * 1024 * 1024))];
    let id = berth.register(&model(&files, "job-kill", &contents)).await;
    files.fault(
        "job-kill",
        "big.bin",
        Some(Fault::Slow(Duration::from_millis(20))),
    );

    let url = format!("{}/v1/models/{id}/deployments", berth.url);
    let client = berth.client().clone();
    let pending = tokio::spawn(async move {
        client
            .post(url)
            .json(&json!({ "deployer": "archive" }))
            .send()
            .await
    });
    // Wait until part of the file has arrived, then kill -9.
    let dir = berth.model_dir("job-kill");
    eventually(
        || "a partial download".to_string(),
        async || {
            files_under(&dir)
                .iter()
                .any(|f| f.starts_with(".fetch-"))
                .then_some(())
        },
    )
    .await;
    berth.kill9();
    assert!(
        pending.await.unwrap().is_err(),
        "the client saw the connection drop"
    );
    assert!(
        !dir.join("big.bin").exists(),
        "no half file under the real name"
    );

    berth.restart();
    let (_, listing) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    let interrupted = &listing["deployments"][0];
    assert_eq!(interrupted["status"], "failed");
    assert_eq!(
        interrupted["error"],
        "interrupted while fetching the model: the server stopped before it finished (killed or crashed?)"
    );

    files.fault("job-kill", "big.bin", None);
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(std::fs::read(dir.join("big.bin")).unwrap(), contents[0].1);
    assert_eq!(
        files_under(&dir),
        ["big.bin"],
        "the dead fetch's temp file was cleaned"
    );
}

async fn deleting_a_model_deletes_its_deployments_and_its_files(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-delete", &adapter_files()))
        .await;
    let (_, deployment) = berth.deploy(id, "archive", json!({})).await;

    let (status, _) = berth.delete(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        berth.get(&format!("/v1/models/{id}")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        berth
            .get(&format!("/v1/deployments/{}", deployment["id"]))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert!(
        !berth.model_dir("job-delete").exists(),
        "the local copy goes with the model"
    );
    let (status, body) = berth.delete(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], format!("model {id} does not exist"));
}

/// A model's local copy is dropped on request, and fetched again by its
/// next deployment; never while a deployment of it is queued or running
/// (nor is the model deleted then).
async fn a_models_files_are_dropped_only_when_no_deployment_uses_them(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-drop", &contents)).await;
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let dir = berth.model_dir("job-drop");
    assert_eq!(files_under(&dir).len(), contents.len());

    let (status, body) = berth.delete(&format!("/v1/models/{id}/files")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert!(!dir.exists(), "the copy is gone");
    assert_eq!(
        berth.get(&format!("/v1/models/{id}")).await.0,
        StatusCode::OK
    );
    // Dropping nothing is no error.
    let (status, _) = berth.delete(&format!("/v1/models/{id}/files")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // Fetched again, every file, by the next deployment.
    let before = files.total_hits();
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        files.total_hits() >= before + contents.len(),
        "not fetched again"
    );
    assert_eq!(files_under(&dir).len(), contents.len());

    // In use: neither the files nor the model go.
    let running = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    let busy = format!(
        "model {id} is in use by deployment {} (queued or running); its files stay until it ends",
        running["id"]
    );
    for path in [format!("/v1/models/{id}/files"), format!("/v1/models/{id}")] {
        let answer = berth.delete(&path).await;
        assert_error(&answer, StatusCode::CONFLICT, &busy);
    }
    assert_eq!(
        files_under(&dir).len(),
        contents.len(),
        "files dropped in use"
    );
    let (status, _) = berth.cancel(&running).await;
    assert!(status.is_success(), "{status}");
    let (status, body) = berth.delete(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert!(!dir.exists());
    assert_eq!(
        berth.delete(&format!("/v1/models/{id}/files")).await.0,
        StatusCode::NOT_FOUND
    );
}

async fn a_fetch_that_takes_too_long_is_stopped(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start_with(backend, &["--fetch-timeout-s", "1"]).await;
    let id = berth
        .register(&model(
            &files,
            "job-slow",
            &[("slow.bin", bytes(4, 1024 * 1024))],
        ))
        .await;
    files.fault(
        "job-slow",
        "slow.bin",
        Some(Fault::Slow(Duration::from_millis(200))),
    );
    let (status, deployment) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{deployment}");
    assert_eq!(
        deployment["error"],
        format!(
            "fetching model {id}: fetching the model's files took longer than the limit of 1s (--fetch-timeout-s)"
        )
    );
    // Nothing under the real name; the partial download is kept to be continued.
    assert_eq!(
        files_under(&berth.model_dir("job-slow")),
        [".fetch-slow.bin"],
        "only the partial download is left"
    );
}
