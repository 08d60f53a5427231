//! Google Cloud Storage buckets as targets, through the JSON API's
//! resumable uploads (object_store's GCS client uploads through the XML
//! API, which carries no CRC32C and leaves no session to cancel): a
//! session is opened with the object's name and type, the file follows in
//! chunks one after another, and the last chunk carries the CRC32C of the
//! whole (`X-Goog-Hash`), which the store checks before the object exists.
//! berth checks in turn the size and CRC32C the store answers with, and
//! removes an object that is not what it sent (an emulator may not check).
//! Nothing is visible under the key until the last chunk is taken; a put
//! that fails or is cancelled deletes its session (`Session`), however it
//! ends. The credential is object_store's (`crate::cloud::gcs`: a service
//! account, application default credentials or the metadata server), a
//! bearer token sent to the store's own origin only.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use object_store::gcp::{GcpCredentialProvider, GoogleConfigKey};
use reqwest::header::{AUTHORIZATION, CONTENT_RANGE, CONTENT_TYPE, LOCATION, RANGE};
use reqwest::{Response, StatusCode};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::answers::{TRIES, quote, retrying};
use super::destination::Destination;
use super::oci::pending::Slot;
use super::parts::object_name;
use super::read::{Piece, ReadError, Reading};
use super::{Body, Error, Key, ObjectInfo, Put, Subject, Tally, Tuning, look_up_of, upload_of};
use crate::causes::innermost;
use crate::cloud;
use crate::trust::Trust;

/// GCS takes a resumable upload's chunks in multiples of this, but for
/// the last.
const QUANTUM: u64 = 256 << 10;
/// The JSON API's origin, unless the target's `base_url` says otherwise.
const GOOGLE: &str = "https://storage.googleapis.com";
/// How long a failed or cancelled put waits for its session's deletion
/// before leaving it to a task of its own.
const ABORT_WAIT: Duration = Duration::from_secs(5);

/// One bucket's client, and what messages say about it.
pub(super) struct Bucket {
    client: reqwest::Client,
    credentials: GcpCredentialProvider,
    bucket: String,
    /// The JSON API's origin: where tokens and requests go.
    base: url::Url,
    /// Where the credential comes from, for "refused" messages.
    said: String,
    tuning: Tuning,
}

/// What the store says of an object.
#[derive(Deserialize)]
struct Stored {
    size: String,
    crc32c: Option<String>,
    etag: Option<String>,
    generation: Option<String>,
}

impl Bucket {
    pub(super) fn build(
        name: &str,
        url: &url::Url,
        options: &[(GoogleConfigKey, String)],
        trust: &Trust,
        tuning: Tuning,
    ) -> Result<Self, String> {
        let bucket = url.host_str().unwrap_or_default().to_string();
        let builder = cloud::gcs(&bucket, trust, options, false).map_err(|e| innermost(&e))?;
        let base = builder
            .get_config_value(&GoogleConfigKey::BaseUrl)
            .unwrap_or_else(|| GOOGLE.to_string());
        let base = url::Url::parse(&base).map_err(|e| format!("base_url {base:?}: {e}"))?;
        let store = builder.build().map_err(|e| innermost(&e))?;
        Ok(Self {
            client: super::client(trust)?,
            credentials: store.credentials().clone(),
            bucket,
            base,
            said: cloud::gcs_credential(Some(&format!("target {name:?}")), options, false),
            tuning,
        })
    }

