//! The server's long-lived loops are supervised: one that ends while the
//! server runs is an error in its log, a count in `/metrics` and a 503 of
//! `/readyz` naming it; the fence's end stops what runs here and lets
//! nothing more start (fail closed). Each loop is made to panic by the
//! debug build's `BERTH_TEST_LOOP_PANIC=NAME:MS`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use berth::auth::{Role, new_token};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, eventually, model};

/// What `/readyz` says once it answers 503 for a loop's end (not for a
/// load still under way).
async fn not_ready(berth: &Berth) -> String {
    eventually(
        || "a 503 of /readyz naming a loop".to_string(),
        async || {
            let response = berth
                .client()
                .get(format!("{}/readyz", berth.url))
                .send()
                .await
                .unwrap();
            if response.status() != StatusCode::SERVICE_UNAVAILABLE {
                return None;
            }
            let body: Value = response.json().await.unwrap();
            let said = body["error"].as_str().unwrap().to_string();
            said.contains(" ended (").then_some(said)
        },
    )
    .await
}

/// The deployment at `path` once `done` holds of it.
async fn once(berth: &Berth, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    eventually(
        || format!("the change of {path}"),
        async || {
            let row = berth.get(path).await.1;
            done(&row).then_some(row)
        },
    )
    .await
}

async fn metrics(berth: &Berth) -> String {
    let response = berth
        .client()
        .get(format!("{}/metrics", berth.url))
        .send()
        .await
        .unwrap();
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_loop_that_ends_while_the_server_runs_is_said_counted_and_makes_it_not_ready() {
    let dir = tempfile::TempDir::new().unwrap();
    let tokens = dir.path().join("tokens");
    let (_, line) = new_token("ops", Role::Admin).unwrap();
    std::fs::write(&tokens, format!("{line}\n")).unwrap();
    let tokens = tokens.display().to_string();
    let webhook = [
        "--webhook-url",
        "http://127.0.0.1:9/hook",
        "--webhook-secret",
        "s",
    ];
    let cases: [(&str, Backend, &[&str]); 11] = [
        ("rules follower", Backend::Sqlite, &[]),
        ("queue worker", Backend::Sqlite, &[]),
        ("lease keeper", Backend::Sqlite, &[]),
        ("event pruner", Backend::Sqlite, &[]),
        ("event appender", Backend::Sqlite, &[]),
        ("catalog follower", Backend::Sqlite, &[]),
        ("plugins folder watcher", Backend::Sqlite, &[]),
        ("SQLite committer", Backend::Sqlite, &[]),
        ("PostgreSQL listener", Backend::Postgres, &[]),
        ("webhook deliverer", Backend::Sqlite, &webhook),
        (
            "token reloader",
            Backend::Sqlite,
            &["--api-tokens-file", &tokens],
        ),
    ];
    for (name, backend, args) in cases {
        let berth = args
            .iter()
            .fold(Berth::options(backend), |o, a| o.arg(a))
            .env("BERTH_TEST_LOOP_PANIC", &format!("{name}:300"))
            // The watcher's end comes before the folder is loaded.
            .start_listening()
            .await;
        let said = not_ready(&berth).await;
        assert_eq!(
            said,
            format!(
                "not ready: the {name} ended (it panicked: BERTH_TEST_LOOP_PANIC asked the {name} \
                 to panic); restart the server"
            )
        );
        // The line reaches the test's copy of the log after the answer
        // may have.
        berth
            .logged(&format!(
                "the {name} ended while the server runs (it panicked: BERTH_TEST_LOOP_PANIC asked \
                 the {name} to panic); /readyz answers 503 until the server is restarted"
            ))
            .await;
        if args.is_empty() {
            assert!(
                metrics(&berth)
                    .await
                    .contains(&format!("berth_loops_ended_total{{name=\"{name}\"}} 1")),
                "{name}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_fence_ends_what_runs_is_stopped_and_nothing_more_starts() {
    let files = FileServer::start().await;
    let dir = tempfile::TempDir::new().unwrap();
    let trigger = dir.path().join("fence-panics");
    let berth = Berth::options(Backend::Sqlite)
        .env(
            "BERTH_TEST_LOOP_PANIC",
            &format!("fence:@{}", trigger.display()),
        )
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-fence", &adapter_files()))
        .await;
    // A guest that would run a minute, running when the fence ends.
    let running = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 60_000 }))
        .await;
    let path = format!("/v1/deployments/{}", running["id"]);
    once(&berth, &path, |row| row["phase"] == "deploying").await;
    std::fs::write(&trigger, b"").unwrap();
    let row = once(&berth, &path, |row| row["status"] == "failed").await;
    let error = row["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(
            "stopped: this server's fence ended (it panicked: BERTH_TEST_LOOP_PANIC asked the \
             fence to panic), and a deployment it runs could outlive its lease unnoticed"
        ),
        "{row}"
    );
    assert!(not_ready(&berth).await.contains("the fence ended"));
    // Nothing more runs here: a new deployment waits in the queue.
    let queued = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 1 }))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, row) = berth
        .get(&format!("/v1/deployments/{}", queued["id"]))
        .await;
    assert_eq!(row["status"], "queued", "{row}");
}
