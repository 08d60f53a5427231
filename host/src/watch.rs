//! Hot plugins: keeps the served deployers in step with the plugins folder
//! while the server runs. The folder is polled (portable, and immune to lost
//! notifications); a change is applied only once the file has stayed the
//! same for a whole poll interval, so a plugin still being copied in is not
//! loaded half-written. A replacement is swapped in only after it compiled
//! and checked; a bad one leaves the previous version serving. Deployments
//! already running hold the version they started with.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::deployers::Deployers;
use crate::events::{Event, Events};
use crate::runtime::{PluginSet, Rejection};

/// What identifies a file's version without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
}

type Scan = BTreeMap<String, Fingerprint>;

/// The plugin files (`*.wasm`, `*.toml`) of the folder.
fn scan(dir: &Path) -> Scan {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Scan::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            if !(name.ends_with(".wasm") || name.ends_with(".toml")) {
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
        let now = scan(deployers.dir());
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
            .filter_map(|file| file.rsplit_once('.').map(|(stem, _)| stem.to_string()))
            .collect();
        let set = self.reload(deployers, events, &now, &changed).await;
        deployers.replace(set);
        self.applied = now;
        self.seen = None;
    }

    async fn reload(
        &self,
        deployers: &Deployers,
        events: &Events,
        now: &Scan,
        changed: &BTreeSet<String>,
    ) -> PluginSet {
        let current = deployers.current();
        let concerns = |file: &str, name: &str| {
            file == format!("{name}.wasm") || file == format!("{name}.toml")
        };
        let mut set = PluginSet {
            deployers: current
                .deployers
                .iter()
                .filter(|(name, _)| !changed.contains(*name))
                .map(|(name, plugin)| (name.clone(), plugin.clone()))
                .collect(),
            rejected: current
                .rejected
                .iter()
                .filter(|r| !changed.iter().any(|name| concerns(&r.file, name)))
                .cloned()
                .collect(),
        };
        for name in changed {
            let wasm = format!("{name}.wasm");
            let previous = current.deployers.get(name);
            if !now.contains_key(&wasm) {
                if now.contains_key(&format!("{name}.toml")) {
                    reject(
                        events,
                        &mut set,
                        format!("{name}.toml"),
                        format!("a manifest without a plugin: there is no {wasm} beside it"),
                    );
                }
                if previous.is_some() {
                    tracing::info!(plugin = %name, "deployer removed: its file left the plugins folder");
                    events.publish(Event::PluginRemoved { name: name.clone() });
                }
                continue;
            }
            if previous.is_none() && set.deployers.len() >= self.max {
                let reason = format!(
                    "too many deployers: this server loads at most {} (--max-deployers)",
                    self.max
                );
                reject(events, &mut set, wasm, reason);
                continue;
            }
            match deployers
                .runtime()
                .load_file(&deployers.dir().join(&wasm), name)
                .await
            {
                Ok(plugin) => {
                    tracing::info!(
                        plugin = %name,
                        sha256 = %plugin.sha256,
                        "{} deployer: {}",
                        if previous.is_some() { "replaced" } else { "loaded" },
                        plugin.description
                    );
                    set.deployers.insert(name.clone(), Arc::new(plugin));
                    events.publish(Event::PluginLoaded { name: name.clone() });
                }
                Err(reason) => match previous {
                    Some(old) => {
                        set.deployers.insert(name.clone(), old.clone());
                        let reason = format!(
                            "{reason} (still serving the previous version, sha256 {})",
                            old.sha256
                        );
                        reject(events, &mut set, wasm, reason);
                    }
                    None => reject(events, &mut set, wasm, reason),
                },
            }
        }
        set
    }
}

fn reject(events: &Events, set: &mut PluginSet, file: String, reason: String) {
    tracing::warn!(file, "skipped plugin: {reason}");
    events.publish(Event::PluginRejected {
        file: file.clone(),
        reason: reason.clone(),
    });
    set.rejected.push(Rejection { file, reason });
}
