//! `berth serve`: opens the records, loads the plugins folder, and serves the
//! HTTP API until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;
use crate::catalog::Catalog;
use crate::db::{Db, Topic};
use crate::deployers::Deployers;
use crate::events::Events;
use crate::fetch::{Access, Fetcher, Split};
use crate::http::{ApiContext, Webhook};
use crate::pipeline::{Pipeline, QueueSettings, Stop, interrupted, remove_failed_output};
use crate::runtime::{
    CodeCache, Compiler, Engines, Limits, Origin, Runtime, Signers, TrustedKey, folder_names,
};
use crate::trust::Trust;
use crate::watch::Watcher;

use super::LogFormat;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML file of these settings (keys: the flags' names in snake
    /// case); flags and environment variables win over it.
    #[arg(long, env = "BERTH_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:7878")]
    listen: SocketAddr,
    /// Where berth keeps its database, models and compiled plugins.
    #[arg(long, env = "BERTH_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    /// sqlite://PATH or postgres://… (default: SQLite at DATA_DIR/berth.db).
    #[arg(long, env = "BERTH_DATABASE_URL")]
    database_url: Option<String>,
    /// The folder of deployer plugins (NAME.wasm and optional NAME.toml).
    #[arg(long, env = "BERTH_PLUGINS_DIR", default_value = "./plugins")]
    plugins_dir: PathBuf,
    /// Where compiled plugin code is kept between starts (default:
    /// DATA_DIR/cache). Servers may share one.
    #[arg(long, env = "BERTH_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Where models' files are fetched to (default: DATA_DIR/models).
    #[arg(long, env = "BERTH_MODELS_DIR")]
    models_dir: Option<PathBuf>,
    /// At most this many deployers are loaded, from the plugins folder and
    /// stored over the API together.
    #[arg(long, env = "BERTH_MAX_DEPLOYERS", default_value_t = 20)]
    max_deployers: usize,
    /// The largest plugin `PUT /v1/deployers/{name}` takes, in MiB.
    #[arg(long, env = "BERTH_MAX_PLUGIN_MIB", default_value_t = crate::catalog::DEFAULT_MAX_PLUGIN_MIB,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_plugin_mib: u64,
    /// Default memory limit of a deployer, in MiB (a manifest may change it).
    #[arg(long, env = "BERTH_MEMORY_MIB", default_value_t = 512)]
    memory_mib: u64,
    /// Default quota of a deployment's output directory, in MiB (a
    /// manifest's out_mib may change it): a deployer that writes more is
    /// stopped and its deployment fails.
    #[arg(long, env = "BERTH_OUT_MIB", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=crate::runtime::MAX_OUT_MIB))]
    out_mib: u64,
    /// Default wall-clock limit of one deploy call, in seconds (at most a week).
    #[arg(long, env = "BERTH_TIMEOUT_S", default_value_t = 1800,
          value_parser = clap::value_parser!(u64).range(1..=crate::runtime::MAX_TIMEOUT_S))]
    timeout_s: u64,
    /// Credentials for sources, by URL prefix: a TOML file of
    /// `[[source]]` entries with `prefix` and `headers` (HTTP) or `options`
    /// (object stores); values may use `${VAR}` from this environment.
    #[arg(long, env = "BERTH_SOURCES_FILE")]
    sources_file: Option<PathBuf>,
    /// PEM certificates (an internal CA) trusted for HTTPS in addition to
    /// the public roots: by sources, deployers' outgoing requests and the
    /// webhook.
    #[arg(long, env = "BERTH_CA_FILE", value_name = "PEM")]
    ca_file: Option<PathBuf>,
    /// A public key whose plugin signatures this server trusts: the second
    /// line of a minisign `.pub` file (`berth plugin keygen` writes one).
    /// Repeat it for several keys (BERTH_TRUSTED_KEYS: comma-separated; in
    /// the config file a list, `trusted_key = ["RW…", "RW…"]`).
    #[arg(long = "trusted-key", env = "BERTH_TRUSTED_KEYS", value_name = "KEY",
          value_delimiter = ',', action = clap::ArgAction::Append,
          value_parser = TrustedKey::parse)]
    trusted_key: Vec<TrustedKey>,
    /// Load only plugins that come with a detached signature over their
    /// bytes by a --trusted-key (`NAME.wasm.sig` beside a folder plugin);
    /// others are refused with the reason. Without it, unsigned plugins
    /// load too, but a trusted key's signature that does not match still
    /// refuses its plugin.
    #[arg(long, env = "BERTH_REQUIRE_SIGNED")]
    require_signed: bool,
    /// Limit on fetching all files of one deployment, in seconds.
    #[arg(long, env = "BERTH_FETCH_TIMEOUT_S", default_value_t = 1800)]
    fetch_timeout_s: u64,
    /// Connections per file for large files on sources that honour ranges
    /// (object stores and CDNs cap each connection's rate); 1 reads every
    /// file in one stream.
    #[arg(long, env = "BERTH_FETCH_CONNECTIONS", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    fetch_connections: u16,
    /// The size of one piece read over one connection, in MiB; a file with
    /// less than two pieces' worth to download is read in one stream.
    #[arg(long, env = "BERTH_FETCH_PIECE_MIB", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    fetch_piece_mib: u64,
    /// Free space, in MiB, that berth keeps on the data and models volumes:
    /// a fetch that would eat into it fails before downloading, and new
    /// deployments are refused (503) while less is free, so that every
    /// started deployment can still record its end.
    #[arg(long, env = "BERTH_MIN_FREE_MIB", default_value_t = 256)]
    min_free_mib: u64,
    /// How often the plugins folder is checked for added, replaced or
    /// removed plugins, in milliseconds; 0 turns watching off. A change is
    /// applied once its files stood still for one interval.
    #[arg(long, env = "BERTH_PLUGINS_POLL_MS", default_value_t = 250)]
    plugins_poll_ms: u64,
    /// How plugins are compiled: `tiered` serves a new plugin from quickly
    /// compiled baseline code (Winch) within seconds and swaps in optimized
    /// code (Cranelift) when a background compile ends; `optimized` serves
    /// a plugin only once Cranelift is done; `baseline` never optimizes
    /// (for testing). Compiled code is cached for each tier.
    #[arg(long, env = "BERTH_COMPILER", default_value_t = Compiler::Tiered)]
    compiler: Compiler,
    /// Plugin instances (calls under way) that can exist at once, in a pool
    /// reserved up front and reused from call to call, which makes a fresh
    /// sandbox cheap; further calls wait for a free one. 0 maps each
    /// instance afresh instead (for hosts that limit address space: each
    /// pooled instance reserves about 16 GiB of it per compiler, 32 GiB
    /// when tiered, never memory).
    #[arg(long, env = "BERTH_INSTANCE_POOL", default_value_t = Engines::DEFAULT_POOL)]
    instance_pool: u32,
    /// Deployments this server runs at once; the rest wait in the queue,
    /// in order, for this server or another one on the same database.
    #[arg(long, env = "BERTH_MAX_RUNNING", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..))]
    max_running: u16,
    /// How long, in milliseconds, this server's claim on a deployment it
    /// runs lasts unless renewed (every third of it). When it runs out
    /// (the server was killed, froze or lost the database), any server
    /// fails the deployment naming this one.
    #[arg(long, env = "BERTH_LEASE_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(300..))]
    lease_ms: u64,
    /// How long, in seconds, a deployment that no live server can run
    /// (none has its deployer at the version asked for) stays queued
    /// before it fails saying so.
    #[arg(long, env = "BERTH_QUEUE_TIMEOUT_S", default_value_t = 300)]
    queue_timeout_s: u64,
    /// This server's name in other servers' records and messages (a
    /// deployment lost with it names it). Default: HOST:PORT.
    #[arg(long, env = "BERTH_SERVER_NAME")]
    server_name: Option<String>,
    /// POST every deployment event as JSON to this URL, from the event
    /// log: in id order, retried until --webhook-give-up-s.
    #[arg(long, env = "BERTH_WEBHOOK_URL")]
    webhook_url: Option<String>,
    /// Sign webhook bodies with this secret (header X-Berth-Signature).
    #[arg(long, env = "BERTH_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// How long the webhook keeps trying to deliver an event, in seconds
    /// after the event happened (default 12 hours); then the event is
    /// given up, logged and counted. At most --events-retention-s.
    #[arg(long, env = "BERTH_WEBHOOK_GIVE_UP_S", default_value_t = 43_200,
          value_parser = clap::value_parser!(u64).range(1..))]
    webhook_give_up_s: u64,
    /// How long the event log keeps events, in seconds (default a day): a
    /// client resuming the event stream (Last-Event-ID, ?after=) gets what
    /// is kept. Progress events make up most of it: up to 4 a second per
    /// running deployment, about 350 bytes each (some 5 MB per hour a
    /// deployment runs).
    #[arg(long, env = "BERTH_EVENTS_RETENTION_S", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(1..))]
    events_retention_s: u64,
    /// The accepted API tokens: `NAME ROLE SHA256` lines (`berth token new`
    /// prints one); read again when it changes.
    #[arg(long, env = "BERTH_API_TOKENS_FILE", value_name = "FILE")]
    api_tokens_file: Option<PathBuf>,
    /// One accepted API token, with the admin role, recorded as
    /// BERTH_API_TOKEN (for a single operator).
    #[arg(
        long,
        env = "BERTH_API_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    api_token: Option<String>,
    /// Serve without API tokens on an address other than loopback: anyone
    /// who reaches it may register, deploy and delete.
    #[arg(long, env = "BERTH_INSECURE_NO_AUTH")]
    insecure_no_auth: bool,
    /// Record Prometheus metrics and serve them at /metrics (on or off).
    #[arg(long, env = "BERTH_METRICS", default_value = "on",
          value_parser = clap::builder::BoolishValueParser::new(),
          action = clap::ArgAction::Set)]
    metrics: bool,
    /// Also serve /metrics, and nothing else, on this address.
    #[arg(long, env = "BERTH_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// How log lines are written to stderr: text, or json (one object a line).
    #[arg(long, env = "BERTH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(super) log_format: LogFormat,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let clock = std::time::Instant::now();
    let args = args.absolute()?;
    // First: tokens, a sources file, a CA file or signature settings that
    // cannot be used stop the start before anything is opened.
    let tokens = open_tokens(&args)?;
    let access = load_access(&args)?;
    let trust = load_trust(&args)?;
    let signers = signers(&args)?;
    if args.metrics {
        crate::metrics::install();
    } else if let Some(addr) = args.metrics_listen {
        anyhow::bail!("--metrics-listen {addr} serves metrics, but --metrics is off");
    }
    let webhook = webhook(&args)?;
    let (db, server_id) = open_records(&args).await?;
    let events = Events::stored(db.clone(), server_id.clone(), crate::http::event_data);
    let (deployers, watcher, runtime) = prepare_deployers(&args, &trust, signers, &db).await?;
    let catalog = Arc::new(
        Catalog::new(
            db.clone(),
            deployers.clone(),
            events.clone(),
            args.max_deployers,
        )
        .with_max_plugin_bytes((args.max_plugin_mib << 20) as usize),
    );
    // Before the first look, so that no change made meanwhile is missed.
    let catalog_wakeups = db.wakeups(Topic::Deployers);
    let webhook_trust = trust.clone();
    let fetcher = Fetcher::new(args.models_dir(), Duration::from_secs(args.fetch_timeout_s))?
        .trust(trust)?
        .split(Split {
            connections: usize::from(args.fetch_connections),
            piece_bytes: args.fetch_piece_mib << 20,
        })
        .access(access)
        .reserve(args.min_free_mib << 20);
    // Servers on other machines may share the models volume.
    let fetcher = match db.backend().is_postgres() {
        true => fetcher.shared_locks(Arc::new(db.clone())),
        false => fetcher,
    };
    // Bound now so that the server's name can carry its port; accepting
    // starts at the end.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let server_name = match &args.server_name {
        Some(name) => name.clone(),
        None => format!("{}:{}", host_name(), listener.local_addr()?.port()),
    };
    let queue = QueueSettings {
        max_running: usize::from(args.max_running),
        lease: Duration::from_millis(args.lease_ms),
        queue_timeout: Duration::from_secs(args.queue_timeout_s),
    };
    let pipeline = Arc::new(
        Pipeline::new(
            db.clone(),
            events.clone(),
            deployers.clone(),
            fetcher,
            server_id.clone(),
            args.data_dir.join("out"),
        )
        .reserve(args.min_free_mib << 20)
        .queue(queue, server_name),
    );
    tokio::spawn(crate::events::prune(
        db.clone(),
        Duration::from_secs(args.events_retention_s),
        pipeline.stopping().clone(),
    ));
    // Before listening, so that a new receiver's cursor is set before the
    // first deployment.
    let delivery = match &webhook {
        Some(webhook) => Some(
            webhook
                .clone()
                .start(
                    db.clone(),
                    server_id,
                    &webhook_trust,
                    pipeline.stopping().clone(),
                )
                .await?,
        ),
        None => None,
    };
    pipeline.start_workers();
    // Listening comes first: the deployers appear one by one as they
    // compile (seconds each for Python and JavaScript), /readyz tells when
    // all are in, and only then does the watcher take over the folder.
    let poll = Duration::from_millis(args.plugins_poll_ms);
    let stopping = pipeline.stopping().clone();
    let (loading, loading_events) = (deployers.clone(), events.clone());
    let (plugins_dir, cache_dir, max) = (
        args.plugins_dir.clone(),
        args.cache_dir(),
        args.max_deployers,
    );
    let following = catalog.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let plugins = runtime
            .load_dir_each(&plugins_dir, max, |name, set, changes| {
                loading.loaded(name, set.clone());
                loading_events.announce(changes);
            })
            .await;
        // Also clears names whose files went away during the load, and
        // brings in a folder that could not be read as the set's rejection.
        loading.folder_loaded(plugins.clone());
        // The stored deployers come after the folder's, which win.
        if let Err(e) = following.refresh().await {
            tracing::error!("could not load the deployers stored over the API: {e}; trying again");
        }
        loading.finish_loading();
        log_loaded(&loading, &plugins_dir, &cache_dir, started.elapsed());
        tokio::spawn(following.follow(catalog_wakeups, stopping.clone()));
        if !poll.is_zero() {
            watcher.run(loading, loading_events, stopping, poll).await;
        }
    });

    if let Some(addr) = args.metrics_listen {
        serve_metrics(addr, pipeline.stopping().clone()).await?;
    }
    tracing::info!(
        ready_ms = clock.elapsed().as_millis() as u64,
        "berth is listening on http://{}",
        listener.local_addr()?
    );
    if let Some(tokens) = &tokens {
        tokio::spawn(reload_tokens(tokens.clone(), pipeline.stopping().clone()));
    }
    let app = crate::http::app(ApiContext {
        db: db.clone(),
        events: events.clone(),
        deployers,
        catalog,
        pipeline: pipeline.clone(),
        tokens,
        webhook,
    });
    let stopping = pipeline.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            stop_signal().await;
            tracing::info!("stopping: running deployments are interrupted and recorded as failed");
            stopping.stop();
        })
        .await?;
    pipeline.drain(Duration::from_secs(30)).await;
    // The events of the drained deployments go into the log before the
    // database closes; the webhook hands its lease back.
    events.close(Duration::from_secs(10)).await;
    if let Some(delivery) = delivery {
        let _ = delivery.await;
    }
    db.close().await;
    tracing::info!("stopped");
    Ok(())
}

