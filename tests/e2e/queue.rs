//! One server's queue: past `--max-running` deployments wait, in order;
//! a queued one can be cancelled and never starts; a client that leaves
//! while its deployment waits cancels it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth, Shared, servers};
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
    let (status, stopped) = berth.cancel(&busy).await;
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
    let (status, _) = berth.cancel(&busy).await;
    assert_eq!(status, StatusCode::OK);
}

/// The deployments table scanned from end to end so far: PostgreSQL's
/// count, once every session that read it has ended (a session reports
/// its counts when it goes).
async fn whole_reads(conn: &mut sqlx::PgConnection) -> i64 {
    eventually(
        || "the server's sessions to end".to_string(),
        async || {
            let others: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            (others == 0).then_some(())
        },
    )
    .await;
    sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'deployments'")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// A long history does not slow what comes next: with 20,000 ended
/// deployments recorded, deployments taken at once, queued and claimed,
/// and the sweeps meanwhile find rows by status through the index, never
/// by reading the whole table. (PostgreSQL plans a prepared statement once
/// for every value after five runs, and that plan of `status = $1` read
/// every row: a deployment cost a scan of its whole history.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_history_is_never_read_whole_to_queue_run_or_sweep() {
    use sqlx::Connection;
    let files = FileServer::start().await;
    let shared = Shared::new().await;
    let id = {
        let berth = servers(&shared, 1, &[]).await.remove(0);
        let id = berth
            .register(&model(&files, "job-history", &adapter_files()))
            .await;
        let (status, first) = berth.deploy(id, "misbehave", json!({ "mode": "ok" })).await;
        assert_eq!(status, StatusCode::OK, "{first}");
        id
    };
    // Filled on a session of its own, ended before counting: a session's
    // counts (this fill's scan among them) arrive when it ends.
    let mut fill = sqlx::PgConnection::connect(&shared.database_url)
        .await
        .unwrap();
    for statement in [
        "INSERT INTO deployments (model_id, deployer, options, status, dir, out_dir, details, \
         server_id, created_at, plugin_sha256) SELECT model_id, deployer, options, status, dir, \
         out_dir, details, server_id, created_at, plugin_sha256 \
         FROM deployments, generate_series(1, 20000)",
        "ANALYZE deployments",
    ] {
        sqlx::query(statement).execute(&mut fill).await.unwrap();
    }
    fill.close().await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&shared.database_url)
        .await
        .unwrap();
    let before = whole_reads(&mut conn).await;

    let berth = servers(&shared, 1, &["--max-running", "1"]).await.remove(0);
    for _ in 0..40 {
        let (status, row) = berth.deploy(id, "misbehave", json!({ "mode": "ok" })).await;
        assert_eq!(status, StatusCode::OK, "{row}");
    }
    // Busy until cancelled: the three after it wait, then are claimed.
    let busy = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 60_000 }))
        .await;
    let mut queued = Vec::new();
    for _ in 0..3 {
        let row = berth
            .deploy_detached(id, "misbehave", json!({ "mode": "ok" }))
            .await;
        assert_eq!(row["status"], "queued", "behind {busy}: {row}");
        queued.push(row["id"].as_i64().unwrap());
    }
    let (status, _) = berth.cancel(&busy).await;
    assert_eq!(status, StatusCode::OK);
    for deployment in queued {
        let row = eventually(
            || format!("queued deployment {deployment} to be claimed and end"),
            async || {
                let (_, row) = berth.get(&format!("/v1/deployments/{deployment}")).await;
                has_ended(&row).then_some(row)
            },
        )
        .await;
        assert_eq!(row["status"], "completed", "{row}");
    }
    drop(berth);
    let after = whole_reads(&mut conn).await;
    assert_eq!(
        after - before,
        0,
        "the deployments table was read whole {} times",
        after - before
    );
}
