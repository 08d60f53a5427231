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

/// A plugin of this version, linked and checked once; each call instantiates
/// it into a fresh `Store`.
pub(crate) struct PluginPre(DeployerPre<State>);

impl PluginPre {
    pub(crate) fn new(pre: InstancePre<State>) -> wasmtime::Result<Self> {
        DeployerPre::new(pre).map(Self)
    }

    /// The engine its code was compiled by, which its stores must share.
    pub(crate) fn engine(&self) -> &wasmtime::Engine {
        self.0.engine()
    }

    /// One call into a fresh instance in `store`, as a future that borrows
    /// nothing (the question is converted now), so it may run on any
    /// thread; it hands the store back with the answer.
    pub(crate) fn ask(
        &self,
        mut store: Store<State>,
        question: Question<'_>,
    ) -> impl Future<Output = (wasmtime::Result<Answer>, Store<State>)> + Send + use<> {
        let pre = self.0.clone();
        let question = Asked::from(question);
        async move {
            let answer = ask(&pre, &mut store, question).await;
            (answer, store)
        }
    }
}

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

async fn ask(
    pre: &DeployerPre<State>,
    store: &mut Store<State>,
    question: Asked,
) -> wasmtime::Result<Answer> {
    let instance = pre.instantiate_async(&mut *store).await?;
    let api = instance.berth_deployer_plugin();
    Ok(match question {
        Asked::Describe => Answer::Info(api.call_describe(&mut *store).await?.into()),
        Asked::CheckOptions(options) => {
            Answer::Checked(api.call_check_options(&mut *store, &options).await?)
        }
        Asked::Deploy(request) => Answer::Deployed(
            api.call_deploy(&mut *store, &request)
                .await?
                .map(Reply::from),
        ),
    })
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
