//! `berth serve`'s settings: every flag, its environment variable and its
//! default (a `--config` file's keys are the same names), and the paths
//! derived from them. Only declares and derives: never opens a file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::cli::LogFormat;
use crate::pipeline::PicklePolicy;
use crate::runtime::{Compiler, Engines, TrustedKey};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML file of these settings (keys: the flags' names in snake
    /// case); flags and environment variables win over it.
    #[arg(long, env = "BERTH_CONFIG", value_name = "FILE")]
    pub(super) config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:7878")]
    pub(super) listen: SocketAddr,
    /// Where berth keeps its database, models and compiled plugins.
    #[arg(long, env = "BERTH_DATA_DIR", default_value = "./data")]
    pub(super) data_dir: PathBuf,
    /// sqlite://PATH or postgres://… (default: SQLite at DATA_DIR/berth.db).
    #[arg(long, env = "BERTH_DATABASE_URL")]
    pub(super) database_url: Option<String>,
    /// How long, in seconds, serve keeps trying to reach its database at
    /// start (PostgreSQL restarting, or started after berth), saying so
    /// each time, before it gives up; 0: one try.
    #[arg(long, env = "BERTH_DATABASE_WAIT_S", default_value_t = 60)]
    pub(super) database_wait_s: u64,
    /// The folder of deployer plugins (NAME.wasm and optional NAME.toml).
    #[arg(long, env = "BERTH_PLUGINS_DIR", default_value = "./plugins")]
    pub(super) plugins_dir: PathBuf,
    /// Where compiled plugin code is kept between starts (default:
    /// DATA_DIR/cache). Servers may share one.
    #[arg(long, env = "BERTH_CACHE_DIR")]
    pub(super) cache_dir: Option<PathBuf>,
    /// Where models' files are fetched to (default: DATA_DIR/models).
    #[arg(long, env = "BERTH_MODELS_DIR")]
    pub(super) models_dir: Option<PathBuf>,
    /// At most this many deployers are loaded, from the plugins folder and
    /// stored over the API together.
    #[arg(long, env = "BERTH_MAX_DEPLOYERS", default_value_t = 20)]
    pub(super) max_deployers: usize,
    /// The largest plugin `PUT /v1/deployers/{name}` takes, in MiB.
    #[arg(long, env = "BERTH_MAX_PLUGIN_MIB", default_value_t = crate::catalog::DEFAULT_MAX_PLUGIN_MIB,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(super) max_plugin_mib: u64,
    /// Default memory limit of a deployer, in MiB (a manifest may change it).
    #[arg(long, env = "BERTH_MEMORY_MIB", default_value_t = 512)]
    pub(super) memory_mib: u64,
    /// Default quota of a deployment's output directory, in MiB (a
    /// manifest's out_mib may change it): a deployer that writes more is
    /// stopped and its deployment fails.
    #[arg(long, env = "BERTH_OUT_MIB", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=crate::runtime::MAX_OUT_MIB))]
    pub(super) out_mib: u64,
    /// Default wall-clock limit of one deploy call, in seconds (at most a week).
    #[arg(long, env = "BERTH_TIMEOUT_S", default_value_t = 1800,
          value_parser = clap::value_parser!(u64).range(1..=crate::runtime::MAX_TIMEOUT_S))]
    pub(super) timeout_s: u64,
    /// Credentials for sources, by URL prefix, and publishing targets: a
    /// TOML file of `[[source]]` entries with `prefix` and `headers` (HTTP)
    /// or `options` (object stores), and `[[target]]` entries with `name`,
    /// `url` and the same `headers` or `options`; values may use `${VAR}`
    /// from this environment.
    #[arg(long, env = "BERTH_SOURCES_FILE")]
    pub(super) sources_file: Option<PathBuf>,
    /// PEM certificates (an internal CA) trusted for HTTPS in addition to
    /// the public roots: by sources, deployers' outgoing requests and the
    /// webhook.
    #[arg(long, env = "BERTH_CA_FILE", value_name = "PEM")]
    pub(super) ca_file: Option<PathBuf>,
    /// A public key whose plugin signatures this server trusts: the second
    /// line of a minisign `.pub` file (`berth plugin keygen` writes one).
    /// Repeat it for several keys (BERTH_TRUSTED_KEYS: comma-separated; in
    /// the config file a list, `trusted_key = ["RW…", "RW…"]`).
    #[arg(long = "trusted-key", env = "BERTH_TRUSTED_KEYS", value_name = "KEY",
          value_delimiter = ',', action = clap::ArgAction::Append,
          value_parser = TrustedKey::parse)]
    pub(super) trusted_key: Vec<TrustedKey>,
    /// Load only plugins that come with a detached signature over their
    /// bytes by a --trusted-key (`NAME.wasm.sig` beside a folder plugin);
    /// others are refused with the reason. Without it, unsigned plugins
    /// load too, but a trusted key's signature that does not match still
    /// refuses its plugin.
    #[arg(long, env = "BERTH_REQUIRE_SIGNED")]
    pub(super) require_signed: bool,
    /// What this server does with a model's OpenSSF signature (a
    /// `model.sig` given with its registration): off (ignored), record
    /// (verified, and the outcome recorded; every model deploys), require
    /// (only a model a --model-signer signed, over exactly its files,
    /// deploys).
    #[arg(long, env = "BERTH_MODEL_SIGNATURES", value_enum,
          default_value_t = crate::model_trust::Policy::Record)]
    pub(super) model_signatures: crate::model_trust::Policy,
    /// A file of whom models may be signed by: a PEM ECDSA public key
    /// (`model_signing sign key`), PEM CA certificates (`model_signing sign
    /// certificate`), or a Sigstore signer (`model_signing sign sigstore`):
    /// TOML with trusted_root (Sigstore's trusted_root.json, verified
    /// offline), identity (`*` matches any run) and issuer. Repeat it for
    /// several (BERTH_MODEL_SIGNERS: comma-separated).
    #[arg(long = "model-signer", env = "BERTH_MODEL_SIGNERS", value_name = "FILE",
          value_delimiter = ',', action = clap::ArgAction::Append)]
    pub(super) model_signer: Vec<PathBuf>,
    /// Sign what deployments publish with this ECDSA P-256/P-384 private
    /// key (PKCS#8 PEM): a model.sig in the folder of the files published
    /// to file, http(s) and s3 targets, attached as a referrer of each
    /// artifact pushed to an oci target; OpenSSF model signing's key
    /// method, which `model_signing verify key` checks. Never seen by a
    /// plugin.
    #[arg(long, env = "BERTH_PUBLISH_SIGNING_KEY", value_name = "PEM")]
    pub(super) publish_signing_key: Option<PathBuf>,
    /// Limit on fetching all files of one deployment, in seconds.
    #[arg(long, env = "BERTH_FETCH_TIMEOUT_S", default_value_t = 1800)]
    pub(super) fetch_timeout_s: u64,
    /// The most connections per large file on sources that honour ranges
    /// (object stores and CDNs cap each connection's rate): a file starts
    /// on one and adds more while they pay; those beyond each file's first
    /// are shared by all files fetched at once; 1 reads every file in one
    /// stream.
    #[arg(long, env = "BERTH_FETCH_CONNECTIONS", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(super) fetch_connections: u16,
    /// The size of one piece read over one connection, in MiB; a file with
    /// less than two pieces' worth to download is read in one stream.
    #[arg(long, env = "BERTH_FETCH_PIECE_MIB", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(super) fetch_piece_mib: u64,
    /// Free space, in MiB, that berth keeps on the data and models volumes:
    /// a fetch that would eat into it fails before downloading, and new
    /// deployments are refused (503) while less is free, so that every
    /// started deployment can still record its end.
    #[arg(long, env = "BERTH_MIN_FREE_MIB", default_value_t = 256)]
    pub(super) min_free_mib: u64,
    /// A budget for the models dir, in GiB (a decimal, like 0.5): before a
    /// fetch that would pass it, the local copies of the models deployed
    /// least recently are dropped (never one a queued or running
    /// deployment uses). Default: no budget. Held in bytes.
    #[arg(long, env = "BERTH_MODELS_MAX_GIB", value_name = "GIB", value_parser = gib_in_bytes)]
    pub(super) models_max_gib: Option<u64>,
    /// What a deployment of a model holding pickle files (`pickle`,
    /// `zip-pickle`: loading one runs code), as the fetch tells them from
    /// their bytes, does: `allow` says nothing; `warn` says which files in
    /// the server's and the deployment's log; `refuse` refuses them to a
    /// deployer whose manifest does not say `accepts_pickle = true`.
    #[arg(long, env = "BERTH_PICKLE", value_enum, default_value_t = PicklePolicy::Warn)]
    pub(super) pickle: PicklePolicy,
    /// How often the plugins folder is checked for added, replaced or
    /// removed plugins, in milliseconds; 0 turns watching off. A change is
    /// applied once its files stood still for one interval.
    #[arg(long, env = "BERTH_PLUGINS_POLL_MS", default_value_t = 250)]
    pub(super) plugins_poll_ms: u64,
    /// How plugins are compiled: `tiered` serves a new plugin from quickly
    /// compiled baseline code (Winch) within seconds and swaps in optimized
    /// code (Cranelift) when a background compile ends; `optimized` serves
    /// a plugin only once Cranelift is done; `baseline` never optimizes
    /// (for testing). Compiled code is cached for each tier.
    #[arg(long, env = "BERTH_COMPILER", default_value_t = Compiler::Tiered)]
    pub(super) compiler: Compiler,
    /// Plugin instances (calls under way) that can exist at once, in a pool
    /// reserved up front and reused from call to call, which makes a fresh
    /// sandbox cheap; further calls wait for a free one. 0 maps each
    /// instance afresh instead (for hosts that limit address space: each
    /// pooled instance reserves about 16 GiB of it per compiler, 32 GiB
    /// when tiered, never memory).
    #[arg(long, env = "BERTH_INSTANCE_POOL", default_value_t = Engines::DEFAULT_POOL)]
    pub(super) instance_pool: u32,
    /// Deployments this server runs at once; the rest wait in the queue,
    /// in order, for this server or another one on the same database.
    #[arg(long, env = "BERTH_MAX_RUNNING", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub(super) max_running: u16,
    /// How long, in milliseconds, this server's claim on a deployment it
    /// runs lasts unless renewed (every third of it). When it runs out
    /// (the server was killed, froze or lost the database), any server
    /// fails the deployment naming this one.
    #[arg(long, env = "BERTH_LEASE_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(300..))]
    pub(super) lease_ms: u64,
    /// How long, in seconds, a deployment that no live server can run
    /// (none has its deployer at the version asked for) stays queued
    /// before it fails saying so.
    #[arg(long, env = "BERTH_QUEUE_TIMEOUT_S", default_value_t = 300)]
    pub(super) queue_timeout_s: u64,
    /// A TOML file of deploy rules (`[[rule]]` tables, as docs/src/api/rules.md
    /// shows); a rule it declares wins over a stored one of the same name.
    #[arg(long, env = "BERTH_RULES_FILE")]
    pub(super) rules_file: Option<PathBuf>,
    /// How long, in seconds, a deployment a rule held for an admin's
    /// approval waits (default 7 days) before it fails saying it expired.
    #[arg(long, env = "BERTH_APPROVAL_EXPIRY_S", default_value_t = 7 * 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) approval_expiry_s: u64,
    /// This server's name in other servers' records and messages (a
    /// deployment lost with it names it). Default: HOST:PORT.
    #[arg(long, env = "BERTH_SERVER_NAME")]
    pub(super) server_name: Option<String>,
    /// POST every deployment event as JSON to this URL, from the event
    /// log: in id order, retried until --webhook-give-up-s.
    #[arg(long, env = "BERTH_WEBHOOK_URL")]
    pub(super) webhook_url: Option<String>,
    /// Sign webhook bodies with this secret (header X-Berth-Signature).
    #[arg(long, env = "BERTH_WEBHOOK_SECRET", hide_env_values = true)]
    pub(super) webhook_secret: Option<String>,
    /// How long the webhook keeps trying to deliver an event, in seconds
    /// after the event happened (default 12 hours); then the event is
    /// given up, logged and counted. At most --events-retention-s.
    #[arg(long, env = "BERTH_WEBHOOK_GIVE_UP_S", default_value_t = 43_200,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) webhook_give_up_s: u64,
    /// How long the event log keeps events, in seconds (default a day): a
    /// client resuming the event stream (Last-Event-ID, ?after=) gets what
    /// is kept. Progress events make up most of it: up to 4 a second per
    /// running deployment, about 350 bytes each (some 5 MB per hour a
    /// deployment runs).
    #[arg(long, env = "BERTH_EVENTS_RETENTION_S", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) events_retention_s: u64,
    /// The accepted API tokens: `NAME ROLE SHA256` lines (`berth token new`
    /// prints one); read again when it changes.
    #[arg(long, env = "BERTH_API_TOKENS_FILE", value_name = "FILE")]
    pub(super) api_tokens_file: Option<PathBuf>,
    /// One accepted API token, with the admin role, recorded as
    /// BERTH_API_TOKEN (for a single operator).
    #[arg(
        long,
        env = "BERTH_API_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(super) api_token: Option<String>,
    /// Serve without API tokens on an address other than loopback: anyone
    /// who reaches it may register, deploy and delete.
    #[arg(long, env = "BERTH_INSECURE_NO_AUTH")]
    pub(super) insecure_no_auth: bool,
    /// Record Prometheus metrics and serve them at /metrics (on or off).
    #[arg(long, env = "BERTH_METRICS", default_value = "on",
          value_parser = clap::builder::BoolishValueParser::new(),
          action = clap::ArgAction::Set)]
    pub(super) metrics: bool,
    /// Also serve /metrics, and nothing else, on this address.
    #[arg(long, env = "BERTH_METRICS_LISTEN")]
    pub(super) metrics_listen: Option<SocketAddr>,
    /// How log lines are written to stderr: text, or json (one object a line).
    #[arg(long, env = "BERTH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(in crate::cli) log_format: LogFormat,
}

