//! Faults between berth and PostgreSQL: a server cut off from the
//! database while another is not. The cut-off server stops its own
//! deployments before its lease can run out (fencing by time), the other
//! ends them once the lease has run out, and nothing runs on two servers
//! at once. The cut is a loopback proxy between one server and a real
//! PostgreSQL server: the network fails, not the database.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::server::{Backend, Berth, Shared};
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
    let start = |shared: &Shared| {
        args.iter()
            .fold(Berth::options(Backend::Postgres).shared(shared), |o, a| {
                o.arg(a)
            })
            .start()
    };
    let cut_off = start(&through_proxy).await;
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
    let other = start(&shared).await;

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
        async || logged_at(&cut_off.log(), "stopping its 2 running deployments"),
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
