//! Benchmark 16: deployers at native speed. The same CPU-bound work done
//! natively and by guests through `berth::runtime` (the server's engine
//! settings, pooled instances), on the optimized tier (Cranelift) and the
//! baseline tier (Winch), each in the same round:
//! - a gzipped tar of the model, level 6: the `archive` example (Rust)
//!   against tar + flate2 here (the crates it is built from, so the same
//!   compressor) and against `tar -czf`;
//! - the sha256 of the model: `misbehave`'s `sha256` mode (Rust, the sha2
//!   crate) and `model-card` hashing a file registered without a checksum
//!   (Python, CPython's hashlib) against sha2 here and `sha256sum`.
//!
//! The model is one file of bf16 weights drawn from a normal distribution,
//! so it compresses like a real one rather than like the random bytes of
//! the other sections.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use berth::model::{ModelFile, TrainedModel};
use berth::runtime::{
    Compiler, DeployCall, Engines, Limits, LogReporter, Manifest, Plugin, Runtime,
};
use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::Ctx;
use crate::data::MIB;
use crate::dropin::example;
use crate::report::{Table, cpu_seconds, load_average, median, secs};

const WEIGHTS: &str = "model.safetensors";
/// What the examples read and the native code reads by.
const READ_BUFFER: usize = 1 << 20;

/// The work a subject is timed on, and so its native contenders.
#[derive(Clone, Copy, PartialEq)]
enum Work {
    Gzip,
    Sha256,
}

/// A deployer of the section and the options of its work.
struct Guest {
    label: String,
    wasm: PathBuf,
    options: &'static str,
    work: Work,
}