impl ServeArgs {
    /// Recorded paths (a deployment's dir and out_dir) must not depend on
    /// the working directory of whoever reads them.
    fn absolute(mut self) -> anyhow::Result<Self> {
        let absolute = |path: Option<PathBuf>| path.as_deref().map(std::path::absolute).transpose();
        self.data_dir = std::path::absolute(&self.data_dir)?;
        self.plugins_dir = std::path::absolute(&self.plugins_dir)?;
        self.models_dir = absolute(self.models_dir)?;
        self.ca_file = absolute(self.ca_file)?;
        self.cache_dir = absolute(self.cache_dir)?;
        Ok(self)
    }

    fn models_dir(&self) -> PathBuf {
        self.models_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("models"))
    }

    fn cache_dir(&self) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("cache"))
    }
}

/// The webhook, if one is configured, checked.
fn webhook(args: &ServeArgs) -> anyhow::Result<Option<Arc<Webhook>>> {
    let Some(url) = &args.webhook_url else {
        return Ok(None);
    };
    url::Url::parse(url).with_context(|| format!("--webhook-url {url} is not a URL"))?;
    anyhow::ensure!(
        args.webhook_give_up_s <= args.events_retention_s,
        "--webhook-give-up-s {} is longer than --events-retention-s {}: events would be pruned \
         from the log while still being delivered; give up sooner or keep events longer",
        args.webhook_give_up_s,
        args.events_retention_s
    );
    Ok(Some(Arc::new(Webhook {
        url: url.clone(),
        secret: args.webhook_secret.clone(),
        give_up: Duration::from_secs(args.webhook_give_up_s),
    })))
}

