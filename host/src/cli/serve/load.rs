//! The deployers at start, in their order: before the server listens, the
//! runtime and a served set that knows every name it is about to load
//! (`FirstLoad::prepare`); once it listens, the first load (`run`): the
//! plugins folder one plugin at a time, then the deployers stored over the
//! API (the folder's names win), then the catalog follower and the folder
//! watcher keep the set current until the server stops. Only sequences:
//! what loads is decided by the runtime's folder rules and the catalog.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::catalog::Catalog;
use crate::db::Db;
use crate::deployers::Deployers;
use crate::events::Events;
use crate::loops::Loops;
use crate::runtime::{CodeCache, Engines, Limits, Origin, Runtime, Signers, folder_names};
use crate::targets::Targets;
use crate::trust::Trust;
use crate::watch::Watcher;

use super::ServeArgs;

/// The deployers as served before their first load: nothing yet, every
/// name to come; and what the load needs.
pub(super) struct FirstLoad {
    pub(super) deployers: Arc<Deployers>,
    runtime: Arc<Runtime>,
    /// Its view of the folder taken before the load, so a change made
    /// during the load is picked up afterwards.
    watcher: Watcher,
    plugins_dir: PathBuf,
    cache_dir: PathBuf,
    max: usize,
    /// How often the watcher looks at the folder; zero: it does not.
    poll: Duration,
}

impl FirstLoad {
    /// The runtime, and the served deployers as loading: the plugins
    /// folder's names and those stored over the API.
    pub(super) async fn prepare(
        args: &ServeArgs,
        trust: &Trust,
        signers: Signers,
        signing_key: Option<crate::signing::SigningKey>,
        targets: Arc<Targets>,
        db: &Db,
    ) -> anyhow::Result<Self> {
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
                .signers(signers)
                .targets(targets)
                .signing_key(signing_key),
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
        let deployers =
            Deployers::loading(runtime.clone(), args.plugins_dir.clone(), names, stored);
        Ok(Self {
            deployers: Arc::new(deployers),
            runtime,
            watcher,
            plugins_dir: args.plugins_dir.clone(),
            cache_dir: args.cache_dir(),
            max: args.max_deployers,
            poll: Duration::from_millis(args.plugins_poll_ms),
        })
    }

    /// The first load, then the followers until `stop`. `catalog_wakeups`
    /// was subscribed before the catalog's first look, so that no change
    /// made meanwhile is missed.
    pub(super) async fn run(
        self,
        catalog: Arc<Catalog>,
        catalog_wakeups: tokio::sync::broadcast::Receiver<String>,
        events: Events,
        stop: CancellationToken,
        loops: Loops,
    ) {
        let Self {
            deployers,
            runtime,
            watcher,
            plugins_dir,
            cache_dir,
            max,
            poll,
        } = self;
        let started = Instant::now();
        let plugins = runtime
            .load_dir_each(&plugins_dir, max, |name, set, changes| {
                deployers.loaded(name, set.clone());
                events.announce(changes);
            })
            .await;
        // Also clears names whose files went away during the load, and
        // brings in a folder that could not be read as the set's rejection.
        deployers.folder_loaded(plugins);
        // The stored deployers come after the folder's, which win.
        if let Err(e) = catalog.refresh().await {
            tracing::error!("could not load the deployers stored over the API: {e}; trying again");
        }
        deployers.finish_loading();
        log_loaded(&deployers, &plugins_dir, &cache_dir, started.elapsed());
        loops.spawn(
            "catalog follower",
            catalog.follow(catalog_wakeups, stop.clone()),
        );
        if !poll.is_zero() {
            watcher.run(deployers, events, stop, poll).await;
        }
    }
}

/// The first load's summary line.
fn log_loaded(
    deployers: &Deployers,
    dir: &std::path::Path,
    cache: &std::path::Path,
    took: Duration,
) {
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
