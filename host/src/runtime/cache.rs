//! Compiled plugin code on disk, so a restart with unchanged plugins does not
//! compile again. An entry is keyed by the wasm's sha256, its tier and the
//! engine's compatibility hash (wasmtime version and settings), and stored with the
//! sha256 of its own bytes: deserializing compiled code is `unsafe`, so an
//! entry whose bytes do not match its recorded hash is never loaded — it is
//! rebuilt. Reads, hashes and writes block: callers run them on a blocking
//! thread, never on the async ones.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::Tier;

#[derive(Debug, Clone)]
pub struct CodeCache {
    dir: PathBuf,
}

/// Where a component came from, for the log and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    Cached,
}

impl CodeCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub(super) fn entry(&self, engine: &Engine, tier: Tier, wasm_sha256: &str) -> PathBuf {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let tier = match tier {
            Tier::Optimized => "",
            Tier::Baseline => "-baseline",
        };
        self.dir.join(format!(
            "{wasm_sha256}{tier}-{:016x}.cwasm",
            hasher.finish()
        ))
    }

    /// The cached component, if a trustworthy entry exists.
    // wasmtime offers no safe way to load precompiled code.
    #[allow(unsafe_code)]
    pub(crate) fn load(&self, engine: &Engine, tier: Tier, wasm_sha256: &str) -> Option<Component> {
        let path = self.entry(engine, tier, wasm_sha256);
        let bytes = std::fs::read(&path).ok()?;
        let recorded = std::fs::read_to_string(seal_path(&path)).unwrap_or_default();
        if hex::encode(Sha256::digest(&bytes)) != recorded.trim() {
            tracing::warn!(entry = %path.display(), "compiled-code cache entry does not match its recorded hash; ignoring it and compiling again");
            return None;
        }
        // SAFETY: wasmtime requires bytes it serialized itself, for this
        // engine's configuration. These are only ever bytes this server
        // wrote with `Component::serialize` under a key that includes the
        // engine's compatibility hash, and they still match the `.sha256`
        // seal written after them: the seal proves the bytes are whole
        // (not torn by a crash mid-write), not that nobody tampered with
        // them; the cache directory is trusted as the server's own.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(entry = %path.display(), "compiled-code cache entry unusable ({e}); compiling again");
                None
            }
        }
    }

    /// Stores a compiled component; failures only cost a later recompile.
    pub(crate) fn store(
        &self,
        engine: &Engine,
        tier: Tier,
        wasm_sha256: &str,
        component: &Component,
    ) {
        let path = self.entry(engine, tier, wasm_sha256);
        if let Err(e) = write_entry(&path, component) {
            tracing::warn!(entry = %path.display(), "could not write the compiled-code cache ({e}); the next start compiles again");
        }
    }
}

fn seal_path(entry: &Path) -> PathBuf {
    entry.with_extension("cwasm.sha256")
}

fn write_entry(path: &Path, component: &Component) -> anyhow::Result<()> {
    let dir = path.parent().expect("cache entries live in the cache dir");
    std::fs::create_dir_all(dir)?;
    let bytes = component.serialize()?;
    let seal = hex::encode(Sha256::digest(&bytes));
    // The seal is written after the entry: a crash in between leaves an entry
    // without a matching seal, which `load` ignores.
    write_atomically(path, &bytes)?;
    write_atomically(&seal_path(path), seal.as_bytes())?;
    Ok(())
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
