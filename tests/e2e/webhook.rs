//! Events out: a loopback receiver gets every deployment event, signed,
//! with its id; a receiver that is down costs deployments nothing, gets
//! every event once it is back (from one of the servers sharing a
//! database, which another takes over from), and an event it never takes
//! is given up after the give-up time.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::events::{Event, ended};
use crate::support::files::FileServer;
use crate::support::prometheus::Scrape;
use crate::support::receiver::Receiver;
use crate::support::server::{Backend, Berth, Shared};
use crate::support::{adapter_files, eventually, model};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_gets_every_deployment_event_signed() {
    let files = FileServer::start().await;
    let receiver = Receiver::start(StatusCode::NO_CONTENT).await;
    let received = receiver.received.clone();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--webhook-url")
        .arg(&receiver.url)
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
                .map(|(h, _, _)| h["x-berth-event"].to_str().unwrap().to_string())
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
    assert_eq!(lifecycle, ["deployment.started", "deployment.completed"]);
    let mut ids = Vec::new();
    for (headers, body, _) in received.lock().unwrap().iter() {
        ids.push(
            headers["x-berth-event-id"]
                .to_str()
                .unwrap()
                .parse::<i64>()
                .unwrap(),
        );
        let signature = headers["x-berth-signature"].to_str().unwrap();
        assert_eq!(
            signature,
            berth::http::signature("hook-secret", body),
            "every body is signed"
        );
        assert_ne!(signature, berth::http::signature("other-secret", body));
    }
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "in id order, once each: {ids:?}"
    );
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

/// The deployment events of the log, as a receiver should get them: (id,
/// kind, data).
fn deployment_events(events: &[Event]) -> Vec<(i64, String, Value)> {
    events
        .iter()
        .filter(|e| e.kind.starts_with("deployment."))
        .map(|e| (e.id.unwrap(), e.kind.clone(), e.data.clone()))
        .collect()
}

/// What the receiver took, as (id, kind, data), each body's type checked.
#[track_caller]
fn taken_events(receiver: &Receiver) -> Vec<(i64, String, Value)> {
    receiver
        .taken()
        .into_iter()
        .map(|(id, kind, body)| {
            assert_eq!(body["type"], kind, "{body}");
            (id, kind, body["data"].clone())
        })
        .collect()
}

