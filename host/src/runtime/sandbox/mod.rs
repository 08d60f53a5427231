//! What one call's `Store` may reach. Deny by default: every call starts from
//! an empty `WasiCtxBuilder`, and each capability module adds only what this
//! call is granted: `filesystem` (the model read-only, the out-dir), `env`
//! (argv and the manifest's variables), `stdio` (output into the log),
//! `network` (HTTP through the gate, never a socket); the publishing targets
//! it may open come from its manifest's grant (`publish`). Never decides a policy
//! of its own: the grants come from the plugin's manifest and the call.

mod env;
mod filesystem;
mod network;
mod stdio;

use std::sync::Arc;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::WasiCtxBuilder;

pub(crate) use filesystem::Mounts;
pub use filesystem::{MODEL_DIR, OUT_DIR};

use super::caps;
use super::connect::Connector;
use super::memory::MemoryBudget;
use super::publish::Publishing;
use super::report::{GuestOutput, Reporter};
use super::state::State;
use super::{CallError, Plugin};

/// Links all of WASI and wasi:http for every plugin: what a call reaches is
/// decided by its context, because a missing import would refuse the plugin
/// at load instead of failing the one operation it was not granted.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    network::add_to_linker(linker)
}

/// A fresh `Store` for one call of `plugin`; `mounts` only for a deployment.
/// `publishing` holds the server's targets; the plugin reaches those its
/// manifest grants, by `publish` and by HTTP.
pub(crate) fn store(
    engine: &Engine,
    plugin: &Plugin,
    connector: &Connector,
    mounts: Option<Mounts<'_>>,
    publishing: Publishing,
    reporter: Arc<dyn Reporter>,
    stderr: GuestOutput,
) -> Result<Store<State>, CallError> {
    let mut wasi = WasiCtxBuilder::new();
    env::grant(&mut wasi, plugin);
    stdio::grant(&mut wasi, reporter.clone(), stderr);
    filesystem::grant(&mut wasi, mounts)?;
    let (http, gate) = network::grant(&mut wasi, plugin, &publishing, connector, reporter.clone());
    let memory_bytes =
        usize::try_from(plugin.limits.memory_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let state = State {
        wasi: wasi.build(),
        http,
        table: ResourceTable::new(),
        gate,
        memory: MemoryBudget::new(memory_bytes),
        publishing,
        reporter,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.memory);
    // Bounds what the host allocates for one string or list the guest hands
    // out, before it is copied; `caps` checks what passes.
    store.set_hostcall_fuel(caps::COPY_BYTES);
    Ok(store)
}
