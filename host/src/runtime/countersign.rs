//! What a deployment published, signed by the server on the way out: with
//! `--publish-signing-key`, once a deployer returns, each `file://`,
//! `http(s)://` or `s3://` target it put files into gets a `model.sig`
//! (OpenSSF model signing, the key method) in the folder those files share,
//! covering exactly them, so a consumer checks what arrived with
//! `model_signing verify key`. On an `oci://` target each artifact written
//! (`REPO:TAG`) gets its signature attached, an OCI referrer of its
//! manifest covering its layers (`publish::Publisher::attach`). The key
//! stays here, like target credentials: the plugin never sees it, and
//! cannot sign anything else.
//! A `model.sig` the deployer put itself is not covered and is replaced:
//! the host's signature is the one that vouches for the deployment.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Runtime;
use super::report::Reporter;
use crate::key::Key;
use crate::model::ModelFile;
use crate::publish::{Body, Publishers, Receipt};
use crate::signing::{self, SIGNATURE_FILE, SigningKey};
use crate::targets::{Kind, Targets};

impl Runtime {
    /// What deployments publish is signed with `key`.
    pub fn signing_key(mut self, key: Option<SigningKey>) -> Self {
        self.signing_key = key.map(Arc::new);
        self
    }

    /// Signs what a deployment put (`published`, its receipts) into each
    /// target that keeps files, when a signing key is configured; each
    /// `model.sig` is reported to `reporter` like any put.
    pub async fn sign_published(
        &self,
        published: &[Receipt],
        reporter: Arc<dyn Reporter>,
        cancel: &CancellationToken,
    ) -> Result<(), String> {
        match &self.signing_key {
            Some(key) => {
                sign_published(
                    key,
                    &self.targets,
                    &self.publishers,
                    published,
                    reporter,
                    cancel,
                )
                .await
            }
            None => Ok(()),
        }
    }
}

/// Signs what `published` (a deployment's receipts, in order) put into
/// each target that keeps files, putting each `model.sig` and reporting
/// it like any put. The error is a sentence for the deployment's record.
async fn sign_published(
    key: &SigningKey,
    targets: &Targets,
    publishers: &Publishers,
    published: &[Receipt],
    reporter: Arc<dyn Reporter>,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let mut by_target: BTreeMap<&str, Vec<&Receipt>> = BTreeMap::new();
    let mut artifacts: Vec<(&Receipt, Vec<&Receipt>)> = Vec::new();
    for receipt in published {
        let kind = targets.get(&receipt.target).map(|t| t.kind());
        let is_signature = receipt.key.rsplit('/').next() == Some(SIGNATURE_FILE);
        match kind {
            _ if is_signature => {}
            Some(Kind::File | Kind::Http { .. } | Kind::S3 { .. }) => {
                by_target.entry(&receipt.target).or_default().push(receipt);
            }
            // An oci target's manifest receipts (`REPO:TAG`) come after the
            // puts of their layers (`REPO:TAG/PATH`).
            Some(Kind::Oci { .. }) if !receipt.key.contains('/') => {
                let prefix = format!("{}/", receipt.key);
                let layers = published
                    .iter()
                    .filter(|r| r.target == receipt.target && r.key.starts_with(&prefix))
                    .collect();
                artifacts.push((receipt, layers));
            }
            _ => {}
        }
    }
    for (manifest, layers) in artifacts {
        attach(key, publishers, manifest, &layers, &reporter, cancel).await?;
    }
    for (target, receipts) in by_target {
        let (folder, files) = folder_of(&receipts);
        let name = folder
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or(target);
        let bundle = signing::sign(key, name, &files)
            .map_err(|e| format!("signing what was published to target {target:?}: {e}"))?;
        let at = format!("{folder}{SIGNATURE_FILE}");
        let at = Key::parse(&at).map_err(|e| format!("target {target:?}: {e}"))?;
        let publisher = publishers
            .get(target)
            .map_err(|e| format!("target {target:?}: {e}"))?;
        let body = Body::Bytes {
            bytes: bundle.into(),
            content_type: "application/json".into(),
        };
        let progress = |_: u64| {};
        let receipt = publisher
            .put(&at, body, &progress, cancel)
            .await
            .map_err(|e| {
                format!(
                    "putting the signature {} into target {target:?}: {e}",
                    at.as_str()
                )
            })?;
        reporter.published(&receipt);
        reporter.host_line(&format!(
            "signed the {} file(s) published to target {target:?}: {} (key sha256:{})",
            files.len(),
            receipt.url,
            key.key_id()
        ));
    }
    Ok(())
}

