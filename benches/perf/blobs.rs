//! Benchmark: the blob store. A second model that shares 3.5 GiB of its
//! 4 GiB with a model already held (seven 512 MiB shards, one 512 MiB file
//! of its own): its first fetch against the same model fetched into an
//! empty models dir, and the disk both take against two plain copies.
//! Then adoption of a models dir of 10,000 files filled without the store
//! (100 models of 100 files, half of them the same in every model): its
//! time and the bytes it reads, against hashing every file.

use std::os::unix::fs::symlink;
use std::time::Instant;

use anyhow::Context;
use berth::fetch::Fetcher;
use berth::fetch::usage;
use berth::model::{ModelFile, TrainedModel};

use crate::Ctx;
use crate::data::{DataFile, GIB, MIB};
use crate::fetch::{fetch, files, fresh_fetcher, model, shell_quote};
use crate::report::{Table, median, secs, settle, sh};

const SHARDS: usize = 7;
const SHARD: u64 = 512 * MIB;

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    shared_model(ctx).await?;
    adoption(ctx).await
}

async fn shared_model(ctx: &Ctx) -> anyhow::Result<()> {
    let mut specs: Vec<(String, u64)> = (0..SHARDS)
        .map(|i| (format!("shard-{i}.safetensors"), SHARD))
        .collect();
    specs.push(("own.safetensors".into(), SHARD));
    let first = files(ctx, "blobs-first", &specs, 7000)?;
    // The second model's shards are the first's bytes (linked at the
    // source: one copy of the data there too); its own file differs.
    let second_root = ctx.source_root.join("blobs-second");
    std::fs::create_dir_all(&second_root)?;
    let mut second: Vec<DataFile> = first[..SHARDS].to_vec();
    for shard in &second {
        let to = second_root.join(&shard.path);
        if !to.exists() {
            std::fs::hard_link(ctx.source_root.join("blobs-first").join(&shard.path), to)?;
        }
    }
    let own = files(
        ctx,
        "blobs-second",
        &[("own.safetensors".into(), SHARD)],
        8000,
    )?;
    second.extend(own);
    let (first, second) = (
        model(ctx, "blobs-first", &first),
        model(ctx, "blobs-second", &second),
    );

    let (mut alone, mut beside) = (Vec::new(), Vec::new());
    let mut on_disk = 0;
    for round in 0..ctx.rounds {
        // The same model into an empty models dir, then the shared one
        // into a dir holding the first model.
        let empty = fresh_fetcher(ctx, "blobs-empty")?;
        settle();
        alone.push(fetch(&empty, &second).await?.as_secs_f64());
        drop(empty);
        let held = fresh_fetcher(ctx, "blobs-held")?;
        fetch(&held, &first).await?;
        settle();
        beside.push(fetch(&held, &second).await?.as_secs_f64());
        on_disk = held.usage().await?.bytes_on_disk;
        println!(
            "round {round}: from empty {}, beside the first {}",
            secs(alone[round]),
            secs(beside[round])
        );
    }
    let total = 4 * GIB;
    let mut table = Table::new("Blob store: a second model sharing 3.5 GiB of its 4 GiB");
    let (alone, beside) = (median(&alone), median(&beside));
    table.row(
        "first fetch beside the first model",
        secs(beside),
        format!(
            "{:.1}× faster than the same model into an empty models dir ({})",
            alone / beside,
            secs(alone)
        ),
    );
    table.row(
        "disk used by both models",
        format!("{:.2} GiB", on_disk as f64 / GIB as f64),
        format!(
            "{:.2}× of two plain copies ({:.2} GiB)",
            on_disk as f64 / (2 * total) as f64,
            (2 * total) as f64 / GIB as f64
        ),
    );
    table.print();
    Ok(())
}

const MODELS: usize = 100;
const FILES: usize = 100;
const FILE_BYTES: usize = 64 * 1024;

async fn adoption(ctx: &Ctx) -> anyhow::Result<()> {
    // Files on disk as a `file://` source: 10,000 requests over loopback
    // would measure the HTTP server, not the adoption.
    let root = ctx.data_dir.join("adopt-source");
    let mut models = Vec::new();
    for m in 0..MODELS {
        let job_id = format!("adopt-{m}");
        let dir = root.join(&job_id);
        std::fs::create_dir_all(&dir)?;
        let mut listed = Vec::new();
        for f in 0..FILES {
            // Half the files are every model's; half are the model's own.
            let seed = if f % 2 == 0 { f } else { (m + 1) * FILES + f };
            let bytes: Vec<u8> = (0..FILE_BYTES)
                .map(|i| (i as u64).wrapping_mul(seed as u64 + 1).to_le_bytes()[1])
                .collect();
            let path = format!("f{f}.bin");
            std::fs::write(dir.join(&path), &bytes)?;
            listed.push(ModelFile {
                path,
                size_bytes: FILE_BYTES as u64,
                sha256: Some(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))),
                format: None,
            });
        }
        models.push(TrainedModel::from_files(
            &job_id,
            format!("file://{}/{{job_id}}/{{path}}", root.display()),
            listed,
        ));
    }
    // Filled while the store could not link (it was on tmpfs): a copy of
    // every file per model, each vouched for by its record.
    let fetcher: Fetcher = fresh_fetcher(ctx, "adopt")?;
    let models_dir = ctx.out_dir.join("adopt");
    let elsewhere = tempfile::tempdir_in("/dev/shm").context("a store on tmpfs")?;
    symlink(elsewhere.path(), models_dir.join(".blobs"))?;
    for model in &models {
        fetch(&fetcher, model).await?;
    }
    std::fs::remove_file(models_dir.join(".blobs"))?;
    let before = usage::scan(&models_dir)?.bytes_on_disk;
    sh("sync")?;
    settle();

    let read_before = io_read()?;
    let started = Instant::now();
    let adopted = fetcher.adopt().await;
    let took = started.elapsed().as_secs_f64();
    let read = io_read()? - read_before;
    let after = usage::scan(&models_dir)?.bytes_on_disk;
    anyhow::ensure!(
        adopted.files == MODELS * FILES,
        "adopted {adopted:?}, not every file"
    );

    settle();
    let (rehash, _) = sh(&format!(
        "find {} -mindepth 1 -name '.*' -prune -o -type f -print0 | xargs -0 sha256sum > /dev/null",
        shell_quote(&models_dir)
    ))?;
    let mut table = Table::new("Blob store: adopting a models dir of 10,000 files (100 models)");
    table.row(
        "adoption",
        secs(took),
        format!(
            "{:.1}× faster than hashing every file with sha256sum ({})",
            rehash.as_secs_f64() / took,
            secs(rehash.as_secs_f64())
        ),
    );
    table.row(
        "bytes read by the adoption",
        format!("{:.1} MiB", read as f64 / MIB as f64),
        format!(
            "of {:.1} MiB of model files (its records and stamps, no file's bytes)",
            before as f64 / MIB as f64
        ),
    );
    table.row(
        "disk freed",
        format!("{:.1} MiB", adopted.freed_bytes as f64 / MIB as f64),
        format!(
            "{:.1} MiB on disk before, {:.1} MiB after",
            before as f64 / MIB as f64,
            after as f64 / MIB as f64
        ),
    );
    table.print();
    Ok(())
}

/// The bytes this process has read through system calls (`rchar`): the
/// page cache's as well as the disk's.
fn io_read() -> anyhow::Result<u64> {
    let io = std::fs::read_to_string("/proc/self/io")?;
    io.lines()
        .find_map(|line| line.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .context("no rchar in /proc/self/io")
}
