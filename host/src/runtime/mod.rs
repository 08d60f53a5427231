//! The sandbox: compiles deployer components, checks they implement
//! `berth:deployer`, and runs their calls in a fresh, limited `Store` each.
//! It never touches the database or the network on its own behalf, and knows
//! nothing of HTTP requests: it is handed a model directory and an out-dir.

mod bindings;
mod cache;
mod error;
mod http_gate;
mod manifest;
mod memory;
mod plugins;
mod report;
mod state;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable, types::ComponentItem};
use wasmtime::{Engine, Store, Trap, UpdateDeadline};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};
use wasmtime_wasi_http::WasiHttpCtx;

use crate::model::TrainedModel;
use bindings::{DeployerPre, PLUGIN_FUNCTIONS, PLUGIN_INTERFACE, WIT_VERSION};
use memory::MemoryBudget;
use report::GuestOutput;
use state::State;

pub use cache::{CodeCache, Origin};
pub use error::CallError;
pub use http_gate::AllowedHost;
pub use manifest::Manifest;
pub use plugins::{PluginSet, Rejection, check_name};
pub use report::{GuestLevel, LogReporter, Reporter};

/// Guest path of the read-only model directory.
pub const MODEL_DIR: &str = "/model";
/// Guest path of the deployment's writable directory.
pub const OUT_DIR: &str = "/out";

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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mib: 512,
            timeout: Duration::from_secs(30 * 60),
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
    pre: DeployerPre<State>,
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
    pub options_json: &'a str,
}

/// What a successful deployment returned, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployed {
    pub reference: String,
    pub details: serde_json::Map<String, serde_json::Value>,
}

pub struct Runtime {
    engine: Engine,
    linker: Linker<State>,
    defaults: Limits,
    cache: Option<CodeCache>,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// What the sandbox of one call may see.
enum Sandbox<'a> {
    /// `describe` / `check-options`: no files at all.
    Bare,
    Deploy {
        model_dir: &'a Path,
        out_dir: &'a Path,
    },
}

enum Question {
    Describe,
    CheckOptions(String),
    Deploy(Box<bindings::DeployRequest>),
}

