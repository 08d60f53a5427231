//! Loading a plugin: reading its `.wasm`, `NAME.toml` and `NAME.wasm.sig`,
//! checking its manifest's sha256 pin and its signature (`signature` holds
//! those rules) before anything is compiled, compiling it or taking it from
//! the code cache, checking which `berth:deployer` version it
//! exports, and asking it to describe itself. Every refusal is a reason a
//! plugin author can act on. The bytes are shared (`Bytes`), never copied,
//! and the file reads, the hash, the signature check, the code cache and
//! the compile run on a blocking thread, never on an async one. Never
//! decides which files of the plugins folder become deployers (`plugins`
//! does).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::plugins::check_name;
use super::tier::{Backend, Code, CodeSlot, Compiler, Job, Tier};
use super::wit::{self, PLUGIN_FUNCTIONS, PLUGIN_INTERFACE, WIT_VERSIONS};
use super::{CodeCache, Limits, LogReporter, Manifest, Origin, Plugin, Runtime, Signers, Verdict};

impl Runtime {
    /// Loads `path` as the deployer `name`, with `NAME.toml` and its
    /// detached signature `NAME.wasm.sig` beside it when present; the
    /// manifest's `${VAR}`s come from this process's environment.
    pub async fn load_file(&self, path: &Path, name: &str) -> Result<Plugin, String> {
        self.load_file_with(path, name, |var| std::env::var(var).ok())
            .await
    }

    /// `load_file`, the manifest's `${VAR}`s read from `lookup`
    /// (`berth plugin run --env`).
    pub async fn load_file_with(
        &self,
        path: &Path,
        name: &str,
        lookup: impl Fn(&str) -> Option<String> + Send + 'static,
    ) -> Result<Plugin, String> {
        check_name(name)?;
        let (path, owned_name) = (path.to_path_buf(), name.to_string());
        let (manifest, wasm, signature) =
            tokio::task::spawn_blocking(move || read_files(&path, &owned_name, lookup))
                .await
                .map_err(|e| format!("reading it crashed: {e}"))??;
        self.load(name, wasm, manifest, signature).await
    }

    /// Compiles (or loads from the cache) and checks one plugin, and asks it
    /// to describe itself. The error is the reason to show for the file.
    /// Under `Compiler::Tiered` the plugin may start on baseline code, its
    /// optimized code following in the background. `signature` is the
    /// text of the detached signature over `wasm` that came with it, if any
    /// (what `NAME.wasm.sig` holds). The sha256 pin and the signature are
    /// checked before compiling: a refused plugin costs no compile. The
    /// bytes are shared, never copied; the hash, the signature check, the
    /// cache and the compile run on a blocking thread, never on the caller's.
    pub async fn load(
        &self,
        name: &str,
        wasm: impl Into<Bytes>,
        manifest: Manifest,
        signature: Option<String>,
    ) -> Result<Plugin, String> {
        check_name(name)?;
        let wasm = wasm.into();
        check_magic(&wasm)?;
        let checks = Checks {
            name: name.to_string(),
            pinned: manifest.sha256.clone(),
            signature,
            signers: self.signers.clone(),
            compiler: self.compiler,
            optimized: self.optimized.clone(),
            first: self.first_tier().clone(),
            cache: self.cache.clone(),
        };
        let bytes = wasm.clone();
        let checked = tokio::task::spawn_blocking(move || checks.run(&bytes))
            .await
            .map_err(|e| format!("checking and compiling it crashed: {e}"))??;
        let Checked {
            sha256,
            verdict,
            backend,
            component,
            origin,
        } = checked;
        let signed_by = match verdict {
            Verdict::Unsigned => None,
            Verdict::Untrusted { key_id } => {
                tracing::warn!(
                    plugin = name,
                    key_id,
                    "plugin {name} is signed by key {key_id}, which this server does not trust \
                     (--trusted-key): loading it unverified, since signatures are not required \
                     (--require-signed)"
                );
                None
            }
            Verdict::Trusted { key_id } => Some(key_id),
        };
        let wit_version = check_world(&backend.engine, &component)?;
        let code = CodeSlot::new(Code {
            pre: backend.link(&component, &wit_version)?,
            tier: backend.tier,
        });

        let limits = Limits {
            memory_mib: manifest.memory_mib.unwrap_or(self.defaults.memory_mib),
            timeout: manifest.timeout.unwrap_or(self.defaults.timeout),
            out_mib: manifest.out_mib.unwrap_or(self.defaults.out_mib),
        };
        let mut plugin = Plugin {
            name: name.to_string(),
            description: String::new(),
            options_schema: None,
            wit_version,
            sha256,
            manifest,
            limits,
            origin,
            signed_by,
            code,
        };
        let reporter = Arc::new(LogReporter::new(name, None));
        let info = match self
            .ask(
                &plugin,
                reporter,
                &CancellationToken::new(),
                wit::Question::Describe,
            )
            .await
        {
            Ok(wit::Answer::Info(info)) => info,
            Ok(_) => unreachable!("describe answers with info"),
            Err(e) => return Err(format!("describe failed: {e}")),
        };
        if let Some(schema) = &info.options_schema
            && serde_json::from_str::<serde_json::Value>(schema).is_err()
        {
            return Err("describe returned an options-schema that is not valid JSON".into());
        }
        plugin.description = plugin
            .manifest
            .description
            .clone()
            .unwrap_or(info.description);
        plugin.options_schema = info.options_schema;
        if plugin.tier() == Tier::Baseline
            && let Some(optimizer) = &self.optimizer
        {
            optimizer.submit(Job {
                name: plugin.name.clone(),
                sha256: plugin.sha256.clone(),
                wit_version: plugin.wit_version.clone(),
                wasm,
                slot: Arc::downgrade(&plugin.code),
            });
        }
        Ok(plugin)
    }
}

