//! OCI registries (the distribution spec): references, manifests read as a
//! model's files, and one registry's client with its authentication. Used
//! by fetching (blobs by digest), registration (a manifest's layers as
//! files), publishing (blobs and a manifest pushed) and the catalog (a
//! deployer's component pulled). Knows nothing of models' records.

pub mod component;
#[cfg(test)]
mod component_tests;
pub mod manifest;
pub mod reference;
pub mod registry;
#[cfg(test)]
mod registry_tests;
/// The CNCF registry the unit tests start (`tests/registry`), included
/// once for all of them: a file included twice is two modules.
#[cfg(test)]
#[path = "../../../tests/registry/registry.rs"]
pub(crate) mod test_registry;

pub use component::{Component, PullError};
pub use manifest::{LayerFile, Manifest};
pub use reference::Reference;
pub use registry::{Access, Error, Login, Registry};
