//! Benchmark 6: one large file from a source that caps each connection's
//! rate, as object stores and CDNs do: `curl -o` (one connection), `aria2c
//! -x 16 -s 16` followed by `sha256sum` (what people use instead), and
//! berth with default settings (as many connections as pay, at most 16),
//! verifying every byte. Then berth's peak resident memory while it
//! fetches a larger file the same way. berth runs in-process, as a
//! deployment calls it.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::ensure;

use crate::Ctx;
use crate::data::{DataFile, GIB};
use crate::fetch::{
    durable_write_floor, fetch, files, fresh_dir, fresh_fetcher, model, shell_quote,
};
use crate::report::{Table, gbps, median, secs, settle, sh, speed_vs, status_kib};

const ARIA: &str = "aria2c -x 16 -s 16 + sha256sum";
const BERTH: &str = "berth, default settings (at most 16 connections)";
const CONTENDERS: [&str; 3] = ["curl -o", ARIA, BERTH];

pub async fn throughput(ctx: &Ctx) -> anyhow::Result<()> {
    let big = files(
        ctx,
        "capped",
        &[("big.bin".into(), ctx.capped_gib * GIB)],
        61,
    )?;
    let bytes = big[0].size;
    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..ctx.rounds {
        for k in 0..CONTENDERS.len() {
            let contender = CONTENDERS[(k + round) % CONTENDERS.len()];
            settle();
            let took = run(ctx, contender, &big).await?;
            times.entry(contender).or_default().push(took);
        }
    }
    let mut table = Table::new(&format!(
        "6. one {} GiB file, each connection capped at {} MB/s (loopback HTTP), median of {} rounds",
        ctx.capped_gib, ctx.cap_mbps, ctx.rounds
    ));
    let curl = median(&times["curl -o"]);
    let aria = median(&times[ARIA]);
    for contender in CONTENDERS {
        let t = median(&times[contender]);
        let versus = match contender {
            "curl -o" => "baseline (one connection, no hash)".to_string(),
            ARIA => {
                format!("{:.2}× curl -o, then hashed", curl / t)
            }
            _ => format!(
                "{:.2}× curl -o; {} (verified, fsynced, renamed)",
                curl / t,
                speed_vs(t, aria, "aria2c + sha256sum")
            ),
        };
        table.row(
            contender,
            format!("{} ({})", secs(t), gbps(bytes, t)),
            versus,
        );
    }
    // Where this machine's disk bounds any fetch that fsyncs: the goal
    // can be no higher than this ratio.
    let floor = durable_write_floor(ctx, bytes)?;
    table.row(
        "disk: dd + fdatasync",
        format!("{} ({})", secs(floor), gbps(bytes, floor)),
        format!(
            "{:.2}× curl -o: the most a fetch that fsyncs can reach here",
            curl / floor
        ),
    );
    let (idle, peak, took) = peak_memory(ctx).await?;
    table.row(
        &format!(
            "berth's resident memory, {} GiB, default settings ({})",
            ctx.rss_gib,
            secs(took)
        ),
        format!("peak {} MiB", peak >> 10),
        format!(
            "+{} MiB over idle ({} MiB)",
            peak.saturating_sub(idle) >> 10,
            idle >> 10
        ),
    );
    table.print();
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}

fn capped_source(ctx: &Ctx) -> String {
    format!(
        "http://{}/cap/{}/{{job_id}}/{{path}}",
        ctx.source.addr, ctx.cap_mbps
    )
}

async fn run(ctx: &Ctx, contender: &str, big: &[DataFile]) -> anyhow::Result<f64> {
    let file = &big[0];
    if contender == BERTH {
        let fetcher = fresh_fetcher(ctx, "berth")?;
        let mut model = model(ctx, "capped", big);
        model.source = capped_source(ctx);
        return Ok(fetch(&fetcher, &model).await?.as_secs_f64());
    }
    let out = fresh_dir(ctx, "peer")?;
    let url = format!(
        "http://{}/cap/{}/capped/{}",
        ctx.source.addr, ctx.cap_mbps, file.path
    );
    let to = out.join("big.bin");
    let script = if contender == "curl -o" {
        format!("curl -sf '{url}' -o {}", shell_quote(&to))
    } else {
        format!(
            "aria2c -q -x 16 -s 16 --file-allocation=none --allow-overwrite=true -d {} -o big.bin '{url}' && sha256sum {}",
            shell_quote(&out),
            shell_quote(&to)
        )
    };
    let (took, stdout) = sh(&script)?;
    let len = std::fs::metadata(&to)?.len();
    ensure!(len == file.size, "{contender} wrote {len} bytes");
    if contender != "curl -o" {
        ensure!(
            stdout.starts_with(&file.sha256),
            "{contender} saw other bytes: {stdout}"
        );
    }
    Ok(took.as_secs_f64())
}

/// berth's resident memory before and at its peak (KiB) while fetching
/// `rss_gib` GiB with default settings, and how long that took.
async fn peak_memory(ctx: &Ctx) -> anyhow::Result<(u64, u64, f64)> {
    let big = files(
        ctx,
        "capped-rss",
        &[("big.bin".into(), ctx.rss_gib * GIB)],
        62,
    )?;
    let fetcher = fresh_fetcher(ctx, "berth")?;
    let mut model = model(ctx, "capped-rss", &big);
    model.source = capped_source(ctx);
    settle();
    let idle = status_kib(std::process::id(), "VmRSS");
    // Resets VmHWM to the current RSS (Linux ≥ 4.0).
    std::fs::write("/proc/self/clear_refs", "5")?;
    let started = Instant::now();
    fetch(&fetcher, &model).await?;
    let took = started.elapsed().as_secs_f64();
    Ok((idle, status_kib(std::process::id(), "VmHWM"), took))
}
