//! What one call may publish, and the host's side of every `publish` call
//! in domain terms (the WIT glue converts): a target is opened only when
//! the plugin's manifest grants it and this server configures it; a model
//! file is put by its recorded path (with its verified sha256), an out
//! file only from under the deployment's out-dir; what a deployment
//! publishes to a target stays within the target's `max_gib`, and its puts
//! within the manifest's caps (`Spending`, shared with the HTTP gate).
//! Every sentence the guest reads is scrubbed of the call's targets'
//! credentials (`crate::scrub`). Every put is
//! reported (`Reporter::published`) before the guest sees its receipt; so
//! is every manifest `finish` writes (an oci target's puts wait in the
//! deployment's `Pending` of that target until then).
//! Never moves bytes itself (`crate::publish` does) and never reads a
//! credential.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::fetch::Stamps;
use crate::human;
use crate::model::TrainedModel;
use crate::publish::{
    Body, FILES_AT_ONCE, Key, ObjectInfo, Pending, Publisher, Publishers, Receipt,
};
use crate::scrub::Scrubber;
use crate::targets::Targets;

use super::OUT_DIR;
use super::report::Reporter;
use super::spending::Spending;

/// What a receipt's record holds besides its texts: its field names, its
/// size, its JSON punctuation.
const RECEIPT_OVERHEAD: usize = 80;

/// `put-bytes` takes at most this much: generated content (a manifest, a
/// card), not files, which go through `put-out-file` from disk.
pub const MAX_PUT_BYTES: usize = 8 << 20;

/// A deployment's options with its `target` filled in where the author
/// may leave it out: the deployer takes a `target` option (its options
/// schema says so), its manifest grants exactly one target, and the
/// options name none. `None`: the options stand as given.
pub fn default_target(plugin: &super::Plugin, options_json: &str) -> Option<String> {
    let [only] = plugin.manifest.targets.as_slice() else {
        return None;
    };
    let schema: serde_json::Value = serde_json::from_str(plugin.options_schema.as_deref()?).ok()?;
    schema.get("properties")?.get("target")?;
    let mut options: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(options_json).ok()?;
    if options.contains_key("target") {
        return None;
    }
    options.insert("target".into(), only.clone().into());
    serde_json::to_string(&options).ok()
}

/// The publishing grants of one call.
pub(crate) struct Publishing {
    plugin: String,
    granted: Vec<String>,
    targets: Arc<Targets>,
    publishers: Arc<Publishers>,
    /// Only a deployment may put: `describe` and `check-options` may not.
    deployment: Option<Deployment>,
    reporter: Arc<dyn Reporter>,
    cancel: CancellationToken,
    /// What its puts and its own requests under targets spend.
    spending: Arc<Spending>,
    /// Finds the granted targets' credentials in what the guest reads.
    scrubber: Scrubber,
    /// What this call's puts left for `finish`, by target: every handle
    /// of a target shares it.
    pending: HashMap<String, Arc<Pending>>,
    /// Told of the bytes the puts send (the reporter's progress).
    progress: Box<dyn Fn(u64) + Send + Sync>,
    /// The model's `source`: an oci target may mount blobs from it.
    model_source: Option<String>,
}

/// What a deployment's puts read from.
struct Deployment {
    model_dir: PathBuf,
    /// Recorded path → size and verified sha256.
    files: HashMap<String, (u64, Option<String>)>,
    out_dir: PathBuf,
    /// The verification record of `model_dir`, read at the first
    /// `put-model-file`: an unchanged file is not hashed again.
    record: Option<PathBuf>,
    stamps: Option<Arc<Stamps>>,
}

/// The host files a deployment's puts may read.
pub(crate) struct Sources<'a> {
    pub(crate) model: &'a TrainedModel,
    pub(crate) model_dir: &'a Path,
    pub(crate) out_dir: &'a Path,
    pub(crate) record: Option<&'a Path>,
}

/// An opened target, as the guest's handle holds it.
pub struct Opened {
    publisher: Publisher,
    pending: Arc<Pending>,
}

impl Opened {
    pub(crate) fn name(&self) -> &str {
        self.publisher.name()
    }
}

