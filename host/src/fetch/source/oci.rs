//! Registries as sources: a model file is a blob of the repository its
//! source names, fetched by its sha256 (which the verification checks as
//! for every file), ranged like an HTTP source so a large blob goes over
//! several connections and an interrupted one is continued. The login is
//! the sources file's for the repository's `oci://` prefix; a redirect to
//! blob storage carries none (`oci::Registry::blob`).

use super::http::body_of;
use super::{Body, Sources, Span};
use crate::oci::Reference;

impl Sources {
    /// Opens the blob `sha256` of `reference`'s repository (shown as
    /// `url`): see `Sources::open`.
    pub(super) async fn open_blob(
        &self,
        url: &str,
        reference: &Reference,
        sha256: &str,
        span: Span,
    ) -> Result<Body, String> {
        let registry = self.registry(reference);
        let repo = &reference.repository;
        let get = |span: Option<Span>| registry.blob(repo, sha256, span.map(|s| s.header()));
        let mut response = get(span.is_partial().then_some(span)).await?;
        if span.is_partial() && response.status() == reqwest::StatusCode::RANGE_NOT_SATISFIABLE {
            // What we hold is longer than the blob: start over.
            response = get(None).await?;
        }
        let status = response.status();
        match status {
            reqwest::StatusCode::NOT_FOUND => Err(format!(
                "the registry {} has no blob {url}",
                registry.name()
            )),
            reqwest::StatusCode::FORBIDDEN => Err(registry.refused(repo)),
            status if !status.is_success() => Err(format!(
                "the registry {} answered {status} ({url})",
                registry.name()
            )),
            _ => body_of(response, span, url),
        }
    }
}

/// What a registry's manifest says a model is: the manifest pinned by
/// digest, and its layers as files.
pub(crate) struct Listed {
    pub(crate) pinned: Reference,
    pub(crate) files: Vec<crate::oci::LayerFile>,
}

impl Sources {
    /// Reads the manifest `reference` names (by tag or digest) and lists
    /// its layers as files; the error is a sentence naming the reference.
    pub(crate) async fn list_manifest(&self, reference: &Reference) -> Result<Listed, String> {
        let registry = self.registry(reference);
        let (digest, manifest, _) = registry
            .manifest(&reference.repository, &reference.manifest_ref())
            .await?;
        let files = manifest.files().map_err(|e| format!("{reference}: {e}"))?;
        Ok(Listed {
            pinned: reference.pinned(&digest),
            files,
        })
    }
}
