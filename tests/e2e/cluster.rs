//! Several `berth serve` processes on one PostgreSQL database, one models
//! volume and one plugins folder, acting as one service: every deployment
//! runs exactly once on a server with room, a killed server's deployments
//! fail by lease, a cancel reaches the owner from any server, a
//! deployment runs only where its deployer's version is loaded, and a
//! deployer pushed to one server is served by all.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::catalog::{push, served};
use crate::support::files::FileServer;
use crate::support::plugins;
use berth::db::Db;

use crate::support::server::{Backend, Berth, Shared, fresh_postgres_database, servers};
use crate::support::{adapter_files, bytes, eventually, has_ended, model, most_at_once};

/// Short enough that a test sees a lease run out; a tick is a third.
const LEASE_MS: u64 = 1500;

/// Every row of every model, by id.
async fn rows(berth: &Berth, models: &[i64]) -> BTreeMap<i64, Value> {
    let mut all = BTreeMap::new();
    for model in models {
        let (status, list) = berth
            .get(&format!("/v1/models/{model}/deployments?limit=500"))
            .await;
        assert_eq!(status, StatusCode::OK, "{list}");
        for row in list["deployments"].as_array().unwrap() {
            all.insert(row["id"].as_i64().unwrap(), row.clone());
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_deployments_over_three_servers_each_run_once() {
    const MAX_RUNNING: usize = 3;
    let files = FileServer::start().await;
    let shared = Shared::new().await;
    let max = MAX_RUNNING.to_string();
    let berths = servers(&shared, 3, &["--max-running", &max]).await;
    let mut models = Vec::new();
    for m in 0..5u64 {
        let job = format!("job-cluster-{m}");
        let contents = [
            ("adapter_config.json", bytes(m, 300)),
            ("adapter_model.safetensors", bytes(m + 100, 256 * 1024)),
        ];
        models.push(berths[0].register(&model(&files, &job, &contents)).await);
    }

    let mut asked = Vec::new();
    for i in 0..200 {
        let berth = &berths[i % 3];
        let model_id = models[i % 5];
        let (deployer, options) = match i % 2 {
            0 => ("archive", json!({})),
            _ => ("misbehave", json!({ "mode": "sleep", "ms": 20 })),
        };
        let queued = berth.deploy_detached(model_id, deployer, options).await;
        asked.push(queued["id"].as_i64().unwrap());
    }
    let done = eventually(
        || "all 200 deployments end".to_string(),
        async || {
            let all = rows(&berths[1], &models).await;
            (all.len() == 200 && all.values().all(has_ended)).then_some(all)
        },
    )
    .await;
    assert_eq!(
        done.keys().copied().collect::<BTreeSet<_>>(),
        asked.iter().copied().collect::<BTreeSet<_>>()
    );
    let failed: Vec<&Value> = done
        .values()
        .filter(|r| r["status"] != "completed")
        .collect();
    assert!(failed.is_empty(), "every deployment completes: {failed:?}");

    // From the deployers' side: each deployment's output exists under
    // exactly one server's out-dirs, the one its row names.
    let ids: Vec<String> = berths.iter().map(Berth::server_id).collect();
    for (id, row) in &done {
        let holders: Vec<&String> = berths
            .iter()
            .zip(&ids)
            .filter(|(b, _)| b.data_dir().join("out").join(id.to_string()).is_dir())
            .map(|(_, server)| server)
            .collect();
        assert_eq!(
            holders,
            [row["server"].as_str().unwrap()],
            "deployment {id}: {row}"
        );
        let out = berths[ids.iter().position(|s| *s == row["server"]).unwrap()]
            .data_dir()
            .join("out")
            .join(id.to_string());
        let written = std::fs::read_dir(&out).unwrap().count();
        assert_eq!(written, 1, "one output file in {}", out.display());
    }
    // Every model file crossed the network once, for all three servers.
    for m in 0..5 {
        let job = format!("job-cluster-{m}");
        for path in ["adapter_config.json", "adapter_model.safetensors"] {
            assert_eq!(files.hits(&job, path), 1, "{job}/{path}");
        }
    }
    for server in &ids {
        let mine: Vec<&Value> = done.values().filter(|r| r["server"] == *server).collect();
        assert!(!mine.is_empty(), "server {server} took part");
        let most = most_at_once(mine.into_iter());
        assert!(
            most <= MAX_RUNNING,
            "server {server} ran {most} at once, more than --max-running {MAX_RUNNING}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_servers_deployments_fail_by_lease_and_a_cancel_reaches_any_owner() {
    let files = FileServer::start().await;
    let shared = Shared::new().await;
    let lease = LEASE_MS.to_string();
    let mut berths = servers(&shared, 3, &["--max-running", "2", "--lease-ms", &lease]).await;
    let contents = [("adapter_config.json", bytes(7, 300))];
    let model_id = berths[0]
        .register(&model(&files, "job-lease", &contents))
        .await;
    let sleep = json!({ "mode": "sleep", "ms": 600_000 });
    let mut asked = Vec::new();
    for i in 0..6 {
        let queued = berths[i % 3]
            .deploy_detached(model_id, "misbehave", sleep.clone())
            .await;
        asked.push(queued["id"].as_i64().unwrap());
    }
    // Two each: every server is full.
    let running = eventually(
        || "all six deployments run".to_string(),
        async || {
            let all = rows(&berths[0], &[model_id]).await;
            all.values()
                .all(|r| r["status"] == "running" && r["phase"] == "deploying")
                .then_some(all)
        },
    )
    .await;
    let victim_id = berths[2].server_id();
    let victims: Vec<i64> = running
        .iter()
        .filter(|(_, r)| r["server"] == victim_id.as_str())
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(victims.len(), 2, "{running:?}");

    let port = berths[2].url.rsplit(':').next().unwrap().to_string();
    let killed = Instant::now();
    berths[2].kill9();
    for id in &victims {
        let row = eventually(
            || format!("deployment {id} of the killed server fails"),
            async || {
                let (_, row) = berths[0].get(&format!("/v1/deployments/{id}")).await;
                has_ended(&row).then_some(row)
            },
        )
        .await;
        assert_eq!(row["status"], "failed", "{row}");
        let error = row["error"].as_str().unwrap();
        assert!(
            error.starts_with("lost while deploying: berth server ")
                && error.contains(&format!(":{port} ({victim_id})")),
            "the error names the lost server and the phase: {error}"
        );
    }
    // A lease plus a tick, with room for a loaded machine.
    let took = killed.elapsed();
    assert!(
        took < Duration::from_millis(LEASE_MS * 4 / 3) + Duration::from_secs(8),
        "the lost deployments failed {took:?} after the kill"
    );

    // A cancel sent to a server that does not own the deployment.
    let (owner_of, others): (Vec<i64>, Vec<i64>) = running
        .iter()
        .filter(|(id, _)| !victims.contains(id))
        .map(|(id, _)| *id)
        .partition(|id| running[id]["server"] == berths[0].server_id().as_str());
    for (id, via) in owner_of
        .iter()
        .map(|id| (id, &berths[1]))
        .chain(others.iter().map(|id| (id, &berths[0])))
    {
        assert_ne!(running[id]["server"], via.server_id().as_str());
        let (status, row) = via
            .post(&format!("/v1/deployments/{id}/cancel"), &json!({}))
            .await;
        assert_eq!(status, StatusCode::OK, "the owner stopped it: {row}");
        assert_eq!(row["status"], "failed", "{row}");
        assert_eq!(row["error"], "cancelled", "{row}");
    }

    // The survivors carry on.
    let (status, row) = berths[1].deploy(model_id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{row}");
    assert_ne!(row["server"], victim_id.as_str());
}

/// Servers mid-rollout: two have deployer `extra` at one version, the
/// third has another `extra` and never runs the first's deployments. A
/// deployment of a version no live server has fails after the queue
/// timeout, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_runs_only_where_its_deployer_version_is_loaded() {
    let files = FileServer::start().await;
    let shared = Shared::new().await;
    let lease = LEASE_MS.to_string();
    let args = [
        "--lease-ms",
        &lease,
        "--queue-timeout-s",
        "1",
        "--max-running",
        "1",
    ];
    let (archive, misbehave) = (
        plugins::example("archive"),
        plugins::test_plugin("misbehave"),
    );
    let mut berths = Vec::new();
    for (extra, sleepy) in [(&archive, true), (&archive, false), (&misbehave, false)] {
        let mut options = Berth::bare(Backend::Postgres)
            .shared(&shared)
            .own_plugins()
            .plugin("extra", extra.clone());
        if sleepy {
            options = options.plugin("sleepy", misbehave.clone());
        }
        berths.push(args.iter().fold(options, |o, a| o.arg(a)).start().await);
    }
    let contents = [("adapter_config.json", bytes(9, 300))];
    let model_id = berths[0]
        .register(&model(&files, "job-rollout", &contents))
        .await;
    for _ in 0..12 {
        berths[0]
            .deploy_detached(model_id, "extra", json!({}))
            .await;
    }
    let done = eventually(
        || "the twelve deployments end".to_string(),
        async || {
            let all = rows(&berths[2], &[model_id]).await;
            all.values().all(has_ended).then_some(all)
        },
    )
    .await;
    let third = berths[2].server_id();
    for row in done.values() {
        assert_eq!(row["status"], "completed", "{row}");
        assert_ne!(
            row["server"],
            third.as_str(),
            "ran on the other version: {row}"
        );
    }

    // Only the first server has that version now; it is busy, then lost
    // with one of them queued.
    berths[1].terminate();
    let busy = berths[0]
        .deploy_detached(
            model_id,
            "sleepy",
            json!({ "mode": "sleep", "ms": 600_000 }),
        )
        .await;
    let busy_path = format!("/v1/deployments/{}", busy["id"]);
    eventually(
        || "the first server is busy".to_string(),
        async || {
            let (_, row) = berths[0].get(&busy_path).await;
            (row["phase"] == "deploying").then_some(())
        },
    )
    .await;
    let stranded = berths[0]
        .deploy_detached(model_id, "extra", json!({}))
        .await;
    berths[0].kill9();
    let path = format!("/v1/deployments/{}", stranded["id"]);
    let row = eventually(
        || "the deployment nobody can run fails".to_string(),
        async || {
            let (_, row) = berths[2].get(&path).await;
            has_ended(&row).then_some(row)
        },
    )
    .await;
    assert_eq!(row["status"], "failed", "{row}");
    assert_eq!(row["server"], Value::Null, "it never ran: {row}");
    let error = row["error"].as_str().unwrap();
    assert!(
        error.starts_with("no berth server could run it: none has deployer extra at sha256 ")
            && error.contains(stranded["plugin_sha256"].as_str().unwrap())
            && error.contains("--queue-timeout-s"),
        "{error}"
    );
    let busy = eventually(
        || "the running deployment of the lost server fails".to_string(),
        async || {
            let (_, row) = berths[2].get(&busy_path).await;
            has_ended(&row).then_some(row)
        },
    )
    .await;
    assert!(
        busy["error"]
            .as_str()
            .unwrap()
            .starts_with("lost while deploying"),
        "{busy}"
    );
}

/// The lock that keeps servers on several machines from filling one
/// model directory at once: one holder per key, released on drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_lock_has_one_holder_at_a_time() {
    let url = fresh_postgres_database().await;
    let (a, b) = (
        Db::connect(&url).await.unwrap(),
        Db::connect(&url).await.unwrap(),
    );
    let held = a.advisory_lock("job-1").await.unwrap();
    let other = b.advisory_lock("job-2").await;
    assert!(other.is_ok(), "another key is free");
    let waiter = tokio::spawn(async move { b.advisory_lock("job-1").await.map(drop) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "a second holder waits");
    drop(held);
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the lock is free once its guard is dropped")
        .unwrap()
        .unwrap();
}

/// A deployer pushed to one server is served by the others without a
/// restart, as are its next version, a rollback and its removal; each
/// server compiles a version once, into its own cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployer_pushed_to_one_server_is_served_by_the_others() {
    let files = FileServer::start().await;
    let shared = Shared::new().await;
    let mut berths = Vec::new();
    for _ in 0..2 {
        // No folder plugins: the pushed bytes are new to both caches.
        let options = Berth::bare(Backend::Postgres).shared(&shared);
        berths.push(options.private_cache().start().await);
    }
    let id = berths[0]
        .register(&model(&files, "job-pushed", &adapter_files()))
        .await;
    let misbehave = std::fs::read(plugins::test_plugin("misbehave")).unwrap();
    let archive = std::fs::read(plugins::example("archive")).unwrap();

    let (status, pushed) = push(&berths[0], "pushed", &[("wasm", &misbehave)]).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    serving(&berths[1], |d| d.is_some_and(|d| d["version"] == 1)).await;
    let (status, ran) = berths[1]
        .deploy(id, "pushed", json!({ "mode": "sleep", "ms": 10 }))
        .await;
    assert_eq!(status, StatusCode::OK, "{ran}");
    assert_eq!(ran["server"], berths[1].server_id().as_str(), "{ran}");
    assert_eq!(ran["plugin_sha256"], pushed["sha256"], "{ran}");

    let (status, _) = push(&berths[0], "pushed", &[("wasm", &archive)]).await;
    assert_eq!(status, StatusCode::OK);
    serving(&berths[1], |d| d.is_some_and(|d| d["version"] == 2)).await;
    let (status, back) = berths[1]
        .post("/v1/deployers/pushed/rollback", &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{back}");
    serving(&berths[0], |d| d.is_some_and(|d| d["version"] == 1)).await;
    let (status, _) = berths[1].delete("/v1/deployers/pushed").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    serving(&berths[0], |d| d.is_none()).await;

    // Server 1 loaded versions 1 and 2 from the database, compiling each
    // once; server 0 took both from the pushes it checked itself.
    let log = berths[1].log();
    let origins: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("deployer stored over the API") && l.contains("plugin=pushed"))
        .map(|l| l.rsplit("origin=").next().unwrap())
        .collect();
    // v1 and v2 from the database, then v1 again for the rollback.
    assert_eq!(origins, ["Compiled", "Compiled", "Cached"], "{log}");
}

/// Waits until `berth` serves deployer `pushed` as `condition` wants.
async fn serving(berth: &Berth, condition: impl Fn(Option<&Value>) -> bool) {
    eventually(
        || {
            format!(
                "deployer pushed to change on {}; log:\n{}",
                berth.url,
                berth.log()
            )
        },
        async || {
            let (_, listing) = berth.get("/v1/deployers").await;
            condition(served(&listing, "pushed")).then_some(())
        },
    )
    .await
}
