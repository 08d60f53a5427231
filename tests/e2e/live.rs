//! Live operations: background deployments, progress, cancellation, logs.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::events::Event;
use crate::support::files::{Fault, FileServer};
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, bytes, eventually, files_under, model, on_both_backends};

on_both_backends!(
    a_background_deployment_reports_progress_in_order,
    cancelling_during_the_fetch_leaves_no_unverified_file,
    cancelling_during_the_deployer_interrupts_the_guest,
    a_deployments_log_holds_what_its_deployer_said,
    sigterm_interrupts_running_deployments_and_stops_cleanly,
);

async fn a_background_deployment_reports_progress_in_order(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = vec![
        ("big.bin", bytes(5, 3 * 1024 * 1024)),
        ("config.json", b"{}".to_vec()),
    ];
    let id = berth.register(&model(&files, "job-bg", &contents)).await;
    files.fault(
        "job-bg",
        "big.bin",
        Some(Fault::Slow(Duration::from_millis(30))),
    );
    let mut events = berth.events().await;

    let clock = Instant::now();
    let started = berth.deploy_detached(id, "archive", json!({})).await;
    let deploy_id = started["id"].clone();
    let midway = wait_for(&berth, &deploy_id, |d| {
        d["progress"]["bytes_done"].as_u64() > Some(0)
    })
    .await;
    assert_eq!(midway["status"], "running");
    assert_eq!(midway["phase"], "fetching");
    assert_eq!(midway["progress"]["bytes_total"], 3 * 1024 * 1024 + 2);
    assert_eq!(midway["progress"]["files_total"], 2);

    let received = events
        .until(|e| {
            e.iter()
                .any(|e| e.kind == "deployment.completed" || e.kind == "deployment.failed")
        })
        .await;
    let elapsed = clock.elapsed();
    let mine: Vec<&Event> = received
        .iter()
        .filter(|e| e.data["deploy_id"] == deploy_id)
        .collect();
    let kinds: Vec<&str> = mine.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds[0], "deployment.started",
        "an idle server takes it at once"
    );
    assert_eq!(
        mine.last().unwrap().kind,
        "deployment.completed",
        "{mine:?}"
    );
    let progress: Vec<&Value> = mine
        .iter()
        .filter(|e| e.kind == "deployment.progress")
        .map(|e| &e.data)
        .collect();
    assert!(
        progress.len() >= 2,
        "progress was reported while fetching: {mine:?}"
    );
    let done: Vec<u64> = progress
        .iter()
        .map(|p| p["progress"]["bytes_done"].as_u64().unwrap())
        .collect();
    assert!(
        done.windows(2).all(|w| w[0] <= w[1]),
        "bytes only grow: {done:?}"
    );
    let phases: Vec<&str> = progress
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert!(
        phases
            .windows(2)
            .all(|w| !(w[0] == "deploying" && w[1] == "fetching")),
        "{phases:?}"
    );
    // Throttled: a few events a second at most (4/s, plus the edges).
    let ceiling = (elapsed.as_secs_f64() * 4.0).ceil() as usize + 2;
    assert!(
        progress.len() <= ceiling,
        "{} progress events in {elapsed:?}",
        progress.len()
    );

    let (_, finished) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
    assert_eq!(finished["status"], "completed");
    assert_eq!(finished["phase"], Value::Null);
}

