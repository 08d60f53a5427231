//! Deployers added while the server runs, over the API: stored in the
//! database (bytes by sha256, each version kept), so every server on it
//! loads them. A push, a rollback and a removal are checked on the server
//! that takes them (the plugin is loaded by the same rules as a folder
//! plugin before anything is stored), recorded, served there at once and
//! announced with `NOTIFY berth_deployers`; every other server then loads
//! the version from the database (compiling it once: the code cache is
//! keyed by sha256). A lost notification is covered by a poll. A name the
//! plugins folder declares is never pushed, and a stored one under such a
//! name is never loaded (`deployers` lists it as rejected).
//! A version may also be pulled from a registry (`oci::component`): the
//! same checks once its bytes are verified, and the manifest's digest
//! kept as the version's source. A version that grants more than the one
//! it replaces (`held`) is stored but held, not served, until an admin
//! approves it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::db::{self, Db, NewVersion, Pushed, StoredVersion, Topic};
use crate::deployers::{ApiSet, Deployers};
use crate::events::Events;
use crate::runtime::{Change, Manifest, Plugin, Rejection, check_name};

/// How often a server looks at the stored deployers without being told:
/// only a lost notification waits this long.
const POLL: Duration = Duration::from_secs(5);

const VERSIONS_HINT: &str = "its versions are the folder's (kept in its version control); \
     only deployers pushed over the API have versions here";
const REMOVE_HINT: &str = "remove its file from the folder";
const ROLLBACK_HINT: &str = "put the version you want back in the folder";
const SHADOWED_HINT: &str = "the version stored over the API under its name is not loaded here, \
     so it cannot be rolled back on this server; use a server whose folder does not declare it";

/// `--max-plugin-mib`'s default: a Python deployer is some 20 MiB.
pub const DEFAULT_MAX_PLUGIN_MIB: u64 = 128;

/// A plugin as `PUT /v1/deployers/{name}` takes it.
pub struct Upload {
    pub name: String,
    pub wasm: Vec<u8>,
    /// The manifest's TOML text (what `NAME.toml` holds beside a folder
    /// plugin).
    pub manifest: Option<String>,
    /// The detached signature's text (what `NAME.wasm.sig` holds).
    pub signature: Option<String>,
    /// Where the bytes were pulled from (`oci://…@sha256:…`); none for an
    /// upload.
    pub source: Option<String>,
    /// The API token that sent it.
    pub by: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "deployer {0} is declared in this server's plugins folder, which wins over the API: \
         push it under another name, or change it in the folder"
    )]
    Declared(String),
    #[error("deployer {name} was not stored: {reason}")]
    Invalid { name: String, reason: String },
    /// The registry did not give the component (502).
    #[error("deployer {name} was not pulled from {reference}: {reason}")]
    Unpulled {
        name: String,
        reference: String,
        reason: String,
    },
    /// The reference names something other than a wasm component (400).
    #[error("deployer {name} was not pulled from {reference}: {reason}")]
    NotComponent {
        name: String,
        reference: String,
        reason: String,
    },
    #[error(
        "deployer {name} was not pulled from {reference}: the component is {size} bytes, \
         larger than this server takes ({} MiB, --max-plugin-mib)", limit >> 20
    )]
    PullTooLarge {
        name: String,
        reference: String,
        size: u64,
        limit: usize,
    },
    #[error(
        "too many deployers: this server loads at most {0} (--max-deployers); remove one first"
    )]
    TooMany(usize),
    #[error("there is no deployer {0} stored over the API (see GET /v1/deployers)")]
    Unknown(String),
    #[error("deployer {name} comes from this server's plugins folder: {hint}")]
    Folder { name: String, hint: &'static str },
    #[error("deployer {name} has no version before the one it serves (version {number})")]
    NoEarlier { name: String, number: i64 },
    #[error("deployer {name} has no version with sha256 {sha256} (see its versions)")]
    NoSuchVersion { name: String, sha256: String },
    #[error(
        "version {number} of deployer {name} is held: it grants more than the version it would replace ({}); approve it with POST /v1/deployers/{name}/approve",
        .adds.join(", ")
    )]
    Held {
        name: String,
        number: i64,
        adds: Vec<String>,
    },
    #[error("deployer {0} has no version held for approval")]
    NothingHeld(String),
    #[error(transparent)]
    Record(#[from] db::Error),
}

/// The stored deployers, kept in step with the database.
pub struct Catalog {
    db: Db,
    deployers: Arc<Deployers>,
    events: Events,
    /// `--max-deployers`: the folder's and the stored ones together.
    max: usize,
    /// `--max-plugin-mib`, in bytes: the largest upload taken.
    max_plugin_bytes: usize,
    /// One change of this server's stored set at a time: a push is stored
    /// and served before the notification it sent is looked at.
    changing: tokio::sync::Mutex<()>,
}

