//! Benchmark 9: `berth serve` (SQLite) under load from its deployers:
//! eight deployments at once handing back the most they can (outputs just
//! under and over the caps, log floods), then twenty at once reading a large
//! model. Meanwhile `GET /healthz` is asked every 10 ms, each time on a new
//! connection from a thread of its own, and the server's peak resident
//! memory is read from `/proc` (VmHWM, reset before the load). Each build
//! given with `--berth LABEL=PATH` (another checkout's binary: the before of
//! a change) runs the same load in turn; by default only this build.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde_json::{Value, json};

use crate::Ctx;
use crate::api::Server;
use crate::data::MIB;
use crate::fetch::files;
use crate::report::{Table, percentile, secs};

/// Each deployer's memory limit (its manifest), so the goal on the
/// server's memory is a sum of known limits.
const MEMORY_MIB: u64 = 128;
/// The server's own allowance above its deployers' limits.
const SERVER_MIB: u64 = 100;
/// How often `/healthz` is asked.
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How long `/healthz` is asked before the load.
const IDLE: Duration = Duration::from_secs(3);
/// A probe not answered by then counts as this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// The model the readers read: files × size.
const READ_FILES: usize = 4;
const READ_FILE_BYTES: u64 = 256 * MIB;
const READERS: usize = 20;

/// berth's caps (`host/src/runtime/caps.rs`): the copy budget and the
/// details cap, the two sizes the worst cases sit on either side of.
const COPY_BYTES: u64 = 16 << 20;
const DETAILS_BYTES: u64 = 1 << 20;

/// The eight worst cases, each kept running by one deployer: the largest
/// outputs that pass the copy budget and the details cap, the smallest
/// that do not, and floods of log lines.
fn worst_cases() -> Vec<Value> {
    let under_copy = COPY_BYTES - 64;
    let over_copy = COPY_BYTES + 1;
    vec![
        // Stored and answered whole (the JSON around the blob is 11 bytes).
        json!({ "mode": "huge-details", "bytes": DETAILS_BYTES - 64 }),
        json!({ "mode": "huge-details", "bytes": under_copy }),
        json!({ "mode": "huge-details", "bytes": over_copy }),
        json!({ "mode": "huge-ref", "bytes": under_copy }),
        json!({ "mode": "huge-error", "bytes": under_copy }),
        json!({ "mode": "huge-error", "bytes": over_copy }),
        json!({ "mode": "long-log-line", "bytes": under_copy }),
        json!({ "mode": "log-flood", "lines": 100_000 }),
    ]
}

/// What one build did under one load, over the rounds.
#[derive(Default)]
struct Figures {
    /// `/healthz` before the load, with the server idle: the baseline.
    idle: Vec<f64>,
    probes: Vec<f64>,
    failed_probes: usize,
    peak_kib: u64,
    deployments: usize,
    completed: usize,
    log_bytes: u64,
    seconds: f64,
}

impl Figures {
    fn latency(probes: &[f64], failed: usize) -> String {
        let failed = match failed {
            0 => String::new(),
            n => format!(" · {n} failed"),
        };
        format!(
            "p50 {} · p99 {} · max {} ({} probes{failed})",
            secs(percentile(probes, 50.0)),
            secs(percentile(probes, 99.0)),
            secs(percentile(probes, 100.0)),
            probes.len()
        )
    }

