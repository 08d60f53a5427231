//! Plugin code in two tiers. Cranelift (the *optimized* tier) makes the code
//! every call should run, but takes half a minute for a Python or
//! JavaScript component; Winch (the *baseline* tier) compiles the same
//! component in a few seconds into slower code. Under `Compiler::Tiered` a
//! new plugin serves from its baseline code at once while the optimizer
//! thread compiles it again with Cranelift, at a low priority, and swaps the
//! optimized code in: calls that already started keep the instance they
//! have. Owns the engines, the per-plugin code slot and the optimizer;
//! never decides whether a plugin is acceptable (`load` does).

use std::sync::mpsc;
use std::sync::{Arc, RwLock, Weak};
use std::time::Instant;

use wasmtime::component::{Component, Linker};
use wasmtime::{Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Strategy};

use super::cache::CodeCache;
use super::state::State;
use super::wit::PluginPre;
use super::{root_message, sandbox, wit};

/// Which compiler made a plugin's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Winch: compiled in seconds, runs slower.
    Baseline,
    /// Cranelift: the steady state.
    Optimized,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Baseline => "baseline",
            Tier::Optimized => "optimized",
        }
    }
}

/// How a runtime compiles the plugins it loads (`berth serve --compiler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compiler {
    /// Baseline code first, so a plugin serves seconds after it arrives,
    /// and optimized code swapped in when the background compile ends.
    #[default]
    Tiered,
    /// Optimized code only: a plugin serves once Cranelift is done.
    Optimized,
    /// Baseline code only, never optimized: for testing that tier.
    Baseline,
}

impl std::str::FromStr for Compiler {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tiered" => Ok(Compiler::Tiered),
            "optimized" => Ok(Compiler::Optimized),
            "baseline" => Ok(Compiler::Baseline),
            other => Err(format!(
                "unknown compiler {other:?}: expected tiered, optimized or baseline"
            )),
        }
    }
}

impl std::fmt::Display for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compiler::Tiered => "tiered",
            Compiler::Optimized => "optimized",
            Compiler::Baseline => "baseline",
        })
    }
}

/// How a runtime's engines compile plugins and allocate their instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Engines {
    pub compiler: Compiler,
    /// How many plugin instances may exist at once, in a pool reserved
    /// up front; `None` maps each instance's memory afresh (on demand).
    pub pool: Option<u32>,
}

impl Engines {
    /// Instances one server keeps in its pool by default (`--instance-pool`).
    pub const DEFAULT_POOL: u32 = 256;

    /// Optimized code only, pooled: what the command-line tools use.
    pub fn optimized() -> Self {
        Self {
            compiler: Compiler::Optimized,
            ..Self::default()
        }
    }
}

impl Default for Engines {
    fn default() -> Self {
        Self {
            compiler: Compiler::Tiered,
            pool: Some(Self::DEFAULT_POOL),
        }
    }
}

/// One compiler's engine and the linker bound to it: a component compiled
/// by an engine only runs in stores of that engine.
pub(crate) struct Backend {
    pub(crate) tier: Tier,
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<State>,
}

impl Backend {
    pub(crate) fn new(tier: Tier, pool: Option<u32>) -> anyhow::Result<Self> {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        config.strategy(match tier {
            Tier::Baseline => Strategy::Winch,
            Tier::Optimized => Strategy::Cranelift,
        });
        if let Some(instances) = pool {
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(instances)));
        }
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        sandbox::add_to_linker(&mut linker)?;
        wit::add_to_linker(&mut linker)?;
        Ok(Self {
            tier,
            engine,
            linker,
        })
    }

    /// Compiles `wasm` (already checked to be a component's bytes).
    pub(crate) fn compile(&self, wasm: &[u8]) -> Result<Component, String> {
        Component::from_binary(&self.engine, wasm)
            .map_err(|e| format!("is not a valid component: {}", root_message(&e)))
    }

    /// Links a component of this engine, built for `berth:deployer@version`,
    /// against the host's imports.
    pub(crate) fn link(&self, component: &Component, version: &str) -> Result<PluginPre, String> {
        let spoken = wit::spoken(version).ok_or_else(|| {
            format!("is built for berth:deployer@{version}, which berth does not speak")
        })?;
        let instance_pre = self.linker.instantiate_pre(component).map_err(|e| {
            format!(
                "needs an import berth does not provide: {}",
                root_message(&e)
            )
        })?;
        PluginPre::new(instance_pre, spoken).map_err(|e| {
            format!(
                "does not implement berth:deployer@{spoken}: {}",
                root_message(&e)
            )
        })
    }
}

/// What a freed memory slot keeps resident: a call to a Python or
/// JavaScript guest dirties a few MiB of its interpreter's heap, which the
/// next call in the slot then reuses without page faults (docs/src/perf, 4a:
/// 0.4–0.7× the on-demand time for them, 0.2× for Rust, where nothing
/// kept gave 0.9–1.25×). 64 MiB was no faster and held 0.5 GiB more
/// under the worst-case load of section 9a.
const KEEP_RESIDENT: usize = 32 << 20;
/// Freed slots kept warm for their plugin: bounds what `KEEP_RESIDENT`
/// holds while idle to 512 MiB at worst.
const WARM_SLOTS: u32 = 16;