/// A positive number of GiB, in bytes (below 2^32 GiB, so it fits).
fn gib_in_bytes(raw: &str) -> Result<u64, String> {
    let bytes = raw
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|gib| gib.is_finite() && *gib < f64::from(u32::MAX))
        .map(|gib| (gib * f64::from(1u32 << 30)).round())
        .filter(|bytes| *bytes >= 1.0);
    match bytes {
        Some(bytes) => Ok(bytes as u64),
        None => Err(format!(
            "{raw:?} is not a budget: give a number of GiB above 0, like 0.5 or 200, or leave the setting out for no budget"
        )),
    }
}

impl ServeArgs {
    /// Recorded paths (a deployment's dir and out_dir) must not depend on
    /// the working directory of whoever reads them.
    pub(super) fn absolute(mut self) -> anyhow::Result<Self> {
        let absolute = |path: Option<PathBuf>| path.as_deref().map(std::path::absolute).transpose();
        self.data_dir = std::path::absolute(&self.data_dir)?;
        self.plugins_dir = std::path::absolute(&self.plugins_dir)?;
        self.models_dir = absolute(self.models_dir)?;
        self.ca_file = absolute(self.ca_file)?;
        self.cache_dir = absolute(self.cache_dir)?;
        Ok(self)
    }

    pub(super) fn models_dir(&self) -> PathBuf {
        self.models_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("models"))
    }

    pub(super) fn cache_dir(&self) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("cache"))
    }
}

#[cfg(test)]
mod tests {
    use super::gib_in_bytes;

    #[test]
    fn budgets_are_positive_gib() {
        assert_eq!(gib_in_bytes("1"), Ok(1 << 30));
        assert_eq!(gib_in_bytes("0.5"), Ok(512 << 20));
        assert_eq!(gib_in_bytes(" 200 "), Ok(200 << 30));
        for refused in ["0", "0.0", "-1", "nan", "inf", "", "1GiB", "1e30"] {
            let refusal = gib_in_bytes(refused).unwrap_err();
            assert!(refusal.contains("above 0"), "{refused:?}: {refusal}");
        }
    }
}
