//! Benchmark 12: servers sharing one PostgreSQL (the first `--pg`). The
//! same no-op deployments of a fetched model, posted with `?wait=false`
//! at 16 in flight round-robin to servers that run at most 4 at once, so
//! most wait in the queue: on one server against three, deployments
//! started per second (taken at the insert or claimed from the queue)
//! and queue-to-start latency (`started_at - created_at` of every row),
//! and the events per second an SSE subscriber receives through the
//! stored log, on the server that ran them (one server) against another
//! server (three: the subscriber's server runs a third of the work).
//! Then the database round trips and commits of each path a deployment
//! takes among servers (`coordination`): counts, where this machine's
//! CPU-bound times say little.

use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use futures::StreamExt;
use sqlx::{Connection, Row};

use crate::Ctx;
use crate::api::{Server, load_at};
use crate::deploys::fresh_database;
use crate::fetch::files;
use crate::report::{Table, median, percentile, secs};

/// Deployments a server runs at once: fewer than in flight, so they queue.
const MAX_RUNNING: &str = "4";

/// What one configuration measured, over the rounds.
#[derive(Default)]
struct Figures {
    claims: Vec<f64>,
    /// The share of deployments that went through the queue.
    queued: Vec<f64>,
    waits: Vec<f64>,
    refills: Vec<f64>,
    events: Vec<f64>,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let Some((_, admin)) = ctx.pg.first() else {
        println!("12. several servers: skipped, it needs a PostgreSQL server (--pg LABEL=URL)");
        return Ok(());
    };
    let tiny = files(ctx, "tiny-cluster", &[("config.json".into(), 4096)], 11)?;
    let total = ctx.calls / 4;
    let mut figures = [Figures::default(), Figures::default()];
    for round in 0..ctx.rounds {
        for (at, count) in [1usize, 3].into_iter().enumerate() {
            let name = format!("cluster-{count}-{round}");
            let (database, url) = fresh_database(admin, &name).await?;
            let models = ctx.out_dir.join(format!("{name}-models"));
            let models = models.display().to_string();
            let mut servers = Vec::new();
            for i in 0..count {
                let args = [
                    "--metrics",
                    "off",
                    "--database-url",
                    &url,
                    "--models-dir",
                    &models,
                    "--max-running",
                    MAX_RUNNING,
                ];
                let bin = ctx.newest();
                servers.push(Server::start_binary(
                    ctx,
                    bin,
                    &format!("{name}-{i}"),
                    &args,
                    None,
                    None,
                )?);
            }
            let model_id = servers[0].register(ctx, "tiny-cluster", &tiny).await?;
            servers[0].deploy(model_id).await?;
            let first_id = last_id(&url).await?;

            let subscriber = servers.last().expect("a server");
            let events = tokio::spawn(receive(
                subscriber.client.clone(),
                subscriber.url.clone(),
                total,
            ));
            // Subscribed before the first deployment is queued.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let next = std::sync::atomic::AtomicUsize::new(0);
            load_at(total, 16, || {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                servers[k % count].deploy_detached(model_id)
            })
            .await?;
            let rate = tokio::time::timeout(Duration::from_secs(300), events)
                .await
                .context("the subscriber did not see every deployment end within 5 minutes")???;
            let measured = claims(&url, first_id).await?;
            figures[at].claims.push(measured.rate);
            figures[at].queued.push(measured.queued);
            figures[at].waits.extend(measured.waits);
            figures[at].refills.extend(measured.refills);
            figures[at].events.push(rate);
            drop(servers);
            let mut conn = sqlx::PgConnection::connect(admin).await?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
                .execute(&mut conn)
                .await?;
            let _ = std::fs::remove_dir_all(&models);
        }
    }

