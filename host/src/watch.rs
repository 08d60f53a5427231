//! Hot plugins: keeps the served deployers in step with the plugins folder
//! while the server runs. The folder is polled (portable, and immune to lost
//! notifications); a change is applied only once the file has stayed the
//! same for a whole poll interval, so a plugin still being copied in is not
//! loaded half-written. What a change means for the served deployers is
//! decided by the runtime's folder rules, the same as at start; this module
//! only notices changes, swaps the set and announces it. Deployments already
//! running hold the version they started with.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::deployers::Deployers;
use crate::events::Events;
use crate::runtime::{Folder, is_plugin_file};

/// What identifies a file's version without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
}

type Scan = BTreeMap<String, Fingerprint>;

/// The plugin files of the folder (`*.wasm`, `*.toml`, `*.wasm.sig`: the
/// runtime's folder rules say which).
fn scan(dir: &Path) -> Scan {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Scan::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            if !is_plugin_file(&name) {
                return None;
            }
            let meta = entry.metadata().ok().filter(|m| m.is_file())?;
            let fingerprint = Fingerprint {
                len: meta.len(),
                mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
                ino: meta.ino(),
            };
            Some((name, fingerprint))
        })
        .collect()
}

/// Takes the folder's state as the one the initial load saw. Call before
/// loading, so a change made during the load is picked up afterwards.
pub struct Watcher {
    applied: Scan,
    seen: Option<Scan>,
    max: usize,
}

impl Watcher {
    pub fn before_load(dir: &Path, max: usize) -> Self {
        Self {
            applied: scan(dir),
            seen: None,
            max,
        }
    }

    /// Polls until the server stops.
    pub async fn run(
        mut self,
        deployers: Arc<Deployers>,
        events: Events,
        stop: CancellationToken,
        every: Duration,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.poll(&deployers, &events).await,
                _ = stop.cancelled() => return,
            }
        }
    }

    async fn poll(&mut self, deployers: &Deployers, events: &Events) {
        // A folder on a slow or network disk must not hold a runtime thread.
        let dir = deployers.dir().to_path_buf();
        let now = tokio::task::spawn_blocking(move || scan(&dir))
            .await
            .unwrap_or_default();
        if now == self.applied {
            self.seen = None;
            return;
        }
        // Apply only what stood still for a whole interval.
        if self.seen.as_ref() != Some(&now) {
            self.seen = Some(now);
            return;
        }
        let changed: BTreeSet<String> = self
            .applied
            .keys()
            .chain(now.keys())
            .filter(|file| self.applied.get(*file) != now.get(*file))
            .cloned()
            .collect();
        let folder = Folder {
            files: now.keys().cloned().collect(),
            changed,
        };
        let (set, changes) = deployers
            .runtime()
            .reconcile_dir(deployers.dir(), &folder, &deployers.folder(), self.max)
            .await;
        deployers.replace(set);
        events.announce(changes);
        self.applied = now;
        self.seen = None;
    }
}
