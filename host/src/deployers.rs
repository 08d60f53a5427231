//! The deployers this server serves, from its two sources: the plugins
//! folder (declared, reviewed, the same at every start) and the deployers
//! stored over the API (`catalog`). The served set is the two merged, and a
//! name the folder declares always comes from the folder: a stored deployer
//! under that name is listed as rejected, never loaded over it. Each
//! source's set is swapped whole on a change; a version that stops being
//! served stays runnable while queued deployments ask for it (they run the
//! version they were accepted for). While the server's first
//! load runs, it also knows the names still to load. Never decides the
//! folder's rules (`runtime::plugins` does), never polls the folder
//! (`watch` does) and never reads the database (`catalog` does).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::db::{Runnable, StoredVersion};
use crate::metrics;
use crate::runtime::{Plugin, PluginSet, Rejection, Runtime};

/// Where a served deployer, or a rejection, comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Folder,
    /// Stored over the API, at this version (boxed: a version is large).
    Api(Box<StoredVersion>),
}

/// The deployers stored over the API, as this server loaded them.
#[derive(Debug, Default, Clone)]
pub struct ApiSet {
    /// Every stored deployer and the version it serves, loaded or not.
    pub stored: BTreeMap<String, StoredVersion>,
    /// Those this server loaded, at the version loaded (a name whose new
    /// version failed to load here keeps the previous one).
    pub loaded: BTreeMap<String, (Arc<Plugin>, StoredVersion)>,
    /// Versions this server could not load, with the reason: not tried
    /// again until the name serves another version.
    pub failed: BTreeMap<String, (StoredVersion, Rejection)>,
}

/// The served set as the API lists it: each deployer and each rejection
/// with its source.
pub struct View {
    pub deployers: Vec<(Arc<Plugin>, Source)>,
    pub rejected: Vec<(Rejection, Source)>,
}

pub struct Deployers {
    runtime: Arc<Runtime>,
    dir: PathBuf,
    state: RwLock<State>,
    /// Tells the catalog that the folder's set changed: a name it declares
    /// may have come or gone.
    folder_changed: tokio::sync::Notify,
}

struct State {
    folder: Arc<PluginSet>,
    api: ApiSet,
    /// The two merged: what deployments run.
    current: Arc<PluginSet>,
    /// Folder names the first load has yet to reach; empty once it ended.
    loading: BTreeSet<String>,
    /// Stored names the first load has yet to reach.
    loading_stored: BTreeSet<String>,
    /// Versions no longer served, by `deployer@sha256`, kept while
    /// deployments accepted for them may still wait in the queue, and
    /// since when.
    retired: BTreeMap<String, (Arc<Plugin>, Instant)>,
}

impl Deployers {
    pub fn new(runtime: Arc<Runtime>, dir: PathBuf, loaded: PluginSet) -> Self {
        metrics::plugins(loaded.deployers.len(), loaded.rejected.len());
        let folder = Arc::new(loaded);
        Self {
            runtime,
            dir,
            state: RwLock::new(State {
                current: folder.clone(),
                folder,
                api: ApiSet::default(),
                loading: BTreeSet::new(),
                loading_stored: BTreeSet::new(),
                retired: BTreeMap::new(),
            }),
            folder_changed: tokio::sync::Notify::new(),
        }
    }

    /// Nothing served yet: the folder's `names` and the `stored` ones are
    /// about to be loaded, one by one.
    pub fn loading(
        runtime: Arc<Runtime>,
        dir: PathBuf,
        names: BTreeSet<String>,
        stored: BTreeSet<String>,
    ) -> Self {
        let deployers = Self::new(runtime, dir, PluginSet::default());
        let mut state = deployers.state.write().expect("deployers lock");
        state.loading = names;
        state.loading_stored = stored;
        drop(state);
        deployers
    }

    /// The names the first load has not reached yet, in name order.
    pub fn still_loading(&self) -> Vec<String> {
        let state = self.state.read().expect("deployers lock");
        state
            .loading
            .union(&state.loading_stored)
            .cloned()
            .collect()
    }

    pub fn is_loading(&self, name: &str) -> bool {
        let state = self.state.read().expect("deployers lock");
        state.loading.contains(name) || state.loading_stored.contains(name)
    }

    /// The first load of the folder is over: `set` is what it made.
    pub fn folder_loaded(&self, set: PluginSet) {
        self.change(|state| {
            state.folder = Arc::new(set);
            state.loading.clear();
        });
    }

    /// The first load is over: what is still named as loading is gone.
    pub fn finish_loading(&self) {
        self.change(|state| {
            state.loading.clear();
            state.loading_stored.clear();
        });
    }

    /// Swaps in the set the first load of the folder has made so far,
    /// `name` included.
    pub fn loaded(&self, name: &str, set: PluginSet) {
        self.change(|state| {
            state.folder = Arc::new(set);
            state.loading.remove(name);
        });
    }

    /// The deployers as they are now, from both sources; a running
    /// deployment keeps the version it started with.
    pub fn current(&self) -> Arc<PluginSet> {
        self.state.read().expect("deployers lock").current.clone()
    }

    /// The plugins folder's set alone, as its rules made it.
    pub fn folder(&self) -> Arc<PluginSet> {
        self.state.read().expect("deployers lock").folder.clone()
    }

    /// The stored deployers as this server loaded them.
    pub fn api(&self) -> ApiSet {
        self.state.read().expect("deployers lock").api.clone()
    }

    /// Swaps in a new set of the folder's deployers at once.
    pub fn replace(&self, set: PluginSet) {
        self.change(|state| state.folder = Arc::new(set));
        self.folder_changed.notify_one();
    }

    /// Swaps in a new set of the stored deployers at once.
    pub fn replace_api(&self, api: ApiSet) {
        self.change(|state| {
            for name in api.stored.keys() {
                state.loading_stored.remove(name);
            }
            state.api = api;
        });
    }

