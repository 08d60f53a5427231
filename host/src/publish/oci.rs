//! OCI registries as targets (`oci://REGISTRY/NAMESPACE/`): a key
//! `REPO:TAG/PATH` is the file PATH of the artifact `NAMESPACE/REPO:TAG`.
//! A put pushes the bytes as a blob of that repository and records a layer
//! (titled PATH) in a `Pending` manifest; `finish` writes the manifests.
//!
//! A blob goes up once: the registry is asked first (`HEAD`) and a blob it
//! has in the repository is not sent again; one it may have in the
//! repository the model came from (an `oci://` source on the same
//! registry) is mounted from there; any other is uploaded — one `PUT` for
//! a blob up to a chunk, else `PATCH`es of a chunk each and the final
//! `PUT` — with the verified digest, which the registry checks, and the
//! last bytes of a file only once it hashed to that digest (`read`). An
//! upload that fails, is cancelled or dropped is cancelled at the registry
//! (`DELETE` of its session). A connection broken, or a 5xx, 408 or 429
//! answer, starts the blob again after a wait, up to `TRIES` times.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, LOCATION};
use reqwest::{Method, Response, StatusCode};
use tokio_util::sync::CancellationToken;

use super::read::{Piece, ReadError, Reading};
use super::{
    Body, Content, Error, Key, ObjectInfo, Put, Subject, Tally, Tuning, look_up_of, upload_of,
};
use crate::backoff::Backoff;
use crate::causes::innermost;
use crate::oci::manifest::{
    Descriptor, EMPTY_CONFIG, EMPTY_JSON, MODELPACK_PATH, Manifest, OCI_MANIFEST, TITLE,
};
use crate::oci::reference::{check_repository, check_tag};
use crate::oci::{Access, Login, Reference};
use crate::trust::Trust;

/// The artifact type of the manifests berth writes.
pub const ARTIFACT_TYPE: &str = "application/vnd.berth.model.v1";
/// The media type of a layer put from a file.
const OCTET_STREAM: &str = "application/octet-stream";
/// When the manifest was written (RFC 3339), as OCI annotates images.
const CREATED: &str = "org.opencontainers.image.created";
/// Bytes read from disk at a time; a chunk is made of several.
const READ: usize = 1 << 20;
/// Tries of one blob, the first included.
const TRIES: u32 = 3;
/// How much of a refusal's body a message quotes.
const QUOTED: usize = 300;
/// How long a failed put waits for the cancel of its upload session.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// The shape of a key, for refusals.
const SHAPE: &str = "REPO:TAG/PATH, e.g. \"llama-ft:job-7/adapter_model.safetensors\"";

/// A key on an oci target, read: where its file goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Place {
    /// `REPO`, as the key says it (relative to the namespace).
    repo: String,
    /// `NAMESPACE/REPO`: the repository at the registry.
    repository: String,
    tag: String,
    /// The file's path in the artifact: its layer's title.
    path: String,
}

