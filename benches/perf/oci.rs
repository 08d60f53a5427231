//! Benchmark 15: a model in an OCI registry (issue 28): Debian's CNCF
//! distribution registry (`tests/registry/`) on loopback holds a model of
//! 4 files (`--publish-mib` each, 1024 MiB by default), pushed as an ORAS
//! artifact by the ORAS Python SDK — the SDK's push is timed, the peer of
//! berth's `oci-publish`. Then the same model pulled and verified:
//!
//! - berth's `Fetcher` (in-process, as a deployment calls it) from the
//!   pinned `oci://` source: blobs by digest, several connections per large
//!   blob, each verified as it streams;
//! - `skopeo copy docker://… dir:…` followed by `sha256sum` of the blobs
//!   (skopeo checks digests too; the hash is what berth's record needs);
//! - the ORAS Python SDK's `pull`.
//!
//! Each run starts from an empty folder with no dirty pages pending. The
//! SDK and skopeo are installed by `scripts/bench`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, ensure};
use berth::model::{ModelFile, TrainedModel};

use crate::Ctx;
use crate::api::Server;
use crate::data::{DataFile, MIB};
use crate::dropin::{drop_in, plugins_dir, served};
use crate::fetch::{fetch, files, fresh_dir, fresh_fetcher, shell_quote};
use crate::registry::Registry;
use crate::report::{Table, cpu_seconds, gbps, median, secs, settle, sh, speed_vs};

const FILES: usize = 4;
const REPO: &str = "bench/model";

const BERTH: &str = "berth fetch (oci://, pinned)";
const SKOPEO: &str = "skopeo copy dir: + sha256sum";
const ORAS_PULL: &str = "oras SDK pull";
const PULLERS: [&str; 3] = [BERTH, SKOPEO, ORAS_PULL];

const BERTH_PUSH: &str = "berth, oci-publish";
const ORAS_PUSH: &str = "oras SDK push";
const PUSHERS: [&str; 2] = [BERTH_PUSH, ORAS_PUSH];

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let specs: Vec<(String, u64)> = (0..FILES)
        .map(|i| (format!("shard-{i}.bin"), ctx.publish_mib * MIB))
        .collect();
    let model = files(ctx, "oci", &specs, 1500)?;
    let bytes: u64 = model.iter().map(|f| f.size).sum();
    let registry = Registry::start();

    // Each round pushes into new repositories (a registry skips the blobs
    // a repository has: only a first push sends every byte).
    let sources = ctx.data_dir.join("oci-sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"registry\"\nurl = \"oci://{}/berth/\"\n",
            registry.host
        ),
    )?;
    let server = Server::start(
        ctx,
        "oci",
        &[
            "--sources-file",
            &sources.display().to_string(),
            "--compiler",
            "optimized",
        ],
    )?;
    let model_id = server.register(ctx, "oci", &model).await?;
    // The first deployment fetches the model; the timed ones find it.
    server.deploy(model_id).await?;
    let plugins = plugins_dir(ctx, "oci");
    std::fs::write(
        plugins.join("oci-publish.toml"),
        "targets = [\"registry\"]\ntimeout_s = 3600\n",
    )?;
    drop_in(&plugins, "oci-publish")?;
    served(&server, "oci-publish", Some("optimized"), Instant::now()).await?;
    let mut pushes: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..ctx.rounds {
        for k in 0..PUSHERS.len() {
            let pusher = PUSHERS[(k + round) % PUSHERS.len()];
            settle();
            let took = if pusher == BERTH_PUSH {
                publish(&server, model_id, &format!("run-{round}"), &model).await?
            } else {
                oras_push(ctx, &registry, &format!("{REPO}-{round}"), &model)?
            };
            pushes.entry(pusher).or_default().push(took);
        }
    }
    drop(server);
    let digest = manifest_digest(&registry, &format!("{REPO}-0")).await?;

    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..ctx.rounds {
        for k in 0..PULLERS.len() {
            let puller = PULLERS[(k + round) % PULLERS.len()];
            settle();
            let used = cpu_seconds();
            let took = pull(ctx, puller, &registry, &digest, &model).await?;
            cpu.entry(puller).or_default().push(cpu_seconds() - used);
            times.entry(puller).or_default().push(took);
        }
    }

    let mut table = Table::new(&format!(
        "15a. pull + verify a model of {FILES} × {} MiB from an OCI registry (loopback)",
        ctx.publish_mib
    ));
    let ours = median(&times[BERTH]);
    for puller in PULLERS {
        let took = median(&times[puller]);
        let versus = if puller == BERTH {
            "baseline".to_string()
        } else {
            format!("berth: {}", speed_vs(ours, took, puller))
        };
        table.row(
            puller,
            format!(
                "{} ({}, CPU {})",
                secs(took),
                gbps(bytes, took),
                secs(median(&cpu[puller]))
            ),
            versus,
        );
    }
    table.print();
    let mut table = Table::new(&format!(
        "15b. push a model of {FILES} × {} MiB to an OCI registry (loopback)",
        ctx.publish_mib
    ));
    let ours = median(&pushes[BERTH_PUSH]);
    for pusher in PUSHERS {
        let took = median(&pushes[pusher]);
        let versus = if pusher == BERTH_PUSH {
            "baseline".to_string()
        } else {
            format!("berth: {}", speed_vs(ours, took, pusher))
        };
        table.row(
            pusher,
            format!("{} ({})", secs(took), gbps(bytes, took)),
            versus,
        );
    }
    table.print();
    Ok(())
}