/// The API tokens, if any are configured; refuses to serve an open API
/// beyond loopback unless told to.
fn open_tokens(args: &ServeArgs) -> anyhow::Result<Option<Arc<Tokens>>> {
    let tokens = Tokens::load(args.api_tokens_file.as_deref(), args.api_token.as_deref())?;
    match &tokens {
        None if !args.listen.ip().is_loopback() && !args.insecure_no_auth => anyhow::bail!(
            "refusing to serve {} without API tokens: anyone who reaches it could register, \
             deploy and delete. Give --api-tokens-file or BERTH_API_TOKEN (`berth token new NAME` \
             makes a token), listen on 127.0.0.1, or pass --insecure-no-auth",
            args.listen
        ),
        None if !args.listen.ip().is_loopback() => tracing::warn!(
            "serving {} without API tokens (--insecure-no-auth): anyone who reaches it may \
             register, deploy and delete",
            args.listen
        ),
        None => {}
        Some(tokens) => {
            if tokens.is_empty() {
                tracing::warn!(
                    file = ?tokens.file(),
                    "the API tokens file lists no tokens: every request to /v1 is refused until one is added"
                );
            }
            tracing::info!(tokens = tokens.len(), "API tokens required");
        }
    }
    Ok(tokens.map(Arc::new))
}