impl Place {
    /// Reads `key` as `REPO:TAG/PATH` under `namespace`.
    pub(super) fn parse(namespace: &str, key: &Key) -> Result<Self, String> {
        let text = key.as_str();
        let refuse = |why: String| {
            format!("key {text:?} is not {SHAPE}, which an oci target's keys are: {why}")
        };
        let (repo, rest) = text
            .split_once(':')
            .ok_or_else(|| refuse("it has no :TAG".into()))?;
        let (tag, path) = rest
            .split_once('/')
            .ok_or_else(|| refuse("it names no /PATH after the tag".into()))?;
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

/// What a deployment's puts to one oci target leave for `finish` to write:
/// a manifest per `REPO:TAG`, in the order they were first put to, each
/// with its layers in the order the puts were made. A put of the same
/// PATH again replaces the layer. Nothing is written until `finish`: a
/// pending manifest never finished is simply not written (its blobs stay
/// unreferenced, for the registry's garbage collection). Empty for other
/// kinds of target. One per deployment and target.
#[derive(Default)]
pub struct Pending {
    /// Where the deployment's model came from, when that is an `oci://`
    /// reference: a blob of the same registry may be mounted from it.
    origin: Option<Reference>,
    manifests: Mutex<Vec<Manifested>>,
    next_id: AtomicU64,
}

/// One manifest being made.
struct Manifested {
    repo: String,
    repository: String,
    tag: String,
    layers: Vec<Layer>,
}

/// One put's layer: reserved when the put starts, filled when it lands.
struct Layer {
    id: u64,
    title: String,
    descriptor: Option<Descriptor>,
}

impl Pending {
    /// For a deployment whose model's `source` is `model_source`.
    pub fn new(model_source: &str) -> Self {
        Self {
            origin: Reference::parse(model_source).ok(),
            ..Self::default()
        }
    }

    /// Whether no put waits for a manifest.
    pub fn is_empty(&self) -> bool {
        self.manifests.lock().expect("never poisoned").is_empty()
    }

    /// Reserves `place`'s layer, after those reserved before.
    fn reserve(&self, place: &Place) -> Slot<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut manifests = self.manifests.lock().expect("never poisoned");
        let index = match manifests
            .iter()
            .position(|m| m.repository == place.repository && m.tag == place.tag)
        {
            Some(index) => index,
            None => {
                manifests.push(Manifested {
                    repo: place.repo.clone(),
                    repository: place.repository.clone(),
                    tag: place.tag.clone(),
                    layers: Vec::new(),
                });
                manifests.len() - 1
            }
        };
        manifests[index].layers.push(Layer {
            id,
            title: place.path.clone(),
            descriptor: None,
        });
        Slot {
            pending: self,
            id,
            filled: false,
        }
    }

    /// Layer `id` landed as `descriptor`; an earlier layer of the same
    /// title is replaced by it.
    fn fill(&self, id: u64, descriptor: Descriptor) {
        let mut manifests = self.manifests.lock().expect("never poisoned");
        for manifest in manifests.iter_mut() {
            let Some(at) = manifest.layers.iter().position(|l| l.id == id) else {
                continue;
            };
            let title = manifest.layers[at].title.clone();
            manifest.layers[at].descriptor = Some(descriptor);
            manifest
                .layers
                .retain(|l| l.id == id || l.title != title || l.descriptor.is_none());
            return;
        }
    }

    /// Layer `id` will not land: its place is given up, and a manifest
    /// left with no layer with it.
    fn release(&self, id: u64) {
        let mut manifests = self.manifests.lock().expect("never poisoned");
        for manifest in manifests.iter_mut() {
            manifest.layers.retain(|l| l.id != id);
        }
        manifests.retain(|m| !m.layers.is_empty());
    }

    /// The next manifest to write, taken out (`restore` puts it back).
    fn take(&self) -> Option<Manifested> {
        let mut manifests = self.manifests.lock().expect("never poisoned");
        (!manifests.is_empty()).then(|| manifests.remove(0))
    }

    fn restore(&self, manifest: Manifested) {
        self.manifests
            .lock()
            .expect("never poisoned")
            .insert(0, manifest);
    }
}

/// A put's reserved layer: given up when dropped unfilled (the put failed,
/// was cancelled or dropped).
pub(super) struct Slot<'a> {
    pending: &'a Pending,
    id: u64,
    filled: bool,
}

impl Slot<'_> {
    fn fill(mut self, descriptor: Descriptor) {
        self.pending.fill(self.id, descriptor);
        self.filled = true;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.filled {
            self.pending.release(self.id);
        }
    }
}

/// One registry, and the namespace the target's repositories are under.
pub(super) struct Registry {
    /// Shared with the tasks that cancel dropped upload sessions.
    client: Arc<crate::oci::Registry>,
    namespace: String,
    chunk: u64,
}

/// How one try of an upload ended, when not with the blob in place.
enum Failed {
    /// Worth another try: the connection broke, or the registry answered
    /// 5xx, 408 or 429. Says why.
    Again(String),
    Stop(Error),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Stop(e)
    }
}

impl Registry {
    pub(super) fn build(
        target: &str,
        registry: &str,
        namespace: &str,
        login: Option<Login>,
        trust: &Trust,
        tuning: Tuning,
    ) -> Result<Self, String> {
        let builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            // The client follows redirects itself, without credentials.
            .redirect(reqwest::redirect::Policy::none());
        let http = trust
            .reqwest(builder)
            .and_then(|b| b.build())
            .map_err(|e| innermost(&e))?;
        let origin = login
            .is_some()
            .then(|| format!("the target {target:?} (its options username and password)"));
        let client = crate::oci::Registry::new(http, registry, login, origin).with_login_hint(
            format!("the sources file: options username and password of the target {target:?}"),
        );
        Ok(Self {
            client: Arc::new(client),
            namespace: namespace.to_string(),
            chunk: tuning.chunk_bytes,
        })
    }