/// One synchronous `oci-publish` deployment into the repository
/// `berth/REPO`, checked against the model; its wall time.
async fn publish(
    server: &Server,
    model_id: i64,
    repo: &str,
    model: &[DataFile],
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let response = server
        .client
        .post(format!("{}/v1/models/{model_id}/deployments", server.url))
        .json(&serde_json::json!({ "deployer": "oci-publish", "options": { "repo": repo, "tag": "v1" } }))
        .send()
        .await?;
    let took = started.elapsed().as_secs_f64();
    let status = response.status();
    let deployment: serde_json::Value = response.json().await?;
    ensure!(
        status.is_success() && deployment["status"] == "completed",
        "oci-publish did not publish ({status}): {deployment}"
    );
    for file in model {
        let put = deployment["published"].as_array().and_then(|all| {
            all.iter().find(|p| {
                p["key"]
                    .as_str()
                    .is_some_and(|k| k.ends_with(&format!("/{}", file.path)))
            })
        });
        ensure!(
            put.is_some_and(|p| p["sha256"] == file.sha256.as_str() && p["bytes"] == file.size),
            "oci-publish's receipt for {} does not match: {deployment}",
            file.path
        );
    }
    Ok(took)
}

/// The ORAS Python SDK pushes the model's files (titled with their names)
/// under `repo:v1`; its wall time.
fn oras_push(
    ctx: &Ctx,
    registry: &Registry,
    repo: &str,
    model: &[DataFile],
) -> anyhow::Result<f64> {
    let dir = ctx.source_root.join("oci");
    let names: Vec<String> = model.iter().map(|f| format!("{:?}", f.path)).collect();
    let script = format!(
        "cd {} && {} -c 'import oras.client; oras.client.OrasClient(hostname=\"{host}\", insecure=True)\
         .push(target=\"{host}/{repo}:v1\", files=[{files}], disable_path_validation=True)' >/dev/null",
        shell_quote(&dir),
        python(),
        host = registry.host,
        files = names.join(", "),
    );
    Ok(sh(&script)?.0.as_secs_f64())
}

fn python() -> String {
    shell_quote(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"))
}

/// The sha256 of the manifest `repo:v1`.
async fn manifest_digest(registry: &Registry, repo: &str) -> anyhow::Result<String> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let client = berth::oci::Registry::new(http, &registry.host, None, None);
    let (digest, manifest, _) = client
        .manifest(repo, "v1")
        .await
        .map_err(anyhow::Error::msg)?;
    ensure!(
        manifest.files().map_err(anyhow::Error::msg)?.len() == FILES,
        "the SDK pushed {manifest:?}"
    );
    Ok(digest)
}

/// One pull of the model by `puller`, checked; its wall time.
async fn pull(
    ctx: &Ctx,
    puller: &str,
    registry: &Registry,
    digest: &str,
    model: &[DataFile],
) -> anyhow::Result<f64> {
    let repo = format!("{REPO}-0");
    if puller == BERTH {
        let fetcher = fresh_fetcher(ctx, "oci-berth")?;
        let trained = TrainedModel::from_files(
            "oci-pull",
            format!("oci://{}/{repo}@sha256:{digest}", registry.host),
            model
                .iter()
                .map(|f| ModelFile {
                    path: f.path.clone(),
                    size_bytes: f.size,
                    sha256: Some(f.sha256.clone()),
                    format: None,
                })
                .collect(),
        );
        return Ok(fetch(&fetcher, &trained).await?.as_secs_f64());
    }
    let out = fresh_dir(ctx, "oci-peer")?;
    let script = if puller == SKOPEO {
        format!(
            "skopeo copy -q --src-tls-verify=false docker://{}/{repo}:v1 dir:{out} && sha256sum {out}/*",
            registry.host,
            out = shell_quote(&out)
        )
    } else {
        format!(
            "{} -c 'import oras.client; oras.client.OrasClient(hostname=\"{host}\", insecure=True)\
             .pull(target=\"{host}/{repo}:v1\", outdir=\"{out}\")' >/dev/null && ls -l {q}",
            python(),
            host = registry.host,
            out = out.display(),
            q = shell_quote(&out),
        )
    };
    let (took, stdout) = sh(&script).with_context(|| format!("{puller} failed"))?;
    for file in model {
        ensure!(
            if puller == SKOPEO {
                stdout.contains(&file.sha256)
            } else {
                std::fs::metadata(out.join(&file.path)).is_ok_and(|m| m.len() == file.size)
            },
            "{puller} did not bring {}",
            file.path
        );
    }
    Ok(took.as_secs_f64())
}