    /// Resolves once the folder's set changed since the last call.
    pub async fn folder_changed(&self) {
        self.folder_changed.notified().await;
    }

    /// Whether the plugins folder declares `name`: a deployer it serves, a
    /// plugin file of it that was refused, or one still loading.
    pub fn declared(&self, name: &str) -> bool {
        let state = self.state.read().expect("deployers lock");
        declared(&state.folder, &state.loading).contains(name)
    }

    /// What the API lists: the served deployers and every rejection, with
    /// their sources.
    pub fn view(&self) -> View {
        let state = self.state.read().expect("deployers lock");
        let source = |name: &str, plugin: &Arc<Plugin>| match state.api.loaded.get(name) {
            Some((stored, version)) if Arc::ptr_eq(stored, plugin) => {
                Source::Api(Box::new(version.clone()))
            }
            _ => Source::Folder,
        };
        let deployers = state
            .current
            .deployers
            .iter()
            .map(|(name, plugin)| (plugin.clone(), source(name, plugin)))
            .collect();
        let declared = declared(&state.folder, &state.loading);
        let folder = state
            .folder
            .rejected
            .iter()
            .map(|r| (r.clone(), Source::Folder));
        let api = api_rejections(&state.api, &declared)
            .into_iter()
            .map(|(r, version)| (r, Source::Api(Box::new(version))));
        View {
            deployers,
            rejected: folder.chain(api).collect(),
        }
    }

    /// What queued deployments may be claimed for, by `deployer@sha256`:
    /// the served versions, and the ones replaced or removed while
    /// deployments accepted for them may still wait (they run the version
    /// they were accepted for, as a running one finishes on its own).
    pub fn runnable(&self) -> BTreeMap<String, Arc<Plugin>> {
        let state = self.state.read().expect("deployers lock");
        let retired = state
            .retired
            .iter()
            .map(|(key, (plugin, _))| (key.clone(), plugin.clone()));
        let served = state
            .current
            .deployers
            .values()
            .map(|p| (Runnable::key(&p.name, &p.sha256), p.clone()));
        retired.chain(served).collect()
    }

    /// Whether versions are kept for the queue (`drop_retired` has work).
    pub fn has_retired(&self) -> bool {
        !self
            .state
            .read()
            .expect("deployers lock")
            .retired
            .is_empty()
    }

    /// Lets go of the retired versions no queued deployment asks for
    /// (`queued`: their keys), once retired for `grace`: a deployment
    /// accepted just before its version was replaced may not be recorded
    /// yet.
    pub fn drop_retired(&self, queued: &HashSet<String>, grace: Duration) {
        let mut state = self.state.write().expect("deployers lock");
        state
            .retired
            .retain(|key, (_, since)| queued.contains(key) || since.elapsed() < grace);
    }

    /// Recomputes the served set after `edit`, under the lock, so the
    /// gauges follow the swaps in their order; a version that stops being
    /// served is retired.
    fn change(&self, edit: impl FnOnce(&mut State)) {
        let mut state = self.state.write().expect("deployers lock");
        edit(&mut state);
        let current = merge(&state.folder, &state.loading, &state.api);
        metrics::plugins(current.deployers.len(), current.rejected.len());
        let before = std::mem::replace(&mut state.current, Arc::new(current));
        let key = |p: &Plugin| Runnable::key(&p.name, &p.sha256);
        for plugin in before.deployers.values() {
            let still = state.current.deployers.get(&plugin.name);
            if still.is_none_or(|now| now.sha256 != plugin.sha256) {
                state
                    .retired
                    .insert(key(plugin), (plugin.clone(), Instant::now()));
            }
        }
        let served: Vec<String> = state.current.deployers.values().map(|p| key(p)).collect();
        for served in served {
            state.retired.remove(&served);
        }
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The plugins folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The names the folder declares.
fn declared(folder: &PluginSet, loading: &BTreeSet<String>) -> BTreeSet<String> {
    let refused = folder
        .rejected
        .iter()
        .filter_map(|r| r.file.strip_suffix(".wasm"));
    folder
        .deployers
        .keys()
        .map(String::as_str)
        .chain(refused)
        .chain(loading.iter().map(String::as_str))
        .map(str::to_string)
        .collect()
}

/// The folder's deployers, and the stored ones under names it does not
/// declare.
fn merge(folder: &PluginSet, loading: &BTreeSet<String>, api: &ApiSet) -> PluginSet {
    let declared = declared(folder, loading);
    let mut set = PluginSet::clone(folder);
    for (name, (plugin, _)) in &api.loaded {
        if !declared.contains(name) {
            set.deployers.insert(name.clone(), plugin.clone());
        }
    }
    set.rejected.extend(
        api_rejections(api, &declared)
            .into_iter()
            .map(|(rejection, _)| rejection),
    );
    set
}

/// The stored versions not served here, and why: shadowed by a declared
/// name, or failed to load.
fn api_rejections(api: &ApiSet, declared: &BTreeSet<String>) -> Vec<(Rejection, StoredVersion)> {
    let mut rejected = Vec::new();
    for (name, version) in &api.stored {
        if declared.contains(name) {
            let reason = format!(
                "declared in this server's plugins folder, which wins: the version stored over \
                 the API (version {}, sha256 {}) is not loaded here",
                version.number, version.sha256
            );
            let file = format!("{name}.wasm");
            rejected.push((Rejection { file, reason }, version.clone()));
        } else if let Some((failed, rejection)) = api.failed.get(name) {
            rejected.push((rejection.clone(), failed.clone()));
        }
    }
    rejected
}

#[cfg(test)]
#[path = "deployers_tests.rs"]
mod tests;