/// The deployers timed: each build of `archive` (this one unless
/// `--archive LABEL=PATH` names others), then the hashers.
fn guests(ctx: &Ctx) -> Vec<Guest> {
    let archives = if ctx.archives.is_empty() {
        vec![("archive (Rust)".to_string(), example("archive"))]
    } else {
        ctx.archives
            .iter()
            .map(|(label, path)| (format!("archive (Rust, {label})"), path.clone()))
            .collect()
    };
    let mut guests: Vec<Guest> = archives
        .into_iter()
        .map(|(label, wasm)| Guest {
            label,
            wasm,
            options: "{}",
            work: Work::Gzip,
        })
        .collect();
    guests.push(Guest {
        label: "misbehave sha256 (Rust)".into(),
        wasm: crate::plugin::plugin_path(),
        options: r#"{"mode":"sha256"}"#,
        work: Work::Sha256,
    });
    guests.push(Guest {
        label: "model-card (Python)".into(),
        wasm: example("model-card"),
        options: "{}",
        work: Work::Sha256,
    });
    guests
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    // Kept with --keep, model and compiled code: a rerun starts at once.
    let dir = ctx.data_dir.join("native");
    let (model_dir, out_dir) = (dir.join("model"), dir.join("out"));
    std::fs::create_dir_all(&model_dir)?;
    std::fs::create_dir_all(&out_dir)?;
    let size = weights(&model_dir.join(WEIGHTS), ctx.native_mib * MIB)?;
    // No checksum recorded: model-card then hashes the file itself.
    let model = TrainedModel::from_files(
        "native",
        String::new(),
        vec![ModelFile {
            path: WEIGHTS.into(),
            size_bytes: size,
            sha256: None,
            format: None,
        }],
    );
    let guests = guests(ctx);
    let limits = Limits {
        timeout: Duration::from_secs(3600),
        out_mib: 4 * ctx.native_mib + 64,
        ..Limits::default()
    };
    let cache = berth::runtime::CodeCache::new(dir.join("cache"));
    let mut tiers = Vec::new();
    for (tier, compiler) in [
        ("optimized", Compiler::Optimized),
        ("baseline", Compiler::Baseline),
    ] {
        let engines = Engines {
            compiler,
            ..Engines::default()
        };
        let runtime = Runtime::new(limits, Some(cache.clone()), engines)?;
        let mut plugins = Vec::new();
        for guest in &guests {
            let wasm = std::fs::read(&guest.wasm).with_context(|| {
                format!(
                    "cannot read {} (run scripts/build-plugins)",
                    guest.wasm.display()
                )
            })?;
            let plugin = runtime
                .load("subject", wasm, Manifest::default(), None)
                .await
                .map_err(anyhow::Error::msg)?;
            plugins.push(plugin);
        }
        tiers.push((tier, runtime, plugins));
    }

    let weights_path = model_dir.join(WEIGHTS);
    let archive_path = out_dir.join("native.tar.gz");
    let (mut tar, mut flate2, mut sha256sum, mut sha2) = (vec![], vec![], vec![], vec![]);
    let mut taken: Vec<Vec<Took>> = vec![Vec::new(); tiers.len() * guests.len()];
    let mut loads = Vec::new();
    for _ in 0..ctx.rounds {
        loads.push(load_average());
        tar.push(timed(|| {
            command(
                Command::new("tar")
                    .arg("-C")
                    .arg(&model_dir)
                    .arg("-czf")
                    .arg(&archive_path)
                    .arg(WEIGHTS),
            )
        })?);
        flate2.push(timed(|| pack(&model_dir, WEIGHTS, &archive_path))?);
        sha256sum.push(timed(|| {
            command(Command::new("sha256sum").arg(&weights_path))
        })?);
        sha2.push(timed(|| hash(&weights_path))?);
        std::fs::remove_file(&archive_path)?;
        let runs = tiers.iter().flat_map(|(_, runtime, plugins)| {
            guests.iter().zip(plugins).map(move |g| (runtime, g))
        });
        for (at, (runtime, (guest, plugin))) in runs.enumerate() {
            taken[at].push(deploy(runtime, plugin, &model, &model_dir, &out_dir, guest).await?);
            // The archive's output, so the out-dir holds one at most.
            for entry in std::fs::read_dir(&out_dir)? {
                std::fs::remove_file(entry?.path())?;
            }
        }
    }

    let rate = |took: Took| {
        format!(
            "{} · CPU {} ({:.0} MB/s a CPU second)",
            secs(took.wall),
            secs(took.cpu),
            size as f64 / took.cpu / 1e6
        )
    };
    // By CPU first: the machine's other work moves the wall times of
    // contenders run one after the other.
    let versus = |ours: Took, theirs: Took, name: &str| {
        format!(
            "{:.2}× {name} by CPU ({:.2}× by wall)",
            theirs.cpu / ours.cpu,
            theirs.wall / ours.wall
        )
    };
    let mut table = Table::new(&format!(
        "16. the same CPU-bound work natively and in the guests (berth::runtime, pooled), \
         one {} MiB bf16 model in page cache, median of {} rounds (load average at each \
         round's start: {})",
        ctx.native_mib,
        ctx.rounds,
        loads.join(" / ")
    ));
    let (tar, flate2, sha256sum, sha2) = (
        Took::median(&tar),
        Took::median(&flate2),
        Took::median(&sha256sum),
        Took::median(&sha2),
    );
    table.row("gzip -6: tar -czf", rate(tar), "baseline".into());
    table.row(
        "gzip -6: tar + flate2 (zlib-rs) here, native",
        rate(flate2),
        versus(flate2, tar, "tar -czf"),
    );
    table.row("sha256: sha256sum", rate(sha256sum), "baseline".into());
    table.row(
        "sha256: sha2 here, native (SHA-NI where the CPU has it)",
        rate(sha2),
        versus(sha2, sha256sum, "sha256sum"),
    );
    let subjects = tiers
        .iter()
        .flat_map(|(tier, _, _)| guests.iter().map(move |guest| (tier, guest)));
    for ((tier, guest), runs) in subjects.zip(&taken) {
        let took = Took::median(runs);
        let (what, native, peer) = match guest.work {
            Work::Gzip => ("gzip -6", flate2, ("tar -czf", tar)),
            Work::Sha256 => ("sha256", sha2, ("sha256sum", sha256sum)),
        };
        table.row(
            &format!("{what}: {}, {tier}", guest.label),
            rate(took),
            format!(
                "{} · {:.2}× {} by CPU",
                versus(took, native, "native"),
                peer.1.cpu / took.cpu,
                peer.0
            ),
        );
    }
    table.print();
    Ok(())
}

