//! `berth plugin check` and `berth plugin run`: load a deployer exactly as
//! the server would, and run one deployment on a local directory; `berth
//! plugin new` (`scaffold`) starts a deployer project.

mod scaffold;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::model::{ModelFile, TrainedModel};
use crate::runtime::{DeployCall, Limits, LogReporter, Runtime};

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Writes a new deployer project in Rust, Python or JavaScript that
    /// builds NAME.wasm on its own, outside berth's repository.
    New(scaffold::NewArgs),
    /// Loads FILE.wasm (and FILE.toml beside it) as the server would and
    /// reports its name, description, WIT version and any problem.
    Check {
        /// The plugin's .wasm file.
        file: PathBuf,
        /// Also time N fresh instantiate + describe calls (median, p99).
        #[arg(long, value_name = "N")]
        repeat: Option<usize>,
    },
    /// Runs one deployment of the files in --dir and prints the result.
    Run {
        /// The plugin's .wasm file.
        file: PathBuf,
        /// A local directory standing in for the model: every file under it
        /// is listed (with its size and sha256) in the request.
        #[arg(long, value_name = "MODEL_DIR")]
        dir: PathBuf,
        /// The deployment's options, a JSON object.
        #[arg(long, value_name = "JSON", default_value = "{}")]
        options: String,
        /// Where the plugin's out-dir is created (default: a new directory
        /// under the system's temp dir).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Memory limit in MiB, instead of the manifest's or the default.
        #[arg(long, value_name = "MIB")]
        memory_mib: Option<u64>,
        /// Time limit in seconds, instead of the manifest's or the default.
        #[arg(long, value_name = "SECONDS")]
        timeout_s: Option<u64>,
    },
}

pub async fn run(command: PluginCommand) -> anyhow::Result<ExitCode> {
    if let PluginCommand::New(args) = &command {
        return scaffold::run(args);
    }
    let runtime = Runtime::new(Limits::default(), None)?;
    match command {
        PluginCommand::Check { file, repeat } => check(&runtime, &file, repeat).await,
        PluginCommand::Run {
            file,
            dir,
            options,
            out,
            memory_mib,
            timeout_s,
        } => {
            let overrides = Overrides {
                memory_mib,
                timeout: timeout_s.map(Duration::from_secs),
            };
            run_once(&runtime, &file, &dir, &options, out, overrides).await
        }
        PluginCommand::New(_) => unreachable!("needs no runtime: answered above"),
    }
}

fn plugin_name(file: &Path) -> anyhow::Result<&str> {
    if file.extension().and_then(|e| e.to_str()) != Some("wasm") {
        anyhow::bail!("{}: a plugin file ends in .wasm", file.display());
    }
    file.file_stem()
        .and_then(|s| s.to_str())
        .with_context(|| format!("{}: the file name is not valid UTF-8", file.display()))
}