    let mut table = Table::new(&format!(
        "12. Several servers on one PostgreSQL: {total} no-op deployments with ?wait=false, \
         16 in flight round-robin, --max-running {MAX_RUNNING}, median of {} rounds",
        ctx.rounds
    ));
    let [one, three] = &figures;
    let line = |f: &Figures| {
        format!(
            "{:.0} started/s ({:.0}% from the queue) · queue-to-start p50 {} · p99 {} · \
             a freed slot refilled p50 {} · p99 {}",
            median(&f.claims),
            100.0 * median(&f.queued),
            secs(median(&f.waits)),
            secs(percentile(&f.waits, 99.0)),
            secs(median(&f.refills)),
            secs(percentile(&f.refills, 99.0)),
        )
    };
    table.row("1 server", line(one), "baseline".into());
    table.row(
        "3 servers",
        line(three),
        format!(
            "{:.2}× one server's started/s",
            median(&three.claims) / median(&one.claims)
        ),
    );
    table.row(
        "events to an SSE subscriber on the server that ran them (1 server)",
        format!("{:.0} events/s", median(&one.events)),
        "baseline".into(),
    );
    table.row(
        "events to an SSE subscriber on another server (3 servers)",
        format!("{:.0} events/s", median(&three.events)),
        format!(
            "{:.2}× the same server's",
            median(&three.events) / median(&one.events)
        ),
    );
    table.print();
    crate::coordination::counts(ctx, admin, &tiny)
        .await?
        .print();
    Ok(())
}

/// The newest deployment's id so far.
async fn last_id(url: &str) -> anyhow::Result<i64> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let row = sqlx::query("SELECT COALESCE(MAX(id), 0) FROM deployments")
        .fetch_one(&mut conn)
        .await?;
    Ok(row.try_get(0)?)
}

/// What the rows of one run say.
struct Measured {
    /// Starts per second, over the span of the starts.
    rate: f64,
    /// The share claimed from the queue: a deployment taken at its insert
    /// starts at its creation's very millisecond.
    queued: f64,
    /// Each row's queue-to-start time.
    waits: Vec<f64>,
    /// Each queued row's time from the moment a slot of its server was
    /// free for it (the end before its start, or its creation if later)
    /// to its start: how fast the queue refills a freed slot.
    refills: Vec<f64>,
}

async fn claims(url: &str, first_id: i64) -> anyhow::Result<Measured> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let rows = sqlx::query(
        "SELECT server_id, created_at, started_at, completed_at FROM deployments WHERE id > $1",
    )
    .bind(first_id)
    .fetch_all(&mut conn)
    .await?;
    let mut parsed = Vec::new();
    for row in &rows {
        let at = |column: &str| -> anyhow::Result<SystemTime> {
            let text: Option<String> = row.try_get(column)?;
            let text = text.with_context(|| format!("a deployment without {column}"))?;
            Ok(humantime::parse_rfc3339(&text)?)
        };
        let server: String = row.try_get("server_id")?;
        parsed.push((
            server,
            at("created_at")?,
            at("started_at")?,
            at("completed_at")?,
        ));
    }
    let seconds = |later: SystemTime, earlier: SystemTime| {
        later
            .duration_since(earlier)
            .unwrap_or_default()
            .as_secs_f64()
    };
    let waits: Vec<f64> = parsed.iter().map(|(_, c, s, _)| seconds(*s, *c)).collect();
    let mut refills = Vec::new();
    for (server, created, started, _) in parsed.iter().filter(|(_, c, s, _)| s > c) {
        let freed = parsed
            .iter()
            .filter(|(other, _, _, ended)| other == server && ended <= started)
            .map(|(_, _, _, ended)| *ended)
            .max()
            .map_or(*created, |ended| ended.max(*created));
        refills.push(seconds(*started, freed));
    }
    let first = parsed.iter().map(|(_, _, s, _)| *s).min();
    let last = parsed.iter().map(|(_, _, s, _)| *s).max();
    let span = match (first, last) {
        (Some(first), Some(last)) => seconds(last, first),
        _ => 0.0,
    };
    Ok(Measured {
        rate: parsed.len() as f64 / span.max(1e-3),
        queued: refills.len() as f64 / parsed.len().max(1) as f64,
        waits,
        refills,
    })
}

/// Follows `/v1/events` until `total` deployments completed; returns the
/// events per second it received, from its first event to its last.
async fn receive(client: reqwest::Client, url: String, total: usize) -> anyhow::Result<f64> {
    let response = client.get(format!("{url}/v1/events")).send().await?;
    let mut body = response.bytes_stream();
    let (mut events, mut completed, mut first) = (0usize, 0usize, None::<Instant>);
    let mut pending = Vec::new();
    while completed < total {
        let chunk = body
            .next()
            .await
            .context("the event stream ended early")??;
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Some(kind) = line.strip_prefix(b"event: ") {
                first.get_or_insert_with(Instant::now);
                events += 1;
                if kind.starts_with(b"deployment.completed") {
                    completed += 1;
                }
            }
        }
    }
    let took = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
    Ok(events as f64 / took.max(1e-3))
}
