//! The runtime: one engine and linker, and the calls into a plugin
//! (`describe`, `check-options`, `deploy`), each in a fresh `Store` bounded in
//! memory and time. Loading lives in `load`, the grants of a call in
//! `sandbox`, the WIT contract in `wit`, the plugins-folder rules in
//! `plugins`, the signature rules in `signature`. It never touches the
//! database or the network on its own behalf, and knows nothing of HTTP
//! requests: it is handed a model directory and an out-dir.

mod cache;
pub mod caps;
mod connect;
mod countersign;
mod error;
mod guests;
mod http_gate;
mod http_targets;
mod load;
mod manifest;
mod memory;
mod own_calls;
mod plugins;
mod publish;
mod quota;
mod report;
mod sandbox;
mod signature;
mod spending;
mod state;
mod tier;
mod wit;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use wasmtime::{Trap, UpdateDeadline};

use crate::model::TrainedModel;
use crate::publish::Publishers;
use crate::signing::SigningKey;
use crate::targets::Targets;
use crate::trust::Trust;
use guests::GuestThreads;
use report::GuestOutput;
use sandbox::Mounts;
use tier::{Backend, CodeSlot, Optimizer};
use wit::{Answer, Question};

pub use cache::{CodeCache, Origin};
pub use error::CallError;
pub use http_gate::AllowedHost;
pub use load::signature_path;
pub use manifest::{MAX_OUT_MIB, MAX_TIMEOUT_S, Manifest};
pub(crate) use plugins::{Change, Folder, is_plugin_file};
pub use plugins::{PluginSet, Rejection, check_name, folder_names};
pub use publish::{MAX_PUT_BYTES, default_target};
pub(crate) use report::one_line;
pub use report::{GuestLevel, LogReporter, Reporter};
pub use sandbox::{MODEL_DIR, OUT_DIR};
pub use signature::{Signers, TrustedKey, Verdict, key_id};
pub use spending::Caps;
pub use tier::{Compiler, Engines, Tier};

/// How often the engine's epoch advances: the granularity of deadlines and
/// of noticing a cancellation while the guest computes.
const EPOCH_TICK: Duration = Duration::from_millis(10);
/// `describe` and `check-options` are quick questions; a plugin that takes
/// longer is broken.
const QUESTION_LIMIT: Duration = Duration::from_secs(30);

/// Per-call limits; a plugin's manifest may override the server's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory_mib: u64,
    pub timeout: Duration,
    /// What a deployment's out-dir may hold (`quota`).
    pub out_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mib: 512,
            timeout: Duration::from_secs(30 * 60),
            out_mib: 1024,
        }
    }
}

/// A checked, pre-instantiated deployer, shared by all calls of its version.
pub struct Plugin {
    pub name: String,
    pub description: String,
    pub options_schema: Option<String>,
    /// The `berth:deployer` version the plugin was built for.
    pub wit_version: String,
    /// Of the `.wasm` file: identifies the version that ran a deployment.
    pub sha256: String,
    pub manifest: Manifest,
    pub limits: Limits,
    pub origin: Origin,
    /// The id of the trusted key whose signature over its bytes it came
    /// with; `None` when it loaded without a verified signature.
    pub signed_by: Option<String>,
    code: Arc<CodeSlot>,
}

impl Plugin {
    /// Which compiler made the code new calls run.
    pub fn tier(&self) -> Tier {
        self.code.current().tier
    }
}

#[cfg(test)]
impl Plugin {
    /// This plugin's code as another deployer's version, for tests of the
    /// sets that hold plugins.
    pub(crate) fn as_version(&self, name: &str, sha256: &str) -> Plugin {
        Plugin {
            name: name.to_string(),
            description: self.description.clone(),
            options_schema: self.options_schema.clone(),
            wit_version: self.wit_version.clone(),
            sha256: sha256.to_string(),
            manifest: self.manifest.clone(),
            limits: self.limits,
            origin: self.origin,
            signed_by: self.signed_by.clone(),
            code: self.code.clone(),
        }
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .finish_non_exhaustive()
    }
}

/// One deployment, as the runtime needs it.
pub struct DeployCall<'a> {
    pub deploy_id: i64,
    pub model: &'a TrainedModel,
    /// Host directory holding the verified files; mounted read-only.
    pub model_dir: &'a Path,
    /// Host directory for the plugin's output; must exist.
    pub out_dir: &'a Path,
    /// berth's verification record of `model_dir` (`Fetcher::record_of`),
    /// by which a model file put to a target is not hashed again while
    /// unchanged; `None`: every put hashes the file it sends.
    pub record: Option<&'a Path>,
    pub options_json: &'a str,
}

/// What a successful deployment returned, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployed {
    pub reference: String,
    pub details: serde_json::Map<String, serde_json::Value>,
}

