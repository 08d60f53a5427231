//! Benchmark 14: publishing a model through targets (issue 26). A real
//! `berth serve` (the bench build) has fetched a model of 4 files
//! (`--publish-mib`, 1024 MiB each by default); each timed run is one
//! synchronous deployment, so its time is the plugin's and the host's:
//!
//! - `s3-publish` into a bucket of `s3s-fs` (a Rust S3 server over a
//!   folder, far faster than moto, checking SigV4; its multipart completion
//!   copies every byte again, which bounds every multipart client), against boto3's `upload_file` (its defaults: 8 MiB parts, 10
//!   threads) file after file, `aws s3 cp --recursive`, and the server's
//!   floor, one `curl -T --aws-sigv4` PUT per file, file after file;
//! - `http-publish` onto a loopback mirror (`Mirror` below: takes `PUT`
//!   with the target's `Authorization`, counts and discards the bytes),
//!   against `curl -T` file after file with the same header.
//!
//! Then berth's resident memory at its peak while it publishes, over its
//! idle (the model fetched, the plugins loaded). Every run lands under a
//! prefix of its own; the bucket is emptied before each. The installs it
//! needs (`s3s-fs` into `target/bench-tools`, the AWS CLI into `.venv`)
//! are `scripts/bench`'s.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};

use crate::Ctx;
use crate::api::Server;
use crate::data::{DataFile, MIB};
use crate::dropin::{drop_in, plugins_dir, served};
use crate::fetch::{files, shell_quote};
use crate::report::{
    PeakRss, Table, cpu_of, cpu_seconds, gbps, median, secs, settle, sh, speed_vs,
};

const FILES: usize = 4;
const BUCKET: &str = "bench";
const REGION: &str = "us-east-1";
const ACCESS_KEY: &str = "berth-bench";
const SECRET_KEY: &str = "berth-bench-secret";
const MIRROR_TOKEN: &str = "berth-bench-mirror-token";

const BERTH_S3: &str = "berth, s3-publish";
const BOTO3: &str = "boto3 upload_file, file after file";
const AWS_CLI: &str = "aws s3 cp --recursive";
const CURL_S3: &str = "curl -T --aws-sigv4, file after file";
const S3_CONTENDERS: [&str; 4] = [BERTH_S3, BOTO3, AWS_CLI, CURL_S3];

const BERTH_HTTP: &str = "berth, http-publish";
const CURL_HTTP: &str = "curl -T, file after file";
const HTTP_CONTENDERS: [&str; 2] = [BERTH_HTTP, CURL_HTTP];

/// One timed run: wall seconds, the client's CPU seconds, the server's.
#[derive(Default, Clone, Copy)]
struct Run {
    wall: f64,
    client_cpu: f64,
    server_cpu: f64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let specs: Vec<(String, u64)> = (0..FILES)
        .map(|i| (format!("shard-{i}.bin"), ctx.publish_mib * MIB))
        .collect();
    let model = files(ctx, "publish", &specs, 700)?;
    let bytes: u64 = model.iter().map(|f| f.size).sum();