    pub(super) fn place(&self, subject: &Subject, key: &Key) -> Result<Place, Error> {
        Place::parse(&self.namespace, key).map_err(|reason| Error::Key {
            target: subject.target.clone(),
            reason,
        })
    }

    /// `oci://REGISTRY/NAMESPACE/REPO:TAG#PATH`: the artifact, and the
    /// file in it after the `#`.
    pub(super) fn url(&self, place: &Place) -> String {
        let artifact = self.reference(&place.repository, &place.tag, None);
        format!("{artifact}#{}", place.path)
    }

    /// The artifact `repository:tag`, and by digest when given.
    fn reference(&self, repository: &str, tag: &str, digest: Option<&str>) -> Reference {
        Reference {
            registry: self.client.name().to_string(),
            repository: repository.to_string(),
            tag: Some(tag.to_string()),
            digest: digest.map(str::to_string),
        }
    }

    /// Reserves the layer of `key` in `pending`, now: a manifest's layers
    /// are in the order the puts were made, not the order they landed.
    pub(super) fn reserve<'a>(
        &self,
        subject: &Subject,
        pending: &'a Pending,
        key: &Key,
    ) -> Result<(Place, Slot<'a>), Error> {
        let place = self.place(subject, key)?;
        let slot = pending.reserve(&place);
        Ok((place, slot))
    }

    /// Puts `body` as the blob of `place`'s repository and fills its
    /// layer: the receipt's url and what was put.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn put(
        &self,
        subject: &Subject,
        key: &Key,
        (place, slot): (Place, Slot<'_>),
        pending: &Pending,
        body: Body,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Put), Error> {
        let super::Digested {
            bytes,
            sha256,
            content_type,
            content,
        } = body.digested(subject, key, cancel).await?;
        let media_type = content_type.map_or_else(|| OCTET_STREAM.to_string(), |t| media_type(&t));
        let what = upload_of(key);
        self.push_blob(
            subject,
            &what,
            (key, &place.repository),
            (bytes, &sha256),
            &content,
            pending.origin.as_ref(),
            tally,
            cancel,
        )
        .await?;
        let mut annotations = BTreeMap::new();
        annotations.insert(TITLE.to_string(), place.path.clone());
        slot.fill(Descriptor {
            media_type,
            digest: format!("sha256:{sha256}"),
            size: bytes,
            annotations,
        });
        Ok((
            self.url(&place),
            Put {
                bytes,
                etag: Some(format!("sha256:{sha256}")),
                sha256,
            },
        ))
    }

    /// Makes the blob `sha256` of `bytes` bytes present in `repository`:
    /// looked up, mounted or uploaded.
    #[allow(clippy::too_many_arguments)]
    async fn push_blob(
        &self,
        subject: &Subject,
        what: &str,
        (key, repository): (&Key, &str),
        (bytes, sha256): (u64, &str),
        content: &Content,
        origin: Option<&Reference>,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(), Error> {
        let present = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            found = self.client.blob_size(repository, sha256, Access::Push) => {
                found.map_err(|e| said(subject, what, e))?
            }
        };
        if present == Some(bytes) {
            tracing::info!(
                target_name = %subject.target,
                "{key}: the registry has the blob sha256:{sha256} in {repository} already; \
                 not uploaded again"
            );
            return Ok(());
        }
        // Mounted only from another repository of the same registry.
        let mount = origin
            .filter(|o| o.registry == self.client.name() && o.repository != repository)
            .map(|o| o.repository.as_str());
        let mut backoff = Backoff::new();
        let mut tries = 0;
        loop {
            tries += 1;
            let why = match self
                .upload(
                    subject,
                    what,
                    (key, repository),
                    (bytes, sha256),
                    content,
                    mount,
                    tally,
                    cancel,
                )
                .await
            {
                Ok(()) => return Ok(()),
                Err(Failed::Stop(e)) => return Err(e),
                Err(Failed::Again(why)) if tries == TRIES => return Err(said(subject, what, why)),
                Err(Failed::Again(why)) => why,
            };
            super::wait_to_try_again(subject, what, &why, &mut backoff, cancel).await?;
        }
    }

    /// One try: a session started (or the blob mounted), the bytes sent in
    /// chunks as they are read, the last request carrying the digest.
    #[allow(clippy::too_many_arguments)]
    async fn upload(
        &self,
        subject: &Subject,
        what: &str,
        (key, repository): (&Key, &str),
        (bytes, sha256): (u64, &str),
        content: &Content,
        mount: Option<&str>,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(), Failed> {
        let mut start = self.client.url(repository, "blobs/uploads/");
        if let Some(from) = mount {
            start
                .query_pairs_mut()
                .append_pair("mount", &format!("sha256:{sha256}"))
                .append_pair("from", from);
        }
        let started = self
            .request(subject, what, repository, cancel, |http| {
                http.post(start.clone()).header(CONTENT_LENGTH, 0)
            })
            .await?;
        if mount.is_some() && started.status() == StatusCode::CREATED {
            tracing::info!(
                target_name = %subject.target,
                "{key}: the blob sha256:{sha256} was mounted into {repository} from {}",
                mount.unwrap_or_default()
            );
            return Ok(());
        }
        if started.status() != StatusCode::ACCEPTED {
            return Err(self.answered(subject, what, repository, started).await);
        }
        let mut session = Session {
            client: self.client.clone(),
            url: next_location(&start, &started).map_err(|e| subject.refused(what, e))?,
            repository: repository.to_string(),
            armed: true,
        };
        let sent = self
            .send_bytes(
                subject,
                what,
                (key, repository),
                (bytes, sha256),
                content,
                &mut session,
                tally,
                cancel,
            )
            .await;
        match sent {
            Ok(()) => {
                session.armed = false;
                Ok(())
            }
            Err(e) => {
                session.cancel().await;
                Err(e)
            }
        }
    }

    /// Sends the bytes of `content` into the open `session`: `PATCH`es of
    /// `chunk` bytes while more is to come, the rest with the final `PUT`,
    /// once the reading ended with the expected digest.
    #[allow(clippy::too_many_arguments)]
    async fn send_bytes(
        &self,
        subject: &Subject,
        what: &str,
        (key, repository): (&Key, &str),
        (bytes, sha256): (u64, &str),
        content: &Content,
        session: &mut Session,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(), Failed> {
        let mut pieces = match content {
            Content::Bytes(b) => Pieces::Bytes(Some(b.clone()), sha256.to_string()),
            Content::File(path, vouched) => Pieces::File(Reading::start(
                path.clone(),
                bytes,
                Some(sha256.to_string()),
                vouched.clone(),
                READ,
                // The last bytes come only once the file is known to be
                // the verified one.
                true,
                cancel.clone(),
            )),
        };
        let chunk = self.chunk as usize;
        let mut buffer = BytesMut::new();
        let mut offset = 0u64;
        loop {
            let piece = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(Error::Cancelled.into()),
                piece = pieces.next() => piece,
            };
            match piece {
                Some(Ok(Piece::Data(data))) => {
                    buffer.extend_from_slice(&data);
                    if buffer.len() >= chunk {
                        let body = buffer.split_to(chunk).freeze();
                        let len = body.len() as u64;
                        let range = format!("{offset}-{}", offset + len - 1);
                        let url = session.url.clone();
                        let answer = self
                            .request(subject, what, repository, cancel, |http| {
                                http.patch(url.clone())
                                    .header(CONTENT_TYPE, OCTET_STREAM)
                                    .header(CONTENT_RANGE, range.as_str())
                                    .header(CONTENT_LENGTH, len)
                                    .body(body.clone())
                            })
                            .await?;
                        if answer.status() != StatusCode::ACCEPTED {
                            return Err(self.answered(subject, what, repository, answer).await);
                        }
                        session.url = next_location(&url, &answer)
                            .map_err(|e| Failed::Stop(subject.refused(what, e)))?;
                        offset += len;
                        tally.reached(offset);
                    }
                }
                Some(Ok(Piece::End { .. })) => break,
                Some(Err(e)) => return Err(subject.source(key, e).into()),
                None if cancel.is_cancelled() => return Err(Error::Cancelled.into()),
                None => {
                    return Err(subject
                        .source(key, "reading the file stopped unexpectedly")
                        .into());
                }
            }
        }
        let body = buffer.freeze();
        let len = body.len() as u64;
        let mut url = session.url.clone();
        url.query_pairs_mut()
            .append_pair("digest", &format!("sha256:{sha256}"));
        let answer = self
            .request(subject, what, repository, cancel, |http| {
                let request = http
                    .put(url.clone())
                    .header(CONTENT_TYPE, OCTET_STREAM)
                    .header(CONTENT_LENGTH, len);
                // A chunk's range, after others; a whole blob needs none.
                let request = if offset > 0 && len > 0 {
                    request.header(CONTENT_RANGE, format!("{offset}-{}", offset + len - 1))
                } else {
                    request
                };
                request.body(body.clone())
            })
            .await?;
        if answer.status() != StatusCode::CREATED {
            return Err(self.answered(subject, what, repository, answer).await);
        }
        tally.reached(offset + len);
        Ok(())
    }

    /// Writes the pending manifests, each once its config blob (`{}`) is
    /// there; one receipt each. Those written are no longer pending; on a
    /// failure, the one that failed and those after it still are.
    pub(super) async fn finish(
        &self,
        subject: &Subject,
        pending: &Pending,
        cancel: &CancellationToken,
    ) -> Result<Vec<(String, String, Put)>, Error> {
        let mut written = Vec::new();
        while let Some(manifest) = pending.take() {
            match self.write(subject, &manifest, cancel).await {
                Ok(receipt) => written.push(receipt),
                Err(e) => {
                    pending.restore(manifest);
                    return Err(e);
                }
            }
        }
        Ok(written)
    }

    /// Writes one manifest: its key (`REPO:TAG`), url and what was put.
    async fn write(
        &self,
        subject: &Subject,
        manifest: &Manifested,
        cancel: &CancellationToken,
    ) -> Result<(String, String, Put), Error> {
        let key = format!("{}:{}", manifest.repo, manifest.tag);
        let what = format!("the manifest {key}");
        let repository = manifest.repository.as_str();
        let config = super::sha256_hex(EMPTY_JSON);
        // For the log lines of the config's blob.
        let named = Key::parse(&key).expect("REPO:TAG of a checked key is a key");
        let never = |_: u64| {};
        self.push_blob(
            subject,
            &what,
            (&named, repository),
            (EMPTY_JSON.len() as u64, &config),
            &Content::Bytes(Bytes::from_static(EMPTY_JSON)),
            None,
            &Tally::new(&never),
            cancel,
        )
        .await?;
        let mut annotations = BTreeMap::new();
        annotations.insert(
            CREATED.to_string(),
            humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        );
        let body = Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.to_string()),
            artifact_type: Some(ARTIFACT_TYPE.to_string()),
            config: Descriptor {
                media_type: EMPTY_CONFIG.to_string(),
                digest: format!("sha256:{config}"),
                size: EMPTY_JSON.len() as u64,
                annotations: BTreeMap::new(),
            },
            layers: manifest
                .layers
                .iter()
                .filter_map(|l| l.descriptor.clone())
                .collect(),
            annotations,
        };
        let body = Bytes::from(serde_json::to_vec(&body).expect("a manifest is JSON"));
        let digest = super::sha256_hex(&body);
        let url = self
            .client
            .url(repository, &format!("manifests/{}", manifest.tag));
        let answer = self
            .request(subject, &what, repository, cancel, |http| {
                http.put(url.clone())
                    .header(CONTENT_TYPE, OCI_MANIFEST)
                    .body(body.clone())
            })
            .await
            .map_err(|failed| match failed {
                Failed::Stop(e) => e,
                Failed::Again(why) => said(subject, &what, why),
            })?;
        if answer.status() != StatusCode::CREATED {
            return Err(
                match self.answered(subject, &what, repository, answer).await {
                    Failed::Stop(e) => e,
                    Failed::Again(why) => subject.refused(&what, why),
                },
            );
        }
        if let Some(said) = answer
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            && said != format!("sha256:{digest}")
        {
            return Err(subject.refused(
                &what,
                format!("the registry stored it as {said}, not the sha256:{digest} sent"),
            ));
        }
        let reference = self.reference(repository, &manifest.tag, Some(&digest));
        Ok((
            key,
            reference.to_string(),
            Put {
                bytes: body.len() as u64,
                etag: Some(format!("sha256:{digest}")),
                sha256: digest,
            },
        ))
    }

    /// The layer titled PATH in the manifest `REPO:TAG`, if both exist.
    pub(super) async fn stat(
        &self,
        subject: &Subject,
        key: &Key,
        place: &Place,
    ) -> Result<Option<ObjectInfo>, Error> {
        let what = look_up_of(key);
        let found = self
            .client
            .manifest_if_any(&place.repository, &place.tag)
            .await
            .map_err(|e| said(subject, &what, e))?;
        let Some((_, manifest, _)) = found else {
            return Ok(None);
        };
        Ok(manifest
            .layers
            .iter()
            .find(|layer| {
                layer
                    .annotations
                    .get(MODELPACK_PATH)
                    .or_else(|| layer.annotations.get(TITLE))
                    == Some(&place.path)
            })
            .map(|layer| ObjectInfo {
                bytes: layer.size,
                etag: Some(layer.digest.clone()),
            }))
    }

    /// Sends what `build` makes for `repository` with push access; a
    /// connection that broke is `Again`, as are answers worth another try.
    async fn request(
        &self,
        subject: &Subject,
        what: &str,
        repository: &str,
        cancel: &CancellationToken,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Response, Failed> {
        let answer = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Error::Cancelled.into()),
            answer = self.client.send(repository, Access::Push, build) => answer,
        };
        match answer {
            Ok(response) if worth_retrying(response.status()) => {
                Err(Failed::Again(format!("it answered {}", response.status())))
            }
            Ok(response) => Ok(response),
            Err(e) if e.starts_with("cannot reach the registry") => Err(Failed::Again(e)),
            Err(e) => Err(said(subject, what, e).into()),
        }
    }

    /// An answer that is not the expected one, for a message: its status
    /// and the start of its body (the registry's error document).
    async fn answered(
        &self,
        subject: &Subject,
        what: &str,
        repository: &str,
        response: Response,
    ) -> Failed {
        let status = response.status();
        if status == StatusCode::FORBIDDEN {
            return subject
                .refused(what, self.client.refused(repository))
                .into();
        }
        let mut said = Vec::new();
        let mut response = response;
        while said.len() < QUOTED {
            match response.chunk().await {
                Ok(Some(chunk)) => said.extend_from_slice(&chunk),
                _ => break,
            }
        }
        let said = String::from_utf8_lossy(&said[..said.len().min(QUOTED)])
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let reason = if said.is_empty() {
            format!("it answered {status}")
        } else {
            format!("it answered {status}: {said}")
        };
        subject.refused(what, reason).into()
    }
}

