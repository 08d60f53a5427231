//! Benchmark 13: how soon a deployer pushed over the API to one server is
//! usable on another server of the same PostgreSQL database (the first
//! `--pg`), cold (each server compiles into a cache of its own): from the
//! moment the `PUT` is sent to the first completed deployment on the other
//! server. The baseline, in the same run, is the way before the API: the
//! file dropped into that other server's plugins folder (benchmark 11's
//! measure). Also the storage a version takes in the database: the
//! `.wasm`'s size against what the catalog's tables grew by.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use sqlx::{Connection, Row};

use crate::Ctx;
use crate::api::Server;
use crate::deploys::fresh_database;
use crate::dropin::{drop_in, example, first_deployment, model_files, plugins_dir};
use crate::report::{Table, median, secs};

/// The catalog's tables, whose growth is a version's cost.
const TABLES: &str = "pg_total_relation_size('plugin_blobs') \
     + pg_total_relation_size('deployer_versions') + pg_total_relation_size('stored_deployers')";

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let Some((_, admin)) = ctx.pg.first() else {
        println!("13. pushed deployers: skipped, it needs a PostgreSQL server (--pg LABEL=URL)");
        return Ok(());
    };
    let mut table = Table::new(
        "13. from PUT /v1/deployers/NAME on one server to its first completed deployment on another, cold",
    );
    let mut storage = Table::new("13. storage per version in PostgreSQL");
    for (deployer, language) in [
        ("archive", "Rust"),
        ("model-card", "Python"),
        ("safetensors-check", "JavaScript"),
    ] {
        let (mut dropped, mut pushed, mut answered, mut shared) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..ctx.rounds {
            let name = format!("push-{deployer}-{round}");
            let (_, url) = fresh_database(admin, &name).await?;
            let files = model_files(ctx)?;
            let args = ["--metrics", "off", "--database-url", &url];
            let baseline = Server::start(ctx, &format!("{name}-dropin"), &args)?;
            // model_files puts them where the source serves job "dropin".
            let id = baseline.register(ctx, "dropin", &files).await?;
            let since = Instant::now();
            drop_in(&plugins_dir(ctx, &format!("{name}-dropin")), deployer)?;
            dropped.push(first_deployment(&baseline, id, deployer, since).await?);
            drop(baseline);

            let wasm = std::fs::read(example(deployer))?;
            let (grew, took, answer) =
                push_across(ctx, admin, &format!("{name}-b"), deployer, &wasm, None).await?;
            pushed.push(took);
            answered.push(answer);
            let cache = ctx.out_dir.join(format!("{name}-cache"));
            let (_, took, _) = push_across(
                ctx,
                admin,
                &format!("{name}-c"),
                deployer,
                &wasm,
                Some(&cache),
            )
            .await?;
            shared.push(took);
            if round == 0 {
                storage.row(
                    &format!("{deployer} ({language}): the .wasm"),
                    bytes(wasm.len() as i64),
                    "baseline".into(),
                );
                storage.row(
                    &format!("{deployer} ({language}): the catalog's tables grew by"),
                    bytes(grew),
                    format!("{:.2}× the .wasm", grew as f64 / wasm.len() as f64),
                );
            }
        }
        let (dropped, pushed, answered, shared) = (
            median_of(&dropped),
            median_of(&pushed),
            median_of(&answered),
            median_of(&shared),
        );
        table.row(
            &format!("{deployer} ({language}), dropped into the other server's folder"),
            secs(dropped),
            "baseline".into(),
        );
        table.row(
            &format!("{deployer} ({language}), pushed to one server, deployed on the other"),
            secs(pushed),
            format!(
                "{:.2}× the drop-in; the PUT was answered after {} (checked and stored)",
                pushed / dropped,
                secs(answered)
            ),
        );
        table.row(
            &format!("{deployer} ({language}), the same, the servers sharing --cache-dir"),
            secs(shared),
            format!("{:.2}× the drop-in", shared / dropped),
        );
    }
    table.print();
    storage.print();
    Ok(())
}

/// Two servers on a fresh database (sharing `cache` if given): the time
/// from sending `PUT /v1/deployers/DEPLOYER` to one to the first completed
/// deployment on the other, and to the `PUT`'s answer; and what the
/// catalog's tables grew by.
async fn push_across(
    ctx: &Ctx,
    admin: &str,
    name: &str,
    deployer: &str,
    wasm: &[u8],
    cache: Option<&std::path::Path>,
) -> anyhow::Result<(i64, Duration, Duration)> {
    let (_, url) = fresh_database(admin, name).await?;
    let mut args = vec!["--metrics", "off", "--database-url", &url];
    let cache = cache.map(|c| c.display().to_string());
    if let Some(cache) = &cache {
        args.extend(["--cache-dir", cache]);
    }
    let to = Server::start(ctx, &format!("{name}-to"), &args)?;
    let other = Server::start(ctx, &format!("{name}-other"), &args)?;
    let id = other.register(ctx, "dropin", &model_files(ctx)?).await?;
    let before = catalog_bytes(&url).await?;
    let since = Instant::now();
    let response = to
        .client
        .put(format!("{}/v1/deployers/{deployer}", to.url))
        .header("content-type", "application/wasm")
        .body(wasm.to_vec())
        .send()
        .await?;
    let answered = since.elapsed();
    ensure!(
        response.status().is_success(),
        "the push of {deployer} failed: {}",
        response.text().await?
    );
    let usable = first_deployment(&other, id, deployer, since).await?;
    Ok((catalog_bytes(&url).await? - before, usable, answered))
}

fn median_of(times: &[Duration]) -> f64 {
    let times: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
    median(&times)
}

fn bytes(n: i64) -> String {
    format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
}

/// What the catalog's tables take on disk now, in bytes.
async fn catalog_bytes(url: &str) -> anyhow::Result<i64> {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let row = sqlx::query(&format!("SELECT ({TABLES})::BIGINT AS size"))
        .fetch_one(&mut conn)
        .await?;
    Ok(row.try_get("size")?)
}
