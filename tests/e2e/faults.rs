//! Faults between berth and PostgreSQL, under load, with real PostgreSQL
//! servers:
//! - the database restarts (a fast shutdown; a `kill -9`) for a few
//!   seconds: nothing is lost, nothing runs twice, every deployment ends
//!   once in the event log, and meanwhile the servers answer 503 with a
//!   sentence;
//! - it stays away longer than the fence: what ran is stopped and failed
//!   naming the outage, what was queued runs after;
//! - one server is cut off while another is not: the cut-off server stops
//!   its own deployments before its lease can run out (fencing by time),
//!   the other ends them once it has, and nothing runs on two servers at
//!   once. The cut is a loopback proxy: the network fails, not the
//!   database.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::postgres::OwnPostgres;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::receiver::Receiver;
use crate::support::server::{Berth, Shared, servers};
use crate::support::{bytes, eventually, has_ended, model};

/// A lease short enough for a test; the fence goes up at 4/5 of it.
const LEASE_MS: u64 = 3000;

fn at(rfc3339: &str) -> SystemTime {
    humantime::parse_rfc3339_weak(rfc3339.trim_end_matches('Z'))
        .unwrap_or_else(|e| panic!("{rfc3339:?}: {e}"))
}

/// When the first line of `log` holding `words` was logged.
fn logged_at(log: &str, words: &str) -> Option<SystemTime> {
    let line = log.lines().find(|line| line.contains(words))?;
    Some(at(line.split_whitespace().next()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_cut_off_from_the_database_stops_its_deployments_before_its_lease_runs_out() {
    let files = FileServer::start().await;
    let shared = Shared::new().await;
    let proxy = Proxy::start(upstream_of(&shared.database_url)).await;
    let through_proxy = shared.with_database_url(proxy.url_of(&shared.database_url));
    let lease = LEASE_MS.to_string();
    let args = ["--lease-ms", &lease, "--max-running", "2"];
    let cut_off = servers(&through_proxy, 1, &args).await.remove(0);
    let model_id = cut_off
        .register(&model(&files, "job-cut", &[("a.json", bytes(3, 300))]))
        .await;
    let sleep = json!({ "mode": "sleep", "ms": 600_000 });
    let mut ids = Vec::new();
    for _ in 0..2 {
        let queued = cut_off
            .deploy_detached(model_id, "misbehave", sleep.clone())
            .await;
        ids.push(queued["id"].as_i64().unwrap());
    }
    for id in &ids {
        eventually(
            || format!("deployment {id} runs on the server to be cut off"),
            async || {
                let (_, row) = cut_off.get(&format!("/v1/deployments/{id}")).await;
                (row["phase"] == "deploying").then_some(())
            },
        )
        .await;
    }
    // Only now the other server: the two run on the first.
    let other = servers(&shared, 1, &args).await.remove(0);

    proxy.cut();
    let cut_at = SystemTime::now();
    let mut ended = Vec::new();
    for id in &ids {
        let row: Value = eventually(
            || format!("deployment {id} of the cut-off server ends"),
            async || {
                let (_, row) = other.get(&format!("/v1/deployments/{id}")).await;
                has_ended(&row).then_some(row)
            },
        )
        .await;
        assert_eq!(row["status"], "failed", "{row}");
        let error = row["error"].as_str().unwrap();
        assert!(
            error.starts_with("lost while deploying: berth server ")
                && error.contains(&cut_off.server_id()),
            "the other server ended it for the lapsed lease: {error}"
        );
        ended.push(at(row["completed_at"].as_str().unwrap()));
    }

    // The cut-off server stopped both guests before the other ended them.
    let stopped = eventually(
        || format!("the cut-off server logs its fence:\n{}", cut_off.log()),
        async || logged_at(&cut_off.log(), "stopping 2 of its running deployments"),
    )
    .await;
    let first_end = ended.iter().min().unwrap();
    let window = first_end.duration_since(stopped).unwrap_or_else(|e| {
        panic!(
            "the guests were stopped {:?} after the other server ended their deployments",
            e.duration()
        )
    });
    let fence_after = stopped.duration_since(cut_at).unwrap_or_default();
    eprintln!(
        "fence went up {fence_after:?} after the cut; the other server ended the deployments {window:?} later"
    );
    assert!(
        fence_after < Duration::from_millis(LEASE_MS),
        "the fence went up {fence_after:?} after the cut, later than a lease"
    );

    // Healed, the cut-off server takes work again; what it ran left no
    // output behind.
    proxy.heal();
    eventually(
        || "the healed server is ready again".to_string(),
        async || {
            let (status, _) = cut_off.get("/readyz").await;
            status.is_success().then_some(())
        },
    )
    .await;
    for id in &ids {
        let out = cut_off.data_dir().join("out").join(id.to_string());
        eventually(
            || format!("{} is removed", out.display()),
            async || (!out.exists()).then_some(()),
        )
        .await;
    }
    let (status, row) = cut_off.deploy(model_id, "archive", json!({})).await;
    assert!(status.is_success(), "{row}");
    assert_eq!(row["status"], "completed", "{row}");
}

/// Every deployment of `model`, by id, once all of `ids` ended; waits at
/// most `patience` (a hang guard).
async fn all_ended(
    berth: &Berth,
    model: i64,
    ids: &[i64],
    patience: Duration,
) -> BTreeMap<i64, Value> {
    let deadline = Instant::now() + patience;
    loop {
        let (status, list) = berth
            .get(&format!("/v1/models/{model}/deployments?limit=500"))
            .await;
        if status == StatusCode::OK {
            let rows: BTreeMap<i64, Value> = list["deployments"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| (row["id"].as_i64().unwrap(), row.clone()))
                .collect();
            if ids.iter().all(|id| rows.get(id).is_some_and(has_ended)) {
                return rows;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not every deployment ended within {patience:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each of `ids` ended exactly once in the event log, as its row says:
/// read from the start by a client resuming with `Last-Event-ID: 0`. The
/// ids of the deployment events read (what the webhook delivers).
async fn ended_once_each(berth: &Berth, rows: &BTreeMap<i64, Value>, ids: &[i64]) -> Vec<i64> {
    let mut log = berth.events_from("", Some(0)).await;
    let ends = |events: &[crate::support::events::Event], id: i64| -> Vec<String> {
        events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind.as_str(),
                    "deployment.completed" | "deployment.failed"
                ) && e.data["deploy_id"] == id
            })
            .map(|e| e.kind.clone())
            .collect()
    };
    let events = log
        .until(|events| ids.iter().all(|id| !ends(events, *id).is_empty()))
        .await;
    for id in ids {
        let ends = ends(events, *id);
        let status = rows[id]["status"].as_str().unwrap();
        assert_eq!(
            ends,
            [format!("deployment.{status}")],
            "deployment {id} ends once, as its row says: {}",
            rows[id]
        );
    }
    events
        .iter()
        .filter(|e| e.kind.starts_with("deployment."))
        .filter_map(|e| e.id)
        .collect()
}

/// What every server answers while the database is away: alive, not
/// ready, and a write refused with a 503 and a sentence, soon.
async fn answers_while_away(berths: &[Berth], files: &FileServer) {
    futures::future::join_all(berths.iter().map(|berth| answers_alone(berth, files))).await;
}

async fn answers_alone(berth: &Berth, files: &FileServer) {
    let (status, _) = berth.get("/healthz").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "/healthz answers while the database is away"
    );
    let (status, ready) = eventually(
        || "/readyz says the database is away".to_string(),
        async || {
            let (status, body) = berth.get("/readyz").await;
            (status == StatusCode::SERVICE_UNAVAILABLE).then_some((status, body))
        },
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(ready.to_string().contains("database"), "{ready}");
    let asked = Instant::now();
    let (status, refused) = berth
        .post(
            "/v1/models",
            &model(files, "job-away", &[("a.json", bytes(9, 10))]),
        )
        .await;
    let took = asked.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(error.contains("cannot reach its database"), "{error}");
    // A hang guard: the pool gives up within its connection wait.
    assert!(took < Duration::from_secs(20), "the write hung {took:?}");
}

/// How the database goes away.
#[derive(Clone, Copy, Debug)]
enum Restart {
    Fast,
    Kill9,
}

/// Two servers with a webhook, 16 deployments (12 in the background, 4
/// waited for), then the database away for 5 s, shorter than the fence (a
/// 30 s lease: stopped 24 s after the last renewal): every deployment
/// completes, each once, each sync client gets its row, and the webhook
/// delivers every event.
async fn a_restart_under_load_loses_nothing(how: Restart) {
    let files = FileServer::start().await;
    let pg = OwnPostgres::start().await;
    let shared = Shared::on(pg.url.clone());
    let receiver = Receiver::start(StatusCode::OK).await;
    let berths = servers(
        &shared,
        2,
        &[
            "--max-running",
            "3",
            "--lease-ms",
            "30000",
            "--webhook-url",
            &receiver.url,
        ],
    )
    .await;
    let model_id = berths[0]
        .register(&model(&files, "job-restart", &[("a.json", bytes(5, 300))]))
        .await;
    let sleep = json!({ "mode": "sleep", "ms": 1500 });
    let mut ids = Vec::new();
    for i in 0..12 {
        let row = berths[i % 2]
            .deploy_detached(model_id, "misbehave", sleep.clone())
            .await;
        ids.push(row["id"].as_i64().unwrap());
    }
    let mut waiting = Vec::new();
    for i in 0..4 {
        let url = format!("{}/v1/models/{model_id}/deployments", berths[i % 2].url);
        let client = berths[i % 2].client().clone();
        let body = json!({ "deployer": "misbehave", "options": sleep });
        waiting.push(tokio::spawn(async move {
            let answer = client.post(url).json(&body).send().await.unwrap();
            let status = answer.status();
            (status, answer.json::<Value>().await.unwrap())
        }));
    }
    // Every row recorded (a sync request whose row is not yet written when
    // the database goes is rightly answered 503), and some running.
    eventually(
        || "all 16 deployments recorded, and running on both servers".to_string(),
        async || {
            let (_, list) = berths[0]
                .get(&format!("/v1/models/{model_id}/deployments?limit=500"))
                .await;
            let rows = list["deployments"].as_array()?;
            let running = rows.iter().filter(|r| r["status"] == "running").count();
            (rows.len() >= 16 && running >= 4).then_some(())
        },
    )
    .await;

    let away = Instant::now();
    match how {
        Restart::Fast => pg.stop().await,
        Restart::Kill9 => pg.kill().await,
    }
    answers_while_away(&berths, &files).await;
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(away.elapsed())).await;
    pg.restart().await;
    let back = Instant::now();

    for waited in waiting {
        let (status, row) = waited.await.unwrap();
        assert_eq!(
            status,
            StatusCode::OK,
            "{how:?}: a sync client gets its row: {row}"
        );
        assert_eq!(row["status"], "completed", "{row}");
        ids.push(row["id"].as_i64().unwrap());
    }
    let rows = all_ended(&berths[1], model_id, &ids, Duration::from_secs(90)).await;
    eprintln!(
        "{how:?}: database away {:?}; all {} deployments ended {:?} after it came back",
        back - away,
        ids.len(),
        back.elapsed()
    );
    for id in &ids {
        assert_eq!(
            rows[id]["status"], "completed",
            "{how:?}: nothing lost: {}",
            rows[id]
        );
    }
    let logged = ended_once_each(&berths[0], &rows, &ids).await;
    // The webhook delivered every event of the log, through the outage.
    let delivered = eventually(
        || "the webhook delivers every event".to_string(),
        async || {
            let taken: std::collections::BTreeSet<i64> =
                receiver.taken().iter().map(|(id, _, _)| *id).collect();
            logged
                .iter()
                .all(|id| taken.contains(id))
                .then_some(taken.len())
        },
    )
    .await;
    assert!(delivered >= logged.len());
    // Ran once: each one's output is on the server its row names, and on
    // no other.
    for id in &ids {
        let holders: Vec<String> = berths
            .iter()
            .filter(|b| b.data_dir().join("out").join(id.to_string()).exists())
            .map(Berth::server_id)
            .collect();
        assert!(
            holders.iter().all(|h| rows[id]["server"] == h.as_str()),
            "deployment {id} ran on {holders:?}: {}",
            rows[id]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_fast_restart_under_load_loses_nothing_and_runs_nothing_twice() {
    a_restart_under_load_loses_nothing(Restart::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_killed_and_restarted_under_load_loses_nothing_and_runs_nothing_twice() {
    a_restart_under_load_loses_nothing(Restart::Kill9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_fence_fails_what_ran_naming_it_and_runs_the_queue_after() {
    let files = FileServer::start().await;
    let pg = OwnPostgres::start().await;
    let shared = Shared::on(pg.url.clone());
    let lease = LEASE_MS.to_string();
    let berth = &servers(&shared, 1, &["--max-running", "2", "--lease-ms", &lease]).await[0];
    let model_id = berth
        .register(&model(&files, "job-long", &[("a.json", bytes(6, 300))]))
        .await;
    let mut running = Vec::new();
    for _ in 0..2 {
        let row = berth
            .deploy_detached(
                model_id,
                "misbehave",
                json!({ "mode": "sleep", "ms": 600_000 }),
            )
            .await;
        running.push(row["id"].as_i64().unwrap());
    }
    let mut queued = Vec::new();
    for _ in 0..2 {
        let row = berth
            .deploy_detached(model_id, "misbehave", json!({ "mode": "sleep", "ms": 100 }))
            .await;
        assert_eq!(row["status"], "queued", "{row}");
        queued.push(row["id"].as_i64().unwrap());
    }
    pg.stop().await;
    // Three leases: the fence goes up at 4/5 of one.
    tokio::time::sleep(Duration::from_millis(3 * LEASE_MS)).await;
    pg.restart().await;

    let ids: Vec<i64> = running.iter().chain(&queued).copied().collect();
    let rows = all_ended(berth, model_id, &ids, Duration::from_secs(60)).await;
    for id in &running {
        let row = &rows[id];
        assert_eq!(row["status"], "failed", "{row}");
        let error = row["error"].as_str().unwrap();
        assert!(
            error.contains("could not reach") && error.contains("database"),
            "the error names the outage: {error}"
        );
    }
    for id in &queued {
        assert_eq!(
            rows[id]["status"], "completed",
            "queued work runs after: {}",
            rows[id]
        );
    }
    ended_once_each(berth, &rows, &ids).await;
}