/// The registry client's words (or an answer's, "it answered 503"), as a
/// refusal or as no answer.
fn said(subject: &Subject, what: &str, e: String) -> Error {
    if e.starts_with("cannot reach the registry") {
        subject.unreachable(what, e)
    } else {
        subject.refused(what, e)
    }
}

/// Whether an answer may be different next time.
fn worth_retrying(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

/// Where an upload continues: the answer's `Location`, relative to the
/// request's URL.
fn next_location(request: &url::Url, answer: &Response) -> Result<url::Url, String> {
    answer
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|l| request.join(l).ok())
        .filter(|next| matches!(next.scheme(), "http" | "https"))
        .ok_or_else(|| {
            format!(
                "the registry answered {} with no upload location to continue at",
                answer.status()
            )
        })
}

/// A layer's media type for bytes put with `content_type`: its
/// `type/subtype` without parameters when it is one, else
/// `application/octet-stream`.
fn media_type(content_type: &str) -> String {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    let part = |p: &str| {
        (1..=127).contains(&p.len())
            && p.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
    };
    match essence.split_once('/') {
        Some((kind, sub)) if part(kind) && part(sub) => essence.to_ascii_lowercase(),
        _ => OCTET_STREAM.to_string(),
    }
}

/// What an upload sends, in order: bytes in memory, or a file being read.
enum Pieces {
    Bytes(Option<Bytes>, String),
    File(Reading),
}

