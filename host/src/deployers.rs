//! The deployers this server serves: the runtime that loads them, the
//! plugins folder they come from, and the current set, swapped whole when
//! the folder changes. Never decides the folder's rules (`runtime::plugins`
//! does) and never polls the folder (`watch` does).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::metrics;
use crate::runtime::{PluginSet, Runtime};

pub struct Deployers {
    runtime: Arc<Runtime>,
    dir: PathBuf,
    current: RwLock<Arc<PluginSet>>,
}

impl Deployers {
    pub fn new(runtime: Arc<Runtime>, dir: PathBuf, loaded: PluginSet) -> Self {
        metrics::plugins(loaded.deployers.len(), loaded.rejected.len());
        Self {
            runtime,
            dir,
            current: RwLock::new(Arc::new(loaded)),
        }
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