impl Publishing {
    pub(crate) fn new(
        plugin: &super::Plugin,
        targets: Arc<Targets>,
        publishers: Arc<Publishers>,
        sources: Option<Sources<'_>>,
        reporter: Arc<dyn Reporter>,
        cancel: CancellationToken,
    ) -> Self {
        let model_source = sources.as_ref().map(|s| s.model.source.clone());
        let deployment = sources.map(|s| Deployment {
            model_dir: s.model_dir.to_path_buf(),
            files: s
                .model
                .files
                .iter()
                .map(|f| (f.path.clone(), (f.size_bytes, f.sha256.clone())))
                .collect(),
            out_dir: s.out_dir.to_path_buf(),
            record: s.record.map(Path::to_path_buf),
            stamps: None,
        });
        Self {
            plugin: plugin.name.clone(),
            granted: plugin.manifest.targets.clone(),
            spending: Arc::new(Spending::new(targets.clone(), plugin.manifest.records)),
            scrubber: targets.scrubber(&plugin.manifest.targets),
            targets,
            publishers,
            deployment,
            progress: Box::new({
                let reporter = reporter.clone();
                move |bytes| reporter.publishing(bytes)
            }),
            reporter,
            cancel,
            pending: HashMap::new(),
            model_source,
        }
    }

    /// The server's targets (those the plugin is granted are reachable).
    pub(crate) fn targets(&self) -> &Targets {
        &self.targets
    }

    pub(crate) fn spending(&self) -> Arc<Spending> {
        self.spending.clone()
    }