async fn check(runtime: &Runtime, file: &Path, repeat: Option<usize>) -> anyhow::Result<ExitCode> {
    let name = plugin_name(file)?;
    match runtime.load_file(file, name).await {
        Ok(plugin) => {
            println!("name:        {}", plugin.name);
            println!("description: {}", plugin.description);
            println!("wit:         berth:deployer@{}", plugin.wit_version);
            println!("sha256:      {}", plugin.sha256);
            println!(
                "limits:      {} MiB memory, {} per deployment",
                plugin.limits.memory_mib,
                crate::human::duration(plugin.limits.timeout)
            );
            let hosts: Vec<_> = plugin
                .manifest
                .allowed_hosts
                .iter()
                .map(|h| h.to_string())
                .collect();
            println!(
                "network:     {}",
                if hosts.is_empty() {
                    "none".into()
                } else {
                    hosts.join(", ")
                }
            );
            let env: Vec<_> = plugin
                .manifest
                .env
                .iter()
                .map(|(k, _)| k.as_str())
                .collect();
            println!(
                "env:         {}",
                if env.is_empty() {
                    "none".into()
                } else {
                    env.join(", ")
                }
            );
            if let Some(schema) = &plugin.options_schema {
                let compact = serde_json::from_str::<serde_json::Value>(schema)
                    .map(|v| v.to_string())
                    .unwrap_or_else(|_| schema.clone());
                println!("options:     {compact}");
            }
            if let Some(n) = repeat.filter(|n| *n > 0) {
                let mut took = Vec::with_capacity(n);
                for _ in 0..n {
                    let started = std::time::Instant::now();
                    runtime.describe(&plugin).await?;
                    took.push(started.elapsed());
                }
                took.sort();
                let at = |q: f64| took[((n - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
                println!(
                    "describe:    {n} fresh instances: median {:.0} µs, p99 {:.0} µs",
                    at(0.5),
                    at(0.99)
                );
            }
            println!("ok");
            Ok(ExitCode::SUCCESS)
        }
        Err(reason) => {
            println!("{}: {reason}", file.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn run_once(
    runtime: &Runtime,
    file: &Path,
    dir: &Path,
    options: &str,
    out: Option<PathBuf>,
    overrides: Overrides,
) -> anyhow::Result<ExitCode> {
    let name = plugin_name(file)?;
    let parsed: serde_json::Value =
        serde_json::from_str(options).context("--options is not valid JSON")?;
    anyhow::ensure!(
        parsed.is_object(),
        "--options must be a JSON object, like '{{\"level\": 9}}'"
    );

    let mut plugin = runtime
        .load_file(file, name)
        .await
        .map_err(|reason| anyhow::anyhow!("{}: {reason}", file.display()))?;
    plugin.limits.memory_mib = overrides.memory_mib.unwrap_or(plugin.limits.memory_mib);
    plugin.limits.timeout = overrides.timeout.unwrap_or(plugin.limits.timeout);
    if let Err(e) = runtime.check_options(&plugin, options).await {
        println!("deployer {name} refused the options: {e}");
        return Ok(ExitCode::FAILURE);
    }

    let model = model_of_dir(dir)?;
    let out_dir = match out {
        Some(out) => out,
        None => std::env::temp_dir().join(format!("berth-run-{name}-{}", std::process::id())),
    };
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create the out-dir {}", out_dir.display()))?;

    let call = DeployCall {
        deploy_id: 1,
        model: &model,
        model_dir: dir,
        out_dir: &out_dir,
        options_json: options,
    };
    let reporter = Arc::new(LogReporter::new(name, None));
    // Ctrl-C interrupts the guest instead of killing the process mid-write.
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    match runtime.deploy(&plugin, call, reporter, &cancel).await {
        Ok(deployed) => {
            let result = serde_json::json!({
                "ref": deployed.reference,
                "details": deployed.details,
                "out_dir": out_dir,
            });
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("deployer {name} failed: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Limits given on the command line win over the manifest's.
struct Overrides {
    memory_mib: Option<u64>,
    timeout: Option<Duration>,
}

/// Describes every regular file under `dir` the way a registration would.
fn model_of_dir(dir: &Path) -> anyhow::Result<TrainedModel> {
    anyhow::ensure!(dir.is_dir(), "--dir {}: not a directory", dir.display());
    let mut files = Vec::new();
    collect_files(dir, dir, &mut files)?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let name = dir
        .canonicalize()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let source = format!("file://{}/{{path}}", dir.display());
    Ok(TrainedModel::from_files(&name, source, files))
}

fn collect_files(root: &Path, dir: &Path, files: &mut Vec<ModelFile>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            collect_files(root, &path, files)?;
        } else if kind.is_file() {
            let mut hasher = digest_io::IoWrapper(Sha256::new());
            let size = std::io::copy(&mut std::fs::File::open(&path)?, &mut hasher)?;
            let relative = path
                .strip_prefix(root)?
                .to_string_lossy()
                .replace('\\', "/");
            files.push(ModelFile {
                path: relative,
                size_bytes: size,
                sha256: Some(hex::encode(hasher.0.finalize())),
            });
        }
    }
    Ok(())
}