enum Answer {
    Info(bindings::DeployerInfo),
    Checked(Result<(), String>),
    Deployed(Result<bindings::DeployResult, String>),
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
    pub fn new(defaults: Limits, cache: Option<CodeCache>) -> anyhow::Result<Self> {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config)?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        // Every plugin gets wasi:http linked (componentize-js imports it
        // always); the gate in each Store decides what may pass.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        bindings::berth::deployer::host::add_to_linker::<State, HasSelf<State>>(
            &mut linker,
            |state| state,
        )?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let (ticker_engine, stop) = (engine.clone(), ticker_stop.clone());
        std::thread::Builder::new()
            .name("berth-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticker_engine.increment_epoch();
                }
            })?;

        Ok(Self {
            engine,
            linker,
            defaults,
            cache,
            ticker_stop,
        })
    }

    pub fn defaults(&self) -> Limits {
        self.defaults
    }

    /// Compiles (or loads from the cache) and checks one plugin, and asks it
    /// to describe itself. The error is the reason to show for the file.
    pub async fn load(
        &self,
        name: &str,
        wasm: Vec<u8>,
        manifest: Manifest,
    ) -> Result<Plugin, String> {
        check_name(name)?;
        let sha256 = hex::encode(Sha256::digest(&wasm));
        let (component, origin) = self.compile(wasm, &sha256).await?;
        let wit_version = self.check_world(&component)?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(|e| {
            format!(
                "needs an import berth does not provide: {}",
                root_message(&e)
            )
        })?;
        let pre = DeployerPre::new(instance_pre).map_err(|e| {
            format!(
                "does not implement berth:deployer@{WIT_VERSION}: {}",
                root_message(&e)
            )
        })?;

        let limits = Limits {
            memory_mib: manifest.memory_mib.unwrap_or(self.defaults.memory_mib),
            timeout: manifest.timeout.unwrap_or(self.defaults.timeout),
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
            pre,
        };
        let reporter = Arc::new(LogReporter {
            plugin: name.to_string(),
            deploy_id: None,
        });
        let info = match self
            .ask(
                &plugin,
                Sandbox::Bare,
                reporter,
                &CancellationToken::new(),
                Question::Describe,
            )
            .await
        {
            Ok(Answer::Info(info)) => info,
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
        Ok(plugin)
    }

    async fn compile(&self, wasm: Vec<u8>, sha256: &str) -> Result<(Component, Origin), String> {
        if !wasm.starts_with(b"\0asm") {
            return Err(
                "is not a WebAssembly file (it does not start with the \\0asm magic)".into(),
            );
        }
        if wasm.get(4..8) == Some(&[1, 0, 0, 0]) {
            return Err("is a core WebAssembly module, not a component (build it for wasm32-wasip2, or wrap it with `wasm-tools component new`)".into());
        }
        if let Some(component) = self
            .cache
            .as_ref()
            .and_then(|c| c.load(&self.engine, sha256))
        {
            return Ok((component, Origin::Cached));
        }
        let engine = self.engine.clone();
        let started = Instant::now();
        let component = tokio::task::spawn_blocking(move || Component::from_binary(&engine, &wasm))
            .await
            .map_err(|e| format!("compiling it crashed: {e}"))?
            .map_err(|e| format!("is not a valid component: {}", root_message(&e)))?;
        tracing::debug!(
            sha256,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "compiled a plugin"
        );
        if let Some(cache) = &self.cache {
            cache.store(&self.engine, sha256, &component);
        }
        Ok((component, Origin::Compiled))
    }

    /// Explains, in the plugin author's terms, why a component is not a
    /// deployer of the version this server speaks. Returns its version.
    fn check_world(&self, component: &Component) -> Result<String, String> {
        let ty = component.component_type();
        let wanted = format!("{PLUGIN_INTERFACE}@{WIT_VERSION}");
        let mut found = None;
        for (name, item) in ty.exports(&self.engine) {
            if let Some(version) = name
                .strip_prefix(PLUGIN_INTERFACE)
                .and_then(|v| v.strip_prefix('@'))
            {
                found = Some((version.to_string(), item));
            }
        }
        let Some((version, item)) = found else {
            let exports: Vec<_> = ty
                .exports(&self.engine)
                .map(|(name, _)| name.to_string())
                .collect();
            return Err(format!(
                "exports no {wanted} interface (exports: {}); is it built for another world? Generate its bindings from berth's wit/ with world \"deployer\"",
                if exports.is_empty() {
                    "nothing".to_string()
                } else {
                    exports.join(", ")
                }
            ));
        };
        if !compatible(&version, WIT_VERSION) {
            return Err(format!(
                "built for berth:deployer@{version} but this server speaks {WIT_VERSION}"
            ));
        }
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            return Err(format!("exports {wanted} but not as an interface"));
        };
        let functions: Vec<_> = instance
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        for function in PLUGIN_FUNCTIONS {
            if !functions.iter().any(|f| f == function) {
                return Err(format!("exports no {function} function"));
            }
        }
        Ok(version)
    }

    /// Instantiates the plugin afresh and asks it to describe itself: the
    /// cost of the smallest call, which `berth plugin check --repeat` times.
    pub async fn describe(&self, plugin: &Plugin) -> Result<String, CallError> {
        let reporter = Arc::new(LogReporter {
            plugin: plugin.name.clone(),
            deploy_id: None,
        });
        let token = CancellationToken::new();
        match self
            .ask(plugin, Sandbox::Bare, reporter, &token, Question::Describe)
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
        let reporter = Arc::new(LogReporter {
            plugin: plugin.name.clone(),
            deploy_id: None,
        });
        let question = Question::CheckOptions(options_json.to_string());
        match self
            .ask(
                plugin,
                Sandbox::Bare,
                reporter,
                &CancellationToken::new(),
                question,
            )
            .await?
        {
            Answer::Checked(verdict) => verdict.map_err(CallError::Refused),
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
        let request = deploy_request(&call);
        let sandbox = Sandbox::Deploy {
            model_dir: call.model_dir,
            out_dir: call.out_dir,
        };
        let question = Question::Deploy(Box::new(request));
        let result = match self
            .ask(plugin, sandbox, reporter, cancel, question)
            .await?
        {
            Answer::Deployed(result) => result.map_err(CallError::Refused)?,
            _ => unreachable!("deploy answers with a result"),
        };
        let details = parse_details(&result.details_json)?;
        Ok(Deployed {
            reference: result.ref_,
            details,
        })
    }

    async fn ask(
        &self,
        plugin: &Plugin,
        sandbox: Sandbox<'_>,
        reporter: Arc<dyn Reporter>,
        cancel: &CancellationToken,
        question: Question,
    ) -> Result<Answer, CallError> {
        let limit = match question {
            Question::Deploy(_) => plugin.limits.timeout,
            _ => plugin.limits.timeout.min(QUESTION_LIMIT),
        };
        let stderr = GuestOutput::stderr(reporter.clone());
        let mut store = self.store(plugin, sandbox, reporter, stderr.clone())?;
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
            // Yield at every tick so the executor can run the timers and
            // cancellations that race this call.
            Ok(UpdateDeadline::Yield(1))
        });

        let work = async {
            let instance = plugin.pre.instantiate_async(&mut store).await?;
            let api = instance.berth_deployer_plugin();
            wasmtime::Result::Ok(match question {
                Question::Describe => Answer::Info(api.call_describe(&mut store).await?),
                Question::CheckOptions(options) => {
                    Answer::Checked(api.call_check_options(&mut store, &options).await?)
                }
                Question::Deploy(request) => {
                    Answer::Deployed(api.call_deploy(&mut store, &request).await?)
                }
            })
        };
        // The epoch deadline stops wasm code; this outer bound also stops a
        // guest that sits blocked inside a host call (slow I/O).
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(limit + EPOCH_TICK * 10, work) => outcome,
            _ = cancel.cancelled() => return Err(CallError::Cancelled),
        };
        match outcome {
            Err(_elapsed) => Err(CallError::TimedOut { limit }),
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(classify(
                e,
                store.data().memory.exhausted,
                plugin,
                limit,
                &stderr,
            )),
        }
    }

    fn store(
        &self,
        plugin: &Plugin,
        sandbox: Sandbox<'_>,
        reporter: Arc<dyn Reporter>,
        stderr: GuestOutput,
    ) -> Result<Store<State>, CallError> {
        // Deny by default: an empty context, then only what this call is granted.
        let mut wasi = WasiCtxBuilder::new();
        wasi.args(&[plugin.name.as_str()])
            .envs(&plugin.manifest.env)
            .stdout(GuestOutput::stdout(reporter.clone()))
            .stderr(stderr)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            // Reading the model is the hot path; blocking reads on the
            // current thread are ~3x faster than hopping to a blocking pool.
            .allow_blocking_current_thread(true);
        if let Sandbox::Deploy { model_dir, out_dir } = sandbox {
            wasi.preopened_dir(model_dir, MODEL_DIR, FsPerms::ReadOnly)
                .map_err(|e| {
                    CallError::Sandbox(format!("model directory {}: {e}", model_dir.display()))
                })?;
            wasi.preopened_dir(out_dir, OUT_DIR, FsPerms::ReadWrite)
                .map_err(|e| {
                    CallError::Sandbox(format!("output directory {}: {e}", out_dir.display()))
                })?;
        }
        let memory_bytes =
            usize::try_from(plugin.limits.memory_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let state = State {
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            gate: http_gate::HttpGate::new(&plugin.name, plugin.manifest.allowed_hosts.clone()),
            memory: MemoryBudget::new(memory_bytes),
            reporter,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.memory);
        Ok(store)
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
    let trap = match e.downcast_ref::<Trap>() {
        Some(trap) => trap.to_string(),
        None => root_message(&e),
    };
    CallError::Crashed {
        trap,
        output: stderr.tail(),
    }
}

fn root_message(e: &wasmtime::Error) -> String {
    e.root_cause().to_string()
}

/// Semver compatibility for 0.x: same minor, any patch.
fn compatible(version: &str, ours: &str) -> bool {
    let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    major_minor(version) == major_minor(ours)
}

fn deploy_request(call: &DeployCall<'_>) -> bindings::DeployRequest {
    let m = call.model;
    bindings::DeployRequest {
        deploy_id: call.deploy_id,
        model: bindings::TrainedModel {
            id: m.id,
            name: m.name.clone(),
            job_id: m.job_id.clone(),
            base_model: m.base_model.clone(),
            model_size: m.model_size.clone(),
            dataset: m.dataset.clone(),
            num_examples: m.num_examples,
            num_train_steps: m.num_train_steps,
            final_loss: m.final_loss,
            params_json: m.params_json.clone(),
            files: m
                .files
                .iter()
                .map(|f| bindings::ModelFile {
                    path: f.path.clone(),
                    size_bytes: f.size_bytes,
                    sha256: f.sha256.clone(),
                })
                .collect(),
        },
        dir: MODEL_DIR.to_string(),
        out_dir: OUT_DIR.to_string(),
        options_json: call.options_json.to_string(),
    }
}

fn parse_details(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, CallError> {
    if text.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(CallError::BadResult(format!(
            "returned details-json that is not a JSON object: {}",
            preview(&other.to_string())
        ))),
        Err(e) => Err(CallError::BadResult(format!(
            "returned details-json that is not valid JSON ({e}): {}",
            preview(text)
        ))),
    }
}

fn preview(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_must_be_a_json_object_or_empty() {
        assert!(parse_details("").unwrap().is_empty());
        assert_eq!(parse_details(r#"{"a": 1}"#).unwrap()["a"], 1);
        let err = parse_details("[1, 2, 3]").unwrap_err().to_string();
        assert_eq!(
            err,
            "returned details-json that is not a JSON object: [1,2,3]"
        );
        let err = parse_details("{not json").unwrap_err().to_string();
        assert!(
            err.starts_with("returned details-json that is not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn versions_are_compatible_within_a_minor() {
        assert!(compatible("0.1.0", "0.1.0"));
        assert!(compatible("0.1.7", "0.1.0"));
        assert!(!compatible("0.2.0", "0.1.0"));
    }
}