impl Catalog {
    pub fn new(db: Db, deployers: Arc<Deployers>, events: Events, max: usize) -> Self {
        Self {
            db,
            deployers,
            events,
            max,
            max_plugin_bytes: (DEFAULT_MAX_PLUGIN_MIB << 20) as usize,
            changing: tokio::sync::Mutex::new(()),
        }
    }

    /// The largest plugin an upload may carry, in bytes.
    pub fn max_plugin_bytes(&self) -> usize {
        self.max_plugin_bytes
    }

    pub fn with_max_plugin_bytes(mut self, bytes: usize) -> Self {
        self.max_plugin_bytes = bytes;
        self
    }

    /// Checks `upload` as a folder plugin is checked, stores it as the
    /// version its name serves, serves it here and tells the other servers.
    pub async fn push(
        &self,
        upload: Upload,
    ) -> Result<(Arc<Plugin>, StoredVersion, Pushed), Error> {
        let Upload {
            name,
            wasm,
            manifest,
            signature,
            source,
            by,
        } = upload;
        self.admit(&name)?;
        let invalid = |reason| Error::Invalid {
            name: name.clone(),
            reason,
        };
        // Shared, not copied: up to --max-plugin-mib.
        let wasm = Bytes::from(wasm);
        let plugin = self
            .load(&name, wasm.clone(), manifest.as_deref(), signature.clone())
            .await
            .map_err(invalid)?;
        let _changing = self.changing.lock().await;
        // Against the version it would replace: a wider one waits for an
        // admin, the one served keeps serving.
        let held = self
            .served(&name)
            .map(|old| {
                held::widening(
                    (&old.manifest, &old.limits),
                    (&plugin.manifest, &plugin.limits),
                )
            })
            .unwrap_or_default();
        let new = NewVersion {
            name: name.clone(),
            wasm,
            sha256: plugin.sha256.clone(),
            manifest,
            signature,
            source,
            added_by: by,
            held,
        };
        let (version, pushed) = self.db.store_version(new).await?;
        let plugin = match pushed {
            // Served already, unless this server could not load it before
            // (it can now: it just did).
            Pushed::Unchanged => match self.served(&name) {
                Some(served) if served.sha256 == version.sha256 => served,
                _ => {
                    let plugin = Arc::new(plugin);
                    self.serve(plugin.clone(), version.clone(), false);
                    plugin
                }
            },
            Pushed::Held => {
                tracing::warn!(
                    plugin = %name,
                    version = version.number,
                    adds = %version.held.clone().unwrap_or_default().join(", "),
                    "deployer version held: it grants more than the version it would replace"
                );
                Arc::new(plugin)
            }
            Pushed::Added | Pushed::Replaced => {
                let plugin = Arc::new(plugin);
                self.serve(plugin.clone(), version.clone(), pushed == Pushed::Replaced);
                self.tell_others(&name).await;
                plugin
            }
        };
        Ok((plugin, version, pushed))
    }

    /// Whether a version under `name` may be pushed at all: a valid name,
    /// not the folder's, and room for it.
    fn admit(&self, name: &str) -> Result<(), Error> {
        check_name(name).map_err(|reason| Error::Invalid {
            name: name.to_string(),
            reason,
        })?;
        if self.deployers.declared(name) {
            return Err(Error::Declared(name.to_string()));
        }
        let plugins = self.deployers.current();
        if !plugins.deployers.contains_key(name) && plugins.deployers.len() >= self.max {
            return Err(Error::TooMany(self.max));
        }
        Ok(())
    }

    /// Removes a stored deployer and its versions, here and everywhere.
    pub async fn remove(&self, name: &str) -> Result<(), Error> {
        let _changing = self.changing.lock().await;
        if !self.db.remove_stored(name).await? {
            return Err(self.not_stored(name, REMOVE_HINT));
        }
        let mut api = self.deployers.api();
        api.stored.remove(name);
        api.failed.remove(name);
        let served = api.loaded.remove(name).is_some();
        self.deployers.replace_api(api);
        tracing::info!(plugin = %name, "deployer removed: it was removed over the API");
        if served {
            self.events.announce(vec![Change::Removed {
                name: name.to_string(),
            }]);
        }
        self.tell_others(name).await;
        Ok(())
    }

    /// Every version of a stored deployer, oldest first, and the one it
    /// serves.
    pub async fn versions(&self, name: &str) -> Result<(Vec<StoredVersion>, StoredVersion), Error> {
        self.stored_versions(name, VERSIONS_HINT).await
    }