/// A plugin's manifest, bytes and signature text, read from the folder.
fn read_files(
    path: &Path,
    name: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(Manifest, Vec<u8>, Option<String>), String> {
    let manifest_path = path.with_extension("toml");
    let manifest = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => {
            Manifest::parse(&text, lookup).map_err(|e| format!("manifest {name}.toml: {e}"))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Manifest::default(),
        Err(e) => return Err(format!("manifest {name}.toml cannot be read: {e}")),
    };
    let wasm = std::fs::read(path).map_err(|e| format!("cannot be read: {e}"))?;
    let signature = match std::fs::read_to_string(signature_path(path)) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("signature {name}.wasm.sig cannot be read: {e}")),
    };
    Ok((manifest, wasm, signature))
}

/// What checking and compiling a plugin needs of the runtime, owned, so
/// that it runs on a blocking thread.
struct Checks {
    name: String,
    /// The manifest's sha256 pin.
    pinned: Option<String>,
    signature: Option<String>,
    signers: Signers,
    compiler: Compiler,
    optimized: Arc<Backend>,
    first: Arc<Backend>,
    cache: Option<CodeCache>,
}

/// A plugin whose bytes passed the checks, and its code.
struct Checked {
    sha256: String,
    verdict: Verdict,
    backend: Arc<Backend>,
    component: Component,
    origin: Origin,
}

impl Checks {
    /// The sha256 pin, the signature, then the code. Blocks.
    fn run(self, wasm: &[u8]) -> Result<Checked, String> {
        let sha256 = hex::encode(Sha256::digest(wasm));
        if let Some(pinned) = &self.pinned
            && *pinned != sha256
        {
            return Err(format!(
                "its sha256 is {sha256} but its manifest {}.toml pins {pinned}",
                self.name
            ));
        }
        let verdict = self
            .signers
            .check(&self.name, wasm, self.signature.as_deref())?;
        let (backend, component, origin) = self.code(wasm, &sha256)?;
        Ok(Checked {
            sha256,
            verdict,
            backend,
            component,
            origin,
        })
    }

