//! `berth plugin check` and `berth plugin run`: load a deployer exactly as
//! the server would, and run one deployment on a local directory; `berth
//! plugin new` (`scaffold`) starts a deployer project; `berth plugin keygen`
//! and `sign` (`sign`) make a signing key and a plugin's signature. The
//! compiled-code cache lives in `cache`, the model handed to the deployer
//! in `model`, the guest's lines on stderr in `guest_lines`, what a run
//! puts in place of a server's configuration (`--env`, `--targets-file`,
//! the deployment id) in `trial`.

mod cache;
mod guest_lines;
mod model;
mod scaffold;
mod sign;
mod trial;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use tokio_util::sync::CancellationToken;

use crate::runtime::{DeployCall, LogReporter, Reporter, Signers, TrustedKey, signature_path};
use cache::CacheArgs;
use guest_lines::GuestLines;

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Writes a new deployer project in Rust, Python or JavaScript that
    /// builds NAME.wasm on its own, outside berth's repository.
    New(scaffold::NewArgs),
    /// Makes a key pair for signing plugins: an unencrypted secret key
    /// (keep it secret) and its public key, which servers trust with
    /// --trusted-key.
    Keygen(sign::KeygenArgs),
    /// Writes FILE.sig: a detached signature over FILE's bytes, made with
    /// a secret key from `berth plugin keygen` (or `minisign -G -W`).
    Sign(sign::SignArgs),
    /// Loads FILE.wasm (and FILE.toml and FILE.wasm.sig beside it) as the
    /// server would and reports its name, description, WIT version,
    /// signature and any problem.
    Check {
        /// The plugin's .wasm file.
        file: PathBuf,
        /// Check its signature against this public key (repeatable), as a
        /// server with --trusted-key would.
        #[arg(long = "trusted-key", value_name = "KEY", action = clap::ArgAction::Append,
              value_parser = TrustedKey::parse)]
        trusted_key: Vec<TrustedKey>,
        /// A sources file whose [[target]]s to look up the targets the
        /// manifest grants in, as `berth serve --sources-file` (and `plugin
        /// run --targets-file`) would read it; default: BERTH_SOURCES_FILE.
        #[arg(long, env = "BERTH_SOURCES_FILE", value_name = "FILE")]
        targets_file: Option<PathBuf>,
        /// Also time N fresh instantiate + describe calls (median, p99).
        #[arg(long, value_name = "N")]
        repeat: Option<usize>,
        #[command(flatten)]
        cache: CacheArgs,
    },
    /// Runs one deployment of the files in --dir and prints the result.
    #[command(after_long_help = RUN_EXAMPLES)]
    Run {
        /// The plugin's .wasm file.
        file: PathBuf,
        /// A local directory standing in for the model: without --model,
        /// every regular file under it is listed (with its size and sha256)
        /// in the request.
        #[arg(long, value_name = "MODEL_DIR")]
        dir: PathBuf,
        /// A registration body, as POST /v1/models takes it: the request
        /// carries its metadata and files, each taken from --dir by its
        /// path and checked against its recorded size and sha256 as a
        /// deployment checks what it fetches.
        #[arg(long, value_name = "FILE.json")]
        model: Option<PathBuf>,
        /// The deployment's options, a JSON object.
        #[arg(long, value_name = "JSON", default_value = "{}")]
        options: String,
        /// Where the plugin's out-dir is created (default: a new directory
        /// under the system's temp dir, removed again if the plugin writes
        /// nothing to it).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// The deployment's id, as the plugin is handed it (default: the
        /// time in milliseconds, printed on stderr: far above a server's
        /// ids, which count from 1, so a trial run never writes the keys
        /// a server's deployment will). E.g. --deploy-id 42.
        #[arg(long, value_name = "N",
              value_parser = clap::value_parser!(i64).range(1..))]
        deploy_id: Option<i64>,
        /// A value for ${NAME} in the plugin's manifest (FILE.toml beside
        /// FILE.wasm), read before this process's environment; repeatable.
        /// The plugin sees only what the manifest's env grants, as on a
        /// server. E.g. --env MIRROR_TOKEN=dev-token for a manifest with
        /// env = { MIRROR_TOKEN = "${MIRROR_TOKEN}" }.
        #[arg(long = "env", value_name = "NAME=VALUE", action = clap::ArgAction::Append,
              value_parser = trial::parse_env)]
        env: Vec<(String, String)>,
        /// Publishing targets: a sources file's [[target]] entries, as
        /// `berth serve --sources-file` reads them (${VAR} from this
        /// process's environment). The plugin reaches the ones its
        /// manifest's targets grants; a request under an http(s) target's
        /// URL gets the target's headers from berth. E.g. --targets-file
        /// sources.toml.
        #[arg(long, value_name = "FILE")]
        targets_file: Option<PathBuf>,
        /// Memory limit in MiB, instead of the manifest's or the default.
        #[arg(long, value_name = "MIB")]
        memory_mib: Option<u64>,
        /// Time limit in seconds, instead of the manifest's or the default.
        #[arg(long, value_name = "SECONDS",
              value_parser = clap::value_parser!(u64).range(1..=crate::runtime::MAX_TIMEOUT_S))]
        timeout_s: Option<u64>,
        /// Shows the deployer's log and progress lines as they happen
        /// (the default when stderr is a terminal).
        #[arg(short, long, conflicts_with = "quiet")]
        verbose: bool,
        /// Leaves the deployer's lines to the log (BERTH_LOG), as the
        /// server does.
        #[arg(short, long)]
        quiet: bool,
        #[command(flatten)]
        cache: CacheArgs,
    },
}

