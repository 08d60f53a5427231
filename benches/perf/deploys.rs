//! Benchmark 4c: synchronous no-op deployments of an already-fetched model
//! through the HTTP API at 1, 16 and 100 in flight, on SQLite and on each
//! PostgreSQL given with `--pg LABEL=URL`, for every build given with
//! `--berth LABEL=PATH` (a before and an after), the servers taking turns in
//! every round. Beside them, measured in the same run: `GET /healthz` at 16
//! in flight (the HTTP floor) and the disk's synced-commit bound, single-row
//! SQLite WAL commits with berth's settings (`synchronous` at its default,
//! FULL) in a loop, alone; and the same with 16 rows a commit, what grouping
//! commits could reach. Each row has the server's CPU a deployment; on
//! PostgreSQL also the database's (its processes on this machine), which
//! shares the same cores.

use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::Connection;

use crate::Ctx;
use crate::api::{Server, load_at};
use crate::fetch::files;
use crate::report::{Table, cpu_of, median, percentile, secs};

/// How long each commit-bound loop runs.
const COMMIT_LOOP: Duration = Duration::from_secs(3);

/// One server under test: a build on a backend.
struct Subject {
    label: String,
    server: Server,
    model_id: i64,
    /// What each concurrency measured, over the rounds.
    rounds: Vec<Rounds>,
    /// A PostgreSQL database made for this server, dropped at the end:
    /// the admin URL, and the database's name and URL.
    database: Option<(String, (String, String))>,
}

#[derive(Default)]
struct Rounds {
    rates: Vec<f64>,
    latencies: Vec<f64>,
    /// The server's CPU seconds per request.
    cpu: Vec<f64>,
    /// The disks' flush requests per request (see `syncs`).
    flushes: Vec<f64>,
    /// On PostgreSQL, the CPU seconds per request of every `postgres`
    /// process on this machine (see `database_cpu`).
    database_cpu: Vec<f64>,
}

impl Rounds {
    fn figure(&self) -> String {
        format!(
            "{:.0}/s · p50 {} · p99 {} · CPU {:.2} ms/deploy · {:.1} flushes/deploy",
            median(&self.rates),
            secs(median(&self.latencies)),
            secs(percentile(&self.latencies, 99.0)),
            median(&self.cpu) * 1e3,
            median(&self.flushes),
        ) + &match self.database_cpu.is_empty() {
            true => String::new(),
            false => format!(
                " · database CPU {:.2} ms/deploy",
                median(&self.database_cpu) * 1e3
            ),
        }
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let tiny = files(ctx, "tiny", &[("config.json".into(), 4096)], 7)?;
    let mut subjects = Vec::new();
    for (build, bin) in &ctx.builds {
        let mut backends = vec![("SQLite".to_string(), None)];
        for (label, url) in &ctx.pg {
            backends.push((label.clone(), Some(url.clone())));
        }
        for (backend, admin) in backends {
            let label = format!("{build}, {backend}");
            let name = format!("deploys-{}", subjects.len());
            let database = match &admin {
                Some(admin) => Some((admin.clone(), fresh_database(admin, &name).await?)),
                None => None,
            };
            let mut args = vec!["--metrics", "off"];
            if let Some((_, (_, url))) = &database {
                args.extend(["--database-url", url]);
            }
            let server = Server::start_binary(ctx, bin, &name, &args, None, None)
                .with_context(|| format!("starting {label}"))?;
            let model_id = server.register(ctx, "tiny", &tiny).await?;
            // Fetched once: every timed deployment finds it verified.
            server.deploy(model_id).await?;
            let url = match &database {
                Some((_, (_, url))) => url.clone(),
                None => format!(
                    "sqlite://{}",
                    ctx.out_dir.join(&name).join("data/berth.db").display()
                ),
            };
            record_history(&url, ctx.history).await?;
            subjects.push(Subject {
                label,
                server,
                model_id,
                rounds: (0..=ctx.in_flight.len())
                    .map(|_| Rounds::default())
                    .collect(),
                database,
            });
        }
    }

    let (single, single_fsyncs) = sqlite_commits(ctx, 1).await?;
    let (grouped, grouped_fsyncs) = sqlite_commits(ctx, 16).await?;
    let total = ctx.calls;
    for round in 0..ctx.rounds {
        // Rotate which goes first, so a drift of the machine's load does
        // not favour one.
        for k in 0..subjects.len() {
            let count = subjects.len();
            let subject = &mut subjects[(k + round) % count];
            let (server, id) = (&subject.server, subject.model_id);
            let pid = server.pid();
            let cpu = cpu_of(pid);
            let (rate, latencies) = load_at(total, 16, || server.healthz()).await?;
            let floor = &mut subject.rounds[0];
            floor.rates.push(rate);
            floor.cpu.push((cpu_of(pid) - cpu) / total as f64);
            floor.flushes.push(0.0);
            floor.latencies.extend(latencies);
            for (at, &in_flight) in ctx.in_flight.iter().enumerate() {
                // One client at a time is slow: fewer requests.
                let total = if in_flight == 1 { total / 4 } else { total };
                let (cpu, flushes, database) = (cpu_of(pid), syncs(), database_cpu());
                let (rate, latencies) = load_at(total, in_flight, || server.deploy(id)).await?;
                let figures = &mut subject.rounds[at + 1];
                if subject.database.is_some() {
                    figures
                        .database_cpu
                        .push((database_cpu() - database) / total as f64);
                }
                figures
                    .flushes
                    .push((syncs() - flushes) as f64 / total as f64);
                figures.rates.push(rate);
                figures.cpu.push((cpu_of(pid) - cpu) / total as f64);
                figures.latencies.extend(latencies);
            }
        }
    }

    let history = match ctx.history {
        0 => String::new(),
        rows => format!(", {rows} ended deployments recorded before"),
    };
    let mut table = Table::new(&format!(
        "4c. Synchronous no-op deployments of a fetched model, {total} requests \
         ({} at 1 in flight), --metrics off{history}, median of {} rounds",
        total / 4,
        ctx.rounds
    ));
    table.row(
        "SQLite WAL, single-row commits in a loop, alone",
        format!("{single:.0} commits/s ({single_fsyncs:.2} disk flushes a commit)"),
        "baseline: the disk's synced-commit bound".into(),
    );
    table.row(
        "SQLite WAL, 16 rows a commit, alone",
        format!(
            "{:.0} rows/s ({grouped_fsyncs:.2} disk flushes a commit)",
            grouped * 16.0
        ),
        format!(
            "{:.1}× single-row: what grouping could reach",
            grouped * 16.0 / single
        ),
    );
    for subject in &subjects {
        table.row(
            &format!("{}: GET /healthz, 16 in flight", subject.label),
            subject.rounds[0]
                .figure()
                .replace(" · 0.0 flushes/deploy", "")
                .replace("/deploy", "/request"),
            "the HTTP floor".into(),
        );
        for (at, &in_flight) in ctx.in_flight.iter().enumerate() {
            let figures = &subject.rounds[at + 1];
            table.row(
                &format!("{}: deployments, {in_flight} in flight", subject.label),
                figures.figure(),
                format!(
                    "{:.0} flushes/s: {:.0}% of the commit bound",
                    median(&figures.rates) * median(&figures.flushes),
                    100.0 * median(&figures.rates) * median(&figures.flushes) / single
                ),
            );
        }
    }
    table.print();
    for subject in subjects {
        drop(subject.server);
        if let Some((admin, (name, _))) = subject.database {
            let mut conn = sqlx::PgConnection::connect(&admin).await?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
                .execute(&mut conn)
                .await?;
        }
    }
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}

/// Records `rows` ended deployments more in the database at `url`, copies
/// of the one there (in the columns every build has), and refreshes the
/// planner's statistics, as a server in use for a while has them.
async fn record_history(url: &str, rows: u64) -> anyhow::Result<()> {
    if rows == 0 {
        return Ok(());
    }
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(url).await?;
    sqlx::query(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) \
         INSERT INTO deployments (model_id, deployer, options, status, dir, out_dir, details, \
         server_id, created_at) SELECT model_id, deployer, options, status, dir, out_dir, \
         details, server_id, created_at FROM deployments, n"
    ))
    .execute(&mut conn)
    .await
    .with_context(|| format!("recording {rows} ended deployments"))?;
    sqlx::query("ANALYZE deployments")
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

