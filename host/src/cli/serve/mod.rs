//! `berth serve`: checks its settings, opens the records, recovers what a
//! killed run left, serves the HTTP API while the plugins folder loads, and
//! stops on SIGINT/SIGTERM. The process's stop token is made and cancelled
//! here, and handed to everything that must end with the server. `run`
//! reads as the list of steps; `args` declares the settings, `setup` opens
//! and checks what they name, `load` sequences the deployers' first load.

mod args;
mod load;
mod setup;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::catalog::Catalog;
use crate::db::Topic;
use crate::events::Events;
use crate::http::ApiContext;
use crate::loops::Loops;
use crate::pipeline::{Pipeline, QueueSettings};
use crate::rules::Rules;

pub use args::ServeArgs;
pub(super) use setup::redact;

use load::FirstLoad;

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let clock = Instant::now();
    setup::large_buffers_go_back();
    let args = args.absolute()?;
    // First: tokens, a sources file (sources and targets), a CA file or signature settings that
    // cannot be used stop the start before anything is opened.
    let tokens = setup::open_tokens(&args)?;
    let access = setup::load_access(&args)?;
    let targets = setup::load_targets(&args)?;
    let mlflow = setup::load_mlflow(&args)?;
    let trust = setup::load_trust(&args)?;
    let model_trust =
        crate::model_trust::ModelTrust::load(args.model_signatures, &args.model_signer)
            .map_err(anyhow::Error::msg)?;
    let signers = setup::signers(&args)?;
    let signing_key = setup::publish_signing_key(&args)?;
    let declared_rules = match &args.rules_file {
        Some(path) => Rules::read_file(path).map_err(anyhow::Error::msg)?,
        None => Vec::new(),
    };
    setup::metrics(&args)?;
    let webhook = setup::webhook(&args)?;
    let shutdown = CancellationToken::new();
    // Every long-lived loop runs in this set: one that ends early is said.
    let loops = Loops::new(shutdown.clone());

    let (db, server_id) = setup::open_records(&args).await?;
    for (name, task) in db.tasks() {
        loops.watch(name, task);
    }
    let events = Events::stored(
        db.clone(),
        server_id.clone(),
        crate::http::event_data,
        &loops,
    );
    let first_load =
        FirstLoad::prepare(&args, &trust, signers, signing_key, targets.clone(), &db).await?;
    let deployers = first_load.deployers.clone();
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
    let fetcher = setup::fetcher(&args, trust.clone(), access, &db)?;
    // Bound now so that the server's name can carry its port; accepting
    // starts at the end.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let server_name = match &args.server_name {
        Some(name) => name.clone(),
        None => format!("{}:{}", setup::host_name(), listener.local_addr()?.port()),
    };
    let queue = QueueSettings {
        max_running: usize::from(args.max_running),
        lease: Duration::from_millis(args.lease_ms),
        queue_timeout: Duration::from_secs(args.queue_timeout_s),
        approval_expiry: Duration::from_secs(args.approval_expiry_s),
    };
    let pipeline = Arc::new(
        Pipeline::new(
            db.clone(),
            events.clone(),
            deployers.clone(),
            fetcher.clone(),
            server_id.clone(),
            args.data_dir.join("out"),
            shutdown.clone(),
        )
        .reserve(args.min_free_mib << 20)
        .pickles(args.pickle)
        .queue(queue, server_name)
        .model_trust(model_trust),
    );

    loops.spawn(
        "event pruner",
        crate::events::prune(
            db.clone(),
            Duration::from_secs(args.events_retention_s),
            shutdown.clone(),
        ),
    );
    // Before the recovery's events and before listening, so that a new
    // receiver's cursor is set before the first deployment's end.
    let delivery = match &webhook {
        Some(webhook) => Some(
            webhook
                .clone()
                .start(db.clone(), server_id, &trust, shutdown.clone(), &loops)
                .await?,
        ),
        None => None,
    };
    pipeline.recover().await;
    pipeline.start_workers(&loops);
    // A models dir filled before the blob store (or by a server that
    // could not link) is adopted into it, in the background. Then the
    // storage gauges start from what the models dir holds; each scan
    // (`GET /v1/storage`) sets them again.
    let adopting = fetcher.clone();
    loops.spawn_once("adoption", async move {
        adopting.adopt().await;
        if let Err(e) = adopting.usage().await {
            tracing::warn!("scanning the models dir for the storage metrics: {e}");
        }
    });
    if let Some(addr) = args.metrics_listen {
        setup::serve_metrics(addr, shutdown.clone()).await?;
    }
    if let Some(tokens) = &tokens {
        loops.spawn(
            "token reloader",
            setup::reload_tokens(tokens.clone(), shutdown.clone()),
        );
    }

    tracing::info!(
        ready_ms = clock.elapsed().as_millis() as u64,
        "berth is listening on http://{}",
        listener.local_addr()?
    );
    // Listening comes first: the deployers appear one by one as they
    // compile (seconds each for Python and JavaScript), /readyz tells when
    // all are in, and only then does the watcher take over the folder.
    // Started after the line above, so the log says so in that order: a
    // folder of cached code loads in a millisecond.
    // The first load, then the plugins folder's watcher until the stop
    // (none with --plugins-poll-ms 0: only a panic is an end).
    loops.spawn_once(
        "plugins folder watcher",
        first_load.run(
            catalog.clone(),
            catalog_wakeups,
            events.clone(),
            shutdown.clone(),
            loops.clone(),
        ),
    );
    let rules = Arc::new(Rules::new(db.clone(), deployers.clone(), declared_rules));
    loops.spawn(
        "rules follower",
        crate::rules::fire::run(
            rules.clone(),
            pipeline.clone(),
            db.clone(),
            crate::http::happened,
            shutdown.clone(),
        ),
    );
    let ctx = ApiContext {
        db: db.clone(),
        events: events.clone(),
        deployers,
        catalog,
        rules,
        pipeline: pipeline.clone(),
        fetcher,
        tokens,
        webhook,
        targets,
        shutdown: shutdown.clone(),
        models_max_bytes: args.models_max_gib,
        loops: loops.clone(),
        mlflow: mlflow.clone(),
    };
    if mlflow.iter().any(|server| !server.follow.is_empty()) {
        loops.spawn(
            "mlflow catch-up",
            crate::http::mlflow_catch_up::run(ctx.clone(), shutdown.clone()),
        );
    }
    let app = crate::http::app(ctx);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let signal = setup::stop_signal().await;
            tracing::info!(
                "stopping on {signal}: running deployments are interrupted and recorded as failed"
            );
            shutdown.cancel();
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
