//! Rust bindings of `berth:deployer@0.1.0`, generated from `wit/`. The only
//! module that names the generated types; WASI's own interfaces come from
//! wasmtime-wasi so the filesystem imports link to its implementation.

wasmtime::component::bindgen!({
    world: "deployer",
    path: "../wit",
    exports: { default: async },
    with: {
        "wasi": wasmtime_wasi::p2::bindings,
    },
});

pub use self::berth::deployer::host::{Host, Level};
pub use self::berth::deployer::types::{
    DeployRequest, DeployResult, DeployerInfo, ModelFile, TrainedModel,
};

/// The version of the package this server speaks; a plugin's export name
/// carries the version it was built for.
pub const WIT_VERSION: &str = "0.1.0";
/// The interface every plugin exports, without its version suffix.
pub const PLUGIN_INTERFACE: &str = "berth:deployer/plugin";
/// The functions of that interface, in WIT spelling.
pub const PLUGIN_FUNCTIONS: [&str; 3] = ["describe", "check-options", "deploy"];