pub struct Runtime {
    compiler: Compiler,
    optimized: Arc<Backend>,
    /// Unless the compiler is `Optimized`.
    baseline: Option<Arc<Backend>>,
    /// Only under `Compiler::Tiered`.
    optimizer: Option<Optimizer>,
    defaults: Limits,
    cache: Option<CodeCache>,
    /// Guests' outgoing connections: the TLS roots they trust.
    connector: connect::Connector,
    /// Whose signatures a plugin may load with, and whether it must.
    signers: Signers,
    /// The operator's publishing targets, which a plugin's manifest grants
    /// by name; none by default.
    targets: Arc<Targets>,
    /// What puts into them, trusting what `trust` does.
    publishers: Arc<Publishers>,
    trust: Trust,
    ticker_stop: Arc<AtomicBool>,
    guests: GuestThreads,
    /// One permit per instance the pool holds (`Engines::pool`): a call
    /// past them waits for one instead of failing to instantiate.
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Signs what deployments publish (`--publish-signing-key`); none by
    /// default.
    signing_key: Option<Arc<SigningKey>>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// Why the epoch callback stopped the guest.
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("deadline reached")]
    Deadline,
    #[error("cancelled")]
    Cancelled,
}

impl Runtime {
    pub fn new(
        defaults: Limits,
        cache: Option<CodeCache>,
        engines: Engines,
    ) -> anyhow::Result<Self> {
        let Engines { compiler, pool } = engines;
        let optimized = Arc::new(Backend::new(Tier::Optimized, pool)?);
        let baseline = match compiler {
            Compiler::Optimized => None,
            Compiler::Tiered | Compiler::Baseline => {
                Some(Arc::new(Backend::new(Tier::Baseline, pool)?))
            }
        };
        let optimizer = match compiler {
            Compiler::Tiered => Some(Optimizer::start(optimized.clone(), cache.clone())?),
            Compiler::Optimized | Compiler::Baseline => None,
        };

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let engines: Vec<_> = std::iter::once(&optimized)
            .chain(&baseline)
            .map(|backend| backend.engine.clone())
            .collect();
        let stop = ticker_stop.clone();
        std::thread::Builder::new()
            .name("berth-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    for engine in &engines {
                        engine.increment_epoch();
                    }
                }
            })?;

        Ok(Self {
            compiler,
            optimized,
            baseline,
            optimizer,
            defaults,
            cache,
            connector: connect::Connector::new(&Trust::default()),
            signers: Signers::default(),
            targets: Arc::default(),
            publishers: Arc::new(Publishers::new(Arc::default(), &Trust::default())),
            trust: Trust::default(),
            ticker_stop,
            guests: GuestThreads::new()?,
            slots: pool.map(|n| Arc::new(tokio::sync::Semaphore::new(n as usize))),
            signing_key: None,
        })
    }

    /// Guests' HTTPS requests also trust the certificates of `trust`
    /// (`--ca-file`).
    pub fn trust(mut self, trust: &Trust) -> Self {
        self.connector = connect::Connector::new(trust);
        self.trust = trust.clone();
        self.publishers = Arc::new(Publishers::new(self.targets.clone(), trust));
        self
    }

    /// Plugins load under these signature rules (`--trusted-key`,
    /// `--require-signed`); by default none is required and none verified.
    pub fn signers(mut self, signers: Signers) -> Self {
        self.signers = signers;
        self
    }

    /// The publishing targets plugins may be granted (the sources file's
    /// `[[target]]`s); by default none.
    pub fn targets(mut self, targets: Arc<Targets>) -> Self {
        self.publishers = Arc::new(Publishers::new(targets.clone(), &self.trust));
        self.targets = targets;
        self
    }

    pub fn defaults(&self) -> Limits {
        self.defaults
    }

    /// The backend a plugin without cached code is compiled with first.
    fn first_tier(&self) -> &Arc<Backend> {
        self.baseline.as_ref().unwrap_or(&self.optimized)
    }

    /// Instantiates the plugin afresh and asks it to describe itself: the
    /// cost of the smallest call, which `berth plugin check --repeat` times.
    pub async fn describe(&self, plugin: &Plugin) -> Result<String, CallError> {
        let reporter = Arc::new(LogReporter::new(&plugin.name, None));
        let token = CancellationToken::new();
        match self
            .ask(plugin, reporter, &token, Question::Describe)
            .await?
        {
            Answer::Info(info) => Ok(info.description),
            _ => unreachable!("describe answers with info"),
        }
    }

    /// Asks the plugin whether it accepts these options (a JSON object).
    pub async fn check_options(
        &self,
        plugin: &Plugin,
        options_json: &str,
    ) -> Result<(), CallError> {
        let reporter = Arc::new(LogReporter::new(&plugin.name, None));
        let question = Question::CheckOptions(options_json);
        match self
            .ask(plugin, reporter, &CancellationToken::new(), question)
            .await?
        {
            Answer::Checked(verdict) => verdict.map_err(|e| CallError::Refused(caps::error(e))),
            _ => unreachable!("check-options answers with a verdict"),
        }
    }

    /// Runs one deployment in a fresh sandbox. Cancelling `cancel` (or
    /// dropping the future) interrupts the guest within a few milliseconds.
    pub async fn deploy(
        &self,
        plugin: &Plugin,
        call: DeployCall<'_>,
        reporter: Arc<dyn Reporter>,
        cancel: &CancellationToken,
    ) -> Result<Deployed, CallError> {
        let reply = match self
            .ask(plugin, reporter, cancel, Question::Deploy(&call))
            .await?
        {
            Answer::Deployed(reply) => reply.map_err(|e| CallError::Refused(caps::error(e)))?,
            _ => unreachable!("deploy answers with a result"),
        };
        caps::check_reference(&reply.reference)?;
        let details = caps::parse_details(&reply.details_json)?;
        Ok(Deployed {
            reference: reply.reference,
            details,
        })
    }

    /// One call into the plugin, timed whatever its outcome: the call
    /// boundary every `describe`, `check-options` and `deploy` crosses.
    async fn ask(
        &self,
        plugin: &Plugin,
        reporter: Arc<dyn Reporter>,
        cancel: &CancellationToken,
        question: Question<'_>,
    ) -> Result<Answer, CallError> {
        let call = match question {
            Question::Describe => "describe",
            Question::CheckOptions(_) => "check_options",
            Question::Deploy(_) => "deploy",
        };
        let clock = Instant::now();
        let answer = self.call(plugin, reporter, cancel, question).await;
        crate::metrics::plugin_call(&plugin.name, call, clock.elapsed());
        answer
    }

    async fn call(
        &self,
        plugin: &Plugin,
        reporter: Arc<dyn Reporter>,
        cancel: &CancellationToken,
        question: Question<'_>,
    ) -> Result<Answer, CallError> {
        let (limit, mounts, sources) = match &question {
            Question::Deploy(call) => (
                plugin.limits.timeout,
                Some(Mounts {
                    model_dir: call.model_dir,
                    out_dir: call.out_dir,
                }),
                Some(publish::Sources {
                    model: call.model,
                    model_dir: call.model_dir,
                    out_dir: call.out_dir,
                    record: call.record,
                }),
            ),
            _ => (plugin.limits.timeout.min(QUESTION_LIMIT), None, None),
        };
        let publishing = publish::Publishing::new(
            plugin,
            self.targets.clone(),
            self.publishers.clone(),
            sources,
            reporter.clone(),
            cancel.clone(),
        );
        let slot = match &self.slots {
            Some(slots) => tokio::select! {
                slot = slots.clone().acquire_owned() => Some(slot.expect("the semaphore is never closed")),
                _ = cancel.cancelled() => return Err(CallError::Cancelled),
            },
            None => None,
        };
        let out_dir = mounts.as_ref().map(|m| m.out_dir.to_path_buf());
        let quota = plugin.limits.out_mib.saturating_mul(1 << 20);
        let stderr = GuestOutput::stderr(reporter.clone());
        let code = plugin.code.current();
        let mut store = sandbox::store(
            code.pre.engine(),
            plugin,
            &self.connector,
            mounts,
            publishing,
            reporter,
            stderr.clone(),
        )?;
        let deadline = Instant::now() + limit;
        let flag = cancel.clone();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if flag.is_cancelled() {
                return Err(Stop::Cancelled.into());
            }
            if Instant::now() >= deadline {
                return Err(Stop::Deadline.into());
            }
            // Yield at every tick so the guests sharing the guest threads
            // take turns, and an abort from the caller is noticed.
            Ok(UpdateDeadline::Yield(1))
        });
        let plugin_ask = code.pre.ask(store, question);

        let measured = out_dir.clone();
        let mut ask = Box::pin(async move {
            let (answer, store) = plugin_ask.await;
            let exhausted = store.data().memory.exhausted;
            // The instance's slot is free once its store is gone.
            drop(store);
            drop(slot);
            // What it wrote just before returning, measured here: a guest
            // thread may block, and the caller is spared a hop.
            let held = match (&answer, measured) {
                (Ok(_), Some(dir)) => quota::used(&dir),
                _ => 0,
            };
            (answer, exhausted, held)
        });
        // A question has no mounts, so nothing in it blocks a thread: its
        // first slice (at most one epoch tick of guest code) runs here,
        // and most end within it, sparing the two thread hops of a move
        // to the guest threads.
        if out_dir.is_none()
            && let Poll::Ready((answer, out_of_memory, _)) = futures::poll!(&mut ask)
        {
            return answer.map_err(|e| classify(e, out_of_memory, plugin, limit, &stderr));
        }
        // The rest runs on the guest threads, off the runtime that serves
        // HTTP; the store is dropped there too, freeing the guest's memory.
        let mut work = self.guests.spawn(ask);
        let watched = out_dir.clone();
        let over_quota = async move {
            match watched {
                Some(dir) => quota::exceeded(dir, quota).await,
                None => std::future::pending().await,
            }
        };
        let over = |held| CallError::OverQuota {
            limit_mib: plugin.limits.out_mib,
            held,
        };
        // The epoch deadline stops wasm code; this outer bound also stops a
        // guest that sits blocked inside a host call (slow I/O).
        let ended = tokio::select! {
            ended = tokio::time::timeout(limit + EPOCH_TICK * 10, &mut work) => {
                ended.map_err(|_elapsed| CallError::TimedOut { limit })
            }
            _ = cancel.cancelled() => Err(CallError::Cancelled),
            _ = over_quota => Err(over(0)),
        };
        let (answer, out_of_memory, held) = match ended {
            Ok(Ok(ended)) => ended,
            // A panic in the host's side of a call is the caller's, as it
            // was when the guest ran in the caller's task.
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The guest threads were shut down: the runtime is being dropped.
            Ok(Err(_)) => return Err(CallError::Cancelled),
            Err(stopped) => {
                // Stopped from here: the guest no longer runs once this
                // returns (the caller may remove its out-dir next), as when
                // it ran in this task and was dropped with it.
                work.abort();
                let _ = work.await;
                return Err(match stopped {
                    // What it left, now that it stopped.
                    CallError::OverQuota { .. } => over(held(out_dir).await),
                    stopped => stopped,
                });
            }
        };
        if answer.is_ok() && held > quota {
            return Err(over(held));
        }
        match answer {
            Ok(answer) => Ok(answer),
            Err(e) => Err(classify(e, out_of_memory, plugin, limit, &stderr)),
        }
    }
}