/// Reads the tokens file again when it changes, so a token is added or
/// revoked without a restart.
async fn reload_tokens(tokens: Arc<Tokens>, stopping: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopping.cancelled() => return,
        }
        match tokens.reload() {
            Ok(true) => tracing::info!(tokens = tokens.len(), "API tokens file read again"),
            Ok(false) => {}
            Err(e) => tracing::error!("{e}; the tokens read before stay accepted"),
        }
    }
}

/// Opens the database and fails this server's rows that a previous run
/// left running, removing their output directories.
async fn open_records(args: &ServeArgs) -> anyhow::Result<(Db, String)> {
    let data_dir = &args.data_dir;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data dir {}", data_dir.display()))?;
    let database_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("berth.db").display()));
    let db = Db::connect(&database_url)
        .await
        .with_context(|| format!("cannot open the database {}", redact(&database_url)))?;
    let server_id = server_id(data_dir)?;
    if let Err(e) = fail_leftovers(&db, &server_id).await {
        // A full disk must not keep the server from serving reads: the
        // leftovers are failed as soon as the database takes the write.
        tracing::error!(
            "could not mark the deployments left running by the previous run as failed ({e}); trying again in the background"
        );
        let (db, server_id) = (db.clone(), server_id.clone());
        tokio::spawn(async move {
            let mut wait = Duration::from_secs(1);
            loop {
                tokio::time::sleep(wait).await;
                match fail_leftovers(&db, &server_id).await {
                    Ok(()) => break,
                    Err(e) => tracing::warn!(
                        "still cannot mark the deployments left running by the previous run as failed ({e}); trying again in {}",
                        crate::human::duration(wait)
                    ),
                }
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        });
    }
    Ok((db, server_id))
}

