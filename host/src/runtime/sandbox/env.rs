//! `wasi:cli/environment`: the plugin's name as its only argument and the
//! variables its manifest grants, already resolved. Never passes on the
//! server's own environment.

use wasmtime_wasi::WasiCtxBuilder;

use crate::runtime::Plugin;

pub(super) fn grant(wasi: &mut WasiCtxBuilder, plugin: &Plugin) {
    wasi.args(&[plugin.name.as_str()])
        .envs(&plugin.manifest.env);
}