    pub(crate) fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }

    /// A sentence for the guest, without a credential in any form.
    fn said(&self, sentence: impl ToString) -> String {
        self.scrubber.text(&sentence.to_string()).into_owned()
    }

    /// Opens the target `name`: deny by default.
    pub(crate) fn open(&mut self, name: &str) -> Result<Opened, String> {
        self.targets.open(&self.plugin, &self.granted, name)?;
        let publisher = self.publishers.get(name).map_err(|e| self.said(e))?;
        let source = self.model_source.as_deref().unwrap_or_default();
        let pending = self
            .pending
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Pending::new(source)))
            .clone();
        Ok(Opened { publisher, pending })
    }

    /// Where `key` lands; a folder key, ending in `/`, answers where the
    /// keys under it land, ending in `/` too (`Publisher::folder_url`).
    pub(crate) fn url(&self, target: &Opened, key: &str) -> Result<String, String> {
        let url = match key.strip_suffix('/').filter(|folder| !folder.is_empty()) {
            Some(folder) => target.publisher.folder_url(&self.key(target, folder)?),
            None => target.publisher.url(&self.key(target, key)?),
        };
        url.map_err(|e| self.said(e))
    }

    /// Writes what the target's puts left pending (an oci target's
    /// manifests), reporting each; nothing for other targets.
    pub(crate) async fn finish(&self, target: &Opened) -> Result<Vec<Receipt>, String> {
        let receipts = target
            .publisher
            .finish(&target.pending, &self.cancel)
            .await
            .map_err(|e| self.said(e))?;
        Ok(receipts
            .into_iter()
            .map(|receipt| self.recorded(receipt))
            .collect())
    }

    pub(crate) async fn stat(
        &self,
        target: &Opened,
        key: &str,
    ) -> Result<Option<ObjectInfo>, String> {
        let key = self.key(target, key)?;
        let info = target
            .publisher
            .stat(&key)
            .await
            .map_err(|e| self.said(e))?;
        Ok(info.map(|info| ObjectInfo {
            etag: info.etag.map(|e| self.said(e)),
            ..info
        }))
    }

    /// Puts the model's file recorded at `path`.
    pub(crate) async fn put_model_file(
        &mut self,
        target: &Opened,
        path: &str,
        key: &str,
    ) -> Result<Receipt, String> {
        let stamps = self.stamps(target).await?;
        let (key, body, bytes) = self.model_file(target, stamps.as_deref(), path, key)?;
        self.put(target, key, body, bytes).await
    }

    /// Puts the model's files, each `(path, key)`, `FILES_AT_ONCE` at a
    /// time: one result per pair, in order. A pair refused (no such file,
    /// a key given before, past the budget) is not put; the others are.
    pub(crate) async fn put_model_files(
        &mut self,
        target: &Opened,
        files: &[(String, String)],
    ) -> Vec<Result<Receipt, String>> {
        let stamps = match self.stamps(target).await {
            Ok(stamps) => stamps,
            Err(e) => return vec![Err(e); files.len()],
        };
        let name = target.name();
        let mut results: Vec<Option<Result<Receipt, String>>> = vec![None; files.len()];
        let mut keys = Vec::new();
        let mut puts = Vec::new();
        let mut given = HashSet::new();
        let mut reserved = self.spending.sent(name);
        for (index, (path, key)) in files.iter().enumerate() {
            let put = self
                .model_file(target, stamps.as_deref(), path, key)
                .and_then(|(key, body, bytes)| {
                    if !given.insert(key.as_str().to_string()) {
                        return Err(format!(
                            "put-model-files: the key {:?} is given twice; only its first \
                             file is put",
                            key.as_str()
                        ));
                    }
                    self.within_budget(name, reserved, &key, bytes)?;
                    self.spending.put()?;
                    reserved += bytes;
                    Ok((key, body))
                });
            match put {
                Ok((key, body)) => {
                    keys.push(key);
                    puts.push((index, body));
                }
                Err(e) => results[index] = Some(Err(e)),
            }
        }
        let this = &*self;
        // Every put is made here, in the order given (an oci target's
        // layers keep that order, whichever lands first); they run
        // `FILES_AT_ONCE` at a time.
        let mut sends = Vec::with_capacity(puts.len());
        for (key, (index, body)) in keys.iter().zip(puts) {
            let sent = this.send(target, key, body);
            sends.push(async move { (index, sent.await) });
        }
        let mut sending = futures::stream::iter(sends).buffer_unordered(FILES_AT_ONCE);
        while let Some((index, put)) = sending.next().await {
            results[index] = Some(put);
        }
        drop(sending);
        let landed: u64 = results.iter().flatten().flatten().map(|r| r.bytes).sum();
        self.spending.add(name, landed);
        results
            .into_iter()
            .map(|result| result.expect("every pair was refused or sent"))
            .collect()
    }

    /// What putting the model's file recorded at `path` at `key` sends,
    /// and its size.
    fn model_file(
        &self,
        target: &Opened,
        stamps: Option<&Stamps>,
        path: &str,
        key: &str,
    ) -> Result<(Key, Body, u64), String> {
        let key = self.key(target, key)?;
        let deployment = self.deployment(target)?;
        let Some((bytes, sha256)) = deployment.files.get(path) else {
            return Err(format!(
                "put-model-file {path:?}: the model has no file recorded at that path \
                 (use a model-file.path of the request, relative to {})",
                super::MODEL_DIR
            ));
        };
        let body = Body::File {
            path: deployment.model_dir.join(path),
            bytes: *bytes,
            sha256: sha256.clone(),
            vouched: stamps.and_then(|s| s.get(path).cloned()),
        };
        Ok((key, body, *bytes))
    }

    /// Puts a file the deployment wrote under its out-dir.
    pub(crate) async fn put_out_file(
        &mut self,
        target: &Opened,
        path: &str,
        key: &str,
    ) -> Result<Receipt, String> {
        let key = self.key(target, key)?;
        let out_dir = self.deployment(target)?.out_dir.clone();
        let file = tokio::task::spawn_blocking({
            let path = path.to_string();
            move || out_file(&out_dir, &path)
        })
        .await
        .map_err(|e| format!("put-out-file {path:?}: looking at it crashed: {e}"))??;
        let bytes = file.1;
        let body = Body::File {
            path: file.0,
            bytes,
            sha256: None,
            vouched: None,
        };
        self.put(target, key, body, bytes).await
    }

    /// Puts a few bytes the guest handed over.
    pub(crate) async fn put_bytes(
        &mut self,
        target: &Opened,
        key: &str,
        bytes: Vec<u8>,
        content_type: &str,
    ) -> Result<Receipt, String> {
        let key = self.key(target, key)?;
        self.deployment(target)?;
        if bytes.len() > MAX_PUT_BYTES {
            return Err(format!(
                "put-bytes {}: {} is more than put-bytes takes ({}); write the file under {OUT_DIR} \
                 and use put-out-file",
                key.as_str(),
                human::size(bytes.len() as u64),
                human::size(MAX_PUT_BYTES as u64)
            ));
        }
        let content_type = match content_type.trim() {
            "" => "application/octet-stream".to_string(),
            given => given
                .parse::<http::HeaderValue>()
                .map(|_| given.to_string())
                .map_err(|_| {
                    format!(
                        "put-bytes {}: content type {content_type:?} is not a header value",
                        key.as_str()
                    )
                })?,
        };
        let size = bytes.len() as u64;
        let body = Body::Bytes {
            bytes: bytes.into(),
            content_type,
        };
        self.put(target, key, body, size).await
    }

    /// Puts `body` within the target's budget, reports its progress and
    /// its receipt.
    async fn put(
        &mut self,
        target: &Opened,
        key: Key,
        body: Body,
        size: u64,
    ) -> Result<Receipt, String> {
        let name = target.name();
        self.within_budget(name, self.spending.sent(name), &key, size)?;
        self.spending.put()?;
        let receipt = self.send(target, &key, body).await?;
        self.spending.add(name, receipt.bytes);
        Ok(receipt)
    }

    /// Whether `size` more bytes at `key` keep what this deployment puts
    /// to the target `name` (`sent` so far) within its `max_gib`.
    fn within_budget(&self, name: &str, sent: u64, key: &Key, size: u64) -> Result<(), String> {
        self.spending.within_budget(name, sent, key.as_str(), size)
    }

    /// Sends `body` to `key`, reporting its progress and its receipt. The
    /// put starts (takes its place in an oci manifest) when this is
    /// called.
    fn send<'a>(
        &'a self,
        target: &'a Opened,
        key: &'a Key,
        body: Body,
    ) -> impl Future<Output = Result<Receipt, String>> + Send + 'a {
        let put =
            target
                .publisher
                .put_into(&target.pending, key, body, &*self.progress, &self.cancel);
        async move {
            let receipt = put.await.map_err(|e| self.said(e))?;
            Ok(self.recorded(receipt))
        }
    }

    /// `receipt` scrubbed (a destination's etag is its own words),
    /// reported and counted against the record's size.
    fn recorded(&self, receipt: Receipt) -> Receipt {
        let receipt = Receipt {
            etag: receipt.etag.map(|e| self.said(e)),
            ..receipt
        };
        self.reporter.published(&receipt);
        let size = receipt.target.len()
            + receipt.key.len()
            + receipt.url.len()
            + receipt.sha256.len()
            + receipt.etag.as_ref().map_or(0, String::len)
            + RECEIPT_OVERHEAD;
        self.spending.recorded(size as u64);
        receipt
    }

    /// The deployment's verification record, read once.
    async fn stamps(&mut self, target: &Opened) -> Result<Option<Arc<Stamps>>, String> {
        let deployment = self.deployment(target)?;
        if deployment.stamps.is_none()
            && let Some(record) = deployment.record.clone()
        {
            // An unreadable record is an empty one: every file is hashed.
            let stamps = tokio::task::spawn_blocking(move || Stamps::load(&record))
                .await
                .unwrap_or_default();
            if let Some(deployment) = &mut self.deployment {
                deployment.stamps = Some(Arc::new(stamps));
            }
        }
        Ok(self.deployment(target)?.stamps.clone())
    }

    fn key(&self, target: &Opened, key: &str) -> Result<Key, String> {
        Key::parse(key).map_err(|e| format!("target {:?}: {e}", target.name()))
    }

    fn deployment(&self, target: &Opened) -> Result<&Deployment, String> {
        self.deployment.as_ref().ok_or_else(|| {
            format!(
                "target {:?}: only deploy may put; describe and check-options may not",
                target.name()
            )
        })
    }
}

