//! Benchmark 11: how soon a plugin dropped into a running server's plugins
//! folder serves, cold (no compiled code cached for it). A real `berth
//! serve` (the bench build) has already fetched a small model with the
//! misbehave plugin; the plugin is copied in (a temp name, then a rename)
//! and synchronous deployments are asked for until one completes. Before:
//! Cranelift only and the folder polled every second (the previous
//! defaults); after: the defaults (tiered code, polled every 250 ms), where
//! the time until the optimized code took over is printed too. Then the
//! four examples dropped in at once, until each has deployed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use sha2::{Digest, Sha256};

use crate::Ctx;
use crate::api::Server;
use crate::data::DataFile;
use crate::report::{Table, secs};

const BEFORE: [&str; 4] = ["--compiler", "optimized", "--plugins-poll-ms", "1000"];
/// Far above any compile here: a hang guard.
const GUARD: Duration = Duration::from_secs(600);

pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../plugins/{name}.wasm"))
}

/// Copies like an operator should: to a temp name, then a rename.
pub fn drop_in(server_plugins: &Path, name: &str) -> anyhow::Result<()> {
    let temp = server_plugins.join(format!(".{name}.part"));
    std::fs::copy(example(name), &temp)
        .with_context(|| format!("cannot copy {name} (run scripts/build-plugins)"))?;
    std::fs::rename(&temp, server_plugins.join(format!("{name}.wasm")))?;
    Ok(())
}

/// Asks for a deployment by `deployer` until one completes; the time it
/// took from `since`.
pub async fn first_deployment(
    server: &Server,
    model_id: i64,
    deployer: &str,
    since: Instant,
) -> anyhow::Result<Duration> {
    loop {
        let response = server
            .client
            .post(format!("{}/v1/models/{model_id}/deployments", server.url))
            .json(&json!({ "deployer": deployer, "options": {} }))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or_default();
        if status.is_success() {
            return Ok(since.elapsed());
        }
        // Until the plugin is served: 400 (no such deployer) or 503 (still
        // loading). Anything else is the deployment failing.
        if !matches!(status.as_u16(), 400 | 503) {
            bail!("{deployer} did not deploy ({status}): {body}");
        }
        if since.elapsed() > GUARD {
            bail!("{deployer} did not serve within {GUARD:?}: {body}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `deployer` is served with code of `tier` (any if `None`);
/// the time from `since`.
pub async fn served(
    server: &Server,
    deployer: &str,
    tier: Option<&str>,
    since: Instant,
) -> anyhow::Result<Duration> {
    loop {
        let deployers: Value = server
            .client
            .get(format!("{}/v1/deployers", server.url))
            .send()
            .await?
            .json()
            .await?;
        let found = deployers["deployers"]
            .as_array()
            .and_then(|all| all.iter().find(|d| d["name"] == deployer));
        if found.is_some_and(|d| tier.is_none_or(|tier| d["tier"] == tier)) {
            return Ok(since.elapsed());
        }
        if since.elapsed() > GUARD {
            bail!("{deployer} was not served ({tier:?}) within {GUARD:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A model every example deploys: an adapter config, a valid one-tensor
/// safetensors file and some bytes.
pub fn model_files(ctx: &Ctx) -> anyhow::Result<Vec<DataFile>> {
    let root = ctx.source_root.join("dropin");
    std::fs::create_dir_all(&root)?;
    let header = br#"{"lora_A":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut tensors = (header.len() as u64).to_le_bytes().to_vec();
    tensors.extend_from_slice(header);
    tensors.extend_from_slice(&[0; 8]);
    let mut listed = Vec::new();
    for (path, bytes) in [
        (
            "adapter_config.json",
            br#"{"r": 8, "lora_alpha": 16}"#.to_vec(),
        ),
        ("adapter_model.safetensors", tensors),
    ] {
        std::fs::write(root.join(path), &bytes)?;
        listed.push(DataFile {
            path: path.to_string(),
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
        });
    }
    listed.push(crate::data::make(&root, "weights.bin", 1 << 20, 11)?);
    Ok(listed)
}

/// A server of its own with the model fetched already.
async fn start_with_model(ctx: &Ctx, name: &str, args: &[&str]) -> anyhow::Result<(Server, i64)> {
    let server = Server::start(ctx, name, args)?;
    let id = server.register(ctx, "dropin", &model_files(ctx)?).await?;
    first_deployment(&server, id, "misbehave", Instant::now()).await?;
    Ok((server, id))
}

pub fn plugins_dir(ctx: &Ctx, name: &str) -> PathBuf {
    ctx.out_dir.join(name).join("plugins")
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let mut table = Table::new(
        "11. from dropping a plugin into the folder to its first completed deployment, cold",
    );
    for (deployer, language) in [
        ("model-card", "Python"),
        ("safetensors-check", "JavaScript"),
    ] {
        let name = format!("dropin-before-{deployer}");
        let (server, id) = start_with_model(ctx, &name, &BEFORE).await?;
        let dropped = Instant::now();
        drop_in(&plugins_dir(ctx, &name), deployer)?;
        let before = first_deployment(&server, id, deployer, dropped).await?;
        drop(server);

        let name = format!("dropin-after-{deployer}");
        let (server, id) = start_with_model(ctx, &name, &[]).await?;
        let dropped = Instant::now();
        drop_in(&plugins_dir(ctx, &name), deployer)?;
        let after = first_deployment(&server, id, deployer, dropped).await?;
        let steady = served(&server, deployer, Some("optimized"), dropped).await?;
        drop(server);

        table.row(
            &format!("{deployer} ({language}), Cranelift only, polled every 1 s"),
            secs(before.as_secs_f64()),
            "before".into(),
        );
        table.row(
            &format!("{deployer} ({language}), tiered, polled every 250 ms"),
            secs(after.as_secs_f64()),
            format!(
                "{:.2}× before; optimized code serving after {}",
                after.as_secs_f64() / before.as_secs_f64(),
                secs(steady.as_secs_f64())
            ),
        );
    }

    let examples = ["archive", "http-publish", "model-card", "safetensors-check"];
    let mut all = Vec::new();
    for (label, args) in [("before", &BEFORE[..]), ("after", &[][..])] {
        let name = format!("dropin-four-{label}");
        let (server, id) = start_with_model(ctx, &name, args).await?;
        let dropped = Instant::now();
        for example in examples {
            drop_in(&plugins_dir(ctx, &name), example)?;
        }
        let mut last = Duration::ZERO;
        for example in examples {
            // http-publish refuses to deploy without a mirror: served is
            // what counts for it.
            last = if example == "http-publish" {
                served(&server, example, None, dropped).await?
            } else {
                first_deployment(&server, id, example, dropped).await?
            }
            .max(last);
        }
        let steady = if label == "after" {
            let mut steady = Duration::ZERO;
            for example in examples {
                steady = steady.max(served(&server, example, Some("optimized"), dropped).await?);
            }
            Some(steady)
        } else {
            None
        };
        all.push((label, last, steady));
    }
    let before = all[0].1;
    for (label, last, steady) in all {
        table.row(
            &format!("the four examples dropped in at once, {label}: until all serve"),
            secs(last.as_secs_f64()),
            match steady {
                None => "before".into(),
                Some(steady) => format!(
                    "{:.2}× before; all optimized after {}",
                    last.as_secs_f64() / before.as_secs_f64(),
                    secs(steady.as_secs_f64())
                ),
            },
        );
    }
    table.print();
    Ok(())
}