impl Pieces {
    async fn next(&mut self) -> Option<Result<Piece, ReadError>> {
        match self {
            Pieces::Bytes(data, sha256) => Some(Ok(match data.take() {
                Some(data) => Piece::Data(data),
                None => Piece::End {
                    sha256: sha256.clone(),
                },
            })),
            Pieces::File(reading) => reading.next().await,
        }
    }
}

/// An upload session not yet completed: cancelled at the registry when
/// the upload fails (`cancel`) or, if its future is dropped first, by a
/// task spawned on drop. A registry also forgets old sessions by itself;
/// this only does it sooner.
struct Session {
    client: Arc<crate::oci::Registry>,
    url: url::Url,
    repository: String,
    armed: bool,
}

impl Session {
    async fn cancel(&mut self) {
        self.armed = false;
        cancel_session(&self.client, &self.repository, &self.url).await;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (client, repository, url) = (
            self.client.clone(),
            self.repository.clone(),
            self.url.clone(),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { cancel_session(&client, &repository, &url).await });
        }
    }
}

/// `DELETE`s an upload session, waiting at most `CANCEL_WAIT`; a session
/// that stays is forgotten by the registry later.
async fn cancel_session(client: &crate::oci::Registry, repository: &str, url: &url::Url) {
    let request = client.send(repository, Access::Push, |http| {
        http.request(Method::DELETE, url.clone())
    });
    let _ = tokio::time::timeout(CANCEL_WAIT, request).await;
}
