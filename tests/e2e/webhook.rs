//! Events out: a loopback receiver gets every deployment event, signed; a
//! receiver that is down costs deployments nothing.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, eventually, model};

type Received = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

async fn receiver() -> (String, Received) {
    let received = Received::default();
    let app = Router::new()
        .route(
            "/hook",
            post(
                |State(r): State<Received>, headers: HeaderMap, body: Bytes| async move {
                    r.lock().unwrap().push((headers, body));
                    StatusCode::NO_CONTENT
                },
            ),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_gets_every_deployment_event_signed() {
    let files = FileServer::start().await;
    let (url, received) = receiver().await;
    let berth = Berth::options(Backend::Sqlite)
        .arg("--webhook-url")
        .arg(&url)
        .env("BERTH_WEBHOOK_SECRET", "hook-secret")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-hook", &adapter_files()))
        .await;
    let (status, deployment) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK);

    let kinds = eventually(
        || "the receiver getting deployment.completed".to_string(),
        async || {
            let kinds: Vec<String> = received
                .lock()
                .unwrap()
                .iter()
                .map(|(h, _)| h["x-berth-event"].to_str().unwrap().to_string())
                .collect();
            kinds
                .contains(&"deployment.completed".to_string())
                .then_some(kinds)
        },
    )
    .await;
    let lifecycle: Vec<_> = kinds
        .iter()
        .filter(|k| *k != "deployment.progress")
        .collect();
    assert_eq!(
        lifecycle,
        [
            "deployment.queued",
            "deployment.started",
            "deployment.completed"
        ]
    );
    for (headers, body) in received.lock().unwrap().iter() {
        let signature = headers["x-berth-signature"].to_str().unwrap();
        assert_eq!(
            signature,
            berth::http::signature("hook-secret", body),
            "every body is signed"
        );
        assert_ne!(signature, berth::http::signature("other-secret", body));
    }
    let last: Value = serde_json::from_slice(&received.lock().unwrap().last().unwrap().1).unwrap();
    assert_eq!(last["type"], "deployment.completed");
    assert_eq!(last["data"]["deploy_id"], deployment["id"]);
    assert_eq!(last["data"]["ref"], deployment["ref"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_is_down_does_not_hold_deployments_back() {
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .arg("--webhook-url")
        .arg("http://127.0.0.1:9/hook")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-hook-down", &adapter_files()))
        .await;
    for _ in 0..3 {
        let (status, body) = berth.deploy(id, "archive", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    // The deployments answered while the first event was still being retried.
    let log = berth.log();
    assert!(log.contains("webhook delivery failed"), "{log}");
    assert!(
        !log.contains("gave up"),
        "deliveries were still being retried when all three deployments had ended"
    );
}
