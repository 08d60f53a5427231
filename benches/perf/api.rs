//! Benchmarks 4b and 5 against the real server (`berth serve`, the bench
//! build of the binary, SQLite): no-op deployments through the HTTP API at
//! 100 in flight, against `GET /healthz` at the same concurrency, each on a
//! server with metrics and one with `--metrics off`, and deployments on a
//! third that also checks an API token on each; and the server's resident
//! memory while it fetches a large model.

use std::io::{BufRead, BufReader};
use std::path::Path;
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
use crate::report::{PeakRss, Table, median, percentile, secs, status_kib};

const CONCURRENCY: usize = 100;

pub struct Server {
    child: Child,
    pub url: String,
    pub client: reqwest::Client,
    /// Sent as `Authorization: Bearer` on API calls, when the server
    /// requires a token.
    token: Option<String>,
    /// Bytes the server has written to its log (stderr) so far.
    pub log_bytes: Arc<AtomicU64>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// A server of its own in `out_dir/NAME`, with `args` added.
    pub fn start(ctx: &Ctx, name: &str, args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_token(ctx, name, args, None)
    }

    /// The same, requiring `token` (`BERTH_API_TOKEN`) if given.
    fn start_with_token(
        ctx: &Ctx,
        name: &str,
        args: &[&str],
        token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let bin = Path::new(env!("CARGO_BIN_EXE_berth"));
        Self::start_binary(ctx, bin, name, args, None, token)
    }

