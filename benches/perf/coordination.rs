//! Benchmark 12's coordination cost as counts, which this machine's two
//! cores cannot distort the way they distort its times: per deployment,
//! the PostgreSQL round trips and commits of each path a deployment takes
//! among servers sharing a database, counted on the wire by `pgwire`'s
//! proxy (nothing is counted inside berth). The paths, each taken by
//! `PER_PATH` deployments one after the other:
//! - taken at insert: a synchronous deployment on a server with room;
//! - queued then claimed: posted with `?wait=false` to a server that is
//!   full, claimed by the other server, woken by the NOTIFY;
//! - cancelled elsewhere: running on one server, cancelled through the
//!   other, which records the cancel; the first stops it and records it.
//!
//! Each figure covers the deployment from its POST until the records hold
//! its end. What idle servers do (heartbeats, lease renewals) is counted
//! alone first and taken off in proportion to each path's time.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, Row};

use crate::Ctx;
use crate::api::Server;
use crate::data::DataFile;
use crate::deploys::fresh_database;
use crate::pgwire::{Counted, Proxy};
use crate::report::Table;

const PER_PATH: usize = 20;
/// Holds a slot until cancelled.
const SLEEP: &str = r#"{"mode":"sleep","ms":600000}"#;
const NO_OP: &str = r#"{"mode":"ok"}"#;
/// How long idle servers are counted for.
const IDLE: Duration = Duration::from_secs(5);

/// Counts per deployment: `model` (already on the source) deployed on two
/// servers sharing a fresh database behind the proxy.
pub async fn counts(ctx: &Ctx, admin: &str, tiny: &[DataFile]) -> anyhow::Result<Table> {
    let (database, url) = fresh_database(admin, "coordination").await?;
    let proxy = Proxy::start(&url).await?;
    let through = proxy.url(&url)?;
    let models = ctx.out_dir.join("coordination-models");
    let models = models.display().to_string();
    let start = |name: &str, max_running: &str| {
        let args = [
            "--metrics",
            "off",
            "--database-url",
            &through,
            "--models-dir",
            &models,
            "--max-running",
            max_running,
        ];
        Server::start_binary(ctx, ctx.newest(), name, &args, None, None)
    };
    // `full` runs one deployment at a time, `roomy` several.
    let full = start("coordination-full", "1")?;
    let roomy = start("coordination-roomy", "4")?;
    let model_id = full.register(ctx, "tiny-cluster", tiny).await?;
    // Fetched, and every statement prepared once, before anything counts.
    full.deploy(model_id).await?;
    roomy.deploy(model_id).await?;
    let mut records = PgConnection::connect(&url).await?;

    let before = proxy.counted();
    tokio::time::sleep(IDLE).await;
    let idle = per_second(proxy.counted() - before, IDLE);

    let mut taken = Path::default();
    for _ in 0..PER_PATH {
        taken
            .time(&proxy, || async {
                let id = post(&roomy, model_id, NO_OP, true).await?;
                ended(&mut records, id).await
            })
            .await?;
    }

    let holder = post(&full, model_id, SLEEP, false).await?;
    let mut claimed = Path::default();
    for _ in 0..PER_PATH {
        claimed
            .time(&proxy, || async {
                let id = post(&full, model_id, NO_OP, false).await?;
                ended(&mut records, id).await
            })
            .await?;
    }
    let servers: i64 = sqlx::query(
        "SELECT COUNT(DISTINCT server_id) FROM deployments WHERE status = 'completed' \
         AND id > $1",
    )
    .bind(holder)
    .fetch_one(&mut records)
    .await?
    .try_get(0)?;
    ensure!(
        servers == 1,
        "the queued deployments were not all claimed by the server with room"
    );
    cancel(&roomy, holder).await?;
    ended(&mut records, holder).await?;

    let mut cancelled = Path::default();
    for _ in 0..PER_PATH {
        cancelled
            .time(&proxy, || async {
                let id = post(&full, model_id, SLEEP, false).await?;
                running(&mut records, id).await?;
                cancel(&roomy, id).await?;
                ended(&mut records, id).await
            })
            .await?;
    }

    drop((full, roomy));
    drop(records);
    let mut conn = PgConnection::connect(admin).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    let _ = std::fs::remove_dir_all(&models);

    let mut table = Table::new(&format!(
        "12b. PostgreSQL round trips and commits per deployment, by path, two servers \
         (counted on the wire; {PER_PATH} deployments a path, one at a time; idle servers' \
         own traffic taken off)"
    ));
    table.row(
        "idle, both servers (heartbeats, lease renewals)",
        format!("{:.1} round trips/s · {:.1} commits/s", idle.0, idle.1),
        "taken off below".into(),
    );
    for (path, measured) in [
        ("taken at insert (synchronous, a server with room)", &taken),
        ("queued on a full server, claimed by the other", &claimed),
        (
            "running on one server, cancelled through the other",
            &cancelled,
        ),
    ] {
        let (round_trips, commits) = measured.per_deployment(idle);
        table.row(
            path,
            format!("{round_trips:.1} round trips · {commits:.1} commits"),
            format!(
                "over {:.0} ms a deployment",
                1e3 * measured.seconds / PER_PATH as f64
            ),
        );
    }
    Ok(table)
}

