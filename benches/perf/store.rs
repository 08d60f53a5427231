//! Benchmark 6: a 20-file model from an S3-compatible store (moto's server
//! on loopback, `tests/moto/serve.py`), berth's fetch against the same
//! client library, object_store, getting the files one after the other and
//! hashing each as it streams, and the same 4 files at a time (berth's
//! concurrency); and, when the AWS CLI is installed (Debian's `awscli`),
//! `aws s3 cp --recursive` followed by `sha256sum`. All verify every byte;
//! berth also fsyncs and renames into place.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use berth::fetch::{Access, Fetcher, Quiet};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::Ctx;
use crate::data::{self, DataFile, MIB};
use crate::fetch::fresh_dir;
use crate::moto::Moto;
use crate::report::{Table, gbps, median, secs, settle, sh, speed_vs};

const BUCKET: &str = "bench";
const FILES: usize = 20;
const FILE_SIZE: u64 = 16 * MIB;

const AWS_CLI: &str = "aws s3 cp --recursive + sha256sum";

const CONTENDERS: [&str; 4] = [
    "object_store, file after file",
    "object_store, 4 files at a time",
    AWS_CLI,
    "berth",
];

pub async fn model(ctx: &Ctx) -> anyhow::Result<()> {
    let moto = Moto::start(&[BUCKET]);
    let store = AmazonS3Builder::new()
        .with_endpoint(&moto.endpoint)
        .with_allow_http(true)
        .with_region(&moto.region)
        .with_access_key_id(&moto.access_key_id)
        .with_secret_access_key(&moto.secret_access_key)
        .with_bucket_name(BUCKET)
        .build()?;
    let root = ctx.source_root.join("s3");
    let mut files = Vec::new();
    for i in 0..FILES {
        let file = data::make(
            &root,
            &format!("shard-{i:02}.bin"),
            FILE_SIZE,
            600 + i as u64,
        )?;
        let bytes = std::fs::read(root.join(&file.path))?;
        store
            .put(&Key::from(format!("model/{}", file.path)), bytes.into())
            .await
            .context("cannot put the benchmark's files into moto")?;
        files.push(file);
    }
    let sources_file = format!(
        "[[source]]\nprefix = \"s3://{BUCKET}/\"\noptions = {{ endpoint = \"{}\", \
         region = \"{}\", access_key_id = \"{}\", secret_access_key = \"{}\" }}",
        moto.endpoint, moto.region, moto.access_key_id, moto.secret_access_key
    );

    let aws_cli = sh("command -v aws").is_ok();
    let contenders: Vec<&str> = CONTENDERS
        .into_iter()
        .filter(|c| aws_cli || *c != AWS_CLI)
        .collect();
    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..ctx.rounds {
        for k in 0..contenders.len() {
            let contender = contenders[(k + round) % contenders.len()];
            settle();
            let took = match contender {
                "berth" => berth(ctx, &sources_file, &files).await?,
                "object_store, file after file" => get_all(ctx, &store, &files, 1).await?,
                "object_store, 4 files at a time" => get_all(ctx, &store, &files, 4).await?,
                _ => aws_s3_cp(ctx, &moto, &files)?,
            };
            times.entry(contender).or_default().push(took);
        }
    }

    let bytes = FILES as u64 * FILE_SIZE;
    let baseline = median(&times[CONTENDERS[0]]);
    let ours = median(&times["berth"]);
    let mut table = Table::new(&format!(
        "6. fetch + verify a model of {FILES} × {} MiB files from an S3-compatible store \
         (moto, loopback), median of {} rounds",
        FILE_SIZE / MIB,
        ctx.rounds
    ));
    table.row(
        CONTENDERS[0],
        format!("{} ({})", secs(baseline), gbps(bytes, baseline)),
        "baseline: get, write and sha256 each file in turn".into(),
    );
    let four = median(&times[CONTENDERS[1]]);
    table.row(
        CONTENDERS[1],
        format!("{} ({})", secs(four), gbps(bytes, four)),
        format!(
            "{} (the same, as many at once as berth)",
            speed_vs(four, baseline, "the baseline")
        ),
    );
    match times.get(AWS_CLI) {
        Some(aws) => {
            let aws = median(aws);
            table.row(
                AWS_CLI,
                format!("{} ({})", secs(aws), gbps(bytes, aws)),
                format!(
                    "{} (its defaults: 10 requests at once, 8 MiB parts)",
                    speed_vs(aws, baseline, "the baseline")
                ),
            );
        }
        None => table.row(
            AWS_CLI,
            "not run".into(),
            "the AWS CLI is not installed (apt-get install awscli)".into(),
        ),
    }
    table.row(
        "berth",
        format!("{} ({})", secs(ours), gbps(bytes, ours)),
        format!(
            "{} (4 files at a time; verified, fsynced, renamed)",
            speed_vs(ours, baseline, "the baseline")
        ),
    );
    table.print();
    Ok(())
}

