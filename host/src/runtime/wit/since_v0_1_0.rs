//! `berth:deployer@0.1.0`: its bindings, generated from `wit/`, the host's
//! side of its imports, and the conversions between its types and berth's.
//! WASI's own interfaces come from wasmtime-wasi so the filesystem imports
//! link to its implementation. Never grants a capability.

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use self::berth::deployer::host::{self, Host, Level};
use self::berth::deployer::types::{self, DeployRequest, DeployResult, DeployerInfo};
use super::{Answer, Info, Question, Reply};
use crate::runtime::caps;
use crate::runtime::report::GuestLevel;
use crate::runtime::state::State;
use crate::runtime::{DeployCall, MODEL_DIR, OUT_DIR};

wasmtime::component::bindgen!({
    world: "deployer",
    path: "../wit/0.1.0",
    exports: { default: async },
    with: {
        "wasi": wasmtime_wasi::p2::bindings,
    },
});

/// The version of the package this module speaks; a plugin's export name
/// carries the version it was built for.
pub(crate) const WIT_VERSION: &str = "0.1.0";

/// Links the imports this version adds to WASI: the `host` interface.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    host::add_to_linker::<State, HasSelf<State>>(linker, |state| state)
}

super::plugin_pre!();

/// A `Question` in this version's own types (0.2.0's too: it shares them).
pub(super) enum Asked {
    Describe,
    CheckOptions(String),
    /// Boxed: the request is ten times the size of the other questions.
    Deploy(Box<DeployRequest>),
}

impl From<Question<'_>> for Asked {
    fn from(question: Question<'_>) -> Self {
        match question {
            Question::Describe => Asked::Describe,
            Question::CheckOptions(options) => Asked::CheckOptions(options.to_string()),
            Question::Deploy(call) => Asked::Deploy(Box::new(call.into())),
        }
    }
}

impl Host for State {
    fn log(&mut self, level: Level, message: String) {
        self.reporter.log(level.into(), &caps::log_line(&message));
    }

    fn progress(&mut self, done: u64, total: u64, note: String) {
        self.reporter.progress(done, total, caps::note(&note));
    }
}

impl From<Level> for GuestLevel {
    fn from(level: Level) -> Self {
        match level {
            Level::Debug => GuestLevel::Debug,
            Level::Info => GuestLevel::Info,
            Level::Warn => GuestLevel::Warn,
            Level::Error => GuestLevel::Error,
        }
    }
}

impl From<&DeployCall<'_>> for DeployRequest {
    fn from(call: &DeployCall<'_>) -> Self {
        let m = call.model;
        DeployRequest {
            deploy_id: call.deploy_id,
            model: types::TrainedModel {
                id: m.id,
                name: m.name.clone(),
                job_id: m.job_id.clone(),
                // The contract's fields are not optional: unknown is
                // "" and 0 there, as its docs say.
                base_model: m.base_model.clone().unwrap_or_default(),
                model_size: m.model_size.clone().unwrap_or_default(),
                dataset: m.dataset.clone().unwrap_or_default(),
                num_examples: m.num_examples.unwrap_or_default(),
                num_train_steps: m.num_train_steps.unwrap_or_default(),
                final_loss: m.final_loss,
                params_json: m.params_json.clone(),
                files: m
                    .files
                    .iter()
                    .map(|f| types::ModelFile {
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
}

impl From<DeployerInfo> for Info {
    fn from(info: DeployerInfo) -> Self {
        Info {
            description: info.description,
            options_schema: info.options_schema,
        }
    }
}

impl From<DeployResult> for Reply {
    fn from(result: DeployResult) -> Self {
        Reply {
            reference: result.ref_,
            details_json: result.details_json,
        }
    }
}
