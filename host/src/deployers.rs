//! The deployers this server serves: the runtime that loads them, the
//! plugins folder they come from, the current set, swapped whole when the
//! folder changes, and, while the server's first load of the folder runs,
//! the names still to load. Never decides the folder's rules
//! (`runtime::plugins` does) and never polls the folder (`watch` does).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::metrics;
use crate::runtime::{PluginSet, Runtime};

pub struct Deployers {
    runtime: Arc<Runtime>,
    dir: PathBuf,
    current: RwLock<Arc<PluginSet>>,
    /// Deployer names the first load has yet to reach; empty once it ended.
    loading: RwLock<BTreeSet<String>>,
}

impl Deployers {
    pub fn new(runtime: Arc<Runtime>, dir: PathBuf, loaded: PluginSet) -> Self {
        metrics::plugins(loaded.deployers.len(), loaded.rejected.len());
        Self {
            runtime,
            dir,
            current: RwLock::new(Arc::new(loaded)),
            loading: RwLock::new(BTreeSet::new()),
        }
    }

    /// Nothing served yet: `names` are about to be loaded, one by one.
    pub fn loading(runtime: Arc<Runtime>, dir: PathBuf, names: BTreeSet<String>) -> Self {
        let deployers = Self::new(runtime, dir, PluginSet::default());
        *deployers.loading.write().expect("loading lock") = names;
        deployers
    }

    /// The names the first load has not reached yet, in name order.
    pub fn still_loading(&self) -> Vec<String> {
        self.loading
            .read()
            .expect("loading lock")
            .iter()
            .cloned()
            .collect()
    }

    pub fn is_loading(&self, name: &str) -> bool {
        self.loading.read().expect("loading lock").contains(name)
    }

    /// The first load is over: `set` is what it made.
    pub fn finish_loading(&self, set: PluginSet) {
        self.replace(set);
        self.loading.write().expect("loading lock").clear();
    }

    /// Swaps in the set the first load has made so far, `name` included.
    pub fn loaded(&self, name: &str, set: PluginSet) {
        self.replace(set);
        self.loading.write().expect("loading lock").remove(name);
    }

    /// The deployers as they are now; a running deployment keeps the
    /// version it started with.
    pub fn current(&self) -> Arc<PluginSet> {
        self.current.read().expect("plugin set lock").clone()
    }

    /// Swaps in a new set of deployers at once.
    pub fn replace(&self, set: PluginSet) {
        let mut current = self.current.write().expect("plugin set lock");
        // Under the lock, so the gauges follow the swaps in their order.
        metrics::plugins(set.deployers.len(), set.rejected.len());
        *current = Arc::new(set);
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The plugins folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