    let s3 = S3sFs::start(&ctx.data_dir.join("s3s-fs"))?;
    let mirror = Mirror::start()?;
    let sources = ctx.data_dir.join("publish-sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"bucket\"\nurl = \"s3://{BUCKET}/berth/\"\n\
             options = {{ endpoint = \"{}\", region = \"{REGION}\", access_key_id = \"{ACCESS_KEY}\", \
             secret_access_key = \"{SECRET_KEY}\" }}\n\n\
             [[target]]\nname = \"mirror\"\nurl = \"http://{}/berth/\"\n\
             headers = {{ Authorization = \"Bearer {MIRROR_TOKEN}\" }}\n",
            s3.endpoint, mirror.addr
        ),
    )?;
    // Optimized code from the start: the plugins only call the host, and a
    // tier change during a run is noise.
    let server = Server::start(
        ctx,
        "publish",
        &[
            "--sources-file",
            &sources.display().to_string(),
            "--compiler",
            "optimized",
        ],
    )?;
    let model_id = server.register(ctx, "publish", &model).await?;
    // The first deployment fetches the model; the timed ones find it.
    server.deploy(model_id).await?;
    let plugins = plugins_dir(ctx, "publish");
    for (plugin, target) in [("s3-publish", "bucket"), ("http-publish", "mirror")] {
        // The manifest first: the plugin is loaded with what is there when
        // its .wasm appears.
        std::fs::write(
            plugins.join(format!("{plugin}.toml")),
            format!("targets = [\"{target}\"]\ntimeout_s = 3600\n"),
        )?;
        drop_in(&plugins, plugin)?;
        served(&server, plugin, Some("optimized"), Instant::now()).await?;
    }
    settle();
    let idle_kib = server.status_kib("VmRSS");
    let mut peak_kib = 0;

    let mut times: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
    let mut serial = 0;
    for round in 0..ctx.rounds {
        for k in 0..S3_CONTENDERS.len() {
            let contender = S3_CONTENDERS[(k + round) % S3_CONTENDERS.len()];
            serial += 1;
            let prefix = format!("run-{serial}");
            s3.empty()?;
            settle();
            let (run, keys) = if contender == BERTH_S3 {
                let rss = PeakRss::start(server.pid());
                let deployed = deploy(
                    &server,
                    model_id,
                    ("s3-publish", "bucket", &prefix),
                    &model,
                    s3.pid(),
                )
                .await;
                peak_kib = peak_kib.max(rss.stop());
                deployed?
            } else {
                peer_to_s3(ctx, &s3, contender, &prefix, &model)?
            };
            s3.check(&keys, &model, contender)?;
            times.entry(contender).or_default().push(run);
        }
        for k in 0..HTTP_CONTENDERS.len() {
            let contender = HTTP_CONTENDERS[(k + round) % HTTP_CONTENDERS.len()];
            serial += 1;
            let prefix = format!("run-{serial}");
            mirror.forget();
            settle();
            let (run, keys) = if contender == BERTH_HTTP {
                let rss = PeakRss::start(server.pid());
                let deployed = deploy(
                    &server,
                    model_id,
                    ("http-publish", "mirror", &prefix),
                    &model,
                    std::process::id(),
                )
                .await;
                peak_kib = peak_kib.max(rss.stop());
                deployed?
            } else {
                curl_to_mirror(ctx, &mirror, &prefix, &model)?
            };
            mirror.check(&keys, &model, contender == BERTH_HTTP)?;
            times.entry(contender).or_default().push(run);
        }
    }
    drop(server);
    drop(s3);

    let medians: HashMap<&str, Run> = times
        .iter()
        .map(|(contender, runs)| {
            let of = |f: fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
            (
                *contender,
                Run {
                    wall: of(|r| r.wall),
                    client_cpu: of(|r| r.client_cpu),
                    server_cpu: of(|r| r.server_cpu),
                },
            )
        })
        .collect();
    let figure = |contender: &str| {
        let run = medians[contender];
        format!(
            "{} ({}; CPU {:.1} s, server {:.1} s)",
            secs(run.wall),
            gbps(bytes, run.wall),
            run.client_cpu,
            run.server_cpu
        )
    };

    let size = if ctx.publish_mib.is_multiple_of(1024) {
        format!("{} GiB", ctx.publish_mib / 1024)
    } else {
        format!("{} MiB", ctx.publish_mib)
    };
    let mut table = Table::new(&format!(
        "14a. publish a model of {FILES} × {size} to an S3-compatible store (s3s-fs, loopback), \
         median of {} rounds",
        ctx.rounds
    ));
    let berth = medians[BERTH_S3].wall;
    let (boto3, aws) = (medians[BOTO3].wall, medians[AWS_CLI].wall);
    let (faster, faster_name) = if boto3 <= aws {
        (boto3, "boto3")
    } else {
        (aws, "aws s3 cp")
    };
    table.row(
        BERTH_S3,
        figure(BERTH_S3),
        format!(
            "{}; {}; {} (put-model-files: 3 files at once, 6 MiB parts, 8 in flight in all, sha256 per part)",
            speed_vs(berth, faster, faster_name),
            speed_vs(berth, medians[CURL_S3].wall, "curl -T"),
            speed_vs(
                berth,
                if faster_name == "boto3" { aws } else { boto3 },
                if faster_name == "boto3" {
                    "aws s3 cp"
                } else {
                    "boto3"
                }
            ),
        ),
    );
    table.row(
        BOTO3,
        figure(BOTO3),
        "its defaults: 8 MiB parts, 10 threads, default checksums".into(),
    );
    table.row(
        AWS_CLI,
        figure(AWS_CLI),
        "its defaults: 8 MiB parts, 10 requests at once".into(),
    );
    table.row(
        CURL_S3,
        figure(CURL_S3),
        "floor: one PUT per file, payload unsigned, no checksum".into(),
    );
    table.print();

    let mut table = Table::new(&format!(
        "14b. publish a model of {FILES} × {size} to an HTTP mirror (loopback, bytes discarded), \
         median of {} rounds",
        ctx.rounds
    ));
    table.row(
        BERTH_HTTP,
        figure(BERTH_HTTP),
        format!(
            "{} (put-model-files: 3 files at once, Content-Digest sha-256)",
            speed_vs(medians[BERTH_HTTP].wall, medians[CURL_HTTP].wall, "curl -T")
        ),
    );
    table.row(CURL_HTTP, figure(CURL_HTTP), "baseline".into());
    table.row(
        "berth's resident memory while publishing (VmRSS every 10 ms)",
        format!("peak {} MiB", peak_kib >> 10),
        format!(
            "+{} MiB over idle ({} MiB, the model fetched, the plugins loaded)",
            peak_kib.saturating_sub(idle_kib) >> 10,
            idle_kib >> 10
        ),
    );
    table.print();
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}