async fn metric(berth: &Berth, name: &str) -> f64 {
    let text = berth
        .client()
        .get(format!("{}/metrics", berth.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    Scrape::parse(&text).value(name, &[])
}

fn server_id(berth: &Berth) -> String {
    std::fs::read_to_string(berth.data_dir().join("server-id")).unwrap()
}

/// Two servers on one database deliver to one receiver that answers 503
/// for a while: `GET /v1/webhook` shows the failure on both; once the
/// receiver is back it gets every deployment event, in id order, from one
/// server; when that server stops, the other takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_a_while_gets_every_event_from_one_server() {
    let receiver = Receiver::start(StatusCode::SERVICE_UNAVAILABLE).await;
    let shared = Shared::new().await;
    let start = || {
        Berth::options(Backend::Postgres)
            .shared(&shared)
            .arg("--webhook-url")
            .arg(&receiver.url)
            .start()
    };
    let (a, b) = (start().await, start().await);
    let files = FileServer::start().await;
    let id = a
        .register(&model(&files, "job-hook-outage", &adapter_files()))
        .await;
    let mut deployed = Vec::new();
    for (server, deployer, options) in [
        (&a, "archive", json!({})),
        (&b, "misbehave", json!({"mode": "ok"})),
    ] {
        let (status, deployment) = server.deploy(id, deployer, options).await;
        assert_eq!(status, StatusCode::OK, "{deployment}");
        deployed.push(deployment["id"].clone());
    }

    let failing = eventually(
        || format!("the webhook failing; log of a:\n{}", a.log()),
        async || {
            let (status, state) = b.get("/v1/webhook").await;
            assert_eq!(status, StatusCode::OK, "{state}");
            (!state["failing"].is_null()).then_some(state)
        },
    )
    .await;
    let error = failing["failing"]["last_error"].as_str().unwrap();
    assert!(error.contains("503"), "{failing}");
    assert!(failing["pending"].as_i64().unwrap() > 0, "{failing}");
    assert!(failing["failing"]["next_attempt"].is_string(), "{failing}");
    let (_, on_a) = a.get("/v1/webhook").await;
    assert_eq!(on_a["url"], receiver.url, "{on_a}");
    assert_eq!(on_a["delivered_through"], failing["delivered_through"]);

    let mut log = a.events_from("?after=0", None).await;
    let expected = deployment_events(log.until(|e| deployed.iter().all(|id| ended(e, id))).await);
    let last = expected.last().unwrap().0;
    receiver.answer(StatusCode::NO_CONTENT);
    let caught_up = eventually(
        || format!("the webhook caught up; log of a:\n{}", a.log()),
        async || {
            let (_, state) = a.get("/v1/webhook").await;
            (state["failing"].is_null()
                && state["pending"] == 0
                && state["delivered_through"].as_i64() >= Some(last))
            .then_some(state)
        },
    )
    .await;
    assert_eq!(
        taken_events(&receiver),
        expected,
        "every event, in order, once each"
    );
    let refused = receiver
        .received
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, answer)| *answer == 503)
        .count();
    assert!(refused > 0);

    // One server delivered them all: the one the state names.
    let (from_a, from_b) = (
        metric(&a, "berth_webhook_delivered_total").await,
        metric(&b, "berth_webhook_delivered_total").await,
    );
    assert!(from_a == 0.0 || from_b == 0.0, "a: {from_a}, b: {from_b}");
    assert!(from_a + from_b >= expected.len() as f64);
    let (mut holder, survivor) = if from_a > 0.0 { (a, b) } else { (b, a) };
    assert_eq!(caught_up["delivering_server"], server_id(&holder));
    assert!(
        !survivor
            .log()
            .contains("this server delivers webhook events")
    );

    // The holder stops and hands delivery back; the other takes over.
    assert!(holder.terminate().success());
    let (status, more) = survivor
        .deploy(id, "misbehave", json!({"mode": "ok"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{more}");
    let mut after = survivor.events_from(&format!("?after={last}"), None).await;
    let more_events = deployment_events(after.until(|e| ended(e, &more["id"])).await);
    eventually(
        || format!("the survivor delivering; its log:\n{}", survivor.log()),
        async || {
            let (_, state) = survivor.get("/v1/webhook").await;
            (state["delivering_server"] == server_id(&survivor) && state["pending"] == 0)
                .then_some(())
        },
    )
    .await;
    let taken = taken_events(&receiver);
    assert_eq!(taken[..expected.len()], expected[..]);
    assert_eq!(taken[expected.len()..], more_events[..]);
}

/// A receiver that never takes an event: each is tried until it is older
/// than the give-up time, then given up, logged and counted, and the
/// events after it are tried in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_never_taken_is_given_up_after_the_give_up_time() {
    let receiver = Receiver::start(StatusCode::SERVICE_UNAVAILABLE).await;
    let berth = Berth::options(Backend::Sqlite)
        .arg("--webhook-url")
        .arg(&receiver.url)
        .arg("--webhook-give-up-s")
        .arg("1")
        .start()
        .await;
    let files = FileServer::start().await;
    let id = berth
        .register(&model(&files, "job-hook-give-up", &adapter_files()))
        .await;
    let (status, first) = berth.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let mut log = berth.events_from("?after=0", None).await;
    let expected = deployment_events(log.until(|e| ended(e, &first["id"])).await);
    let state = eventually(
        || format!("every event given up; log:\n{}", berth.log()),
        async || {
            let (_, state) = berth.get("/v1/webhook").await;
            (state["given_up"].as_u64() == Some(expected.len() as u64)).then_some(state)
        },
    )
    .await;
    assert_eq!(state["pending"], 0, "{state}");
    assert!(state["failing"].is_null(), "{state}");
    assert!(berth.log().contains("webhook gave up on an event"));
    assert_eq!(
        metric(&berth, "berth_webhook_given_up_total").await,
        expected.len() as f64
    );
    // Each was tried more than once before it was given up.
    let attempts = receiver.received.lock().unwrap().len();
    assert!(attempts > expected.len(), "{attempts} attempts");

    receiver.answer(StatusCode::OK);
    let (status, second) = berth.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let taken = eventually(
        || "the next deployment's events delivered".to_string(),
        async || {
            let taken = taken_events(&receiver);
            taken
                .iter()
                .any(|(_, kind, data)| {
                    kind == "deployment.completed" && data["deploy_id"] == second["id"]
                })
                .then_some(taken)
        },
    )
    .await;
    assert!(
        taken
            .iter()
            .all(|(_, _, data)| data["deploy_id"] == second["id"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_webhook_its_state_is_not_found() {
    let app = crate::support::router::App::start(Backend::Sqlite).await;
    crate::support::assert_error(
        &app.get("/v1/webhook").await,
        StatusCode::NOT_FOUND,
        "this server has no webhook: start it with --webhook-url (BERTH_WEBHOOK_URL)",
    );
}

#[test]
fn a_give_up_time_past_the_retention_stops_the_start() {
    let data = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .args(["--webhook-url", "http://127.0.0.1:9/hook"])
        .args(["--webhook-give-up-s", "100", "--events-retention-s", "10"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--webhook-give-up-s 100 is longer than --events-retention-s 10"),
        "{stderr}"
    );
}
