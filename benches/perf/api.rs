//! Benchmarks 4b and 5 against the real server (`berth serve`, the bench
//! build of the binary, SQLite): no-op deployments through the HTTP API at
//! 100 in flight, against `GET /healthz` at the same concurrency; and the
//! server's resident memory while it fetches a large model.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::Ctx;
use crate::data::{DataFile, GIB};
use crate::fetch::{big_model, files};
use crate::report::{Table, median, percentile, secs};

const CONCURRENCY: usize = 100;

struct Server {
    child: Child,
    url: String,
    client: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(ctx: &Ctx) -> anyhow::Result<Self> {
        let home = ctx.out_dir.join("server");
        let _ = std::fs::remove_dir_all(&home);
        let plugins = home.join("plugins");
        std::fs::create_dir_all(&plugins)?;
        std::fs::copy(crate::plugin::plugin_path(), plugins.join("misbehave.wasm"))
            .context("cannot copy the misbehave plugin (run scripts/build-plugins)")?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--listen", "127.0.0.1:0", "--plugins-dir"])
            .arg(&plugins)
            .arg("--data-dir")
            .arg(home.join("data"))
            .env("BERTH_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start berth serve")?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        // It listens first, then loads its plugins: ready once both happened.
        std::thread::spawn(move || {
            let mut url = None;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("berth is listening on ") {
                    let rest = &line[at + "berth is listening on ".len()..];
                    url = rest.split_whitespace().next().map(str::to_string);
                }
                if line.contains("plugins folder loaded: ready") {
                    let _ = tx.send(url.clone().unwrap_or_default());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(300))
            .context("berth serve did not start listening and load its plugins")?;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(CONCURRENCY)
            .build()?;
        Ok(Self { child, url, client })
    }

    async fn register(&self, ctx: &Ctx, job_id: &str, files: &[DataFile]) -> anyhow::Result<i64> {
        let listed: Vec<Value> = files
            .iter()
            .map(|f| json!({ "path": f.path, "size_bytes": f.size, "sha256": f.sha256 }))
            .collect();
        let body = json!({
            "name": job_id, "job_id": job_id, "base_model": "bench", "model_size": "-", "dataset": "-",
            "num_examples": 1, "num_train_steps": 1,
            "source": format!("http://{}/{{job_id}}/{{path}}", ctx.source.addr),
            "files": listed,
        });
        let response = self
            .client
            .post(format!("{}/v1/models", self.url))
            .json(&body)
            .send()
            .await?;
        ensure!(
            response.status().is_success(),
            "registering {job_id}: {}",
            response.text().await?
        );
        let model: Value = response.json().await?;
        model["id"]
            .as_i64()
            .context("the registered model has no id")
    }

    async fn deploy(&self, model_id: i64) -> anyhow::Result<()> {
        let response = self
            .client
            .post(format!("{}/v1/models/{model_id}/deployments", self.url))
            .json(&json!({ "deployer": "misbehave", "options": { "mode": "ok" } }))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("deployment failed: {}", response.text().await?);
        }
        Ok(())
    }

    async fn healthz(&self) -> anyhow::Result<()> {
        let response = self
            .client
            .get(format!("{}/healthz", self.url))
            .send()
            .await?;
        ensure!(
            response.status().is_success(),
            "healthz answered {}",
            response.status()
        );
        response.bytes().await?;
        Ok(())
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| {
                v.trim_start_matches(':')
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }
}

/// Runs `total` requests with `CONCURRENCY` in flight; returns requests per
/// second and each request's latency.
async fn load<F, Fut>(total: usize, request: F) -> anyhow::Result<(f64, Vec<f64>)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    let latencies: Vec<anyhow::Result<f64>> = futures::stream::iter(0..total)
        .map(|_| {
            let request = request();
            async move {
                let t = Instant::now();
                request.await?;
                Ok(t.elapsed().as_secs_f64())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let latencies = latencies.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok((total as f64 / elapsed, latencies))
}

/// Benchmark 4b.
pub async fn deployments(ctx: &Ctx) -> anyhow::Result<()> {
    let tiny = files(ctx, "tiny", &[("config.json".into(), 4096)], 7)?;
    let server = Server::start(ctx)?;
    let id = server.register(ctx, "tiny", &tiny).await?;
    server.deploy(id).await?;

    let total = (ctx.calls / 2).max(CONCURRENCY * 5);
    let (health_rps, health) = load(total, || server.healthz()).await?;
    let (deploy_rps, deploys) = load(total, || server.deploy(id)).await?;
    let mut table = Table::new(&format!(
        "4b. HTTP API, {total} requests, {CONCURRENCY} in flight (SQLite)"
    ));
    let figure = |rps: f64, l: &[f64]| {
        format!(
            "{rps:.0} req/s · p50 {} · p99 {}",
            secs(median(l)),
            secs(percentile(l, 99.0))
        )
    };
    table.row(
        "GET /healthz",
        figure(health_rps, &health),
        "baseline: the HTTP floor".into(),
    );
    table.row(
        "POST deployments (no-op plugin, synchronous)",
        figure(deploy_rps, &deploys),
        format!(
            "{:.1}% of the floor's rate; each is recorded twice and runs a fresh sandbox",
            100.0 * deploy_rps / health_rps
        ),
    );
    table.print();
    Ok(())
}

/// Benchmark 5: peak resident memory of the server while it fetches.
pub async fn memory(ctx: &Ctx) -> anyhow::Result<()> {
    let one = files(ctx, "big", &[("big.bin".into(), GIB)], 1)?;
    let many = big_model(ctx)?;
    let server = Server::start(ctx)?;
    let tiny = files(ctx, "tiny", &[("config.json".into(), 4096)], 7)?;
    let id = server.register(ctx, "tiny", &tiny).await?;
    server.deploy(id).await?;
    let idle = server.status_kib("VmRSS");

    let mut table = Table::new(
        "5. berth serve's resident memory while fetching (VmRSS sampled every 10 ms, and VmHWM)",
    );
    table.row(
        "idle, after one small deployment",
        format!("{} MiB", idle >> 10),
        "baseline".into(),
    );
    for (job_id, files, label) in [
        ("big", &one, "fetching a 1 GiB model"),
        ("model", &many, "fetching the large model"),
    ] {
        let id = server.register(ctx, job_id, files).await?;
        // Resets VmHWM to the current RSS (Linux ≥ 4.0).
        let _ = std::fs::write(format!("/proc/{}/clear_refs", server.child.id()), "5");
        let peak = Arc::new(AtomicU64::new(0));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (peak, done, pid) = (peak.clone(), done.clone(), server.child.id());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let status =
                        std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                    let rss = status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.split_whitespace().next()?.parse().ok())
                        .unwrap_or(0);
                    peak.fetch_max(rss, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        let started = Instant::now();
        server.deploy(id).await?;
        let took = started.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        let gib = files.iter().map(|f| f.size).sum::<u64>() as f64 / GIB as f64;
        let sampled = peak.load(Ordering::Relaxed);
        let hwm = server.status_kib("VmHWM");
        table.row(
            &format!("{label} ({gib:.0} GiB, {})", secs(took)),
            format!("peak {} MiB (VmHWM {} MiB)", sampled >> 10, hwm >> 10),
            format!("+{} MiB over idle", sampled.saturating_sub(idle) >> 10),
        );
    }
    table.print();
    drop(server);
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}
