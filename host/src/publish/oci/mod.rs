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

pub(super) mod pending;
mod place;
mod referrer;
mod upload;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::header::CONTENT_TYPE;
use reqwest::{Response, StatusCode};
use tokio_util::sync::CancellationToken;

use super::destination::Destination;
use super::{
    Body, Content, Error, Key, ObjectInfo, Put, Subject, Tally, Tuning, look_up_of, upload_of,
    worth_retrying,
};
use crate::oci::manifest::{
    Descriptor, EMPTY_CONFIG, EMPTY_JSON, MODELPACK_PATH, Manifest, OCI_MANIFEST, TITLE,
};
use crate::oci::{Access, Login, Reference};
use crate::trust::Trust;
use pending::Manifested;
pub use pending::Pending;
use pending::Slot;
pub(super) use place::Place;

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
/// How much of a refusal's body is read for its error codes.
const ERROR_DOCUMENT: usize = 16 << 10;
/// How long a failed put waits for the cancel of its upload session.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

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
    Again(crate::oci::Error),
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
        // The registry client follows redirects itself, without credentials.
        let http = super::client(trust)?;
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
    fn url_of(&self, place: &Place) -> String {
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
        // For the log lines of the config's blob.
        let named = Key::parse(&key).expect("REPO:TAG of a checked key is a key");
        let config = self
            .empty_config(subject, &what, (&named, repository), cancel)
            .await?;
        let body = Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.to_string()),
            artifact_type: Some(ARTIFACT_TYPE.to_string()),
            config,
            layers: manifest
                .layers
                .iter()
                .filter_map(|l| l.descriptor.clone())
                .collect(),
            subject: None,
            annotations: created_now(),
        };
        let body = Bytes::from(serde_json::to_vec(&body).expect("a manifest is JSON"));
        let at = (repository, manifest.tag.as_str());
        let (digest, _) = self
            .put_manifest(subject, &what, at, (OCI_MANIFEST, &body), cancel)
            .await?;
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

    /// Makes the empty config (`{}`) that artifacts use present in
    /// `repository`: its descriptor. `key` names it in log lines.
    async fn empty_config(
        &self,
        subject: &Subject,
        what: &str,
        (key, repository): (&Key, &str),
        cancel: &CancellationToken,
    ) -> Result<Descriptor, Error> {
        let config = super::sha256_hex(EMPTY_JSON);
        let never = |_: u64| {};
        self.push_blob(
            subject,
            what,
            (key, repository),
            (EMPTY_JSON.len() as u64, &config),
            &Content::Bytes(Bytes::from_static(EMPTY_JSON)),
            None,
            &Tally::new(&never),
            cancel,
        )
        .await?;
        Ok(Descriptor {
            media_type: EMPTY_CONFIG.to_string(),
            digest: format!("sha256:{config}"),
            size: EMPTY_JSON.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        })
    }

    /// PUTs `body`, a manifest or index of `media_type`, at `reference` (a
    /// tag or `sha256:…`) of `repository`: its sha256, once the registry
    /// created it and stored it as that, and the answer's headers.
    async fn put_manifest(
        &self,
        subject: &Subject,
        what: &str,
        (repository, reference): (&str, &str),
        (media_type, body): (&str, &Bytes),
        cancel: &CancellationToken,
    ) -> Result<(String, reqwest::header::HeaderMap), Error> {
        let digest = super::sha256_hex(body);
        let url = self
            .client
            .url(repository, &format!("manifests/{reference}"));
        let answer = self
            .request(subject, what, repository, cancel, |http| {
                http.put(url.clone())
                    .header(CONTENT_TYPE, media_type)
                    .body(body.clone())
            })
            .await
            .map_err(|failed| match failed {
                Failed::Stop(e) => e,
                Failed::Again(why) => said(subject, what, why),
            })?;
        if answer.status() != StatusCode::CREATED {
            return Err(
                match self.answered(subject, what, repository, answer).await {
                    Failed::Stop(e) => e,
                    Failed::Again(why) => said(subject, what, why),
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
                what,
                format!("the registry stored it as {said}, not the sha256:{digest} sent"),
            ));
        }
        Ok((digest, answer.headers().clone()))
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
            Ok(response) if worth_retrying(response.status()) => Err(Failed::Again(
                crate::oci::Error::Answered(format!("it answered {}", response.status())),
            )),
            Ok(response) => Ok(response),
            Err(e @ crate::oci::Error::Unreachable(_)) => Err(Failed::Again(e)),
            Err(e) => Err(said(subject, what, e).into()),
        }
    }

    /// An answer that is not the expected one, for a message: its status
    /// and the codes of the registry's error document. Its messages are
    /// not quoted: a registry may echo the request, and the request
    /// carries a token berth got for the login, one no scrubber knows.
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
        let codes = error_codes(response).await;
        let reason = if codes.is_empty() {
            format!("it answered {status}")
        } else {
            format!("it answered {status} ({})", codes.join(", "))
        };
        subject.refused(what, reason).into()
    }
}