    /// `versions`, with what to say of a folder deployer.
    async fn stored_versions(
        &self,
        name: &str,
        hint: &'static str,
    ) -> Result<(Vec<StoredVersion>, StoredVersion), Error> {
        let (versions, current) = self.db.deployer_versions(name).await?;
        let current = current.and_then(|id| versions.iter().find(|v| v.id == id).cloned());
        match current {
            Some(current) => Ok((versions, current)),
            None => Err(self.not_stored(name, hint)),
        }
    }

    /// Why `name` has no stored versions: a folder deployer (`hint` says
    /// what to do instead), or none at all.
    fn not_stored(&self, name: &str, hint: &'static str) -> Error {
        match self.deployers.declared(name) {
            true => Error::Folder {
                name: name.to_string(),
                hint,
            },
            false => Error::Unknown(name.to_string()),
        }
    }

    /// Makes a stored deployer serve an earlier version again: the one
    /// before the version it serves, or the latest with `sha256`. The
    /// version is loaded here first, so one that this server would refuse
    /// (its signature, say) is not made current.
    pub async fn rollback(
        &self,
        name: &str,
        sha256: Option<&str>,
    ) -> Result<(Arc<Plugin>, StoredVersion), Error> {
        let (versions, current) = self.stored_versions(name, ROLLBACK_HINT).await?;
        if self.deployers.declared(name) {
            return Err(Error::Folder {
                name: name.to_string(),
                hint: SHADOWED_HINT,
            });
        }
        let target = match sha256 {
            None => versions
                .iter()
                .rev()
                .find(|v| v.id < current.id && v.held.is_none()),
            Some(sha256) => versions.iter().rev().find(|v| v.sha256 == sha256),
        };
        let target = target.cloned().ok_or_else(|| match sha256 {
            None => Error::NoEarlier {
                name: name.to_string(),
                number: current.number,
            },
            Some(sha256) => Error::NoSuchVersion {
                name: name.to_string(),
                sha256: sha256.to_string(),
            },
        })?;
        if let Some(adds) = &target.held {
            return Err(Error::Held {
                name: name.to_string(),
                number: target.number,
                adds: adds.clone(),
            });
        }
        if target.id == current.id
            && let Some(plugin) = self.served(name)
        {
            return Ok((plugin, current));
        }
        let plugin =
            Arc::new(
                self.load_stored(&target)
                    .await
                    .map_err(|reason| Error::Invalid {
                        name: name.to_string(),
                        reason,
                    })?,
            );
        let _changing = self.changing.lock().await;
        if !self.db.serve_version(name, target.id).await? {
            return Err(Error::Unknown(name.to_string()));
        }
        tracing::info!(
            plugin = %name,
            version = target.number,
            sha256 = %target.sha256,
            "deployer rolled back"
        );
        self.serve(plugin.clone(), target.clone(), true);
        self.tell_others(name).await;
        Ok((plugin, target))
    }

    /// Brings this server's stored set in line with the database: loads
    /// what changed, drops what was removed, keeps the rest as it is.
    pub async fn refresh(&self) -> Result<(), db::Error> {
        let _changing = self.changing.lock().await;
        let stored = self.db.stored_deployers().await?;
        let before = self.deployers.api();
        let mut room = self
            .max
            .saturating_sub(self.deployers.folder().deployers.len());
        let mut next = ApiSet::default();
        let mut changes = Vec::new();
        for version in stored {
            let name = version.name.clone();
            next.stored.insert(name.clone(), version.clone());
            if self.deployers.declared(&name) {
                continue;
            }
            let held = before.loaded.get(&name);
            if let Some((plugin, loaded)) = held
                && loaded.id == version.id
            {
                next.loaded.insert(name, (plugin.clone(), version));
                room = room.saturating_sub(1);
                continue;
            }
            if let Some((failed, rejection)) = before.failed.get(&name)
                && failed.id == version.id
            {
                // Tried already: the same bytes would fail the same way.
                if let Some(held) = held {
                    next.loaded.insert(name.clone(), held.clone());
                    room = room.saturating_sub(1);
                }
                next.failed.insert(name, (version, rejection.clone()));
                continue;
            }
            if held.is_none() && room == 0 {
                let reason = format!(
                    "too many deployers: this server loads at most {} (--max-deployers)",
                    self.max
                );
                let rejection = self.rejected(&name, reason, &mut changes);
                next.failed.insert(name, (version, rejection));
                continue;
            }
            match self.load_stored(&version).await {
                Ok(plugin) => {
                    self.log_loaded(&plugin, &version, held.is_some());
                    changes.push(Change::Loaded {
                        name: name.clone(),
                        replaced: held.is_some(),
                    });
                    next.loaded.insert(name, (Arc::new(plugin), version));
                    room = room.saturating_sub(1);
                }
                Err(reason) => {
                    let reason = match held {
                        Some((old, _)) => format!(
                            "{reason} (still serving the previous version, sha256 {})",
                            old.sha256
                        ),
                        None => reason,
                    };
                    let rejection = self.rejected(&name, reason, &mut changes);
                    if let Some(held) = held {
                        next.loaded.insert(name.clone(), held.clone());
                        room = room.saturating_sub(1);
                    }
                    next.failed.insert(name, (version, rejection));
                }
            }
        }
        for name in before.loaded.keys() {
            if !next.stored.contains_key(name) {
                tracing::info!(plugin = %name, "deployer removed: it was removed over the API");
                changes.push(Change::Removed { name: name.clone() });
            }
        }
        self.deployers.replace_api(next);
        self.events.announce(changes);
        Ok(())
    }

