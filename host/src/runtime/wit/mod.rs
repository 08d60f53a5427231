//! The plugin contract, `berth:deployer`, as the rest of the runtime sees it:
//! questions and answers in domain terms. Each version of the WIT package has
//! a module of its own (`since_v0_1_0`) holding its bindings and conversions,
//! so another version can arrive beside it; those modules are the only ones
//! that name generated types. Never decides what a plugin may reach.

mod since_v0_1_0;

pub(crate) use since_v0_1_0::{PLUGIN_FUNCTIONS, PluginPre, WIT_VERSION, add_to_linker};

use super::DeployCall;

/// The interface every plugin exports, without its version suffix.
pub(crate) const PLUGIN_INTERFACE: &str = "berth:deployer/plugin";

/// One call into a plugin.
pub(crate) enum Question<'a> {
    Describe,
    CheckOptions(&'a str),
    Deploy(&'a DeployCall<'a>),
}

/// What the plugin answered, before berth checks it.
pub(crate) enum Answer {
    Info(Info),
    Checked(Result<(), String>),
    Deployed(Result<Reply, String>),
}

/// A plugin's description of itself.
pub(crate) struct Info {
    pub(crate) description: String,
    pub(crate) options_schema: Option<String>,
}

/// A successful deployment as the plugin returned it.
pub(crate) struct Reply {
    pub(crate) reference: String,
    pub(crate) details_json: String,
}