/// berth's fetch into an empty models dir, as a deployment calls it.
async fn berth(ctx: &Ctx, sources_file: &str, files: &[DataFile]) -> anyhow::Result<f64> {
    let dir = fresh_dir(ctx, "berth-s3")?;
    let access = Access::parse(sources_file, |_| None).map_err(anyhow::Error::msg)?;
    let fetcher = Fetcher::new(dir, Duration::from_secs(600))?.access(access);
    let mut model = crate::fetch::model(ctx, "model", files);
    model.source = format!("s3://{BUCKET}/{{job_id}}/{{path}}");
    let started = Instant::now();
    fetcher
        .fetch(&model, Arc::new(Quiet), &CancellationToken::new())
        .await
        .context("berth could not fetch the model from moto")?;
    Ok(started.elapsed().as_secs_f64())
}

/// The AWS CLI's own copy of the model's prefix, then a hash of each file.
fn aws_s3_cp(ctx: &Ctx, moto: &Moto, files: &[DataFile]) -> anyhow::Result<f64> {
    let dir = fresh_dir(ctx, "aws-cli")?;
    let script = format!(
        "set -e\nexport AWS_ACCESS_KEY_ID='{}' AWS_SECRET_ACCESS_KEY='{}' AWS_EC2_METADATA_DISABLED=true\n\
         aws s3 cp --recursive --only-show-errors --endpoint-url '{}' --region '{}' s3://{BUCKET}/model/ '{}'\n\
         cd '{}' && sha256sum *\n",
        moto.access_key_id,
        moto.secret_access_key,
        moto.endpoint,
        moto.region,
        dir.display(),
        dir.display()
    );
    let (took, stdout) = sh(&script)?;
    for file in files {
        ensure!(
            stdout.contains(&format!("{}  {}", file.sha256, file.path)),
            "the AWS CLI got other bytes for {}",
            file.path
        );
    }
    Ok(took.as_secs_f64())
}

/// The baselines: each object streamed to its file and hashed, `at_once`
/// objects at a time.
async fn get_all(
    ctx: &Ctx,
    store: &AmazonS3,
    files: &[DataFile],
    at_once: usize,
) -> anyhow::Result<f64> {
    let dir = fresh_dir(ctx, "object-store")?;
    let started = Instant::now();
    futures::stream::iter(files)
        .map(|file| get_one(store, file, &dir))
        .buffer_unordered(at_once)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(started.elapsed().as_secs_f64())
}

async fn get_one(store: &AmazonS3, file: &DataFile, dir: &Path) -> anyhow::Result<()> {
    let mut stream = store
        .get(&Key::from(format!("model/{}", file.path)))
        .await?
        .into_stream();
    let mut out = tokio::fs::File::create(dir.join(&file.path)).await?;
    let mut hasher = Sha256::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        hasher.update(&chunk);
        out.write_all(&chunk).await?;
    }
    out.flush().await?;
    let sha256 = hex::encode(hasher.finalize());
    ensure!(
        sha256 == file.sha256,
        "object_store got other bytes for {}",
        file.path
    );
    Ok(())
}