/// The host path and size of the regular file `path` names under
/// `out_dir` (relative to it, or under `/out`): never a link out of it, a
/// folder or a pipe. The guest waits on this call, so what is checked is
/// what is read.
fn out_file(out_dir: &Path, path: &str) -> Result<(PathBuf, u64), String> {
    let refuse = |why: &str| format!("put-out-file {path:?}: {why}");
    let relative = match path.strip_prefix(OUT_DIR) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest.trim_start_matches('/'),
        _ => path,
    };
    let relative = Path::new(relative);
    if relative.as_os_str().is_empty()
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(refuse(&format!(
            "name a file under {OUT_DIR}, relative to it or starting with {OUT_DIR}/ (no .., no other absolute path)"
        )));
    }
    let root = out_dir
        .canonicalize()
        .map_err(|e| refuse(&format!("the out-dir cannot be read: {e}")))?;
    // Missing, or leading out of the out-dir: one sentence, so that a
    // deployer cannot learn which paths exist on the host.
    let not_under = || refuse("no such file under the out-dir");
    let real = root
        .join(relative)
        .canonicalize()
        .map_err(|_| not_under())?;
    if !real.starts_with(&root) {
        return Err(not_under());
    }
    let meta = std::fs::metadata(&real).map_err(|e| refuse(&e.to_string()))?;
    if !meta.is_file() {
        return Err(refuse("not a regular file"));
    }
    Ok((real, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_files_are_regular_files_under_the_out_dir_only() {
        let dir = tempfile::TempDir::new().unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::write(out.join("sub/a.txt"), b"abc").unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), out.join("link")).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            out.join("fifo"),
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();

        let found = out_file(&out, "sub/a.txt").unwrap();
        assert_eq!(found.1, 3);
        assert_eq!(out_file(&out, "/out/sub/a.txt").unwrap(), found);
        for (path, why) in [
            ("../secret", "no .."),
            ("/etc/passwd", "no other absolute path"),
            ("", "name a file"),
            ("missing", "no such file"),
            ("link", "no such file under the out-dir"),
            ("sub", "not a regular file"),
            ("fifo", "not a regular file"),
        ] {
            let e = out_file(&out, path).unwrap_err();
            assert!(e.contains(why), "{path}: {e}");
        }
    }
}
