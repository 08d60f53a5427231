//! Outbound network: `wasi:http` through the plugin's `HttpGate`, which
//! holds the allow-list policy (`http_gate.rs`), with the http(s) targets
//! the manifest grants (`http_targets.rs`); raw TCP, UDP and name lookups
//! are never granted. Never decides by itself which host may pass.

use std::sync::Arc;

use wasmtime::component::Linker;
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi_http::WasiHttpCtx;

use crate::runtime::Plugin;
use crate::runtime::connect::Connector;
use crate::runtime::http_gate::HttpGate;
use crate::runtime::http_targets::HttpTargets;
use crate::runtime::publish::Publishing;
use crate::runtime::report::Reporter;
use crate::runtime::state::State;

/// wasi:http is linked for every plugin because componentize-js imports it
/// always; the gate in each `Store` decides what may pass.
pub(super) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)
}

pub(super) fn grant(
    wasi: &mut WasiCtxBuilder,
    plugin: &Plugin,
    publishing: &Publishing,
    connector: &Connector,
    reporter: Arc<dyn Reporter>,
) -> (WasiHttpCtx, HttpGate) {
    wasi.allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    let gate = HttpGate::new(
        &plugin.name,
        plugin.manifest.allowed_hosts.clone(),
        HttpTargets::granted(publishing.targets(), &plugin.name, &plugin.manifest.targets),
        connector.clone(),
        reporter,
        publishing.spending(),
        publishing.scrubber().clone(),
    );
    (WasiHttpCtx::new(), gate)
}
