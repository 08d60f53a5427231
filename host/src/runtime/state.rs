//! What a plugin's `Store` holds for one call: the WASI context it was
//! granted, the HTTP gate, its memory budget and where its reports go. The
//! only file that implements wasmtime's view traits (they change between
//! releases; wasmtime is pinned for that reason); never decides what goes
//! into them (`sandbox` does).

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::http_gate::HttpGate;
use super::memory::MemoryBudget;
use super::publish::Publishing;
use super::report::Reporter;

pub(crate) struct State {
    pub(crate) wasi: WasiCtx,
    pub(crate) http: WasiHttpCtx,
    pub(crate) table: ResourceTable,
    pub(crate) gate: HttpGate,
    pub(crate) memory: MemoryBudget,
    /// The targets it may open and what its puts may read.
    pub(crate) publishing: Publishing,
    pub(crate) reporter: Arc<dyn Reporter>,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.gate,
        }
    }
}
