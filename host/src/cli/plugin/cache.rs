//! Where `berth plugin check` and `run` keep compiled plugin code: per user,
//! so an edit–run loop compiles a plugin once per change, not once per try.
//! Entries are a server's (`runtime::CodeCache`), so the two may share a dir.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use crate::runtime::{CodeCache, Compiler, Engines, Origin, Plugin, Runtime};

#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Where compiled plugin code is kept between runs (default:
    /// $XDG_CACHE_HOME/berth, else ~/.cache/berth).
    #[arg(long, env = "BERTH_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compiles the plugin without reading or writing the cache.
    #[arg(long)]
    no_cache: bool,
    /// Which compiler makes the plugin's code: `baseline` (Winch: a
    /// rebuilt Python or JavaScript plugin runs within seconds, its code
    /// slower), or `optimized` (Cranelift, the code a server settles on:
    /// tens of seconds the first time, for timing a deployer); each is
    /// cached.
    #[arg(long, value_name = "COMPILER", default_value_t = Compiler::Baseline)]
    compiler: Compiler,
}

impl CacheArgs {
    /// The cache to use, if any.
    pub fn dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        let dir = self.cache_dir.clone().or_else(user_cache_dir);
        if dir.is_none() {
            eprintln!(
                "no compiled-code cache: neither XDG_CACHE_HOME nor HOME is set; pass --cache-dir DIR to keep compiled code between runs"
            );
        }
        dir
    }
}

/// The XDG base directory rule: `$XDG_CACHE_HOME` if it is an absolute
/// path (a relative one is to be ignored), else `$HOME/.cache`.
fn user_cache_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute());
    let home = || {
        std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(|home| PathBuf::from(home).join(".cache"))
    };
    xdg.or_else(home).map(|dir| dir.join("berth"))
}

impl CacheArgs {
    /// A runtime with the server's defaults, this cache (`dir()`) and this
    /// compiler.
    pub fn runtime(&self, cache: Option<&Path>) -> anyhow::Result<Runtime> {
        let engines = Engines {
            compiler: self.compiler,
            ..Engines::default()
        };
        Runtime::new(Default::default(), cache.map(CodeCache::new), engines)
    }
}

/// Loads the plugin as the server would, its manifest's `${VAR}`s read
/// from `lookup`, and says on stderr whether its code was compiled or came
/// from the cache, and how long loading took.
pub async fn load(
    runtime: &Runtime,
    file: &Path,
    name: &str,
    cache: Option<&Path>,
    lookup: impl Fn(&str) -> Option<String> + Send + 'static,
) -> Result<Plugin, String> {
    let started = Instant::now();
    let plugin = runtime.load_file_with(file, name, lookup).await?;
    let took = crate::human::duration(started.elapsed());
    match (plugin.origin, cache) {
        (Origin::Cached, Some(dir)) => eprintln!(
            "plugin {name}: loaded from the compiled-code cache in {took} ({})",
            dir.display()
        ),
        (Origin::Compiled, Some(dir)) => eprintln!(
            "plugin {name}: compiled and loaded in {took}; kept in the compiled-code cache ({}) for the next run",
            dir.display()
        ),
        (_, None) => eprintln!("plugin {name}: compiled and loaded in {took} (no cache)"),
    }
    Ok(plugin)
}