async fn cancelling_during_the_fetch_leaves_no_unverified_file(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = vec![("big.bin", bytes(6, 4 * 1024 * 1024))];
    let id = berth
        .register(&model(&files, "job-cancel-fetch", &contents))
        .await;
    files.fault(
        "job-cancel-fetch",
        "big.bin",
        Some(Fault::Slow(Duration::from_millis(30))),
    );

    let started = berth.deploy_detached(id, "archive", json!({})).await;
    let deploy_id = &started["id"];
    wait_for(&berth, deploy_id, |d| {
        d["progress"]["bytes_done"].as_u64() > Some(0)
    })
    .await;
    let (status, cancelled) = berth
        .post(&format!("/v1/deployments/{deploy_id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "failed");
    assert_eq!(cancelled["error"], "cancelled");
    let on_disk = files_under(&berth.model_dir("job-cancel-fetch"));
    assert!(
        on_disk.iter().all(|f| f != "big.bin"),
        "unverified bytes under the real name: {on_disk:?}"
    );

    files.fault("job-cancel-fetch", "big.bin", None);
    let (status, again) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        files_under(&berth.model_dir("job-cancel-fetch")),
        ["big.bin"]
    );
}

async fn cancelling_during_the_deployer_interrupts_the_guest(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-cancel-guest", &adapter_files()))
        .await;
    let started = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "loop" }))
        .await;
    let deploy_id = &started["id"];
    wait_for(&berth, deploy_id, |d| d["phase"] == "deploying").await;

    let (status, cancelled) = berth
        .post(&format!("/v1/deployments/{deploy_id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "failed");
    assert_eq!(cancelled["error"], "cancelled");

    let (status, body) = berth
        .post(&format!("/v1/deployments/{deploy_id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body["error"],
        format!(
            "deployment {deploy_id} already ended (failed); only a running deployment can be cancelled"
        )
    );

    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the server runs the next deployment: {body}"
    );
}

async fn a_deployments_log_holds_what_its_deployer_said(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-logs", &adapter_files()))
        .await;
    let (status, deployment) = berth
        .deploy(id, "misbehave", json!({ "mode": "stdio" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let (status, logs) = berth
        .get(&format!("/v1/deployments/{}/logs", deployment["id"]))
        .await;
    assert_eq!(status, StatusCode::OK);
    let logs = logs.as_str().unwrap();
    for line in [
        "info hello from stdout",
        "warn hello from stderr",
        "info hello from host::log at Level::Info",
    ] {
        assert!(logs.contains(line), "{line:?} missing from:\n{logs}");
    }
    assert_eq!(
        deployment["progress"]["deployer"],
        json!({ "done": 1, "total": 2, "note": "half" })
    );
}

/// Polls the deployment until `condition` holds for it.
async fn wait_for(berth: &Berth, id: &Value, condition: impl Fn(&Value) -> bool) -> Value {
    eventually(
        || {
            format!(
                "deployment {id} reaching the condition; log:\n{}",
                berth.log()
            )
        },
        async || {
            let (_, deployment) = berth.get(&format!("/v1/deployments/{id}")).await;
            condition(&deployment).then_some(deployment)
        },
    )
    .await
}

async fn sigterm_interrupts_running_deployments_and_stops_cleanly(backend: Backend) {
    let files = FileServer::start().await;
    let mut berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-term", &adapter_files()))
        .await;
    // A subscriber and a synchronous request stay open across the stop.
    let _events = berth.events().await;
    let sync = {
        let (client, url) = (
            berth.client().clone(),
            format!("{}/v1/models/{id}/deployments", berth.url),
        );
        tokio::spawn(async move {
            client
                .post(url)
                .json(&json!({ "deployer": "misbehave", "options": { "mode": "loop" } }))
                .send()
                .await
        })
    };
    let background = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "loop" }))
        .await;
    wait_for(&berth, &background["id"], |d| d["phase"] == "deploying").await;

    let status = tokio::task::block_in_place(|| berth.terminate());
    assert!(status.success(), "berth exits cleanly: {status}");
    let answered = sync.await.unwrap().unwrap();
    assert_eq!(answered.status(), StatusCode::BAD_GATEWAY);
    let row: Value = answered.json().await.unwrap();
    // Sent first, but the background one may have fetched the files.
    assert!(
        [
            "interrupted while fetching the model: the server stopped before it finished",
            "interrupted while deploying: the server stopped before it finished",
        ]
        .contains(&row["error"].as_str().unwrap_or_default()),
        "{row}"
    );
    assert!(
        berth
            .log()
            .contains("stopping on SIGTERM: running deployments are interrupted"),
        "{}",
        berth.log()
    );

    berth.restart();
    let (_, stopped) = berth
        .get(&format!("/v1/deployments/{}", background["id"]))
        .await;
    assert_eq!(stopped["status"], "failed");
    assert_eq!(
        stopped["error"],
        "interrupted while deploying: the server stopped before it finished"
    );
    assert!(
        !berth.log().contains("marked deployments left running"),
        "the stop itself recorded them: {}",
        berth.log()
    );
}

/// The log says which signal stopped the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stop_names_its_signal() {
    let mut berth = Berth::start(Backend::Sqlite).await;
    let status = tokio::task::block_in_place(|| berth.stop_by("INT"));
    assert!(status.success(), "berth exits cleanly: {status}");
    assert!(
        berth.log().contains("stopping on SIGINT: "),
        "{}",
        berth.log()
    );
}
