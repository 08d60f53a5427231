//! Image manifests: the layers read as a model's files (which annotation
//! or media type names each file), and the manifest a push writes. Pure.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// What a manifest request accepts: the two single-manifest types, and
/// the two index types so that an index is named as one, not a 404.
pub const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json, \
    application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";

/// ORAS and most artifact tools: the file's name.
pub const TITLE: &str = "org.opencontainers.image.title";
/// CNCF ModelPack: the file's path in the model.
pub const MODELPACK_PATH: &str = "org.cncf.model.filepath";
/// The empty config OCI artifacts use (`{}`).
pub const EMPTY_CONFIG: &str = "application/vnd.oci.empty.v1+json";
pub const EMPTY_JSON: &[u8] = b"{}";

/// Layers of Docker Model Runner's layout that carry no title: the name
/// each file gets.
const DOCKER_AI: [(&str, &str); 5] = [
    ("application/vnd.docker.ai.gguf.v3", "model.gguf"),
    ("application/vnd.docker.ai.safetensors", "model.safetensors"),
    ("application/vnd.docker.ai.license", "LICENSE"),
    ("application/vnd.docker.ai.mmproj", "model.mmproj"),
    (
        "application/vnd.docker.ai.chat.template.jinja",
        "template.jinja",
    ),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    /// The manifest this one is about (a signature's, say): OCI 1.1's
    /// referrers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    /// In an index of referrers: the artifact type of the manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    /// The sha256 hex of `digest`, if it is a sha256 digest.
    pub fn sha256(&self) -> Option<&str> {
        self.digest
            .strip_prefix("sha256:")
            .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// One layer read as a model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerFile {
    pub path: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

impl Manifest {
    /// Reads a manifest body; `media_type` is the answer's `Content-Type`.
    /// An index is refused with what to do instead.
    pub fn parse(body: &[u8], media_type: Option<&str>) -> Result<Self, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Kind {
            media_type: Option<String>,
            manifests: Option<serde_json::Value>,
        }
        let kind: Kind =
            serde_json::from_slice(body).map_err(|e| format!("the manifest is not JSON: {e}"))?;
        let media_type = kind.media_type.as_deref().or(media_type);
        if kind.manifests.is_some() || matches!(media_type, Some(OCI_INDEX | DOCKER_LIST)) {
            return Err(
                "the reference names an index of several manifests (an image for \
                 several platforms); name one of its manifests by digest"
                    .into(),
            );
        }
        serde_json::from_slice(body).map_err(|e| format!("the manifest cannot be read: {e}"))
    }

    /// The layers as files: a layer's path is its ModelPack file path or
    /// its title, or, for Docker Model Runner's untitled layers, the name
    /// its media type gives. Layers that name no file are left out; none
    /// at all is an error saying which annotations were looked for.
    pub fn files(&self) -> Result<Vec<LayerFile>, String> {
        let mut files = Vec::new();
        let mut by_type: BTreeMap<&str, usize> = BTreeMap::new();
        for layer in &self.layers {
            let Some(sha256) = layer.sha256() else {
                return Err(format!(
                    "a layer's digest {:?} is not sha256: berth verifies files by sha256",
                    layer.digest
                ));
            };
            let named = layer
                .annotations
                .get(MODELPACK_PATH)
                .or_else(|| layer.annotations.get(TITLE))
                .cloned()
                .or_else(|| {
                    let (_, name) = DOCKER_AI.iter().find(|(t, _)| *t == layer.media_type)?;
                    let n = by_type.entry(name).or_default();
                    *n += 1;
                    Some(match *n {
                        1 => name.to_string(),
                        n => numbered(name, n),
                    })
                });
            if let Some(path) = named {
                files.push(LayerFile {
                    path,
                    size: layer.size,
                    sha256: sha256.to_ascii_lowercase(),
                });
            }
        }
        if files.is_empty() {
            return Err(format!(
                "none of the manifest's {} layers names a file: berth reads a layer's path \
                 from its {MODELPACK_PATH} or {TITLE} annotation (as ORAS and ModelPack \
                 write them), or a Docker Model Runner media type",
                self.layers.len()
            ));
        }
        Ok(files)
    }
}

/// `model.gguf`, 2 → `model-2.gguf`.
fn numbered(name: &str, n: usize) -> String {
    match name.rsplit_once('.') {
        Some((stem, ext)) => format!("{stem}-{n}.{ext}"),
        None => format!("{name}-{n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(media_type: &str, digit: char, annotations: &[(&str, &str)]) -> serde_json::Value {
        serde_json::json!({
            "mediaType": media_type,
            "digest": format!("sha256:{}", digit.to_string().repeat(64)),
            "size": 7,
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        })
    }

    fn manifest(layers: Vec<serde_json::Value>) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": EMPTY_CONFIG, "digest": format!("sha256:{}", "4".repeat(64)), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn layers_name_files_by_modelpack_path_title_or_docker_ai_type() {
        let body = manifest(vec![
            layer(
                "application/vnd.cncf.model.weight.v1.raw",
                'a',
                &[
                    (MODELPACK_PATH, "w/model.safetensors"),
                    (TITLE, "model.safetensors"),
                ],
            ),
            layer(
                "application/vnd.oci.image.layer.v1.tar",
                'b',
                &[(TITLE, "config.json")],
            ),
            layer("application/vnd.docker.ai.gguf.v3", 'c', &[]),
            layer("application/vnd.docker.ai.gguf.v3", 'd', &[]),
            layer("application/vnd.docker.ai.license", 'e', &[]),
            layer("application/octet-stream", 'f', &[]),
        ]);
        let files = Manifest::parse(&body, None).unwrap().files().unwrap();
        let named: Vec<_> = files
            .iter()
            .map(|f| (f.path.as_str(), f.sha256.chars().next().unwrap()))
            .collect();
        assert_eq!(
            named,
            [
                ("w/model.safetensors", 'a'),
                ("config.json", 'b'),
                ("model.gguf", 'c'),
                ("model-2.gguf", 'd'),
                ("LICENSE", 'e')
            ]
        );
        assert!(files.iter().all(|f| f.size == 7));
    }

    #[test]
    fn a_manifest_without_files_an_index_or_another_digest_is_refused() {
        let e = Manifest::parse(
            &manifest(vec![layer("application/octet-stream", 'a', &[])]),
            None,
        )
        .unwrap()
        .files()
        .unwrap_err();
        assert!(
            e.starts_with("none of the manifest's 1 layers names a file"),
            "{e}"
        );

        let index =
            serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": []})).unwrap();
        let e = Manifest::parse(&index, Some(OCI_INDEX)).unwrap_err();
        assert!(e.contains("an index of several manifests"), "{e}");

        let mut bad = serde_json::from_slice::<serde_json::Value>(&manifest(vec![layer(
            "x",
            'a',
            &[(TITLE, "a")],
        )]))
        .unwrap();
        bad["layers"][0]["digest"] = "sha512:ab".into();
        let e = Manifest::parse(&serde_json::to_vec(&bad).unwrap(), None)
            .unwrap()
            .files()
            .unwrap_err();
        assert!(e.contains("is not sha256"), "{e}");

        assert!(
            Manifest::parse(b"<html>", None)
                .unwrap_err()
                .starts_with("the manifest is not JSON")
        );
    }
}
