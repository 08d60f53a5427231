//! Every status change carries its event into its commit: a server that
//! dies right after the commit (the debug build's
//! `BERTH_TEST_ABORT_AFTER=SITE` aborts there, as a kill -9 would) loses
//! no event. After a restart the event is in the log, and the webhook
//! receiver has it exactly once: a claim's `deployment.started`, a queued
//! deployment's cancel, restart recovery's and an approval's expiry's
//! `deployment.failed`. (Before, each was published after the commit, and
//! this window lost it.)

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::receiver::Receiver;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, eventually, model};

/// A server on SQLite delivering to `receiver`, that aborts after `site`.
async fn server(receiver: &Receiver, site: &str, args: &[&str]) -> Berth {
    args.iter()
        .fold(Berth::options(Backend::Sqlite), |o, a| o.arg(a))
        .arg("--webhook-url")
        .arg(&receiver.url)
        .env("BERTH_WEBHOOK_SECRET", "hook-secret")
        .env("BERTH_TEST_ABORT_AFTER", site)
        .start()
        .await
}

/// The events of deployment `id` of `kind` the receiver took.
fn taken(receiver: &Receiver, kind: &str, id: &Value) -> usize {
    receiver
        .taken()
        .iter()
        .filter(|(_, k, body)| k == kind && body["data"]["deploy_id"] == *id)
        .count()
}

/// Once a later deployment's end reached the receiver (it delivers in
/// order), `kind` of `id` reached it exactly once.
async fn delivered_once(berth: &Berth, receiver: &Receiver, model_id: i64, kind: &str, id: &Value) {
    let (status, marker) = berth.deploy(model_id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{marker}");
    let marker_id = marker["id"].clone();
    eventually(
        || {
            format!(
                "the receiver taking the end of deployment {marker_id}: {:?}",
                receiver.taken()
            )
        },
        async || (taken(receiver, "deployment.completed", &marker_id) > 0).then_some(()),
    )
    .await;
    assert_eq!(
        taken(receiver, kind, id),
        1,
        "{kind} of deployment {id}: {:?}",
        receiver.taken()
    );
}

/// Asks without waiting for an answer: the server may die answering.
async fn ask(berth: &Berth, path: &str, body: Value) {
    let _ = berth
        .client()
        .post(format!("{}{path}", berth.url))
        .json(&body)
        .send()
        .await;
}

async fn queue_behind_a_running_one(berth: &Berth, id: i64) -> (Value, Value) {
    let running = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    assert_eq!(running["status"], "running", "{running}");
    let queued = berth.deploy_detached(id, "archive", json!({})).await;
    assert_eq!(queued["status"], "queued", "{queued}");
    (running, queued)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_deployments_cancel_keeps_its_event_through_a_kill_after_the_commit() {
    let files = FileServer::start().await;
    let receiver = Receiver::start(StatusCode::OK).await;
    let mut berth = server(&receiver, "cancel", &["--max-running", "1"]).await;
    let id = berth
        .register(&model(&files, "job-cancel", &adapter_files()))
        .await;
    let (_, queued) = queue_behind_a_running_one(&berth, id).await;
    ask(
        &berth,
        &format!("/v1/deployments/{}/cancel", queued["id"]),
        json!({}),
    )
    .await;
    assert!(!berth.wait_exit().success());
    berth.restart();
    let (_, row) = berth
        .get(&format!("/v1/deployments/{}", queued["id"]))
        .await;
    assert_eq!(row["status"], "failed", "{row}");
    delivered_once(&berth, &receiver, id, "deployment.failed", &queued["id"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_start_keeps_its_event_through_a_kill_after_the_commit() {
    let files = FileServer::start().await;
    let receiver = Receiver::start(StatusCode::OK).await;
    let mut berth = server(&receiver, "claim", &["--max-running", "1"]).await;
    let id = berth
        .register(&model(&files, "job-claim", &adapter_files()))
        .await;
    let (running, queued) = queue_behind_a_running_one(&berth, id).await;
    // Its end makes room: the queue worker claims the queued one.
    ask(
        &berth,
        &format!("/v1/deployments/{}/cancel", running["id"]),
        json!({}),
    )
    .await;
    assert!(!berth.wait_exit().success());
    berth.restart();
    delivered_once(&berth, &receiver, id, "deployment.started", &queued["id"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_recovery_keeps_its_event_through_a_kill_after_the_commit() {
    let files = FileServer::start().await;
    let receiver = Receiver::start(StatusCode::OK).await;
    let mut berth = server(&receiver, "recover", &[]).await;
    let id = berth
        .register(&model(&files, "job-recover", &adapter_files()))
        .await;
    let running = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    berth.kill9();
    // The restart fails what the killed run left, and dies at once after.
    let (status, log) = berth.run_to_exit();
    assert!(!status.success(), "{log}");
    assert!(log.contains("aborting after recover committed"), "{log}");
    berth.restart();
    let (_, row) = berth
        .get(&format!("/v1/deployments/{}", running["id"]))
        .await;
    assert_eq!(row["status"], "failed", "{row}");
    delivered_once(&berth, &receiver, id, "deployment.failed", &running["id"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approvals_expiry_keeps_its_event_through_a_kill_after_the_commit() {
    let files = FileServer::start().await;
    let receiver = Receiver::start(StatusCode::OK).await;
    let mut berth = server(&receiver, "expire", &["--approval-expiry-s", "1"]).await;
    let rule = json!({
        "name": "held",
        // The stream's name of the event (model_registered is taken too).
        "when": { "event": "model.registered" },
        "deploy": { "deployer": "archive", "options": {} },
        "require_approval": true,
    });
    let (status, body) = berth.post("/v1/rules", &rule).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = berth
        .register(&model(&files, "job-expire", &adapter_files()))
        .await;
    assert!(!berth.wait_exit().success());
    berth.restart();
    let (_, listed) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    let held = listed["deployments"][0].clone();
    assert_eq!(held["status"], "failed", "{listed}");
    delivered_once(&berth, &receiver, id, "deployment.failed", &held["id"]).await;
}