/// The instance pool of an engine: memories, tables, stacks and instance
/// records for `instances` plugin instances at once, reserved up front
/// (address space only) and reused, so a call maps nothing. A slot goes
/// back to the plugin's initial memory image by resetting only the pages
/// the last call dirtied (Linux's `PAGEMAP_SCAN`, where the kernel has it).
fn pooling(instances: u32) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(instances)
        // Limits per component that the example plugins stay far below: a
        // componentize-py component has a dozen core instances.
        .total_core_instances(instances.saturating_mul(16))
        .max_core_instances_per_component(64)
        .total_memories(instances.saturating_mul(4))
        .max_memories_per_component(8)
        .total_tables(instances.saturating_mul(16))
        .max_tables_per_component(32)
        .table_elements(1 << 18)
        .total_stacks(instances)
        // wasm32's largest memory; the plugin's budget (`memory`) is what
        // bounds its growth.
        .max_memory_size(4 << 30)
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(1 << 20)
        .max_unused_warm_slots(WARM_SLOTS)
        .pagemap_scan(Enabled::Auto);
    pool
}

/// A plugin's code as calls find it: each call takes the code current when
/// it starts; the optimizer replaces it once.
pub(crate) struct CodeSlot(RwLock<Arc<Code>>);

pub(crate) struct Code {
    pub(crate) pre: PluginPre,
    pub(crate) tier: Tier,
}

impl CodeSlot {
    pub(crate) fn new(code: Code) -> Arc<Self> {
        Arc::new(Self(RwLock::new(Arc::new(code))))
    }

    pub(crate) fn current(&self) -> Arc<Code> {
        self.0.read().expect("code slot lock").clone()
    }

    fn replace(&self, code: Code) {
        *self.0.write().expect("code slot lock") = Arc::new(code);
    }
}

/// A plugin waiting for its optimized code.
pub(crate) struct Job {
    pub(crate) name: String,
    pub(crate) sha256: String,
    /// The `berth:deployer` version it was built for.
    pub(crate) wit_version: String,
    pub(crate) wasm: bytes::Bytes,
    /// Gone when every version holding it was dropped (the plugin was
    /// replaced or removed): its compile is skipped.
    pub(crate) slot: Weak<CodeSlot>,
}

/// The thread that compiles plugins with Cranelift behind their baseline
/// code, one at a time, in the order they arrived.
pub(crate) struct Optimizer {
    jobs: mpsc::Sender<Job>,
}

impl Optimizer {
    /// Starts the thread; it ends when the optimizer is dropped, after the
    /// compile under way, if any.
    pub(crate) fn start(backend: Arc<Backend>, cache: Option<CodeCache>) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        // wasmtime compiles a component's functions on rayon's current
        // pool: this one's threads run at a low priority, so the optimizer
        // takes only the CPU that serving and baseline compiles leave.
        let pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("berth-optimize-{i}"))
            .start_handler(|_| lower_priority())
            .build()
            .map_err(std::io::Error::other)?;
        std::thread::Builder::new()
            .name("berth-optimizer".into())
            .spawn(move || {
                lower_priority();
                for job in queue {
                    optimize(&backend, cache.as_ref(), &pool, job);
                }
            })?;
        Ok(Self { jobs })
    }

    pub(crate) fn submit(&self, job: Job) {
        // The thread only ends with the optimizer: a send cannot fail.
        let _ = self.jobs.send(job);
    }
}

fn optimize(backend: &Backend, cache: Option<&CodeCache>, pool: &rayon::ThreadPool, job: Job) {
    let Job {
        name,
        sha256,
        wit_version,
        wasm,
        slot,
    } = job;
    if slot.strong_count() == 0 {
        return;
    }
    let started = Instant::now();
    let cached = cache.and_then(|c| c.load(&backend.engine, backend.tier, &sha256));
    let component = match cached {
        Some(component) => Ok(component),
        None => pool
            .install(|| backend.compile(&wasm))
            .inspect(|component| {
                if let Some(cache) = cache {
                    cache.store(&backend.engine, backend.tier, &sha256, component);
                }
            }),
    };
    let pre = component.and_then(|component| backend.link(&component, &wit_version));
    match (pre, slot.upgrade()) {
        (Ok(pre), Some(slot)) => {
            slot.replace(Code {
                pre,
                tier: backend.tier,
            });
            tracing::info!(
                plugin = %name,
                sha256 = %sha256,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "deployer optimized: new calls run its Cranelift code"
            );
        }
        // Replaced or removed while it compiled.
        (Ok(_), None) => {}
        (Err(reason), _) => tracing::warn!(
            plugin = %name,
            sha256 = %sha256,
            "the optimized compile failed, so the deployer keeps its baseline code: {reason}"
        ),
    }
}

/// Makes the calling thread yield the CPU to the server's other threads.
fn lower_priority() {
    // SAFETY: setpriority has no memory effects; on Linux, `who` 0 with
    // PRIO_PROCESS names the calling thread only.
    #[allow(unsafe_code)]
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
}
