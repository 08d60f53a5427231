//! Benchmark 21: the same model (20 × 16 MiB files) fetched and verified by
//! berth from each kind of bucket it reads, then published by berth into
//! each kind it writes, on loopback: moto (S3, the baseline),
//! fake-gcs-server (`gs://`) and Azurite (`az://`), each started as the
//! tests start it, each through a sources-file entry (a `[[source]]`, then
//! a `[[target]]`) with its credentials. The emulators are the stores the
//! tests trust, not the clouds: the ratios say what berth's client costs
//! against each emulator's server, not what the clouds would serve.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use berth::fetch::{Access, Fetcher, Quiet};
use berth::publish::{Body, FILES_AT_ONCE, Key as PublishKey, Publishers};
use berth::targets::Targets;
use berth::trust::Trust;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use tokio_util::sync::CancellationToken;

use crate::Ctx;
use crate::azurite::Azurite;
use crate::data::{self, DataFile, MIB};
use crate::fake_gcs::{FakeGcs, service_account_key};
use crate::fetch::fresh_dir;
use crate::moto::Moto;
use crate::report::{Table, gbps, median, secs, settle, speed_vs};

const BUCKET: &str = "bench";
const FILES: usize = 20;
const FILE_SIZE: u64 = 16 * MIB;

/// Each store: its name, the source's URL prefix (a target's url too) and
/// its sources-file entry's options.
struct Store {
    name: &'static str,
    prefix: String,
    entry: String,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let root = ctx.source_root.join("buckets");
    let mut files = Vec::new();
    for i in 0..FILES {
        let name = format!("shard-{i:02}.bin");
        files.push(data::make(&root, &name, FILE_SIZE, 2100 + i as u64)?);
    }
    let read = |file: &DataFile| std::fs::read(root.join(&file.path));

    let moto = Moto::start(&[BUCKET]);
    let s3 = AmazonS3Builder::new()
        .with_endpoint(&moto.endpoint)
        .with_allow_http(true)
        .with_region(&moto.region)
        .with_access_key_id(&moto.access_key_id)
        .with_secret_access_key(&moto.secret_access_key)
        .with_bucket_name(BUCKET)
        .build()?;
    let gcs = FakeGcs::start(&[BUCKET]);
    let azurite = Azurite::start(&[BUCKET]);
    let azure = azurite.client(BUCKET);
    for file in &files {
        let key = format!("model/{}", file.path);
        s3.put(&Key::from(key.as_str()), read(file)?.into())
            .await
            .context("cannot put the benchmark's files into moto")?;
        gcs.put(BUCKET, &key, read(file)?).await;
        azure
            .put(&Key::from(key.as_str()), read(file)?.into())
            .await
            .context("cannot put the benchmark's files into Azurite")?;
    }
    let key_file = ctx.source_root.join("gcs-key.json");
    std::fs::write(&key_file, service_account_key())?;
    let stores = [
        Store {
            name: "S3 (moto)",
            prefix: format!("s3://{BUCKET}/"),
            entry: format!(
                "options = {{ endpoint = \"{}\", region = \"{}\", access_key_id = \"{}\", \
                 secret_access_key = \"{}\" }}",
                moto.endpoint, moto.region, moto.access_key_id, moto.secret_access_key
            ),
        },
        Store {
            name: "GCS (fake-gcs-server)",
            prefix: format!("gs://{BUCKET}/"),
            entry: format!(
                "options = {{ base_url = \"{}\", service_account = \"{}\" }}",
                gcs.endpoint,
                key_file.display()
            ),
        },
        Store {
            name: "Azure Blob (Azurite)",
            prefix: format!("az://{}/{BUCKET}/", azurite.account),
            entry: format!(
                "options = {{ endpoint = \"{}\", account_key = \"{}\" }}",
                azurite.endpoint, azurite.key
            ),
        },
    ];

    let mut fetched: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut published: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..ctx.rounds {
        for k in 0..stores.len() {
            let store = &stores[(k + round) % stores.len()];
            settle();
            let took = fetch(ctx, store, &files).await?;
            fetched.entry(store.name).or_default().push(took);
            settle();
            let took = publish(&root, store, &files, round).await?;
            published.entry(store.name).or_default().push(took);
        }
    }
    for (what, times) in [("fetch + verify", &fetched), ("publish", &published)] {
        let bytes = FILES as u64 * FILE_SIZE;
        let baseline = median(&times[stores[0].name]);
        let mut table = Table::new(&format!(
            "21. {what} a model of {FILES} × {} MiB files, each kind of bucket (emulators on \
             loopback), median of {} rounds",
            FILE_SIZE / MIB,
            ctx.rounds
        ));
        for store in &stores {
            let took = median(&times[store.name]);
            let against = if store.name == stores[0].name {
                "baseline".to_string()
            } else {
                speed_vs(took, baseline, "S3 (moto)")
            };
            table.row(
                &format!("berth, {}", store.name),
                format!("{} ({})", secs(took), gbps(bytes, took)),
                against,
            );
        }
        table.print();
    }
    Ok(())
}

/// berth's publish of the model's files (`FILES_AT_ONCE` at a time, as a
/// deployment's batch puts them) into `store`, under a prefix of its own
/// per round.
async fn publish(
    root: &std::path::Path,
    store: &Store,
    files: &[DataFile],
    round: usize,
) -> anyhow::Result<f64> {
    use futures::StreamExt;
    let sources = format!(
        "[[target]]\nname = \"bench\"\nurl = \"{}published-{round}/\"\n{}\n",
        store.prefix, store.entry
    );
    let targets = Targets::parse(&sources, "bench.toml", |_| None).map_err(anyhow::Error::msg)?;
    let publisher = Publishers::new(Arc::new(targets), &Trust::default()).get("bench")?;
    let never = CancellationToken::new();
    let keys: Vec<PublishKey> = files
        .iter()
        .map(|file| PublishKey::parse(&file.path).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    let mut puts = futures::stream::iter(files.iter().zip(&keys).map(|(file, key)| {
        let body = Body::File {
            path: root.join(&file.path),
            bytes: file.size,
            sha256: Some(file.sha256.clone()),
            vouched: None,
        };
        publisher.put(key, body, &|_| {}, &never)
    }))
    .buffer_unordered(FILES_AT_ONCE);
    while let Some(put) = puts.next().await {
        put.with_context(|| format!("berth could not publish the model to {}", store.name))?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// berth's fetch of the model from `store` into an empty models dir.
async fn fetch(ctx: &Ctx, store: &Store, files: &[DataFile]) -> anyhow::Result<f64> {
    let dir = fresh_dir(ctx, "berth-buckets")?;
    let sources = format!(
        "[[source]]\nprefix = \"{}\"\n{}\n",
        store.prefix, store.entry
    );
    let access = Access::parse(&sources, |_| None).map_err(anyhow::Error::msg)?;
    let fetcher = Fetcher::new(dir, Duration::from_secs(600))?.access(access);
    let mut model = crate::fetch::model(ctx, "model", files);
    model.source = format!("{}{{job_id}}/{{path}}", store.prefix);
    let started = Instant::now();
    fetcher
        .fetch(&model, Arc::new(Quiet), &CancellationToken::new())
        .await
        .with_context(|| format!("berth could not fetch the model from {}", store.name))?;
    Ok(started.elapsed().as_secs_f64())
}