    /// The JSON API's url `segments` under the origin.
    fn api<'s>(&self, segments: impl IntoIterator<Item = &'s str>) -> url::Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) base url")
            .pop_if_empty()
            .extend(segments);
        url
    }

    /// The `Authorization` value of the moment, if the credential is one
    /// (an emulator's `disable_oauth` gives none).
    async fn bearer(&self, subject: &Subject, what: &str) -> Result<Option<String>, Error> {
        match self.credentials.get_credential().await {
            Ok(credential) if credential.bearer.is_empty() => Ok(None),
            Ok(credential) => Ok(Some(format!("Bearer {}", credential.bearer))),
            Err(e) => Err(subject.refused(
                what,
                format!(
                    "no credential could be had: {} (the credentials are {})",
                    innermost(&e),
                    self.said
                ),
            )),
        }
    }

    /// Opens a resumable upload of `total` bytes at `name`.
    async fn open(
        &self,
        subject: &Subject,
        what: &str,
        (name, content_type, total): (&str, &str, u64),
        cancel: &CancellationToken,
    ) -> Result<Session, Error> {
        let auth = self.bearer(subject, what).await?;
        let mut url = self.api(["upload", "storage", "v1", "b", &self.bucket, "o"]);
        url.query_pairs_mut()
            .append_pair("uploadType", "resumable")
            .append_pair("name", name);
        let metadata = serde_json::json!({ "name": name, "contentType": content_type });
        let answer = retrying(subject, what, cancel, || {
            let mut request = self
                .client
                .post(url.clone())
                .header("x-upload-content-type", content_type)
                .header("x-upload-content-length", total)
                .json(&metadata);
            if let Some(auth) = &auth {
                request = request.header(AUTHORIZATION, auth);
            }
            cancellable(request.send(), cancel)
        })
        .await?;
        if !answer.status().is_success() {
            return Err(self.refusal(subject, what, answer).await);
        }
        let session = answer
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .and_then(|l| url::Url::parse(l).ok())
            .ok_or_else(|| subject.refused(what, "the store opened no upload session"))?;
        // The session url is a capability, and the token goes with it: to
        // the store's own origin and nowhere else.
        if session.origin() != self.base.origin() {
            return Err(subject.refused(
                what,
                format!(
                    "the store put its upload session elsewhere ({}), where its credential does not go",
                    session.origin().ascii_serialization()
                ),
            ));
        }
        Ok(Session {
            client: self.client.clone(),
            url: session,
            auth,
            armed: true,
        })
    }

    /// Sends `chunk`, bytes `offset…` of `total`: the last one with the
    /// whole's CRC32C (`crc`). What the store then holds, once complete.
    /// A broken request is tried again from where the store says the
    /// session stands.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        subject: &Subject,
        what: &str,
        session: &Session,
        (offset, chunk, total): (u64, Bytes, u64),
        crc: Option<u32>,
        cancel: &CancellationToken,
    ) -> Result<Option<Stored>, Error> {
        let end = offset + chunk.len() as u64;
        let mut from = offset;
        let mut backoff = crate::backoff::Backoff::new();
        for tries in 1..=TRIES {
            let part = chunk.slice((from - offset) as usize..);
            let range = match part.is_empty() {
                true => format!("bytes */{total}"),
                false => format!("bytes {from}-{}/{total}", end - 1),
            };
            let mut request = session
                .request(reqwest::Method::PUT)
                .header(CONTENT_RANGE, range)
                .header(CONTENT_TYPE, "application/octet-stream")
                .body(part);
            if let Some(crc) = crc {
                let field = format!("crc32c={}", BASE64.encode(crc.to_be_bytes()));
                request = request.header("x-goog-hash", field);
            }
            let why = match cancellable(request.send(), cancel).await? {
                Ok(answer) if answer.status() == StatusCode::PERMANENT_REDIRECT => {
                    match persisted(&answer) {
                        n if n == end && crc.is_none() => return Ok(None),
                        n if (from..end).contains(&n) && n > from => {
                            // It kept part of the chunk: the rest now.
                            from = n;
                            continue;
                        }
                        n => format!("it holds {n} bytes of the {end} sent"),
                    }
                }
                Ok(answer) if answer.status().is_success() && crc.is_some() => {
                    return stored(subject, what, answer).await.map(Some);
                }
                Ok(answer) if answer.status().is_success() => {
                    return Err(subject.refused(what, "the store completed the object early"));
                }
                Ok(answer) if tries < TRIES && super::worth_retrying(answer.status()) => {
                    format!("it answered {}", answer.status())
                }
                Ok(answer) => return Err(self.refusal(subject, what, answer).await),
                Err(e) if tries < TRIES => innermost(&e.without_url()),
                Err(e) => return Err(subject.unreachable(what, innermost(&e.without_url()))),
            };
            super::wait_to_try_again(subject, what, &why, &mut backoff, cancel).await?;
            // Where the session stands: GCS may have kept none, part or all
            // of what was sent.
            let asked = session
                .request(reqwest::Method::PUT)
                .header(CONTENT_RANGE, format!("bytes */{total}"))
                .send();
            match cancellable(asked, cancel).await? {
                Ok(answer) if answer.status() == StatusCode::PERMANENT_REDIRECT => {
                    let n = persisted(&answer);
                    if !(offset..=end).contains(&n) {
                        return Err(subject.refused(
                            what,
                            format!(
                                "the store holds {n} bytes of the upload, not {offset} to {end}"
                            ),
                        ));
                    }
                    from = n;
                }
                Ok(answer) if answer.status().is_success() && crc.is_some() => {
                    return stored(subject, what, answer).await.map(Some);
                }
                _ => {}
            }
        }
        Err(subject.unreachable(what, "the store kept breaking off the upload"))
    }

    /// The store's refusal, in words a person can act on; never the
    /// credential (the words are scrubbed by the caller too).
    async fn refusal(&self, subject: &Subject, what: &str, answer: Response) -> Error {
        let status = answer.status();
        let body = quote(answer, &subject.scrubber).await;
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(body);
        let reason = match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                format!("{status}: {message} (the credentials are {})", self.said)
            }
            StatusCode::NOT_FOUND => format!(
                "{status}: {message} (is there a bucket {} at {}?)",
                self.bucket,
                self.base.origin().ascii_serialization()
            ),
            _ => format!("{status}: {message}"),
        };
        subject.refused(what, reason)
    }

    /// Removes the object `name` the store just made, if still that
    /// generation: what it holds is not what was sent.
    async fn remove(&self, subject: &Subject, what: &str, name: &str, generation: Option<&str>) {
        let Ok(auth) = self.bearer(subject, what).await else {
            return;
        };
        let mut url = self.api(["storage", "v1", "b", &self.bucket, "o", name]);
        if let Some(generation) = generation {
            url.query_pairs_mut()
                .append_pair("ifGenerationMatch", generation);
        }
        let mut request = self.client.delete(url);
        if let Some(auth) = auth {
            request = request.header(AUTHORIZATION, auth);
        }
        if let Err(e) = request.send().await {
            tracing::warn!(
                target_name = %subject.target,
                object = name,
                "cannot remove an object that is not what was sent: {}",
                innermost(&e.without_url())
            );
        }
    }
}

