//! The plugin contract, `berth:deployer`, as the rest of the runtime sees it:
//! questions and answers in domain terms. Each version of the WIT package has
//! a module of its own (`since_v0_1_0`, `since_v0_2_0`) holding its bindings
//! and conversions; those modules are the only ones that name generated
//! types. A plugin speaks the version it exports; every version's imports
//! are linked for all. Never decides what a plugin may reach.

/// A version's `PluginPre`: its bindings' `DeployerPre`, and one call as a
/// `Question` in, an `Answer` out. The same for every version, whose
/// generated names agree; expanded in each `since_*` module, where those
/// names (and `Asked`, the question in the version's types) resolve.
macro_rules! plugin_pre {
    () => {
        /// A plugin of this version, linked and checked once; each call
        /// instantiates it into a fresh `Store`.
        pub(crate) struct PluginPre(DeployerPre<State>);

        impl PluginPre {
            pub(crate) fn new(pre: InstancePre<State>) -> wasmtime::Result<Self> {
                DeployerPre::new(pre).map(Self)
            }

            /// The engine its code was compiled by, which its stores must share.
            pub(crate) fn engine(&self) -> &wasmtime::Engine {
                self.0.engine()
            }

            /// One call into a fresh instance in `store`, as a future that
            /// borrows nothing (the question is converted now), so it may
            /// run on any thread; it hands the store back with the answer.
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
    };
}
use plugin_pre;

mod since_v0_1_0;
mod since_v0_2_0;

use futures::future::Either;
use wasmtime::Store;
use wasmtime::component::{InstancePre, Linker};

use super::DeployCall;
use super::state::State;

/// The versions of `berth:deployer` this server speaks, oldest first.
pub(crate) const WIT_VERSIONS: [&str; 2] = [since_v0_1_0::WIT_VERSION, since_v0_2_0::WIT_VERSION];
/// The functions of the plugin interface, in WIT spelling (every version).
pub(crate) const PLUGIN_FUNCTIONS: [&str; 3] = ["describe", "check-options", "deploy"];

/// Links every version's imports.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    since_v0_1_0::add_to_linker(linker)?;
    since_v0_2_0::add_to_linker(linker)
}

/// A plugin, linked and checked once against the version it was built for;
/// each call instantiates it into a fresh `Store`.
pub(crate) enum PluginPre {
    V0_1(since_v0_1_0::PluginPre),
    V0_2(since_v0_2_0::PluginPre),
}

impl PluginPre {
    /// `version` is one of `WIT_VERSIONS` (a plugin's exported version,
    /// matched by `compatible`).
    pub(crate) fn new(pre: InstancePre<State>, version: &str) -> wasmtime::Result<Self> {
        if version == since_v0_2_0::WIT_VERSION {
            since_v0_2_0::PluginPre::new(pre).map(Self::V0_2)
        } else {
            since_v0_1_0::PluginPre::new(pre).map(Self::V0_1)
        }
    }

    /// The engine its code was compiled by, which its stores must share.
    pub(crate) fn engine(&self) -> &wasmtime::Engine {
        match self {
            Self::V0_1(pre) => pre.engine(),
            Self::V0_2(pre) => pre.engine(),
        }
    }

    /// One call into a fresh instance in `store`, as a future that borrows
    /// nothing, so it may run on any thread; it hands the store back.
    pub(crate) fn ask(
        &self,
        store: Store<State>,
        question: Question<'_>,
    ) -> impl Future<Output = (wasmtime::Result<Answer>, Store<State>)> + Send + use<> {
        match self {
            Self::V0_1(pre) => Either::Left(pre.ask(store, question)),
            Self::V0_2(pre) => Either::Right(pre.ask(store, question)),
        }
    }
}

/// The version of `WIT_VERSIONS` a plugin built for `version` speaks: the
/// same minor, any patch (semver for 0.x).
pub(crate) fn spoken(version: &str) -> Option<&'static str> {
    let major_minor = |v: &str| v.split('.').take(2).collect::<Vec<_>>().join(".");
    WIT_VERSIONS
        .into_iter()
        .find(|ours| major_minor(ours) == major_minor(version))
}

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
