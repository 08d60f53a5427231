//! Benchmark 10: how far a deployer gets past its out-dir quota before it is
//! stopped. `/out` is measured every 20 ms while a deployer runs, so the
//! overshoot should be about what the guest writes in one interval: the
//! baseline is the guest's own write rate, measured in the same run by a
//! deployment that stays under the quota.

use anyhow::{Context, ensure};
use serde_json::{Value, json};

use crate::Ctx;
use crate::api::Server;
use crate::fetch::files;
use crate::report::{Table, median};

const QUOTA_MIB: u64 = 256;
/// `quota::FIRST_INTERVAL`, the shortest pause between two measurements.
const INTERVAL_S: f64 = 0.020;
const MIB: f64 = (1 << 20) as f64;

pub async fn overshoot(ctx: &Ctx) -> anyhow::Result<()> {
    let tiny = files(ctx, "quota", &[("config.json".into(), 4096)], 9)?;
    let server = Server::start(ctx, "quota", &["--out-mib", &QUOTA_MIB.to_string()])?;
    let id = server.register(ctx, "quota", &tiny).await?;
    let (mut overshoots, mut rates) = (Vec::new(), Vec::new());
    for _ in 0..ctx.rounds.max(5) {
        // Under the quota, returning: how fast this guest writes.
        let under = (QUOTA_MIB - 16) << 20;
        let (status, done) = deploy(&server, id, under).await?;
        ensure!(
            status.is_success(),
            "a deployment under the quota failed: {done}"
        );
        let seconds = done["duration_ms"].as_f64().context("no duration")? / 1e3;
        rates.push(under as f64 / MIB / seconds);
        // Writing without end: stopped past the quota.
        let (status, failed) = deploy(&server, id, 4_000_000_000).await?;
        ensure!(
            !status.is_success(),
            "a deployer writing 4 GB was not stopped: {failed}"
        );
        let error = failed["error"].as_str().unwrap_or_default();
        overshoots.push(
            held_mib(error).with_context(|| format!("unexpected error: {error}"))?
                - QUOTA_MIB as f64,
        );
    }
    let rate = median(&rates);
    let mut table = Table::new(&format!(
        "10. Past the out-dir quota ({QUOTA_MIB} MiB), {} deployments writing without end",
        overshoots.len()
    ));
    table.row(
        "guest write rate, under the quota",
        format!("{rate:.0} MiB/s"),
        format!(
            "one {:.0} ms interval of it: {:.1} MiB",
            INTERVAL_S * 1e3,
            rate * INTERVAL_S
        ),
    );
    table.row(
        "held past the quota when stopped, median",
        format!("{:.1} MiB", median(&overshoots)),
        format!(
            "{:.1} intervals' worth",
            median(&overshoots) / (rate * INTERVAL_S)
        ),
    );
    table.row(
        "held past the quota when stopped, most",
        format!("{:.1} MiB", overshoots.iter().cloned().fold(0.0, f64::max)),
        format!(
            "{:.1} intervals' worth",
            overshoots.iter().cloned().fold(0.0, f64::max) / (rate * INTERVAL_S)
        ),
    );
    table.print();
    Ok(())
}

async fn deploy(
    server: &Server,
    id: i64,
    bytes: u64,
) -> anyhow::Result<(reqwest::StatusCode, Value)> {
    let response = server
        .client
        .post(format!("{}/v1/models/{id}/deployments", server.url))
        .json(
            &json!({ "deployer": "misbehave", "options": { "mode": "fill-out", "bytes": bytes } }),
        )
        .send()
        .await?;
    Ok((response.status(), response.json().await?))
}

/// The size in the error's "(300.2 MiB when it was stopped)", in MiB.
fn held_mib(error: &str) -> Option<f64> {
    let (before, _) = error.split_once(" when it was stopped")?;
    let (_, held) = before.rsplit_once('(')?;
    let (number, unit) = held.split_once(' ')?;
    let scale = match unit {
        "KiB" => 1.0 / 1024.0,
        "MiB" => 1.0,
        "GiB" => 1024.0,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}