    /// Keeps this server's stored set current until `stop`: on every
    /// notification (`wake`, subscribed before the first refresh), every
    /// change of the folder, and every `POLL`.
    pub async fn follow(
        self: Arc<Self>,
        mut wake: tokio::sync::broadcast::Receiver<String>,
        stop: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                woken = wake.recv() => {
                    if let Err(RecvError::Closed) = woken {
                        return;
                    }
                }
                _ = self.deployers.folder_changed() => {}
                _ = tick.tick() => {}
            }
            if let Err(e) = self.refresh().await {
                tracing::warn!(
                    "could not read the deployers stored over the API: {e}; trying again in {}",
                    crate::human::duration(POLL)
                );
            }
        }
    }

    /// The stored deployer `name` as served here now.
    fn served(&self, name: &str) -> Option<Arc<Plugin>> {
        self.deployers
            .api()
            .loaded
            .get(name)
            .map(|(plugin, _)| plugin.clone())
    }

    /// Serves `plugin` as the stored deployer at `version`.
    fn serve(&self, plugin: Arc<Plugin>, version: StoredVersion, replaced: bool) {
        let name = version.name.clone();
        self.log_loaded(&plugin, &version, replaced);
        let mut api = self.deployers.api();
        api.failed.remove(&name);
        api.stored.insert(name.clone(), version.clone());
        api.loaded.insert(name.clone(), (plugin, version));
        self.deployers.replace_api(api);
        self.events
            .announce(vec![Change::Loaded { name, replaced }]);
    }

    /// Wakes every server on the database (this one's own follower finds
    /// nothing to do). A lost notification only waits for the next poll.
    async fn tell_others(&self, name: &str) {
        if let Err(e) = self.db.notify(Topic::Deployers, name).await {
            tracing::warn!(
                "could not tell the other servers that deployer {name} changed ({e}); they will \
                 see it within {}",
                crate::human::duration(POLL)
            );
        }
    }

    /// Loads a stored version from the database's bytes.
    async fn load_stored(&self, version: &StoredVersion) -> Result<Plugin, String> {
        let wasm = match self.db.plugin_wasm(&version.sha256).await {
            Ok(Some(wasm)) => wasm,
            Ok(None) => {
                return Err("its bytes are gone from the database (removed meanwhile?)".into());
            }
            Err(e) => return Err(format!("its bytes cannot be read from the database: {e}")),
        };
        self.load(
            &version.name,
            wasm,
            version.manifest.as_deref(),
            version.signature.clone(),
        )
        .await
    }

    /// A plugin from its bytes, manifest text and signature, by the same
    /// rules as a folder plugin; the manifest's `${VAR}`s come from this
    /// server's environment, as a folder manifest's do.
    async fn load(
        &self,
        name: &str,
        wasm: impl Into<Bytes>,
        manifest: Option<&str>,
        signature: Option<String>,
    ) -> Result<Plugin, String> {
        let manifest = match manifest {
            Some(text) => Manifest::parse(text, |var| std::env::var(var).ok())
                .map_err(|e| format!("manifest {name}.toml: {e}"))?,
            None => Manifest::default(),
        };
        self.deployers
            .runtime()
            .load(name, wasm, manifest, signature)
            .await
    }

    fn rejected(&self, name: &str, reason: String, changes: &mut Vec<Change>) -> Rejection {
        tracing::warn!(plugin = %name, "skipped the deployer stored over the API: {reason}");
        let rejection = Rejection {
            file: format!("{name}.wasm"),
            reason,
        };
        changes.push(Change::Rejected(rejection.clone()));
        rejection
    }

    fn log_loaded(&self, plugin: &Plugin, version: &StoredVersion, replaced: bool) {
        tracing::info!(
            plugin = %plugin.name,
            sha256 = %plugin.sha256,
            version = version.number,
            origin = ?plugin.origin,
            "{} deployer stored over the API: {}",
            if replaced { "replaced" } else { "loaded" },
            plugin.description
        );
    }
}

mod held;
mod pull;
pub use pull::Pull;

#[cfg(test)]
#[path = "catalog_tests.rs"]
mod tests;