/// What a deployment's out-dir holds (nothing for a call without one).
async fn held(out_dir: Option<std::path::PathBuf>) -> u64 {
    match out_dir {
        Some(dir) => tokio::task::spawn_blocking(move || quota::used(&dir))
            .await
            .unwrap_or(0),
        None => 0,
    }
}

/// Turns a failed call into the reason a person reads.
fn classify(
    e: wasmtime::Error,
    out_of_memory: bool,
    plugin: &Plugin,
    limit: Duration,
    stderr: &GuestOutput,
) -> CallError {
    if let Some(stop) = e.downcast_ref::<Stop>() {
        return match stop {
            Stop::Cancelled => CallError::Cancelled,
            Stop::Deadline => CallError::TimedOut { limit },
        };
    }
    if out_of_memory {
        return CallError::OutOfMemory {
            limit_mib: plugin.limits.memory_mib,
        };
    }
    if caps::is_copy_refusal(&e) {
        return caps::copy_refused(&e);
    }
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return CallError::Exited { status: exit.0 };
    }
    let trap = e.downcast_ref::<Trap>();
    if trap == Some(&Trap::StackOverflow) || shadow_stack_overflow(&e) {
        return CallError::OutOfStack {
            output: stderr.tail(),
        };
    }
    CallError::Crashed {
        trap: match trap {
            Some(trap) => trap.to_string(),
            None => root_message(&e),
        },
        output: stderr.tail(),
    }
}

/// Whether an out-of-bounds access is a guest's shadow stack (the stack
/// Rust and C keep in linear memory) running out. Rust lays it out first
/// in memory, growing down, so it runs past address 0 and faults; wasmtime
/// reports such a fault without its address, so the sign is where it
/// happened: deep in a recursion, a backtrace as long as wasmtime records
/// (20 frames) in which one function recurs.
fn shadow_stack_overflow(e: &wasmtime::Error) -> bool {
    const RECURRING: usize = 4;
    if e.downcast_ref::<Trap>() != Some(&Trap::MemoryOutOfBounds) {
        return false;
    }
    let Some(trace) = e.downcast_ref::<wasmtime::WasmBacktrace>() else {
        return false;
    };
    let frames = trace.frames();
    frames.len() >= 20
        && frames.iter().any(|frame| {
            let same = |other: &&wasmtime::FrameInfo| {
                other.func_index() == frame.func_index()
                    && other.module().name() == frame.module().name()
            };
            frames.iter().filter(same).count() >= RECURRING
        })
}

fn root_message(e: &wasmtime::Error) -> String {
    e.root_cause().to_string()
}
