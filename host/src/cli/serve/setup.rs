//! What `berth serve` opens and checks before it serves: API tokens (and
//! their reload), sources' credentials, the CA file, plugin signature
//! settings, publishing targets, the webhook, the database and this server's id and name, and
//! the signal that stops it. Each refusal names the setting to change.
//! Never starts a deployment or loads a plugin.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;
use crate::backoff::Backoff;
use crate::db::Db;
use crate::fetch::{Access, Fetcher, Split};
use crate::http::Webhook;
use crate::human;
use crate::pipeline::copies::Evict;
use crate::runtime::Signers;
use crate::targets::Targets;
use crate::trust::Trust;

use super::ServeArgs;

/// The API tokens, if any are configured; refuses to serve an open API
/// beyond loopback unless told to.
pub(super) fn open_tokens(args: &ServeArgs) -> anyhow::Result<Option<Arc<Tokens>>> {
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
pub(super) async fn reload_tokens(tokens: Arc<Tokens>, stopping: CancellationToken) {
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

/// The sources file, if there is one; its values are secrets, so only the
/// prefixes are logged.
pub(super) fn load_access(args: &ServeArgs) -> anyhow::Result<Access> {
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

/// The publishing targets of the sources file (its `[[target]]`s), if
/// there is one; only their names and URLs are logged.
pub(super) fn load_targets(args: &ServeArgs) -> anyhow::Result<Arc<Targets>> {
    let Some(path) = &args.sources_file else {
        return Ok(Arc::default());
    };
    let targets = Targets::load(path)?;
    if !targets.is_empty() {
        tracing::info!(
            file = %path.display(),
            targets = %targets.summary(),
            "publishing targets configured"
        );
    }
    Ok(Arc::new(targets))
}

/// The MLflow tracking servers the sources file follows (its
/// `[[mlflow]]`s), if there is one; only their URLs and names are logged.
pub(super) fn load_mlflow(args: &ServeArgs) -> anyhow::Result<Arc<crate::mlflow::Servers>> {
    let Some(path) = &args.sources_file else {
        return Ok(Arc::default());
    };
    let servers = crate::mlflow::Servers::load(path)?;
    for server in servers.iter() {
        let follow: Vec<String> = server.follow.iter().map(ToString::to_string).collect();
        tracing::info!(
            server = %server.url,
            follow = %follow.join(" "),
            webhook = server.secret().is_some(),
            "MLflow tracking server followed"
        );
    }
    Ok(Arc::new(servers))
}

/// The certificates of `--ca-file`, if given, trusted beside the public
/// roots.
pub(super) fn load_trust(args: &ServeArgs) -> anyhow::Result<Trust> {
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

/// The key that signs what deployments publish, if one is given.
pub(super) fn publish_signing_key(
    args: &ServeArgs,
) -> anyhow::Result<Option<crate::signing::SigningKey>> {
    let Some(path) = &args.publish_signing_key else {
        return Ok(None);
    };
    let pem = std::fs::read(path)
        .with_context(|| format!("--publish-signing-key {}: cannot read it", path.display()))?;
    let key = crate::signing::SigningKey::from_pkcs8_pem(&pem)
        .map_err(|e| anyhow::anyhow!("--publish-signing-key {}: {e}", path.display()))?;
    tracing::info!(
        key = %format!("sha256:{}", key.key_id()),
        "what deployments publish to file, http and s3 targets is signed (model.sig)"
    );
    Ok(Some(key))
}

/// The plugin signature settings, checked: `--require-signed` needs a
/// `--trusted-key` (each key was checked as it was parsed).
pub(super) fn signers(args: &ServeArgs) -> anyhow::Result<Signers> {
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

/// The webhook, if one is configured, checked.
pub(super) fn webhook(args: &ServeArgs) -> anyhow::Result<Option<Arc<Webhook>>> {
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

/// Installs the metrics recorder, unless metrics are off.
pub(super) fn metrics(args: &ServeArgs) -> anyhow::Result<()> {
    if args.metrics {
        crate::metrics::install();
    } else if let Some(addr) = args.metrics_listen {
        anyhow::bail!("--metrics-listen {addr} serves metrics, but --metrics is off");
    }
    Ok(())
}

/// Opens the database, and this server's id among the servers on it.
pub(super) async fn open_records(args: &ServeArgs) -> anyhow::Result<(Db, String)> {
    let data_dir = &args.data_dir;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data dir {}", data_dir.display()))?;
    let database_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("berth.db").display()));
    let db = connect(&database_url, Duration::from_secs(args.database_wait_s)).await?;
    Ok((db, server_id(data_dir)?))
}

/// Opens the database, trying again while it cannot be reached (a
/// PostgreSQL server restarting, or started after berth) for up to
/// `wait`, with a line each time, so a start that waits says why.
async fn connect(database_url: &str, wait: Duration) -> anyhow::Result<Db> {
    let shown = redact(database_url);
    let started = std::time::Instant::now();
    let mut backoff = Backoff::new();
    loop {
        let error = match Db::connect(database_url).await {
            Ok(db) => return Ok(db),
            Err(e) if e.is_unreachable() => e,
            Err(e) => return Err(e).with_context(|| format!("cannot open the database {shown}")),
        };
        let left = wait.saturating_sub(started.elapsed());
        if left.is_zero() {
            anyhow::bail!(
                "cannot reach the database {shown}; gave up after {} (--database-wait-s): {error}. \
                 Is it running, and does the URL name its host and port?",
                human::duration(started.elapsed())
            );
        }
        let pause = backoff.next_wait().min(left);
        tracing::warn!(
            "cannot reach the database {shown} yet ({error}); trying again in {}, for up to {} more \
             (--database-wait-s)",
            human::duration(pause),
            human::duration(left)
        );
        tokio::time::sleep(pause).await;
    }
}

/// The fetcher of models' files, with the sources' credentials, the CA
/// file, the split of large files, the reserve of the models volume and
/// its budget.
pub(super) fn fetcher(
    args: &ServeArgs,
    trust: Trust,
    access: Access,
    db: &Db,
) -> anyhow::Result<Fetcher> {
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
    Ok(match args.models_max_gib {
        Some(max_bytes) => {
            let evict = Evict::new(db.clone(), fetcher.clone());
            fetcher.budget(max_bytes, Arc::new(evict))
        }
        None => fetcher,
    })
}

/// `--metrics-listen`: `/metrics` alone on its own address, until the
/// server stops.
pub(super) async fn serve_metrics(addr: SocketAddr, stop: CancellationToken) -> anyhow::Result<()> {
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

/// Waits for SIGINT (Ctrl-C) or SIGTERM and answers its name, for the
/// log line that says why the server stops.
pub(super) async fn stop_signal() -> &'static str {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// The machine's name, for the server's default name.
pub(super) fn host_name() -> String {
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
pub(in crate::cli) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

/// Makes every allocation of 1 MiB or more its own mapping, returned to
/// the system when freed. A fetch or a publish moves megabyte buffers
/// between threads (read on one, sent from another); glibc's default
/// raises its mapping threshold to the size of the first such buffer
/// freed and then keeps them in per-thread arenas, where they stay
/// resident long after they are freed (measured: +314 MiB of resident
/// memory publishing 4 GiB with three files at once, against +84 MiB of
/// buffers alive at any time).
#[cfg(target_env = "gnu")]
pub(super) fn large_buffers_go_back() {
    #[allow(unsafe_code)]
    // SAFETY: mallopt only sets a tunable of the allocator, under its
    // own locks.
    let _ = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
}

#[cfg(not(target_env = "gnu"))]
pub(super) fn large_buffers_go_back() {}