/// Runs a baseline tool, its output discarded.
fn command(command: &mut Command) -> anyhow::Result<()> {
    let status = command.stdout(std::process::Stdio::null()).status()?;
    ensure!(status.success(), "{command:?} failed");
    Ok(())
}

/// What one run of a contender took: wall seconds, and CPU seconds (user
/// and system, of this process and the tools it waited for), which a
/// machine busy with other work shrinks far less.
#[derive(Clone, Copy)]
struct Took {
    wall: f64,
    cpu: f64,
}

impl Took {
    fn since(wall: Instant, cpu: f64) -> Self {
        Took {
            wall: wall.elapsed().as_secs_f64(),
            cpu: cpu_seconds() - cpu,
        }
    }

    fn median(runs: &[Took]) -> Took {
        let of = |field: fn(&Took) -> f64| median(&runs.iter().map(field).collect::<Vec<_>>());
        Took {
            wall: of(|t| t.wall),
            cpu: of(|t| t.cpu),
        }
    }
}

fn timed(work: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Took> {
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    work()?;
    Ok(Took::since(wall, cpu))
}

async fn deploy(
    runtime: &Runtime,
    plugin: &Plugin,
    model: &TrainedModel,
    model_dir: &Path,
    out_dir: &Path,
    guest: &Guest,
) -> anyhow::Result<Took> {
    let call = DeployCall {
        deploy_id: 1,
        model,
        model_dir,
        out_dir,
        record: None,
        options_json: guest.options,
    };
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    runtime
        .deploy(
            plugin,
            call,
            Arc::new(LogReporter::new("native", Some(1))),
            &CancellationToken::new(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", guest.label))?;
    Ok(Took::since(wall, cpu))
}

/// What `archive` does, natively: one tar entry with fixed metadata,
/// gzipped at level 6, hashed on its way to disk.
fn pack(model_dir: &Path, name: &str, archive: &Path) -> anyhow::Result<()> {
    let file = File::open(model_dir.join(name))?;
    let out = Hashing(BufWriter::new(File::create(archive)?), Sha256::new());
    let mut tar = tar::Builder::new(GzEncoder::new(out, Compression::new(6)));
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(file.metadata()?.len());
    header.set_mode(0o644);
    header.set_mtime(0);
    tar.append_data(
        &mut header,
        name,
        BufReader::with_capacity(READ_BUFFER, file),
    )?;
    let Hashing(mut out, hasher) = tar.into_inner()?.finish()?;
    out.flush()?;
    std::hint::black_box(hasher.finalize());
    Ok(())
}

/// A writer that hashes what passes through it, as `archive`'s does.
struct Hashing<W>(W, Sha256);

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.0.write(buf)?;
        self.1.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

fn hash(path: &Path) -> anyhow::Result<()> {
    let mut file = File::open(path)?;
    let mut buffer = vec![0u8; READ_BUFFER];
    let mut hasher = Sha256::new();
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    std::hint::black_box(hasher.finalize());
    Ok(())
}

/// Writes `size` bytes of little-endian bf16 weights, normal with σ 0.02
/// (a sum of four uniforms), unless a file of that size is there; read
/// once, so every contender starts from the page cache.
fn weights(path: &Path, size: u64) -> anyhow::Result<u64> {
    if std::fs::metadata(path).map(|m| m.len()).ok() != Some(size) {
        let mut out = BufWriter::with_capacity(4 << 20, File::create(path)?);
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut chunk = vec![0u8; MIB as usize];
        for _ in 0..size / MIB {
            for pair in chunk.chunks_exact_mut(2) {
                // xorshift64*, four 16-bit uniforms summed: near normal.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
                let sum: f32 = (0..4).map(|i| ((r >> (16 * i)) & 0xFFFF) as f32).sum();
                let normal = (sum / 65536.0 - 2.0) * (3.0f32).sqrt();
                let bf16 = ((normal * 0.02).to_bits() >> 16) as u16;
                pair.copy_from_slice(&bf16.to_le_bytes());
            }
            out.write_all(&chunk)?;
        }
        out.flush()?;
    }
    let mut file = File::open(path)?;
    io::copy(&mut file, &mut io::sink())?;
    Ok(size)
}
