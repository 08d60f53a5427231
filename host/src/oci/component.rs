//! A WebAssembly component stored in a registry in the wasm OCI artifact
//! layout (what `wkg oci push` and `oras push --artifact-type
//! application/vnd.wasm.config.v0+json` write): a config of type
//! `application/vnd.wasm.config.v0+json` and exactly one layer of type
//! `application/wasm`. Pulled whole into memory, hashed as it is read and
//! never read past the layer's size or the caller's bound; the bytes are
//! handed back only when their sha256 is the layer's digest. Knows nothing
//! of deployers or the catalog.

use sha2::{Digest, Sha256};

use super::manifest::{Descriptor, Manifest};
use super::{Reference, Registry};
use crate::causes::innermost;

/// The config media type of a wasm component artifact.
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The media type of the layer holding the component's bytes.
pub const WASM_LAYER: &str = "application/wasm";

/// A component pulled and verified.
#[derive(Debug)]
pub struct Component {
    /// Its bytes, whose sha256 is the layer's digest.
    pub wasm: Vec<u8>,
    /// The reference pinned to the manifest's digest
    /// (`oci://REG/REPO@sha256:…`): what was pulled, whatever the tag
    /// names later.
    pub pinned: Reference,
}

/// Why no component came: each a sentence of its own, which the caller
/// prefixes with the reference.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The registry did not give the component: unreachable, a login
    /// refused, no such manifest or blob, bytes that are not the digest's.
    #[error("{0}")]
    Registry(String),
    /// The manifest is not a wasm component artifact.
    #[error("{0}")]
    Layout(String),
    /// The layer says it is larger than the caller takes; not read.
    #[error("the component is {size} bytes, more than the caller takes")]
    TooLarge { size: u64 },
}

/// The one `application/wasm` layer of a wasm component artifact, or the
/// sentence saying how `manifest` differs from that layout.
pub fn wasm_layer(manifest: &Manifest) -> Result<&Descriptor, String> {
    let layout = format!(
        "a wasm component artifact has the config type {WASM_CONFIG} and exactly one \
         {WASM_LAYER} layer (as `wkg oci push` writes it)"
    );
    if manifest.config.media_type != WASM_CONFIG {
        return Err(format!(
            "the manifest's config type is {}, not a wasm component's: {layout}",
            manifest.config.media_type
        ));
    }
    let wasm: Vec<&Descriptor> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == WASM_LAYER)
        .collect();
    match wasm.as_slice() {
        [] => Err(format!(
            "the manifest has no {WASM_LAYER} layer (its {} layers are {}): {layout}",
            manifest.layers.len(),
            types(manifest)
        )),
        [layer] if manifest.layers.len() == 1 => {
            layer.sha256().ok_or_else(|| {
                format!(
                    "the wasm layer's digest {:?} is not sha256: berth verifies a component by sha256",
                    layer.digest
                )
            })?;
            Ok(layer)
        }
        _ => Err(format!(
            "the manifest has {} layers ({}), not one: {layout}",
            manifest.layers.len(),
            types(manifest)
        )),
    }
}