    /// The plugin's code from the first tier that has it: optimized code
    /// already cached, else what the compiler setting starts with, from the
    /// cache or compiled now.
    fn code(&self, wasm: &[u8], sha256: &str) -> Result<(Arc<Backend>, Component, Origin), String> {
        let cached = |backend: &Backend| {
            self.cache
                .as_ref()
                .and_then(|c| c.load(&backend.engine, backend.tier, sha256))
        };
        if self.compiler == Compiler::Tiered
            && let Some(component) = cached(&self.optimized)
        {
            return Ok((self.optimized.clone(), component, Origin::Cached));
        }
        if let Some(component) = cached(&self.first) {
            return Ok((self.first.clone(), component, Origin::Cached));
        }
        let started = Instant::now();
        let component = self.first.compile(wasm)?;
        tracing::debug!(
            sha256,
            tier = self.first.tier.as_str(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compiled a plugin"
        );
        if let Some(cache) = &self.cache {
            cache.store(&self.first.engine, self.first.tier, sha256, &component);
        }
        Ok((self.first.clone(), component, Origin::Compiled))
    }
}

/// Where a folder plugin's detached signature is: `NAME.wasm.sig`.
pub fn signature_path(wasm: &Path) -> std::path::PathBuf {
    let mut file = wasm.as_os_str().to_owned();
    file.push(".sig");
    file.into()
}

/// The cheap checks that the bytes are a component at all.
fn check_magic(wasm: &[u8]) -> Result<(), String> {
    if !wasm.starts_with(b"\0asm") {
        return Err("is not a WebAssembly file (it does not start with the \\0asm magic)".into());
    }
    if wasm.get(4..8) == Some(&[1, 0, 0, 0]) {
        return Err("is a core WebAssembly module, not a component (build it for wasm32-wasip2, or wrap it with `wasm-tools component new`)".into());
    }
    Ok(())
}

/// Explains, in the plugin author's terms, why a component is not a
/// deployer of a version this server speaks. Returns the version it was
/// built for.
pub(crate) fn check_world(engine: &Engine, component: &Component) -> Result<String, String> {
    let ty = component.component_type();
    let spoken = WIT_VERSIONS.join(" and ");
    let mut found = None;
    for (name, item) in ty.exports(engine) {
        if let Some(version) = name
            .strip_prefix(PLUGIN_INTERFACE)
            .and_then(|v| v.strip_prefix('@'))
        {
            found = Some((version.to_string(), item));
        }
    }
    let Some((version, item)) = found else {
        let exports: Vec<_> = ty
            .exports(engine)
            .map(|(name, _)| name.to_string())
            .collect();
        return Err(format!(
            "exports no {PLUGIN_INTERFACE} interface (this server speaks berth:deployer@{spoken}; it exports: {}); is it built for another world? Generate its bindings from berth's wit/ with world \"deployer\"",
            if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            }
        ));
    };
    if wit::spoken(&version).is_none() {
        return Err(format!(
            "built for berth:deployer@{version} but this server speaks {spoken}"
        ));
    }
    let ComponentItem::ComponentInstance(instance) = item.ty else {
        return Err(format!(
            "exports {PLUGIN_INTERFACE}@{version} but not as an interface"
        ));
    };
    let functions: Vec<_> = instance
        .exports(engine)
        .map(|(n, _)| n.to_string())
        .collect();
    for function in PLUGIN_FUNCTIONS {
        if !functions.iter().any(|f| f == function) {
            return Err(format!("exports no {function} function"));
        }
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::runtime::Engines;

    /// The code cache is read on a blocking thread: its entry here is a
    /// FIFO that only another task of the same single-threaded runtime
    /// writes, so a read on the runtime's own thread would wait forever.
    #[test]
    fn a_load_reads_the_code_cache_off_the_async_threads() {
        let cache = tempfile::TempDir::new().unwrap();
        let engines = Engines {
            compiler: Compiler::Baseline,
            pool: None,
        };
        let runtime = Runtime::new(
            Limits::default(),
            Some(CodeCache::new(cache.path())),
            engines,
        )
        .unwrap();
        // A component's header and nothing more.
        let wasm: &'static [u8] = b"\0asm\x0d\x00\x01\x00";
        let backend = runtime.first_tier();
        let sha256 = hex::encode(Sha256::digest(wasm));
        let entry = runtime
            .cache
            .as_ref()
            .unwrap()
            .entry(&backend.engine, backend.tier, &sha256);
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &entry,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();

        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let single = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let loaded = single.block_on(async {
                let writer = tokio::spawn(tokio::fs::write(entry, b"not compiled code"));
                let loaded = runtime.load("fifo", wasm, Manifest::default(), None).await;
                writer.await.unwrap().expect("the cache entry was read");
                loaded
            });
            let _ = done.send(loaded);
        });
        let loaded = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the load read the code cache on the runtime's only thread, blocking it");
        // Not a deployer, whatever the cache held: the load went on to say so.
        assert!(loaded.is_err());
    }

    #[test]
    fn versions_are_spoken_within_a_minor() {
        assert_eq!(wit::spoken("0.1.0"), Some("0.1.0"));
        assert_eq!(wit::spoken("0.1.7"), Some("0.1.0"));
        assert_eq!(wit::spoken("0.2.3"), Some("0.2.0"));
        assert_eq!(wit::spoken("0.3.0"), None);
        assert_eq!(wit::spoken("1.0.0"), None);
    }
}
