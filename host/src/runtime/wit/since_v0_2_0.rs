//! `berth:deployer@0.2.0`: its bindings, generated from `wit/`, the host's
//! side of its imports (`host`, and `publish`, whose calls `runtime::publish`
//! answers), and the conversions between its types and berth's. Its `types`
//! are 0.1.0's, unchanged, so they are taken from there (`with`) and the
//! request and answers convert once. Never grants a capability.

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker, Resource};

use self::berth::deployer::host::{self, Level};
use self::berth::deployer::publish::{self, ObjectInfo, Receipt};
use super::since_v0_1_0::Asked;
use super::{Answer, Question, Reply};
use crate::runtime::caps;
use crate::runtime::publish::Opened;
use crate::runtime::report::GuestLevel;
use crate::runtime::state::State;

wasmtime::component::bindgen!({
    world: "deployer",
    path: "../wit",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "wasi": wasmtime_wasi::p2::bindings,
        "berth:deployer/types": super::since_v0_1_0::berth::deployer::types,
        "berth:deployer/publish.target": crate::runtime::publish::Opened,
    },
});

/// The version of the package this module speaks.
pub(crate) const WIT_VERSION: &str = "0.2.0";

/// Links the imports this version adds to WASI: `host` and `publish`.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    host::add_to_linker::<State, HasSelf<State>>(linker, |state| state)?;
    publish::add_to_linker::<State, HasSelf<State>>(linker, |state| state)
}

super::plugin_pre!();

impl host::Host for State {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.reporter.log(level.into(), &caps::log_line(&message));
        Ok(())
    }

    async fn progress(&mut self, done: u64, total: u64, note: String) -> wasmtime::Result<()> {
        self.reporter.progress(done, total, caps::note(&note));
        Ok(())
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

impl publish::Host for State {}

impl publish::HostTarget for State {
    async fn open(&mut self, name: String) -> wasmtime::Result<Result<Resource<Opened>, String>> {
        Ok(match self.publishing.open(&name) {
            Ok(opened) => Ok(self.table.push(opened)?),
            Err(e) => Err(caps::error(e)),
        })
    }

    async fn name(&mut self, target: Resource<Opened>) -> wasmtime::Result<String> {
        Ok(self.table.get(&target)?.name().to_string())
    }

    async fn put_model_file(
        &mut self,
        target: Resource<Opened>,
        path: String,
        key: String,
    ) -> wasmtime::Result<Result<Receipt, String>> {
        let opened = self.table.get(&target)?;
        let put = self.publishing.put_model_file(opened, &path, &key).await;
        Ok(put.map(Receipt::from).map_err(caps::error))
    }

    async fn put_model_files(
        &mut self,
        target: Resource<Opened>,
        files: Vec<(String, String)>,
    ) -> wasmtime::Result<Vec<Result<Receipt, String>>> {
        let opened = self.table.get(&target)?;
        let puts = self.publishing.put_model_files(opened, &files).await;
        Ok(puts
            .into_iter()
            .map(|put| put.map(Receipt::from).map_err(caps::error))
            .collect())
    }

    async fn put_out_file(
        &mut self,
        target: Resource<Opened>,
        path: String,
        key: String,
    ) -> wasmtime::Result<Result<Receipt, String>> {
        let opened = self.table.get(&target)?;
        let put = self.publishing.put_out_file(opened, &path, &key).await;
        Ok(put.map(Receipt::from).map_err(caps::error))
    }

    async fn put_bytes(
        &mut self,
        target: Resource<Opened>,
        key: String,
        bytes: Vec<u8>,
        content_type: String,
    ) -> wasmtime::Result<Result<Receipt, String>> {
        let opened = self.table.get(&target)?;
        let put = self
            .publishing
            .put_bytes(opened, &key, bytes, &content_type)
            .await;
        Ok(put.map(Receipt::from).map_err(caps::error))
    }

    async fn stat(
        &mut self,
        target: Resource<Opened>,
        key: String,
    ) -> wasmtime::Result<Result<Option<ObjectInfo>, String>> {
        let opened = self.table.get(&target)?;
        let found = self.publishing.stat(opened, &key).await;
        Ok(found
            .map(|info| {
                info.map(|i| ObjectInfo {
                    bytes: i.bytes,
                    etag: i.etag,
                })
            })
            .map_err(caps::error))
    }

    async fn url(
        &mut self,
        target: Resource<Opened>,
        key: String,
    ) -> wasmtime::Result<Result<String, String>> {
        let opened = self.table.get(&target)?;
        Ok(self.publishing.url(opened, &key).map_err(caps::error))
    }

    async fn finish(
        &mut self,
        target: Resource<Opened>,
    ) -> wasmtime::Result<Result<Vec<Receipt>, String>> {
        let opened = self.table.get(&target)?;
        let written = self.publishing.finish(opened).await;
        Ok(written
            .map(|receipts| receipts.into_iter().map(Receipt::from).collect())
            .map_err(caps::error))
    }

    async fn drop(&mut self, target: Resource<Opened>) -> wasmtime::Result<()> {
        self.table.delete(target)?;
        Ok(())
    }
}

impl From<crate::model::Receipt> for Receipt {
    fn from(receipt: crate::model::Receipt) -> Self {
        Receipt {
            url: receipt.url,
            bytes: receipt.bytes,
            sha256: receipt.sha256,
            etag: receipt.etag,
        }
    }
}