/// A synchronous deployment by `deployer` into `target` under `prefix`;
/// its time, berth's CPU and the CPU of the store (process `store_pid`),
/// and the keys its receipts name (under the bucket, or the mirror's
/// root), each receipt checked against the model file it says it put.
async fn deploy(
    server: &Server,
    model_id: i64,
    (deployer, target, prefix): (&str, &str, &str),
    model: &[DataFile],
    store_pid: u32,
) -> anyhow::Result<(Run, Vec<String>)> {
    let (cpu, store) = (cpu_of(server.pid()), cpu_of(store_pid));
    let started = Instant::now();
    let response = server
        .client
        .post(format!("{}/v1/models/{model_id}/deployments", server.url))
        .json(&json!({ "deployer": deployer, "options": { "target": target, "prefix": prefix } }))
        .send()
        .await?;
    let wall = started.elapsed().as_secs_f64();
    let client_cpu = cpu_of(server.pid()) - cpu;
    let server_cpu = cpu_of(store_pid) - store;
    let status = response.status();
    let deployment: Value = response.json().await?;
    ensure!(
        status.is_success() && deployment["status"] == "completed",
        "{deployer} did not publish ({status}): {deployment}"
    );
    let mut keys = Vec::new();
    for file in model {
        let receipt = deployment["published"]
            .as_array()
            .and_then(|all| {
                all.iter().find(|p| {
                    p["key"]
                        .as_str()
                        .is_some_and(|k| k.ends_with(&format!("/{}", file.path)))
                })
            })
            .with_context(|| {
                format!("{deployer} recorded no put of {}: {deployment}", file.path)
            })?;
        ensure!(
            receipt["sha256"] == file.sha256.as_str() && receipt["bytes"] == file.size,
            "{deployer}'s receipt for {} does not match the file: {receipt}",
            file.path
        );
        keys.push(format!(
            "berth/{}",
            receipt["key"].as_str().unwrap_or_default()
        ));
    }
    Ok((
        Run {
            wall,
            client_cpu,
            server_cpu,
        },
        keys,
    ))
}

