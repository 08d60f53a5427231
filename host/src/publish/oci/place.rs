//! A key on an oci target (`REPO:TAG/PATH`) read as where its file goes.

use crate::oci::reference::{check_repository, check_tag};
use crate::publish::Key;

/// The shape of a key, for refusals.
const SHAPE: &str = "REPO:TAG/PATH, e.g. \"llama-ft:job-7/adapter_model.safetensors\"";

/// A key on an oci target, read: where its file goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::publish) struct Place {
    /// `REPO`, as the key says it (relative to the namespace).
    pub(super) repo: String,
    /// `NAMESPACE/REPO`: the repository at the registry.
    pub(super) repository: String,
    pub(super) tag: String,
    /// The file's path in the artifact: its layer's title.
    pub(super) path: String,
}

impl Place {
    /// Reads `key` as `REPO:TAG/PATH` under `namespace`.
    pub(in crate::publish) fn parse(namespace: &str, key: &Key) -> Result<Self, String> {
        Self::read(namespace, key, false)
    }

    /// Reads the key of a folder (`REPO:TAG` or `REPO:TAG/DIR`, its `/`
    /// taken off) under `namespace`: `path` is empty for the artifact
    /// itself.
    pub(in crate::publish) fn folder(namespace: &str, key: &Key) -> Result<Self, String> {
        Self::read(namespace, key, true)
    }

    fn read(namespace: &str, key: &Key, folder: bool) -> Result<Self, String> {
        let text = key.as_str();
        let refuse = |why: String| {
            format!("key {text:?} is not {SHAPE}, which an oci target's keys are: {why}")
        };
        let (repo, rest) = text
            .split_once(':')
            .ok_or_else(|| refuse("it has no :TAG".into()))?;
        let (tag, path) = match rest.split_once('/') {
            Some(split) => split,
            None if folder => (rest, ""),
            None => return Err(refuse("it names no /PATH after the tag".into())),
        };
        let repository = match namespace {
            "" => repo.to_string(),
            namespace => format!("{namespace}/{repo}"),
        };
        check_repository(&repository).map_err(refuse)?;
        check_tag(tag).map_err(refuse)?;
        Ok(Self {
            repo: repo.to_string(),
            repository,
            tag: tag.to_string(),
            path: path.to_string(),
        })
    }
}