async fn fail_leftovers(db: &Db, server_id: &str) -> Result<(), crate::db::Error> {
    let out_dirs = db
        .fail_leftovers(server_id, |phase| interrupted(phase, Stop::Unseen))
        .await?;
    if !out_dirs.is_empty() {
        tracing::warn!(
            count = out_dirs.len(),
            "marked deployments left running by the previous run as failed"
        );
    }
    // Their deployers were cut off: what they wrote is half made.
    for out_dir in out_dirs {
        remove_failed_output(PathBuf::from(out_dir)).await;
    }
    Ok(())
}

/// The runtime, and the served deployers as loading: nothing served yet,
/// every name of the plugins folder to come. Returns the watcher that keeps
/// the set current once loaded, its view of the folder taken now, so a
/// change made during the load is picked up afterwards.
async fn prepare_deployers(
    args: &ServeArgs,
    trust: &Trust,
    signers: Signers,
    db: &Db,
) -> anyhow::Result<(Arc<Deployers>, Watcher, Arc<Runtime>)> {
    let limits = Limits {
        memory_mib: args.memory_mib,
        timeout: Duration::from_secs(args.timeout_s),
        out_mib: args.out_mib,
    };
    let cache = Some(CodeCache::new(args.cache_dir()));
    let engines = Engines {
        compiler: args.compiler,
        pool: (args.instance_pool > 0).then_some(args.instance_pool),
    };
    let runtime = Arc::new(
        Runtime::new(limits, cache, engines)?
            .trust(trust)
            .signers(signers),
    );
    let watcher = Watcher::before_load(&args.plugins_dir, args.max_deployers);
    let names = folder_names(&args.plugins_dir);
    let stored = db
        .stored_deployers()
        .await
        .context("cannot read the deployers stored over the API")?
        .into_iter()
        .map(|version| version.name)
        .filter(|name| !names.contains(name))
        .collect();
    let deployers = Deployers::loading(runtime.clone(), args.plugins_dir.clone(), names, stored);
    Ok((Arc::new(deployers), watcher, runtime))
}