/// Signs the layers of the artifact whose manifest `manifest` is, and
/// attaches the signature to it on its oci target, reporting it like any
/// put.
async fn attach(
    key: &SigningKey,
    publishers: &Publishers,
    manifest: &Receipt,
    layers: &[&Receipt],
    reporter: &Arc<dyn Reporter>,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let target = &manifest.target;
    // Each layer by its title, the path a consumer pulls it to; the last
    // put of a path wins, as in the manifest.
    let mut latest: BTreeMap<&str, &Receipt> = BTreeMap::new();
    for layer in layers {
        latest.insert(&layer.key[manifest.key.len() + 1..], layer);
    }
    let files: Vec<ModelFile> = latest
        .into_iter()
        .map(|(path, r)| ModelFile {
            path: path.to_string(),
            size_bytes: r.bytes,
            sha256: Some(r.sha256.clone()),
            format: None,
        })
        .collect();
    let name = manifest.key.replace(':', "-");
    let bundle = signing::sign(key, &name, &files).map_err(|e| {
        format!(
            "signing the artifact {} of target {target:?}: {e}",
            manifest.key
        )
    })?;
    let publisher = publishers
        .get(target)
        .map_err(|e| format!("target {target:?}: {e}"))?;
    let receipt = publisher
        .attach(manifest, bundle.into(), cancel)
        .await
        .map_err(|e| format!("attaching the signature of {}: {e}", manifest.key))?;
    reporter.published(&receipt);
    reporter.host_line(&format!(
        "signed the {} file(s) of {} and attached the signature: {} (key sha256:{})",
        files.len(),
        manifest.url,
        receipt.url,
        key.key_id()
    ));
    Ok(())
}

/// The folder the keys share (`""` or ending in `/`), and each receipt
/// as a file relative to it. The last put of a key wins, as in the target.
fn folder_of(receipts: &[&Receipt]) -> (String, Vec<ModelFile>) {
    let dir = |key: &str| key.rfind('/').map_or("", |i| &key[..=i]).to_string();
    let mut folder = dir(&receipts[0].key);
    for receipt in receipts {
        while !receipt.key.starts_with(&folder) {
            folder = dir(folder.trim_end_matches('/'));
        }
    }
    let mut latest: BTreeMap<&str, &Receipt> = BTreeMap::new();
    for receipt in receipts {
        latest.insert(&receipt.key, receipt);
    }
    let files = latest
        .values()
        .map(|r| ModelFile {
            path: r.key[folder.len()..].to_string(),
            size_bytes: r.bytes,
            sha256: Some(r.sha256.clone()),
            format: None,
        })
        .collect();
    (folder, files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(key: &str) -> Receipt {
        Receipt {
            target: "t".into(),
            key: key.into(),
            url: String::new(),
            bytes: 1,
            sha256: "ab".repeat(32),
            etag: None,
        }
    }

    #[test]
    fn the_files_are_named_from_the_folder_they_share() {
        let put = [
            receipt("runs/7/adapter.safetensors"),
            receipt("runs/7/tok/t.json"),
            receipt("runs/7/adapter.safetensors"),
        ];
        let (folder, files) = folder_of(&put.iter().collect::<Vec<_>>());
        assert_eq!(folder, "runs/7/");
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["adapter.safetensors", "tok/t.json"]);

        let apart = [receipt("a/x"), receipt("b/y"), receipt("top")];
        let (folder, files) = folder_of(&apart.iter().collect::<Vec<_>>());
        assert_eq!(folder, "");
        assert_eq!(files.len(), 3);
        let (folder, _) = folder_of(&[&receipt("a/b/c")]);
        assert_eq!(folder, "a/b/");
    }
}
