//! Benchmarks 1–3: fetch-and-verify throughput against curl (plain, and
//! piped through `openssl dgst -sha256`), finishing an interrupted download
//! against fetching it whole, and re-verifying an unchanged model against a
//! full re-hash. berth runs in-process through `Fetcher::fetch`, exactly as a
//! deployment calls it; each run starts from an empty directory with no
//! dirty pages pending (`sync`, untimed).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use berth::fetch::{Fetcher, Quiet, Split};
use berth::model::{ModelFile, TrainedModel};
use tokio_util::sync::CancellationToken;

use crate::Ctx;
use crate::data::{self, DataFile, GIB, MIB};
use crate::report::{Table, cpu_seconds, gbps, median, secs, settle, sh, speed_vs};

/// Files of the many-files model: 64 × 16 MiB.
const MANY: usize = 64;
const MANY_SIZE: u64 = 16 * MIB;

pub fn model(ctx: &Ctx, job_id: &str, files: &[DataFile]) -> TrainedModel {
    TrainedModel::from_files(
        job_id,
        format!("http://{}/{{job_id}}/{{path}}", ctx.source.addr),
        files
            .iter()
            .map(|f| ModelFile {
                path: f.path.clone(),
                size_bytes: f.size,
                sha256: Some(f.sha256.clone()),
                format: None,
            })
            .collect(),
    )
}

/// Makes (or finds) the files of `job_id` and reads them once, so every
/// client is served from memory alike.
pub fn files(
    ctx: &Ctx,
    job_id: &str,
    specs: &[(String, u64)],
    seed: u64,
) -> anyhow::Result<Vec<DataFile>> {
    let root = ctx.source_root.join(job_id);
    let files = specs
        .iter()
        .enumerate()
        .map(|(i, (path, size))| data::make(&root, path, *size, seed + i as u64))
        .collect::<Result<Vec<_>, _>>()?;
    sh(&format!("cat {}/* > /dev/null", shell_quote(&root)))?;
    Ok(files)
}

pub async fn fetch(fetcher: &Fetcher, model: &TrainedModel) -> anyhow::Result<Duration> {
    let started = Instant::now();
    fetcher
        .fetch(model, Arc::new(Quiet), &CancellationToken::new())
        .await
        .with_context(|| format!("berth could not fetch {}", model.job_id))?;
    Ok(started.elapsed())
}

/// A fetcher with berth's defaults (8 connections per large file) into an
/// empty directory.
pub fn fresh_fetcher(ctx: &Ctx, name: &str) -> anyhow::Result<Fetcher> {
    let dir = ctx.out_dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Fetcher::new(dir, Duration::from_secs(3600))
}

/// A fetcher that reads every file in one stream, as a single connection.
fn one_stream_fetcher(ctx: &Ctx, name: &str) -> anyhow::Result<Fetcher> {
    Ok(fresh_fetcher(ctx, name)?.split(Split {
        connections: 1,
        ..Split::default()
    }))
}

/// The disk's own floor for durable writes of `bytes` (`dd` then
/// `fdatasync`), median seconds of `ctx.rounds`: no fetch that fsyncs
/// what it wrote ends sooner.
pub fn durable_write_floor(ctx: &Ctx, bytes: u64) -> anyhow::Result<f64> {
    let mut disk = Vec::new();
    for _ in 0..ctx.rounds {
        settle();
        let to = shell_quote(&fresh_dir(ctx, "dd")?.join("zeros"));
        let script = format!(
            "dd if=/dev/zero of={to} bs=1M count={} conv=fdatasync 2>/dev/null",
            bytes / MIB
        );
        disk.push(sh(&script)?.0.as_secs_f64());
    }
    Ok(median(&disk))
}

