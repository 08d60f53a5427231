//! A deployer's version pulled from a registry: the component a reference
//! names (`oci::component`, verified by the layer's digest and bounded by
//! `--max-plugin-mib`), then pushed as an upload is, with the reference
//! pinned to the manifest's digest as the version's source.

use std::sync::Arc;

use super::{Catalog, Error, Upload};
use crate::db::{Pushed, StoredVersion};
use crate::oci::{self, PullError};
use crate::runtime::Plugin;

/// A plugin as `PUT /v1/deployers/{name}` takes it from a registry: the
/// component the reference names, with the manifest and signature given
/// beside the reference (a registry holds only the component's bytes).
pub struct Pull {
    pub name: String,
    pub reference: oci::Reference,
    pub manifest: Option<String>,
    pub signature: Option<String>,
    pub by: Option<String>,
}

impl Catalog {
    /// Pulls the component `pull` names from `registry` (the client with
    /// the login for its repository) and pushes it as an upload is pushed,
    /// its source the reference pinned to the manifest's digest. The name
    /// is checked before the registry is asked; nothing is stored unless
    /// the bytes are the layer's digest and the plugin loads.
    pub async fn pull(
        &self,
        registry: &oci::Registry,
        pull: Pull,
    ) -> Result<(Arc<Plugin>, StoredVersion, Pushed), Error> {
        let Pull {
            name,
            reference,
            manifest,
            signature,
            by,
        } = pull;
        self.admit(&name)?;
        let limit = self.max_plugin_bytes;
        let pulled = oci::component::pull(registry, &reference, limit).await;
        let component = pulled.map_err(|e| {
            let (name, reference) = (name.clone(), reference.to_string());
            match e {
                PullError::Registry(reason) => Error::Unpulled {
                    name,
                    reference,
                    reason,
                },
                PullError::Layout(reason) => Error::NotComponent {
                    name,
                    reference,
                    reason,
                },
                PullError::TooLarge { size } => Error::PullTooLarge {
                    name,
                    reference,
                    size,
                    limit,
                },
            }
        })?;
        let source = component.pinned.to_string();
        tracing::info!(plugin = %name, %source, bytes = component.wasm.len(), "deployer pulled");
        self.push(Upload {
            name,
            wasm: component.wasm,
            manifest,
            signature,
            source: Some(source),
            by,
        })
        .await
    }
}