/// What one path's deployments were counted at, and their time.
#[derive(Default)]
struct Path {
    counted: Counted,
    seconds: f64,
}

impl Path {
    async fn time<F, Fut>(&mut self, proxy: &Proxy, deployment: F) -> anyhow::Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let (before, started) = (proxy.counted(), Instant::now());
        deployment().await?;
        let counted = proxy.counted() - before;
        self.seconds += started.elapsed().as_secs_f64();
        self.counted.round_trips += counted.round_trips;
        self.counted.commits += counted.commits;
        Ok(())
    }

    /// Round trips and commits a deployment, less what idle servers did
    /// in the same time.
    fn per_deployment(&self, idle: (f64, f64)) -> (f64, f64) {
        let n = PER_PATH as f64;
        (
            (self.counted.round_trips as f64 - idle.0 * self.seconds).max(0.0) / n,
            (self.counted.commits as f64 - idle.1 * self.seconds).max(0.0) / n,
        )
    }
}

fn per_second(counted: Counted, over: Duration) -> (f64, f64) {
    let seconds = over.as_secs_f64();
    (
        counted.round_trips as f64 / seconds,
        counted.commits as f64 / seconds,
    )
}

/// Posts a deployment of misbehave with `options`; its id.
async fn post(server: &Server, model_id: i64, options: &str, wait: bool) -> anyhow::Result<i64> {
    let options: Value = serde_json::from_str(options)?;
    let response = server
        .client
        .post(format!(
            "{}/v1/models/{model_id}/deployments?wait={wait}",
            server.url
        ))
        .json(&json!({ "deployer": "misbehave", "options": options }))
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or_default();
    ensure!(status.is_success(), "posting a deployment: {status} {body}");
    body["id"].as_i64().context("a deployment without an id")
}

async fn cancel(server: &Server, id: i64) -> anyhow::Result<()> {
    let response = server
        .client
        .post(format!("{}/v1/deployments/{id}/cancel", server.url))
        .send()
        .await?;
    ensure!(
        response.status().is_success(),
        "cancelling deployment {id}: {}",
        response.text().await?
    );
    Ok(())
}

/// Waits until deployment `id`'s status is one of `statuses`, reading the
/// records directly (not through the proxy, so it is not counted).
async fn until(records: &mut PgConnection, id: i64, statuses: &[&str]) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let status: String = sqlx::query("SELECT status FROM deployments WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *records)
            .await?
            .try_get(0)?;
        if statuses.contains(&status.as_str()) {
            return Ok(());
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "deployment {id} is still {status} after a minute"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn ended(records: &mut PgConnection, id: i64) -> anyhow::Result<()> {
    until(records, id, &["completed", "failed"]).await
}

async fn running(records: &mut PgConnection, id: i64) -> anyhow::Result<()> {
    until(records, id, &["running"]).await
}