impl Destination for Bucket {
    async fn put(
        &self,
        subject: &Subject,
        key: &Key,
        _layer: Option<Slot<'_>>,
        body: Body,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Put), Error> {
        let what = upload_of(key);
        let url = subject.join(key);
        let name = object_name(&url, 0).map_err(|e| subject.refused(&what, e))?;
        let (total, content_type, mut pieces) = match body {
            Body::Bytes {
                bytes,
                content_type,
            } => {
                let sha256 = super::sha256_hex(&bytes);
                (
                    bytes.len() as u64,
                    content_type,
                    Pieces::Bytes(vec![Piece::End { sha256 }, Piece::Data(bytes)]),
                )
            }
            Body::File {
                path,
                bytes,
                sha256,
                vouched,
            } => {
                let chunk = self.tuning.chunk_bytes.next_multiple_of(QUANTUM);
                let reading = Reading::start(
                    path,
                    bytes,
                    sha256,
                    vouched,
                    chunk as usize,
                    true,
                    cancel.clone(),
                );
                (
                    bytes,
                    "application/octet-stream".to_string(),
                    Pieces::File(reading),
                )
            }
        };
        let mut session = self
            .open(subject, &what, (&name, &content_type, total), cancel)
            .await?;
        let sent = self
            .send_all(
                subject,
                (key, &what),
                &session,
                &mut pieces,
                total,
                tally,
                cancel,
            )
            .await;
        let (sha256, stored, crc) = match sent {
            Ok(sent) => sent,
            Err(e) => {
                session.cancel(subject).await;
                return Err(e);
            }
        };
        session.armed = false;
        let ours = BASE64.encode(crc.to_be_bytes());
        if stored.size != total.to_string() || stored.crc32c.as_deref() != Some(ours.as_str()) {
            self.remove(subject, &what, &name, stored.generation.as_deref())
                .await;
            return Err(subject.refused(
                &what,
                format!(
                    "the store kept {} bytes with CRC32C {}, not the {total} bytes sent (CRC32C \
                     {ours}); the object was removed",
                    stored.size,
                    stored.crc32c.as_deref().unwrap_or("none")
                ),
            ));
        }
        Ok((
            url.to_string(),
            Put {
                bytes: total,
                sha256,
                etag: stored.etag,
            },
        ))
    }

    async fn stat(&self, subject: &Subject, key: &Key) -> Result<Option<ObjectInfo>, Error> {
        let what = look_up_of(key);
        let name = object_name(&subject.join(key), 0).map_err(|e| subject.refused(&what, e))?;
        let auth = self.bearer(subject, &what).await?;
        let url = self.api(["storage", "v1", "b", &self.bucket, "o", &name]);
        let never = CancellationToken::new();
        let answer = retrying(subject, &what, &never, || {
            let mut request = self.client.get(url.clone());
            if let Some(auth) = &auth {
                request = request.header(AUTHORIZATION, auth);
            }
            async { Ok(request.send().await) }
        })
        .await?;
        match answer.status() {
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => {
                let stored = stored(subject, &what, answer).await?;
                let bytes = stored.size.parse().map_err(|_| {
                    subject.refused(&what, format!("the store gave a size of {:?}", stored.size))
                })?;
                Ok(Some(ObjectInfo {
                    bytes,
                    etag: stored.etag,
                }))
            }
            _ => Err(self.refusal(subject, &what, answer).await),
        }
    }
}