    /// A server of binary `bin` (another build of berth, for a before and
    /// after), the misbehave plugin given `manifest` (`misbehave.toml`) if
    /// any.
    pub fn start_binary(
        ctx: &Ctx,
        bin: &Path,
        name: &str,
        args: &[&str],
        manifest: Option<&str>,
        token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let home = ctx.out_dir.join(name);
        let _ = std::fs::remove_dir_all(&home);
        let plugins = home.join("plugins");
        std::fs::create_dir_all(&plugins)?;
        std::fs::copy(crate::plugin::plugin_path(), plugins.join("misbehave.wasm"))
            .context("cannot copy the misbehave plugin (run scripts/build-plugins)")?;
        if let Some(manifest) = manifest {
            std::fs::write(plugins.join("misbehave.toml"), manifest)?;
        }
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--plugins-dir"])
            .arg(&plugins)
            .arg("--data-dir")
            .arg(home.join("data"))
            .args(args)
            .envs(token.map(|t| ("BERTH_API_TOKEN", t)))
            .env("BERTH_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {} serve", bin.display()))?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let log_bytes = Arc::new(AtomicU64::new(0));
        let counted = log_bytes.clone();
        // Ready once it listens and has loaded its plugins, whichever line
        // comes first: a folder of cached code (push's servers sharing
        // --cache-dir) loads in a millisecond, and a server from before the
        // listening line came first said ready before it. Read to the end,
        // so a server that logs much never blocks on a full pipe.
        std::thread::spawn(move || {
            let (mut url, mut loaded, mut sent) = (None, false, false);
            // Split on bytes: a guest's line need not be UTF-8.
            for line in BufReader::new(stderr).split(b'\n').map_while(Result::ok) {
                counted.fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
                if sent {
                    continue;
                }
                let line = String::from_utf8_lossy(&line);
                if let Some(at) = line.find("berth is listening on ") {
                    let rest = &line[at + "berth is listening on ".len()..];
                    url = rest.split_whitespace().next().map(str::to_string);
                }
                loaded |= line.contains("plugins folder loaded: ready");
                if let (Some(url), true) = (&url, loaded) {
                    sent = true;
                    let _ = tx.send(url.clone());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(300))
            .context("berth serve did not start listening and load its plugins")?;
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(CONCURRENCY)
            .build()?;
        Ok(Self {
            child,
            url,
            client,
            token: token.map(str::to_string),
            log_bytes,
        })
    }

    pub async fn register(
        &self,
        ctx: &Ctx,
        job_id: &str,
        files: &[DataFile],
    ) -> anyhow::Result<i64> {
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
            .bearer_auth(self.token.as_deref().unwrap_or_default())
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

    pub async fn deploy(&self, model_id: i64) -> anyhow::Result<()> {
        let mut request = self
            .client
            .post(format!("{}/v1/models/{model_id}/deployments", self.url))
            .json(&json!({ "deployer": "misbehave", "options": { "mode": "ok" } }));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        if !response.status().is_success() {
            bail!("deployment failed: {}", response.text().await?);
        }
        Ok(())
    }

    /// Queues a no-op deployment (`?wait=false`).
    pub async fn deploy_detached(&self, model_id: i64) -> anyhow::Result<()> {
        let response = self
            .client
            .post(format!(
                "{}/v1/models/{model_id}/deployments?wait=false",
                self.url
            ))
            .json(&json!({ "deployer": "misbehave", "options": { "mode": "ok" } }))
            .bearer_auth(self.token.as_deref().unwrap_or_default())
            .send()
            .await?;
        ensure!(
            response.status() == reqwest::StatusCode::ACCEPTED,
            "queueing a deployment: {}",
            response.text().await?
        );
        Ok(())
    }

    pub async fn healthz(&self) -> anyhow::Result<()> {
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn status_kib(&self, field: &str) -> u64 {
        status_kib(self.child.id(), field)
    }
}

/// Runs `total` requests with `CONCURRENCY` in flight; returns requests per
/// second and each request's latency.
async fn load<F, Fut>(total: usize, request: F) -> anyhow::Result<(f64, Vec<f64>)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    load_at(total, CONCURRENCY, request).await
}

/// Runs `total` requests with `in_flight` at a time; returns requests per
/// second and each request's latency.
pub async fn load_at<F, Fut>(
    total: usize,
    in_flight: usize,
    request: F,
) -> anyhow::Result<(f64, Vec<f64>)>
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
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let latencies = latencies.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok((total as f64 / elapsed, latencies))
}

/// The rounds of one kind of request against one server.
#[derive(Default)]
struct Rounds {
    rates: Vec<f64>,
    latencies: Vec<f64>,
}

impl Rounds {
    fn add(&mut self, (rate, latencies): (f64, Vec<f64>)) {
        self.rates.push(rate);
        self.latencies.extend(latencies);
    }

    fn rate(&self) -> f64 {
        median(&self.rates)
    }

    fn figure(&self) -> String {
        let slowest = self.rates.iter().copied().fold(f64::INFINITY, f64::min);
        let fastest = self.rates.iter().copied().fold(0.0, f64::max);
        format!(
            "{:.0} req/s ({slowest:.0}–{fastest:.0}) · p50 {} · p99 {}",
            self.rate(),
            secs(median(&self.latencies)),
            secs(percentile(&self.latencies, 99.0))
        )
    }

    /// What `self` costs per request over `base`, in server time at this
    /// concurrency: the difference of the inverse rates.
    fn over(&self, base: &Rounds) -> String {
        format!(
            "{:.1}% of metrics off's rate, {:+.1} µs a request",
            100.0 * self.rate() / base.rate(),
            1e6 * (1.0 / self.rate() - 1.0 / base.rate())
        )
    }
}

/// Benchmark 4b: the same requests on a server with metrics (the default)
/// and one with `--metrics off`, alternating in every round. Request ids
/// and their spans are on in both.
pub async fn deployments(ctx: &Ctx) -> anyhow::Result<()> {
    let tiny = files(ctx, "tiny", &[("config.json".into(), 4096)], 7)?;
    let on = Server::start(ctx, "metrics-on", &[])?;
    let off = Server::start(ctx, "metrics-off", &["--metrics", "off"])?;
    let token = "berth_bench_0123456789abcdef";
    let auth = Server::start_with_token(ctx, "auth-on", &[], Some(token))?;
    let id = on.register(ctx, "tiny", &tiny).await?;
    for other in [&off, &auth] {
        ensure!(
            other.register(ctx, "tiny", &tiny).await? == id,
            "the servers gave the model different ids"
        );
    }
    for server in [&on, &off, &auth] {
        server.deploy(id).await?;
    }

    let total = (ctx.calls / 2).max(CONCURRENCY * 5);
    let [
        mut health_on,
        mut health_off,
        mut deploy_on,
        mut deploy_off,
        mut deploy_auth,
    ] = std::array::from_fn(|_| Rounds::default());
    for round in 0..ctx.rounds {
        // Alternate which goes first, so a drift of the machine's load
        // does not favour one.
        // Rotate which goes first, so a drift of the machine's load does
        // not favour one.
        for k in 0..3 {
            match (k + round) % 3 {
                0 => {
                    health_on.add(load(total, || on.healthz()).await?);
                    deploy_on.add(load(total, || on.deploy(id)).await?);
                }
                1 => {
                    health_off.add(load(total, || off.healthz()).await?);
                    deploy_off.add(load(total, || off.deploy(id)).await?);
                }
                _ => deploy_auth.add(load(total, || auth.deploy(id)).await?),
            }
        }
    }
    let mut table = Table::new(&format!(
        "4b. HTTP API, {total} requests, {CONCURRENCY} in flight (SQLite), median of {} rounds",
        ctx.rounds
    ));
    table.row(
        "GET /healthz, --metrics off",
        health_off.figure(),
        "baseline: the HTTP floor".into(),
    );
    table.row(
        "GET /healthz, metrics on",
        health_on.figure(),
        health_on.over(&health_off),
    );
    table.row(
        "POST deployments (no-op plugin, synchronous), --metrics off",
        deploy_off.figure(),
        format!(
            "{:.1}% of the floor's rate; each is recorded twice and runs a fresh sandbox",
            100.0 * deploy_off.rate() / health_off.rate()
        ),
    );
    table.row(
        "POST deployments (no-op plugin, synchronous), metrics on",
        deploy_on.figure(),
        deploy_on.over(&deploy_off),
    );
    table.row(
        "POST deployments, metrics on and an API token checked",
        deploy_auth.figure(),
        deploy_auth.over(&deploy_off),
    );
    table.row(
        "the metrics a synchronous deployment records, in-process",
        format!("{:.2} µs", recording_cost() * 1e6),
        "one thread, uncontended: the floor of the cost above".into(),
    );
    table.row(
        "checking an API token among 20, in-process",
        format!("{:.2} µs", token_check_cost(ctx)? * 1e6),
        "one SHA-256 and 20 constant-time comparisons: the floor of the token's cost".into(),
    );
    table.print();
    Ok(())
}

/// Seconds per `Tokens::caller` with a tokens file of 20 entries, the
/// presented token being the last.
fn token_check_cost(ctx: &Ctx) -> anyhow::Result<f64> {
    use berth::auth::{Role, Tokens, new_token};
    const CHECKS: u32 = 100_000;
    let mut lines = String::new();
    let mut last = String::new();
    for i in 0..20 {
        let (token, line) =
            new_token(&format!("t{i}"), Role::Deploy).map_err(anyhow::Error::msg)?;
        lines.push_str(&line);
        lines.push('\n');
        last = token;
    }
    std::fs::create_dir_all(&ctx.out_dir)?;
    let file = ctx.out_dir.join("tokens");
    std::fs::write(&file, lines)?;
    let tokens = Tokens::load(Some(&file), None)?.context("tokens were loaded")?;
    let started = Instant::now();
    for _ in 0..CHECKS {
        std::hint::black_box(tokens.caller(std::hint::black_box(&last)));
    }
    Ok(started.elapsed().as_secs_f64() / f64::from(CHECKS))
}

/// Seconds per deployment spent recording what one synchronous deployment
/// records (its request, two plugin calls, its fetch, its end), timed
/// without the server around it, where the machine's noise is smaller
/// than the cost.
fn recording_cost() -> f64 {
    use berth::metrics;
    const DEPLOYMENTS: u32 = 200_000;
    metrics::install();
    let completed = berth::model::Outcome::Completed {
        reference: "/out/tiny-1".into(),
        details_json: "{}".into(),
    };
    let took = Duration::from_micros(400);
    let started = Instant::now();
    for _ in 0..DEPLOYMENTS {
        metrics::plugin_call("misbehave", "check_options", took);
        metrics::deployment_started();
        metrics::stamp_verified_bytes(4096);
        metrics::fetch_ended(true, took);
        metrics::plugin_call("misbehave", "deploy", took);
        metrics::deployment_ended("misbehave", &completed, took);
        metrics::http_request("POST", "/v1/models/{id}/deployments", 200);
    }
    started.elapsed().as_secs_f64() / f64::from(DEPLOYMENTS)
}

/// Benchmark 5: peak resident memory of the server while it fetches.
pub async fn memory(ctx: &Ctx) -> anyhow::Result<()> {
    let one = files(ctx, "big", &[("big.bin".into(), GIB)], 1)?;
    let many = big_model(ctx)?;
    let server = Server::start(ctx, "server", &[])?;
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
        let sampler = PeakRss::start(server.child.id());
        let started = Instant::now();
        server.deploy(id).await?;
        let took = started.elapsed().as_secs_f64();
        let sampled = sampler.stop();
        let gib = files.iter().map(|f| f.size).sum::<u64>() as f64 / GIB as f64;
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