impl Destination for Registry {
    /// The folder `key` names (`REPO:TAG`, or `REPO:TAG/DIR`): the
    /// artifact, or `…#DIR/`.
    fn folder_url(&self, subject: &Subject, key: &Key) -> Result<String, Error> {
        let place = Place::folder(&self.namespace, key).map_err(|reason| Error::Key {
            target: subject.target.clone(),
            reason,
        })?;
        let artifact = self.reference(&place.repository, &place.tag, None);
        Ok(match place.path.as_str() {
            "" => artifact.to_string(),
            path => format!("{artifact}#{path}/"),
        })
    }

    /// `oci://REGISTRY/NAMESPACE/REPO:TAG#PATH`; a key of another shape
    /// is refused.
    fn url(&self, subject: &Subject, key: &Key) -> Result<String, Error> {
        Ok(self.url_of(&self.place(subject, key)?))
    }

    /// Reserves the layer of `key` in `pending`, now: a manifest's layers
    /// are in the order the puts were made, not the order they landed.
    fn reserve<'p>(
        &self,
        subject: &Subject,
        pending: &'p Pending,
        key: &Key,
    ) -> Result<Option<Slot<'p>>, Error> {
        let place = self.place(subject, key)?;
        Ok(Some(pending.reserve(&place)))
    }

    /// Puts `body` as the blob of `key`'s repository and fills its
    /// layer: the receipt's url and what was put.
    async fn put(
        &self,
        subject: &Subject,
        key: &Key,
        layer: Option<Slot<'_>>,
        body: Body,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Put), Error> {
        let slot = layer.expect("an oci put reserves its layer");
        let place = self.place(subject, key)?;
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
            slot.origin(),
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
            artifact_type: None,
            annotations,
        });
        Ok((
            self.url_of(&place),
            Put {
                bytes,
                etag: Some(format!("sha256:{sha256}")),
                sha256,
            },
        ))
    }

    /// Writes the pending manifests, each once its config blob (`{}`) is
    /// there; one receipt each. Those written are no longer pending; on a
    /// failure, the one that failed and those after it still are.
    async fn finish(
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

    /// The layer titled PATH in the manifest `REPO:TAG`, if both exist.
    async fn stat(&self, subject: &Subject, key: &Key) -> Result<Option<ObjectInfo>, Error> {
        let place = self.place(subject, key)?;
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
}

/// The `code`s of a distribution-spec error document
/// (`{"errors": [{"code": "BLOB_UNKNOWN", …}]}`): upper-case words of the
/// spec's vocabulary, nothing a request could have put there.
async fn error_codes(response: Response) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Document {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: String,
    }
    let body = super::start_of(response, ERROR_DOCUMENT).await;
    let Ok(document) = serde_json::from_slice::<Document>(&body) else {
        return Vec::new();
    };
    document
        .errors
        .into_iter()
        .map(|e| e.code)
        .filter(|c| {
            (1..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        })
        .take(8)
        .collect()
}

/// The registry client's words, as no answer or as a refusal.
fn said(subject: &Subject, what: &str, e: crate::oci::Error) -> Error {
    match e {
        crate::oci::Error::Unreachable(e) => subject.unreachable(what, e),
        crate::oci::Error::Answered(e) => subject.refused(what, e),
    }
}

/// The annotations of a manifest written now: when, as OCI annotates
/// images (RFC 3339).
fn created_now() -> BTreeMap<String, String> {
    let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    BTreeMap::from([(CREATED.to_string(), now)])
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