pub async fn run(command: PluginCommand) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::Check {
            file,
            trusted_key,
            targets_file,
            repeat,
            cache,
        } => {
            let targets = trial::targets(targets_file.as_deref())?;
            let local = targets_file.as_deref().map(|file| (file, &targets));
            check(&file, trusted_key, local, repeat, &cache).await
        }
        PluginCommand::Run {
            file,
            dir,
            model,
            options,
            out,
            deploy_id,
            env,
            targets_file,
            memory_mib,
            timeout_s,
            verbose,
            quiet,
            cache,
        } => {
            let run = RunArgs {
                file,
                dir,
                model,
                options,
                out,
                deploy_id,
                env: trial::EnvValues::new(env),
                targets_file,
                overrides: Overrides {
                    memory_mib,
                    timeout: timeout_s.map(Duration::from_secs),
                },
                verbose: verbose || (!quiet && std::io::stderr().is_terminal()),
            };
            run_once(run, &cache).await
        }
        PluginCommand::New(args) => scaffold::run(&args),
        PluginCommand::Keygen(args) => sign::keygen(&args).map(|()| ExitCode::SUCCESS),
        PluginCommand::Sign(args) => sign::sign(&args).map(|()| ExitCode::SUCCESS),
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

async fn check(
    file: &Path,
    trusted: Vec<TrustedKey>,
    targets: Option<(&Path, &crate::targets::Targets)>,
    repeat: Option<usize>,
    code: &CacheArgs,
) -> anyhow::Result<ExitCode> {
    let name = plugin_name(file)?;
    let cache = code.dir();
    let verifying = !trusted.is_empty();
    let signers = Signers::new(trusted, false).map_err(anyhow::Error::msg)?;
    let runtime = code.runtime(cache.as_deref())?.signers(signers);
    let signed = signature_path(file).exists();
    let lookup = |var: &str| std::env::var(var).ok();
    match cache::load(&runtime, file, name, cache.as_deref(), lookup).await {
        Ok(plugin) => {
            println!("name:        {}", plugin.name);
            println!("description: {}", plugin.description);
            println!("wit:         berth:deployer@{}", plugin.wit_version);
            println!("sha256:      {}", plugin.sha256);
            let signature = match (&plugin.signed_by, signed, verifying) {
                (Some(id), _, _) => format!("verified: signed by trusted key {id}"),
                (None, false, _) => "none (no .sig beside it)".into(),
                (None, true, false) => {
                    "present, not verified: give --trusted-key KEY to check it".into()
                }
                (None, true, true) => "present, by a key not given with --trusted-key".into(),
            };
            println!("signature:   {signature}");
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
            println!(
                "targets:     {}",
                trial::granted_targets(&plugin.manifest.targets, targets)
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

/// One `plugin run`, as given on the command line.
struct RunArgs {
    file: PathBuf,
    dir: PathBuf,
    model: Option<PathBuf>,
    options: String,
    out: Option<PathBuf>,
    deploy_id: Option<i64>,
    env: trial::EnvValues,
    targets_file: Option<PathBuf>,
    overrides: Overrides,
    verbose: bool,
}

async fn run_once(args: RunArgs, code: &CacheArgs) -> anyhow::Result<ExitCode> {
    let RunArgs {
        file,
        dir,
        options,
        overrides,
        ..
    } = &args;
    let name = plugin_name(file)?;
    let parsed: serde_json::Value =
        serde_json::from_str(options).context("--options is not valid JSON")?;
    anyhow::ensure!(
        parsed.is_object(),
        "--options must be a JSON object, like '{{\"level\": 9}}'"
    );
    // Checked before the plugin loads, which may mean compiling it.
    let registered = match &args.model {
        Some(body) => Some(model::registered(body, dir)?),
        None => None,
    };

    let targets = Arc::new(trial::targets(args.targets_file.as_deref())?);

    let cache = code.dir();
    let runtime = code.runtime(cache.as_deref())?.targets(targets.clone());
    let lookup = args.env.lookup();
    let mut plugin = cache::load(&runtime, file, name, cache.as_deref(), lookup)
        .await
        .map_err(|reason| anyhow::anyhow!("{}: {reason}", file.display()))?;
    args.env.warn_unread(name);
    trial::warn_unreachable_targets(&plugin, &targets, args.targets_file.as_deref());
    plugin.limits.memory_mib = overrides.memory_mib.unwrap_or(plugin.limits.memory_mib);
    plugin.limits.timeout = overrides.timeout.unwrap_or(plugin.limits.timeout);
    // As a server does: the only granted target fills in a left-out
    // `target` option of a deployer that takes one.
    let options = &match crate::runtime::default_target(&plugin, options) {
        Some(filled) => {
            eprintln!(
                "plugin {name}: option \"target\" is {:?}, the only target its manifest grants",
                plugin.manifest.targets[0]
            );
            filled
        }
        None => options.clone(),
    };
    if let Err(e) = runtime.check_options(&plugin, options).await {
        println!("deployer {name} refused the options: {e}");
        return Ok(ExitCode::FAILURE);
    }

    let model = match registered {
        Some(model) => {
            if let Err(e) = model::check_files(&model, dir).await {
                // A deployment's own error text for the same files.
                println!("fetching model {}: {e}", model.id);
                return Ok(ExitCode::FAILURE);
            }
            model
        }
        None => model::of_dir(dir)?,
    };
    let out_dir = match &args.out {
        Some(out) => out.clone(),
        None => std::env::temp_dir().join(format!("berth-run-{name}-{}", std::process::id())),
    };
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create the out-dir {}", out_dir.display()))?;

    let deploy_id = match args.deploy_id {
        Some(id) => id,
        None => {
            let id = trial::default_deploy_id();
            eprintln!("plugin {name}: deployment {id} (from the clock; --deploy-id N to choose)");
            id
        }
    };
    let call = DeployCall {
        deploy_id,
        model: &model,
        model_dir: dir,
        out_dir: &out_dir,
        // A folder of the user's: nothing vouches for its files.
        record: None,
        options_json: options,
    };
    let lines = args.verbose.then(|| Arc::new(GuestLines::new(name)));
    let reporter: Arc<dyn Reporter> = match &lines {
        Some(lines) => lines.clone(),
        None => Arc::new(LogReporter::new(name, None)),
    };
    // Ctrl-C interrupts the guest instead of killing the process mid-write.
    let cancel = CancellationToken::new();
    let on_ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    let deployed = runtime.deploy(&plugin, call, reporter, &cancel).await;
    if let Some(lines) = lines {
        lines.finish();
    }
    // An out-dir of our choosing that the deployer left empty would only
    // litter the temp dir (`remove_dir` removes only an empty one).
    let kept = args.out.is_some() || std::fs::remove_dir(&out_dir).is_err();
    match deployed {
        Ok(deployed) => {
            let result = serde_json::json!({
                "ref": deployed.reference,
                "details": deployed.details,
                "out_dir": kept.then_some(&out_dir),
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

/// `berth plugin run --help`'s last part.
const RUN_EXAMPLES: &str = r#"Examples:
  # Pack a folder with the archive deployer:
  berth plugin run plugins/archive.wasm --dir ./my-model

  # Upload through the target "mirror" of sources.toml, which the manifest
  # http-publish.toml grants (targets = ["mirror"]); the target's headers
  # go with every request under its URL:
  berth plugin run http-publish.wasm --dir ./my-model \
      --options '{"base_url": "http://127.0.0.1:8080/mirror"}' \
      --targets-file sources.toml --deploy-id 7

  # A manifest reading ${MIRROR_TOKEN}, given here instead of exported:
  berth plugin run http-publish.wasm --dir ./my-model \
      --options '{"base_url": "http://127.0.0.1:8080/mirror"}' \
      --env MIRROR_TOKEN=dev-token"#;

/// Limits given on the command line win over the manifest's.
struct Overrides {
    memory_mib: Option<u64>,
    timeout: Option<Duration>,
}