/// The first load's summary line.
fn log_loaded(deployers: &Deployers, dir: &Path, cache: &Path, took: Duration) {
    let plugins = deployers.current();
    let compiled = plugins
        .deployers
        .values()
        .filter(|p| p.origin == Origin::Compiled)
        .count();
    tracing::info!(
        loaded = plugins.deployers.len(),
        compiled,
        from_cache = plugins.deployers.len() - compiled,
        rejected = plugins.rejected.len(),
        folder = %dir.display(),
        cache = %cache.display(),
        took_ms = took.as_millis() as u64,
        "plugins folder loaded: ready"
    );
}

/// The sources file, if there is one; its values are secrets, so only the
/// prefixes are logged.
fn load_access(args: &ServeArgs) -> anyhow::Result<Access> {
    let Some(path) = &args.sources_file else {
        return Ok(Access::default());
    };
    let access = Access::load(path)?;
    tracing::info!(
        file = %path.display(),
        prefixes = %access.prefixes().join(" "),
        "sources file loaded"
    );
    Ok(access)
}

/// The certificates of `--ca-file`, if given, trusted beside the public
/// roots.
fn load_trust(args: &ServeArgs) -> anyhow::Result<Trust> {
    let Some(path) = &args.ca_file else {
        return Ok(Trust::default());
    };
    let trust = Trust::load(path)?;
    tracing::info!(
        file = %path.display(),
        certificates = trust.len(),
        "CA file loaded: trusted for HTTPS beside the public roots"
    );
    Ok(trust)
}

/// The plugin signature settings, checked: `--require-signed` needs a
/// `--trusted-key` (each key was checked as it was parsed).
fn signers(args: &ServeArgs) -> anyhow::Result<Signers> {
    let signers =
        Signers::new(args.trusted_key.clone(), args.require_signed).map_err(anyhow::Error::msg)?;
    let keys: Vec<&str> = signers.keys().iter().map(|k| k.id()).collect();
    tracing::info!(
        trusted_keys = keys.len(),
        keys = %keys.join(" "),
        required = signers.required(),
        "plugin signatures: {}",
        match (signers.required(), keys.is_empty()) {
            (true, _) => "required: only plugins signed by a trusted key load",
            (false, true) => "not required, and no key is trusted (--trusted-key)",
            (false, false) => "not required; a trusted key's signature that does not match refuses its plugin",
        }
    );
    Ok(signers)
}

/// `--metrics-listen`: `/metrics` alone on its own address, until the
/// server stops.
async fn serve_metrics(addr: SocketAddr, stop: CancellationToken) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (--metrics-listen)"))?;
    tracing::info!(
        "metrics are served on http://{}/metrics",
        listener.local_addr()?
    );
    let server = axum::serve(listener, crate::http::metrics_app())
        .with_graceful_shutdown(async move { stop.cancelled().await });
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!("the metrics address stopped serving: {e}");
        }
    });
    Ok(())
}

async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The machine's name, for the server's default name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// This server's identity among replicas sharing a database, kept in the
/// data dir so a restart recognises its own leftovers.
fn server_id(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("server-id");
    if let Ok(id) = std::fs::read_to_string(&path)
        && !id.trim().is_empty()
    {
        return Ok(id.trim().to_string());
    }
    use std::hash::{BuildHasher, RandomState};
    let id = format!(
        "{:016x}",
        RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()))
    );
    std::fs::write(&path, &id).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(id)
}

/// A database URL without its password, for messages.
pub(super) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}