impl Bucket {
    /// Sends every piece, a chunk behind the reading so the last one is
    /// known as the last: the file's digest, what the store holds, and
    /// the CRC32C of what was sent.
    #[allow(clippy::too_many_arguments)]
    async fn send_all(
        &self,
        subject: &Subject,
        (key, what): (&Key, &str),
        session: &Session,
        pieces: &mut Pieces,
        total: u64,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Stored, u32), Error> {
        let mut held: Option<Bytes> = None;
        let (mut offset, mut crc) = (0u64, 0u32);
        loop {
            let piece = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(Error::Cancelled),
                piece = pieces.next() => piece,
            };
            match piece {
                Some(Ok(Piece::Data(chunk))) => {
                    crc = crc32c::crc32c_append(crc, &chunk);
                    if let Some(ready) = held.replace(chunk) {
                        let len = ready.len() as u64;
                        self.send(subject, what, session, (offset, ready, total), None, cancel)
                            .await?;
                        offset += len;
                        tally.reached(offset);
                    }
                }
                Some(Ok(Piece::End { sha256 })) => {
                    let last = held.take().unwrap_or_default();
                    let stored = self
                        .send(
                            subject,
                            what,
                            session,
                            (offset, last, total),
                            Some(crc),
                            cancel,
                        )
                        .await?
                        .expect("the last chunk completes the object");
                    return Ok((sha256, stored, crc));
                }
                Some(Err(e)) => return Err(subject.source(key, e)),
                None if cancel.is_cancelled() => return Err(Error::Cancelled),
                None => return Err(subject.source(key, "reading the file stopped unexpectedly")),
            }
        }
    }
}

/// What a put sends: a file as it is read, or bytes at hand (popped from
/// the end: their data, then their digest).
enum Pieces {
    File(Reading),
    Bytes(Vec<Piece>),
}

impl Pieces {
    async fn next(&mut self) -> Option<Result<Piece, ReadError>> {
        match self {
            Pieces::File(reading) => reading.next().await,
            Pieces::Bytes(pieces) => pieces.pop().map(Ok),
        }
    }
}

/// An open resumable upload: deleted when the put fails or is cancelled
/// (`cancel`), or, if its future is dropped first, by a task spawned on
/// drop, so no session holds bytes that will never be an object.
struct Session {
    client: reqwest::Client,
    /// A capability: never logged, never in a message.
    url: url::Url,
    auth: Option<String>,
    armed: bool,
}

impl Session {
    fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let request = self.client.request(method, self.url.clone());
        match &self.auth {
            Some(auth) => request.header(AUTHORIZATION, auth),
            None => request,
        }
    }

    /// Deletes the session now, waiting at most `ABORT_WAIT`; past that,
    /// the drop leaves it to a task.
    async fn cancel(&mut self, subject: &Subject) {
        let deleted = self.request(reqwest::Method::DELETE).send();
        if let Ok(answer) = tokio::time::timeout(ABORT_WAIT, deleted).await {
            self.armed = false;
            if let Err(e) = answer {
                tracing::warn!(
                    target_name = %subject.target,
                    "cannot cancel an upload session (GCS ends it within a week): {}",
                    innermost(&e.without_url())
                );
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let deleted = self.request(reqwest::Method::DELETE).send();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = deleted.await {
                        tracing::warn!(
                            "cannot cancel an upload session (GCS ends it within a week): {}",
                            innermost(&e.without_url())
                        );
                    }
                });
            }
            Err(_) => tracing::warn!("an upload session is left open: no runtime to cancel it on"),
        }
    }
}

/// How many bytes a `308` says the session holds (`Range: bytes=0-N`).
fn persisted(answer: &Response) -> u64 {
    answer
        .headers()
        .get(RANGE)
        .and_then(|r| r.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes=0-"))
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |last| last + 1)
}

/// The object the store describes in `answer`.
async fn stored(subject: &Subject, what: &str, answer: Response) -> Result<Stored, Error> {
    answer.json().await.map_err(|e| {
        subject.refused(
            what,
            format!(
                "the store's answer is not an object's: {}",
                innermost(&e.without_url())
            ),
        )
    })
}

/// `request`, or `Error::Cancelled` as soon as `cancel` is.
async fn cancellable<F: std::future::Future>(
    request: F,
    cancel: &CancellationToken,
) -> Result<F::Output, Error> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::Cancelled),
        answer = request => Ok(answer),
    }
}
