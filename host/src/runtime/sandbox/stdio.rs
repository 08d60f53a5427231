//! `wasi:cli` stdout and stderr: each line goes to the call's reporter, and
//! stderr keeps its tail to explain a crash. Stdin stays closed; nothing
//! reaches the server's own terminal.

use std::sync::Arc;

use wasmtime_wasi::WasiCtxBuilder;

use crate::runtime::report::{GuestOutput, Reporter};

pub(super) fn grant(wasi: &mut WasiCtxBuilder, reporter: Arc<dyn Reporter>, stderr: GuestOutput) {
    wasi.stdout(GuestOutput::stdout(reporter)).stderr(stderr);
}