/// The layers' media types, for a message.
fn types(manifest: &Manifest) -> String {
    match manifest.layers.is_empty() {
        true => "none".into(),
        false => manifest
            .layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Pulls the component `reference` names from `registry`: the manifest
/// (checked against the reference's digest, if it has one), then the wasm
/// layer, refused before it is read if it says it is over `limit` bytes,
/// and read no further than its size.
pub async fn pull(
    registry: &Registry,
    reference: &Reference,
    limit: usize,
) -> Result<Component, PullError> {
    let repo = &reference.repository;
    let (digest, manifest, _) = registry
        .manifest(repo, &reference.manifest_ref())
        .await
        .map_err(|e| PullError::Registry(e.into()))?;
    let layer = wasm_layer(&manifest).map_err(PullError::Layout)?;
    let hex = layer
        .sha256()
        .expect("wasm_layer checked the digest")
        .to_ascii_lowercase();
    let too_large = || PullError::TooLarge { size: layer.size };
    let size = usize::try_from(layer.size).map_err(|_| too_large())?;
    if size > limit {
        return Err(too_large());
    }
    let mut response = registry
        .blob(repo, &hex, None)
        .await
        .map_err(|e| PullError::Registry(e.into()))?;
    let blob = format!("sha256:{hex}");
    match response.status() {
        reqwest::StatusCode::NOT_FOUND => {
            return Err(PullError::Registry(format!(
                "the registry {} has no blob {blob} (the manifest's wasm layer)",
                registry.name()
            )));
        }
        reqwest::StatusCode::FORBIDDEN => return Err(PullError::Registry(registry.refused(repo))),
        status if !status.is_success() => {
            return Err(PullError::Registry(format!(
                "the registry {} answered {status} for the blob {blob}",
                registry.name()
            )));
        }
        _ => {}
    }
    let mut wasm = Vec::with_capacity(size);
    let mut hasher = Sha256::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        PullError::Registry(format!(
            "the registry {} broke off the blob {blob}: {}",
            registry.name(),
            innermost(&e)
        ))
    })? {
        if wasm.len() + chunk.len() > size {
            return Err(PullError::Registry(format!(
                "the registry {} sent more than the {size} bytes the manifest gives the blob {blob}: refused",
                registry.name()
            )));
        }
        hasher.update(&chunk);
        wasm.extend_from_slice(&chunk);
    }
    let got = hex::encode(hasher.finalize());
    if wasm.len() != size || got != hex {
        return Err(PullError::Registry(format!(
            "the registry {} sent {} bytes whose sha256 is {got} for the blob {blob} \
             ({size} bytes): refused, nothing stored",
            registry.name(),
            wasm.len()
        )));
    }
    Ok(Component {
        wasm,
        pinned: reference.pinned(&digest),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::manifest::{EMPTY_CONFIG, OCI_MANIFEST};

    fn manifest(config: &str, layers: &[&str]) -> Manifest {
        let layers: Vec<_> = layers
            .iter()
            .map(|t| {
                serde_json::json!({"mediaType": t, "digest": format!("sha256:{}", "a".repeat(64)), "size": 9})
            })
            .collect();
        let body = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": config, "digest": format!("sha256:{}", "4".repeat(64)), "size": 2},
            "layers": layers,
        });
        Manifest::parse(&serde_json::to_vec(&body).unwrap(), None).unwrap()
    }

    #[test]
    fn only_the_wasm_component_layout_names_a_layer() {
        #[rustfmt::skip]
        let cases: [(&str, &[&str], Result<(), &str>); 6] = [
            (WASM_CONFIG, &[WASM_LAYER], Ok(())),
            (EMPTY_CONFIG, &[WASM_LAYER],
             Err("the manifest's config type is application/vnd.oci.empty.v1+json, not a wasm component's")),
            (WASM_CONFIG, &[],
             Err("the manifest has no application/wasm layer (its 0 layers are none)")),
            (WASM_CONFIG, &["application/octet-stream"],
             Err("the manifest has no application/wasm layer (its 1 layers are application/octet-stream)")),
            (WASM_CONFIG, &[WASM_LAYER, WASM_LAYER],
             Err("the manifest has 2 layers (application/wasm, application/wasm), not one")),
            (WASM_CONFIG, &[WASM_LAYER, "text/plain"],
             Err("the manifest has 2 layers (application/wasm, text/plain), not one")),
        ];
        for (config, layers, wanted) in cases {
            let m = manifest(config, layers);
            match (wasm_layer(&m), wanted) {
                (Ok(layer), Ok(())) => assert_eq!(layer.size, 9),
                (Err(e), Err(start)) => {
                    assert!(e.starts_with(start), "{config} {layers:?}: {e}");
                    assert!(e.contains("exactly one application/wasm layer"), "{e}");
                }
                (got, wanted) => panic!("{config} {layers:?}: {got:?}, wanted {wanted:?}"),
            }
        }
    }
}