    fn rest(&self, deployers: usize) -> String {
        let goal = deployers as u64 * MEMORY_MIB + SERVER_MIB;
        format!(
            "peak RSS {} MiB (goal < {goal}) · {} deployments ({} completed) in {} · server log {:.1} MiB",
            self.peak_kib >> 10,
            self.deployments,
            self.completed,
            secs(self.seconds),
            self.log_bytes as f64 / MIB as f64
        )
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let tiny = files(ctx, "tiny", &[("config.json".into(), 4096)], 7)?;
    let specs: Vec<(String, u64)> = (0..READ_FILES)
        .map(|i| (format!("part-{i}.bin"), READ_FILE_BYTES))
        .collect();
    let model = files(ctx, "readers", &specs, 40)?;
    let manifest = format!("memory_mib = {MEMORY_MIB}\n");
    let worst = worst_cases();
    let read = vec![json!({ "mode": "read" }); READERS];

    let mut figures: Vec<[Figures; 2]> = ctx.builds.iter().map(|_| Default::default()).collect();
    for round in 0..ctx.rounds {
        for k in 0..ctx.builds.len() {
            // Rotate which build goes first, so a drift of the machine's
            // load does not favour one.
            let b = (k + round) % ctx.builds.len();
            let (label, bin) = &ctx.builds[b];
            for (w, (job_id, files, loads)) in [("tiny", &tiny, &worst), ("readers", &model, &read)]
                .into_iter()
                .enumerate()
            {
                let server = Server::start_binary(ctx, bin, "load", &[], Some(&manifest), None)?;
                let id = server.register(ctx, job_id, files).await?;
                // Fetched once, untimed; the load finds it verified.
                deploy(&server, id, &json!({ "mode": "ok" })).await?;
                figures[b][w].idle.extend(idle(&server));
                let started = Instant::now();
                measure(&server, id, loads, ctx.load_secs, &mut figures[b][w])
                    .await
                    .with_context(|| format!("{label}, {job_id}"))?;
                figures[b][w].seconds += started.elapsed().as_secs_f64();
            }
        }
    }

    for (w, title) in [
        format!(
            "9a. {} worst-case deployers at once (outputs just under and over the caps, log floods), {MEMORY_MIB} MiB each",
            worst.len()
        ),
        format!(
            "9b. {READERS} deployers at once each reading a {} MiB model ({READ_FILES} files), {MEMORY_MIB} MiB each",
            READ_FILES as u64 * READ_FILE_BYTES / MIB
        ),
    ]
    .iter()
    .enumerate()
    {
        let mut table = Table::new(&format!(
            "{title}: GET /healthz every {} ms for {} s, {} round(s)",
            PROBE_EVERY.as_millis(),
            ctx.load_secs,
            ctx.rounds
        ));
        let deployers = if w == 0 { worst.len() } else { READERS };
        for ((label, _), figures) in ctx.builds.iter().zip(&figures) {
            table.row(
                &format!("{label}, idle"),
                Figures::latency(&figures[w].idle, 0),
                "baseline: the same server before the load".into(),
            );
            table.row(
                &format!("{label}, loaded"),
                Figures::latency(&figures[w].probes, figures[w].failed_probes),
                figures[w].rest(deployers),
            );
        }
        table.print();
    }
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}

/// Keeps one deployment of each of `loads` running for `seconds` while a
/// thread asks `/healthz` and reads the server's memory; adds what it saw
/// to `figures`.
async fn measure(
    server: &Server,
    model_id: i64,
    loads: &[Value],
    seconds: u64,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    // Resets VmHWM to the current RSS (Linux ≥ 4.0).
    std::fs::write(format!("/proc/{}/clear_refs", server.pid()), "5")
        .context("cannot reset the server's VmHWM")?;
    let log_before = server.log_bytes.load(Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (stop, addr) = (
            stop.clone(),
            server.url.trim_start_matches("http://").to_string(),
        );
        std::thread::spawn(move || probe(&addr, &stop))
    };
    let until = Instant::now() + Duration::from_secs(seconds);
    let slots = loads.iter().map(|options| async move {
        let mut outcomes = Vec::new();
        while Instant::now() < until {
            outcomes.push(deploy(server, model_id, options).await?);
        }
        anyhow::Ok(outcomes)
    });
    let outcomes = futures::future::join_all(slots).await;
    stop.store(true, Ordering::Relaxed);
    let (probes, failed) = prober.join().expect("the prober does not panic");
    for outcome in outcomes {
        let outcome = outcome?;
        figures.deployments += outcome.len();
        figures.completed += outcome.iter().filter(|completed| **completed).count();
    }
    figures.probes.extend(probes);
    figures.failed_probes += failed;
    figures.peak_kib = figures.peak_kib.max(server.status_kib("VmHWM"));
    figures.log_bytes += server.log_bytes.load(Ordering::Relaxed) - log_before;
    Ok(())
}

/// `/healthz` for a few seconds with nothing else running.
fn idle(server: &Server) -> Vec<f64> {
    let stop = AtomicBool::new(false);
    let addr = server.url.trim_start_matches("http://");
    std::thread::scope(|scope| {
        let prober = scope.spawn(|| probe(addr, &stop));
        std::thread::sleep(IDLE);
        stop.store(true, Ordering::Relaxed);
        prober.join().expect("the prober does not panic").0
    })
}

/// One synchronous deployment; whether it completed. A deployment the
/// deployer failed is an answer like any other; only a server that did not
/// answer with a deployment is an error.
async fn deploy(server: &Server, model_id: i64, options: &Value) -> anyhow::Result<bool> {
    let response = server
        .client
        .post(format!("{}/v1/models/{model_id}/deployments", server.url))
        .json(&json!({ "deployer": "misbehave", "options": options }))
        .send()
        .await?;
    let status = response.status();
    let body = response.bytes().await?;
    let answer: Value = serde_json::from_slice(&body).with_context(|| {
        format!(
            "deploying with {options}: {status}, {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
    })?;
    if let Some(row) = answer.get("status").and_then(Value::as_str) {
        return Ok(row == "completed");
    }
    ensure!(
        answer.get("error").is_some(),
        "deploying with {options}: {status}, neither a deployment nor an error"
    );
    Ok(false)
}

/// Asks `GET /healthz` every `PROBE_EVERY` until `stop`; each probe's
/// seconds, and how many did not answer 200.
fn probe(addr: &str, stop: &AtomicBool) -> (Vec<f64>, usize) {
    let (mut latencies, mut failed) = (Vec::new(), 0);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        if !healthz(addr).unwrap_or(false) {
            failed += 1;
        }
        latencies.push(started.elapsed().as_secs_f64());
        next += PROBE_EVERY;
        match next.checked_duration_since(Instant::now()) {
            Some(wait) => std::thread::sleep(wait),
            // Behind (a slow answer): the next probe goes now.
            None => next = Instant::now(),
        }
    }
    (latencies, failed)
}

/// One `GET /healthz` on a new connection; whether it answered 200.
fn healthz(addr: &str) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(answer.starts_with(b"HTTP/1.1 200"))
}

/// `LABEL=PATH` of `--berth`.
pub fn build(arg: &str) -> anyhow::Result<(String, std::path::PathBuf)> {
    let (label, path) = arg
        .split_once('=')
        .context("--berth takes LABEL=PATH (a berth binary)")?;
    ensure!(
        Path::new(path).is_file(),
        "--berth {label}: {path} is not a file"
    );
    Ok((label.to_string(), path.into()))
}