pub fn fresh_dir(ctx: &Ctx, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = ctx.out_dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// The contenders of benchmark 1, in the order the first round runs them;
/// later rounds rotate the order so no contender always goes first.
const CONTENDERS: [&str; 4] = ["curl -o", "curl -o + sync", "curl | tee | openssl", "berth"];

/// One run of `contender` over `files` of `job_id`, file after file for the
/// baselines; returns its wall time and the CPU time it took (with the
/// loopback source's, the same for every contender).
async fn run(
    ctx: &Ctx,
    contender: &str,
    job_id: &str,
    files: &[DataFile],
) -> anyhow::Result<(f64, f64)> {
    settle();
    let cpu = cpu_seconds();
    let took = run_timed(ctx, contender, job_id, files).await?;
    Ok((took, cpu_seconds() - cpu))
}

async fn run_timed(
    ctx: &Ctx,
    contender: &str,
    job_id: &str,
    files: &[DataFile],
) -> anyhow::Result<f64> {
    if contender == "berth" {
        let fetcher = fresh_fetcher(ctx, "berth")?;
        let took = fetch(&fetcher, &model(ctx, job_id, files)).await?;
        return Ok(took.as_secs_f64());
    }
    let out = fresh_dir(ctx, "curl")?;
    let mut script = String::from("set -e\n");
    for (i, file) in files.iter().enumerate() {
        let url = ctx.source.url(&format!("{job_id}/{}", file.path));
        let to = shell_quote(&out.join(format!("f{i}")));
        script.push_str(&match contender {
            "curl -o" => format!("curl -sf '{url}' -o {to}\n"),
            "curl -o + sync" => format!("curl -sf '{url}' -o {to} && sync {to}\n"),
            _ => format!("curl -sf '{url}' | tee {to} | openssl dgst -sha256\n"),
        });
    }
    let (took, stdout) = sh(&script)?;
    if contender == "curl | tee | openssl" {
        for (file, line) in files.iter().zip(stdout.lines()) {
            ensure!(
                line.ends_with(&file.sha256),
                "openssl saw other bytes for {}: {line}",
                file.path
            );
        }
    }
    for (i, file) in files.iter().enumerate() {
        let len = std::fs::metadata(out.join(format!("f{i}")))?.len();
        ensure!(
            len == file.size,
            "{contender} wrote {len} bytes of {}",
            file.path
        );
    }
    Ok(took.as_secs_f64())
}

/// Benchmark 1.
pub async fn throughput(ctx: &Ctx) -> anyhow::Result<()> {
    let big = files(ctx, "big", &[("big.bin".into(), ctx.big_gib * GIB)], 1)?;
    let specs: Vec<(String, u64)> = (0..MANY)
        .map(|i| (format!("part-{i:02}.bin"), MANY_SIZE))
        .collect();
    let many = files(ctx, "many", &specs, 100)?;

    for (title, job_id, files) in [
        (
            format!(
                "1a. fetch + verify one {} GiB file (loopback HTTP)",
                ctx.big_gib
            ),
            "big",
            &big,
        ),
        (
            format!(
                "1b. fetch + verify a model of {MANY} × {} MiB files",
                MANY_SIZE / MIB
            ),
            "many",
            &many,
        ),
    ] {
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for round in 0..ctx.rounds {
            for k in 0..CONTENDERS.len() {
                let contender = CONTENDERS[(k + round) % CONTENDERS.len()];
                let (took, used) = run(ctx, contender, job_id, files).await?;
                times.entry(contender).or_default().push(took);
                cpu.entry(contender).or_default().push(used);
            }
        }
        let floor = durable_write_floor(ctx, bytes)?;
        let berth = median(&times["berth"]);
        let mut table = Table::new(&format!("{title}, median of {} rounds", ctx.rounds));
        for contender in CONTENDERS {
            let t = median(&times[contender]);
            let versus = if contender == "berth" {
                "verified, fsynced, renamed into place".to_string()
            } else {
                format!("berth: {}", speed_vs(berth, t, contender))
            };
            table.row(
                contender,
                format!(
                    "{} ({}, CPU {})",
                    secs(t),
                    gbps(bytes, t),
                    secs(median(&cpu[contender]))
                ),
                versus,
            );
        }
        // And the CPU's floor for hashing them (from memory, no network).
        let mut hashing = Vec::new();
        for _ in 0..ctx.rounds {
            let paths: Vec<String> = files
                .iter()
                .map(|f| shell_quote(&ctx.source_root.join(job_id).join(&f.path)))
                .collect();
            hashing.push(
                sh(&format!(
                    "openssl dgst -sha256 {} > /dev/null",
                    paths.join(" ")
                ))?
                .0
                .as_secs_f64(),
            );
        }
        table.row(
            "disk: dd + fdatasync",
            format!("{} ({})", secs(floor), gbps(bytes, floor)),
            format!(
                "berth: {} (the durable-write floor)",
                speed_vs(berth, floor, "the disk")
            ),
        );
        let hash_floor = median(&hashing);
        table.row(
            "sha256 only: openssl dgst",
            format!("{} ({})", secs(hash_floor), gbps(bytes, hash_floor)),
            format!(
                "berth: {} (the hashing floor)",
                speed_vs(berth, hash_floor, "hashing alone")
            ),
        );
        if let [file] = files.as_slice() {
            // One file is one SHA-256 chain: no number of cores shortens
            // it. The CPU's own speed for it, from memory with the crate
            // berth hashes with, bounds every verifying fetch.
            let chain = median(
                &(0..ctx.rounds)
                    .map(|_| sha256_in_memory(file.size))
                    .collect::<Vec<_>>(),
            );
            let curl = median(&times["curl -o"]);
            table.row(
                "sha256 only: in memory, one core",
                format!("{} ({})", secs(chain), gbps(bytes, chain)),
                format!(
                    "berth: {}; no verifying fetch can pass {:.2}× curl -o here",
                    speed_vs(berth, chain, "one hash chain"),
                    curl / chain
                ),
            );
        }
        // berth's CPU seconds spread over every core: the soonest this
        // much work can end, however it is scheduled.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let work = median(&cpu["berth"]) / cores as f64;
        table.row(
            &format!("cpu: berth's CPU over {cores} cores"),
            format!("{} ({})", secs(work), gbps(bytes, work)),
            format!(
                "berth: {}; with this much work, at most {:.2}× curl -o",
                speed_vs(berth, work, "its CPU floor"),
                median(&times["curl -o"]) / work
            ),
        );
        table.print();
    }
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}

/// Seconds to hash `len` bytes already in memory on one core.
fn sha256_in_memory(len: u64) -> f64 {
    use sha2::Digest;
    let block = vec![0x5a_u8; MIB as usize];
    let started = Instant::now();
    let mut hasher = sha2::Sha256::new();
    for _ in 0..len / MIB {
        hasher.update(&block);
    }
    std::hint::black_box(hasher.finalize());
    started.elapsed().as_secs_f64()
}

/// Benchmark 2: a download cut off at 90 % and continued, against fetching
/// the file whole.
pub async fn resume(ctx: &Ctx) -> anyhow::Result<()> {
    let big = files(ctx, "big", &[("big.bin".into(), ctx.big_gib * GIB)], 1)?;
    let size = big[0].size;
    let cut_at = size / 10 * 9;
    let mut whole = Vec::new();
    let mut resumed = Vec::new();
    let mut rehashed = Vec::new();
    for _ in 0..ctx.rounds {
        settle();
        let fetcher = one_stream_fetcher(ctx, "berth")?;
        whole.push(
            fetch(&fetcher, &model(ctx, "big", &big))
                .await?
                .as_secs_f64(),
        );
        for crashed in [false, true] {
            let fetcher = cut_off(ctx, &big, cut_at).await?;
            if crashed {
                // As after a kill -9: no checkpoint, the kept bytes are
                // read back and hashed again.
                let record = fetcher
                    .dir_of("big")
                    .with_file_name(".berth")
                    .join("big.resume");
                std::fs::remove_dir_all(&record)
                    .with_context(|| format!("no checkpoint at {}", record.display()))?;
            }
            settle();
            let took = fetch(&fetcher, &model(ctx, "big", &big))
                .await?
                .as_secs_f64();
            if crashed { &mut rehashed } else { &mut resumed }.push(took);
        }
    }
    let (whole, resumed, rehashed) = (median(&whole), median(&resumed), median(&rehashed));
    let mut table = Table::new(&format!(
        "2. finish a {} GiB download interrupted at 90 %, median of {} rounds",
        ctx.big_gib, ctx.rounds
    ));
    table.row("fetch it whole", secs(whole), "baseline".into());
    table.row(
        "continue from 90 %, after a broken-off download",
        secs(resumed),
        format!(
            "{:.2}× faster (the hash continues from its checkpoint; 10 % downloaded)",
            whole / resumed
        ),
    );
    table.row(
        "continue from 90 %, after a crash",
        secs(rehashed),
        format!(
            "{:.2}× faster (no checkpoint: the kept 90 % is hashed again from disk)",
            whole / rehashed
        ),
    );
    table.print();
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}

/// A fetcher whose download of `big` broke off after `cut_at` bytes.
async fn cut_off(ctx: &Ctx, big: &[DataFile], cut_at: u64) -> anyhow::Result<Fetcher> {
    let fetcher = one_stream_fetcher(ctx, "berth")?;
    let mut cut = model(ctx, "big", big);
    cut.source = format!(
        "http://{}/cut/{cut_at}/{{job_id}}/{{path}}",
        ctx.source.addr
    );
    if fetch(&fetcher, &cut).await.is_ok() {
        bail!("the cut download succeeded");
    }
    let kept = std::fs::metadata(fetcher.dir_of("big").join(".fetch-big.bin"))?.len();
    ensure!(kept == cut_at, "kept {kept} bytes, not {cut_at}");
    Ok(fetcher)
}

/// The model of benchmarks 3 and 5: `model_gib` files of 1 GiB.
pub fn big_model(ctx: &Ctx) -> anyhow::Result<Vec<DataFile>> {
    let specs: Vec<(String, u64)> = (0..ctx.model_gib)
        .map(|i| (format!("shard-{i}.bin"), GIB))
        .collect();
    files(ctx, "model", &specs, 1000)
}

/// Benchmark 3: the second deployment of an unchanged model.
pub async fn reverify(ctx: &Ctx) -> anyhow::Result<()> {
    let shards = big_model(ctx)?;
    let model = model(ctx, "model", &shards);
    let fetcher = fresh_fetcher(ctx, "berth")?;
    let first = fetch(&fetcher, &model).await?.as_secs_f64();
    let stamps = fetcher
        .dir_of("model")
        .with_file_name(".berth")
        .join("model.stamps.json");
    ensure!(
        stamps.exists(),
        "no verification record at {}",
        stamps.display()
    );

    let blob_books = stamps.with_file_name("blobs");
    ensure!(
        blob_books.is_dir(),
        "no blob stamps at {}",
        blob_books.display()
    );
    let mut recorded = Vec::new();
    let mut rehash = Vec::new();
    let mut openssl = Vec::new();
    let files: Vec<String> = shards
        .iter()
        .map(|f| shell_quote(&fetcher.dir_of("model").join(&f.path)))
        .collect();
    for _ in 0..ctx.rounds {
        for _ in 0..20 {
            recorded.push(fetch(&fetcher, &model).await?.as_secs_f64());
        }
        std::fs::remove_file(&stamps)?;
        // The blob store vouches for a file its own stamp no longer does
        // (issue 29): without its blobs' stamps too, nothing is hashed.
        for shard in &shards {
            match std::fs::remove_file(blob_books.join(format!("{}.stamp", shard.sha256))) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        rehash.push(fetch(&fetcher, &model).await?.as_secs_f64());
        ensure!(
            stamps.exists(),
            "the re-hash did not write the record again"
        );
        openssl.push(
            sh(&format!("openssl dgst -sha256 {}", files.join(" ")))?
                .0
                .as_secs_f64(),
        );
    }
    let bytes = ctx.model_gib * GIB;
    let (recorded, rehash, openssl) = (median(&recorded), median(&rehash), median(&openssl));
    let mut table = Table::new(&format!(
        "3. re-deploy an unchanged {} GiB model ({} × 1 GiB), files in page cache, median of {} rounds",
        ctx.model_gib, ctx.model_gib, ctx.rounds
    ));
    table.row(
        "first fetch (download + verify)",
        secs(first),
        "for scale".into(),
    );
    table.row(
        "berth, full re-hash (record deleted)",
        format!("{} ({})", secs(rehash), gbps(bytes, rehash)),
        "baseline".into(),
    );
    table.row(
        "openssl dgst -sha256 of the files",
        format!("{} ({})", secs(openssl), gbps(bytes, openssl)),
        "baseline".into(),
    );
    table.row(
        "berth, verification record",
        secs(recorded),
        format!(
            "{:.0}× faster than the re-hash; one lstat per file, no lock",
            rehash / recorded
        ),
    );
    table.print();
    let _ = std::fs::remove_dir_all(&ctx.out_dir);
    Ok(())
}
