//! One server's queue: past `--max-running` deployments wait, in order;
//! a queued one can be cancelled and never starts; a client that leaves
//! while its deployment waits cancels it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, eventually, has_ended, model, most_at_once, on_both_backends};

on_both_backends!(
    a_full_server_queues_the_rest_in_order_and_a_cancelled_one_never_starts,
    a_client_that_leaves_while_its_deployment_waits_cancels_it,
);

async fn a_full_server_queues_the_rest_in_order_and_a_cancelled_one_never_starts(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start_with(backend, &["--max-running", "1"]).await;
    let id = berth
        .register(&model(&files, "job-queue", &adapter_files()))
        .await;
    let mut events = berth.events().await;
    // Busy until cancelled below: the deployments after it wait however
    // long the requests take.
    let busy = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 60_000 }))
        .await;
    assert_eq!(busy["status"], "running", "an idle server takes it: {busy}");
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let queued = berth
            .deploy_detached(id, "misbehave", json!({ "mode": "ok" }))
            .await;
        assert_eq!(queued["status"], "queued", "the server is full: {queued}");
        assert_eq!(queued["server"], Value::Null, "{queued}");
        waiting.push(queued["id"].as_i64().unwrap());
    }

    let (status, cancelled) = berth
        .post(
            &format!("/v1/deployments/{}/cancel", waiting[1]),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "failed", "{cancelled}");
    assert_eq!(cancelled["error"], "cancelled (before it started)");
    assert_eq!(cancelled["started_at"], Value::Null, "it never ran");
    let (status, again) = berth
        .post(
            &format!("/v1/deployments/{}/cancel", waiting[1]),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    let (status, stopped) = berth
        .post(
            &format!("/v1/deployments/{}/cancel", busy["id"]),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");

    let (_, list) = eventually(
        || "every deployment ends".to_string(),
        async || {
            let answer = berth.get(&format!("/v1/models/{id}/deployments")).await;
            answer.1["deployments"]
                .as_array()
                .unwrap()
                .iter()
                .all(has_ended)
                .then_some(answer)
        },
    )
    .await;
    let mut rows: Vec<&Value> = list["deployments"].as_array().unwrap().iter().collect();
    rows.sort_by_key(|r| r["id"].as_i64());
    let ran: Vec<&Value> = rows
        .iter()
        .copied()
        .filter(|r| r["id"] != waiting[1])
        .collect();
    assert_eq!(ran[0]["id"], busy["id"]);
    assert_eq!(ran[0]["status"], "failed", "{}", ran[0]);
    assert_eq!(ran[0]["error"], "cancelled", "{}", ran[0]);
    for row in &ran[1..] {
        assert_eq!(row["status"], "completed", "{row}");
    }
    assert_eq!(most_at_once(ran.iter().copied()), 1, "--max-running 1");
    let starts: Vec<&str> = ran
        .iter()
        .map(|r| r["started_at"].as_str().unwrap())
        .collect();
    assert!(
        starts.windows(2).all(|w| w[0] <= w[1]),
        "they started in order: {starts:?}"
    );

    let received = events
        .until(|e| {
            e.iter()
                .filter(|e| e.kind == "deployment.completed")
                .count()
                >= 2
        })
        .await;
    let of_cancelled: Vec<&str> = received
        .iter()
        .filter(|e| e.data["deploy_id"] == waiting[1])
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(of_cancelled, ["deployment.queued", "deployment.failed"]);
}

async fn a_client_that_leaves_while_its_deployment_waits_cancels_it(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start_with(backend, &["--max-running", "1"]).await;
    let id = berth
        .register(&model(&files, "job-leave", &adapter_files()))
        .await;
    let busy = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 60_000 }))
        .await;
    let gone = berth
        .client()
        .post(format!("{}/v1/models/{id}/deployments", berth.url))
        .json(&json!({ "deployer": "misbehave", "options": { "mode": "ok" } }))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up waiting: {gone:?}");
    let row = eventually(
        || "the deployment of the client that left ends".to_string(),
        async || {
            let (_, list) = berth.get(&format!("/v1/models/{id}/deployments")).await;
            list["deployments"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["id"] != busy["id"] && has_ended(r))
                .cloned()
        },
    )
    .await;
    assert_eq!(row["status"], "failed", "{row}");
    assert_eq!(
        row["error"],
        "cancelled: the client disconnected (before it started)"
    );
    let (status, _) = berth
        .post(
            &format!("/v1/deployments/{}/cancel", busy["id"]),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}