/// One of the S3 baselines into `prefix`; its time, CPU and the keys it
/// wrote.
fn peer_to_s3(
    ctx: &Ctx,
    s3: &S3sFs,
    contender: &str,
    prefix: &str,
    model: &[DataFile],
) -> anyhow::Result<(Run, Vec<String>)> {
    let dir = ctx.source_root.join("publish");
    let keys: Vec<String> = model
        .iter()
        .map(|f| format!("{prefix}/{}", f.path))
        .collect();
    let credentials = format!(
        "export AWS_ACCESS_KEY_ID='{ACCESS_KEY}' AWS_SECRET_ACCESS_KEY='{SECRET_KEY}' \
         AWS_DEFAULT_REGION='{REGION}' AWS_EC2_METADATA_DISABLED=true\n"
    );
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin");
    let script = match contender {
        BOTO3 => {
            let uploads: String = model
                .iter()
                .zip(&keys)
                .map(|(f, key)| {
                    format!(
                        "s3.upload_file({:?}, {BUCKET:?}, {key:?})\n",
                        dir.join(&f.path).display().to_string()
                    )
                })
                .collect();
            format!(
                "set -e\n{credentials}{} - <<'EOF'\nimport boto3\n\
                 s3 = boto3.client('s3', endpoint_url={:?})\n{uploads}EOF\n",
                shell_quote(&venv.join("python")),
                s3.endpoint
            )
        }
        AWS_CLI => format!(
            "set -e\n{credentials}{} -m awscli s3 cp --recursive --only-show-errors --exclude '*.sha256' \
             --endpoint-url '{}' {} 's3://{BUCKET}/{prefix}/'\n",
            shell_quote(&venv.join("python")),
            s3.endpoint,
            shell_quote(&dir)
        ),
        _ => model
            .iter()
            .zip(&keys)
            .map(|(f, key)| {
                // The floor sends the payload unsigned, as it hashes
                // nothing. No `-H 'Expect:'`: curl 7.88 signs the emptied
                // header yet does not send it (SignatureDoesNotMatch);
                // s3s-fs answers the 100-continue at once.
                format!(
                    "curl -sSf -o /dev/null -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
                     --user '{ACCESS_KEY}:{SECRET_KEY}' --aws-sigv4 'aws:amz:{REGION}:s3' \
                     -T {} '{}/{BUCKET}/{key}'\n",
                    shell_quote(&dir.join(&f.path)),
                    s3.endpoint
                )
            })
            .collect::<String>(),
    };
    let (run, _) = timed_sh(&script, s3.pid())?;
    Ok((run, keys))
}

/// `curl -T` of each file onto the mirror under `prefix`, one after the
/// other, with the target's header.
fn curl_to_mirror(
    ctx: &Ctx,
    mirror: &Mirror,
    prefix: &str,
    model: &[DataFile],
) -> anyhow::Result<(Run, Vec<String>)> {
    let dir = ctx.source_root.join("publish");
    let keys: Vec<String> = model
        .iter()
        .map(|f| format!("berth/{prefix}/{}", f.path))
        .collect();
    let script: String = model
        .iter()
        .zip(&keys)
        .map(|(f, key)| {
            format!(
                "curl -sSf -o /dev/null -H 'Expect:' -H 'Authorization: Bearer {MIRROR_TOKEN}' \
                 -T {} 'http://{}/{key}'\n",
                shell_quote(&dir.join(&f.path)),
                mirror.addr
            )
        })
        .collect();
    let (run, _) = timed_sh(&script, std::process::id())?;
    Ok((run, keys))
}

/// `sh(script)` with the CPU it (its processes) and the server (process
/// `server_pid`, which may be this one, for the mirror) used.
fn timed_sh(script: &str, server_pid: u32) -> anyhow::Result<(Run, String)> {
    let own = || cpu_of(std::process::id());
    let (all, mine, server) = (cpu_seconds(), own(), cpu_of(server_pid));
    let (took, stdout) = sh(script)?;
    Ok((
        Run {
            wall: took.as_secs_f64(),
            // What this process spent meanwhile is the mirror's, not the
            // script's.
            client_cpu: (cpu_seconds() - all) - (own() - mine),
            server_cpu: cpu_of(server_pid) - server,
        },
        stdout,
    ))
}

/// `s3s-fs` on a free loopback port over a folder of its own, with one
/// bucket; stopped when dropped.
struct S3sFs {
    endpoint: String,
    root: PathBuf,
    child: Child,
}