/// A new, empty database on the server of `admin`; returns its name and
/// URL.
pub async fn fresh_database(admin: &str, name: &str) -> anyhow::Result<(String, String)> {
    let name = format!("bench_{}_{}", std::process::id(), name.replace('-', "_"));
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .with_context(|| format!("connecting to {admin}"))?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
        .execute(&mut conn)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    let (base, _) = admin
        .rsplit_once('/')
        .context("a PostgreSQL URL ends with /DATABASE")?;
    let url = format!("{base}/{name}");
    Ok((name, url))
}

/// Commits per second of a loop writing `rows` rows a commit into a SQLite
/// WAL database on the data volume, alone, with berth's settings; and the
/// disk flushes a commit took (see `syncs`).
async fn sqlite_commits(ctx: &Ctx, rows: usize) -> anyhow::Result<(f64, f64)> {
    let dir = ctx.out_dir.join("commits");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("bound.db");
    let mut conn =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", file.display())).await?;
    for pragma in [
        "PRAGMA busy_timeout = 10000",
        "PRAGMA journal_mode = WAL",
        "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
    ] {
        sqlx::query(pragma).execute(&mut conn).await?;
    }
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut conn)
        .await?;
    anyhow::ensure!(
        synchronous == 2,
        "SQLite's synchronous is {synchronous}, not FULL (2) as berth's"
    );
    let body = "x".repeat(300);
    let fsyncs = syncs();
    let started = Instant::now();
    let mut commits = 0u64;
    while started.elapsed() < COMMIT_LOOP {
        let mut tx = conn.begin().await?;
        for _ in 0..rows {
            sqlx::query("INSERT INTO t (body) VALUES ($1)")
                .bind(&body)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        commits += 1;
    }
    let rate = commits as f64 / started.elapsed().as_secs_f64();
    let per_commit = (syncs() - fsyncs) as f64 / commits as f64;
    drop(conn);
    let _ = std::fs::remove_dir_all(&dir);
    Ok((rate, per_commit))
}

/// Flush requests the machine's disks completed so far
/// (`/sys/block/*/stat`, field 16): what a synced commit costs the disk,
/// counted over a loop that is the only writer when the machine is
/// otherwise quiet. 0 when unknown.
fn syncs() -> u64 {
    let Ok(blocks) = std::fs::read_dir("/sys/block") else {
        return 0;
    };
    blocks
        .filter_map(Result::ok)
        .filter(|b| !b.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|b| std::fs::read_to_string(b.path().join("stat")).ok())
        .filter_map(|stat| stat.split_whitespace().nth(15)?.parse::<u64>().ok())
        .sum()
}

/// The CPU seconds of every `postgres` process on this machine: the
/// database's own work, which shares the cores with berth and the client
/// when the server is local (the test server is). A backend that exits
/// meanwhile takes its share with it; the pooled ones stay.
fn database_cpu() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == "postgres")
        })
        .map(cpu_of)
        .sum()
}