impl S3sFs {
    fn start(root: &Path) -> anyhow::Result<Self> {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-tools/bin/s3s-fs");
        ensure!(
            bin.is_file(),
            "{} is missing: run scripts/bench, which installs it \
             (cargo install s3s-fs@0.14.1 --features binary --locked --root target/bench-tools)",
            bin.display()
        );
        let _ = std::fs::remove_dir_all(root);
        std::fs::create_dir_all(root.join(BUCKET))?;
        // A free port: bound, read, released. Nothing else here races for it.
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait()? {
                bail!("s3s-fs exited at start ({status})");
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                bail!("s3s-fs did not listen on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            root: root.to_path_buf(),
            child,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Deletes every object, part and record, keeping the bucket: the
    /// disk holds one run at a time.
    fn empty(&self) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(&self.root)? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        std::fs::create_dir_all(self.root.join(BUCKET))?;
        Ok(())
    }

    /// Each of `keys` is an object of its model file's size, and no
    /// multipart upload was left unfinished.
    fn check(&self, keys: &[String], model: &[DataFile], contender: &str) -> anyhow::Result<()> {
        for (key, file) in keys.iter().zip(model) {
            let path = self.root.join(BUCKET).join(key);
            let len = std::fs::metadata(&path)
                .with_context(|| format!("{contender} left no object {key}"))?
                .len();
            ensure!(len == file.size, "{contender} left {key} with {len} bytes");
        }
        let parts = std::fs::read_dir(&self.root)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(".upload_id-"))
            .count();
        ensure!(
            parts == 0,
            "{contender} left {parts} parts of unfinished uploads"
        );
        Ok(())
    }
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback HTTP/1.1 mirror: `PUT` with the expected `Authorization` is
/// read to the end and discarded, answered 201; anything else 401, 404
/// (`HEAD`, nothing is kept) or 405. What it took is counted per path,
/// with whether it came with a `Content-Digest`.
struct Mirror {
    addr: SocketAddr,
    received: Arc<Mutex<HashMap<String, (u64, bool)>>>,
}

impl Mirror {
    fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(HashMap::new()));
        let counted = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counted = counted.clone();
                std::thread::spawn(move || {
                    let _ = mirror_serve(stream, &counted);
                });
            }
        });
        Ok(Self { addr, received })
    }

    fn forget(&self) {
        self.received.lock().expect("never poisoned").clear();
    }

    fn check(&self, keys: &[String], model: &[DataFile], digested: bool) -> anyhow::Result<()> {
        let received = self.received.lock().expect("never poisoned");
        for (key, file) in keys.iter().zip(model) {
            let (len, digest) = received
                .get(&format!("/{key}"))
                .with_context(|| format!("the mirror got no {key}"))?;
            ensure!(*len == file.size, "the mirror got {len} bytes of {key}");
            ensure!(!digested || *digest, "{key} came without a Content-Digest");
        }
        Ok(())
    }
}

fn mirror_serve(
    stream: TcpStream,
    received: &Mutex<HashMap<String, (u64, bool)>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::with_capacity(1 << 20, stream.try_clone()?);
    let mut out = stream;
    let expected = format!("Bearer {MIRROR_TOKEN}");
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request)? == 0 {
            return Ok(());
        }
        let mut parts = request.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or_default().to_string(),
            parts.next().unwrap_or("/").to_string(),
        );
        let (mut length, mut chunked, mut authorized, mut digest, mut expect) =
            (0u64, false, false, false, false);
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let (name, value) = (name.to_ascii_lowercase(), value.trim());
            match name.as_str() {
                "content-length" => length = value.parse().unwrap_or(0),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "authorization" => authorized = value == expected,
                "content-digest" => digest = value.starts_with("sha-256=:"),
                "expect" => expect = value.eq_ignore_ascii_case("100-continue"),
                _ => {}
            }
        }
        let status = match method.as_str() {
            _ if !authorized => "401 Unauthorized",
            "PUT" => {
                if expect {
                    out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
                }
                let got = if chunked {
                    discard_chunked(&mut reader)?
                } else {
                    std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink())?
                };
                received
                    .lock()
                    .expect("never poisoned")
                    .insert(path, (got, digest));
                "201 Created"
            }
            "HEAD" | "GET" => "404 Not Found",
            _ => "405 Method Not Allowed",
        };
        out.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())?;
        if status.starts_with("401") {
            // Its body, if any, was not read: the connection cannot go on.
            return Ok(());
        }
    }
}

/// Reads a chunked body to its end; its length.
fn discard_chunked(reader: &mut impl BufRead) -> std::io::Result<u64> {
    let mut total = 0;
    loop {
        let mut size = String::new();
        reader.read_line(&mut size)?;
        let size = u64::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        if size == 0 {
            // Trailers, to the empty line.
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                    return Ok(total);
                }
            }
        }
        total += std::io::copy(&mut reader.take(size), &mut std::io::sink())?;
        let mut crlf = String::new();
        reader.read_line(&mut crlf)?;
    }
}
