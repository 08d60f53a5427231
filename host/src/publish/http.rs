//! HTTP mirrors as targets: a `PUT` of the body to the target's url
//! joined with the key, with the target's headers (its credentials), the
//! body's digest for the mirror to check (`Content-Digest` and
//! `Repr-Digest`, RFC 9530: the same value, as berth sends no content
//! coding) and its `Content-Length`. A file is streamed from disk; when its
//! digest is expected, the last chunk is sent only once the file hashed to
//! it, so a mirror never receives a whole body that is not the verified
//! one. Redirects are never followed: the credentials go to the target's
//! url and nowhere else. A broken connection or a 5xx answer is tried
//! again after a wait (`crate::backoff`).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, ETAG, HeaderMap, LOCATION};
use reqwest::{Response, StatusCode};
use tokio_util::sync::CancellationToken;

use super::answers::retrying;
use super::destination::Destination;
use super::oci::pending::Slot;
use super::read::{Piece, ReadError, Reading};
use super::{Body, Content, Error, Key, ObjectInfo, Put, Subject, Tally, look_up_of, upload_of};
use crate::trust::Trust;

/// Bytes read from disk at a time; a few are buffered.
const CHUNK: usize = 256 << 10;
/// How often the bytes sent are told to the caller during a request.
const TELL_EVERY: Duration = Duration::from_millis(100);

/// One mirror's client and headers.
pub(super) struct Mirror {
    client: reqwest::Client,
    /// Sensitive: never logged, never in a message.
    headers: HeaderMap,
}

impl Mirror {
    pub(super) fn build(headers: HeaderMap, trust: &Trust) -> Result<Self, String> {
        // Redirects are never followed: the answer is an error (`redirected`).
        let client = super::client(trust)?;
        Ok(Self { client, headers })
    }
}

impl Destination for Mirror {
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
        let url = &subject.join(key);
        let super::Digested {
            bytes,
            sha256,
            content_type,
            content,
        } = body.digested(subject, key, cancel).await?;
        let content_type = content_type.unwrap_or_else(|| "application/octet-stream".to_string());
        let digest = hex::decode(&sha256).expect("digested: 64 hex digits");
        let field = format!("sha-256=:{}:", BASE64.encode(digest));

        let attempt = || {
            let sent = Arc::new(AtomicU64::new(0));
            let failed = Arc::new(Mutex::new(None));
            let mut request = self
                .client
                .put(url.clone())
                .headers(self.headers.clone())
                .header(CONTENT_TYPE, content_type.as_str())
                .header("content-digest", field.as_str())
                .header("repr-digest", field.as_str());
            request = match &content {
                Content::Bytes(b) => request.body(b.clone()),
                Content::File(path, vouched) => {
                    let reading = Reading::start(
                        path.clone(),
                        bytes,
                        Some(sha256.clone()),
                        vouched.clone(),
                        CHUNK,
                        true,
                        cancel.clone(),
                    );
                    // A streamed body is sent chunked unless its length
                    // is said.
                    request
                        .header(CONTENT_LENGTH, bytes)
                        .body(reqwest::Body::wrap_stream(stream(
                            reading,
                            sent.clone(),
                            failed.clone(),
                        )))
                }
            };
            let request = request.send();
            async move {
                let answer = watch(request, &sent, tally, cancel).await?;
                let failed = failed.lock().expect("never poisoned").take();
                match failed {
                    // The body stopped because the file is not as it
                    // should be: the request broke off for that.
                    Some(e) if answer.is_err() => Err(subject.source(key, e)),
                    _ => Ok(answer),
                }
            }
        };
        let response = retrying(subject, &what, cancel, attempt).await?;
        let status = response.status();
        if status.is_success() {
            let put = Put {
                bytes,
                sha256,
                etag: etag(response.headers()),
            };
            return Ok((url.to_string(), put));
        }
        Err(subject.refused(&what, answered(subject, response).await))
    }

    async fn stat(&self, subject: &Subject, key: &Key) -> Result<Option<ObjectInfo>, Error> {
        let what = look_up_of(key);
        let url = &subject.join(key);
        // A look-up is not cancelled by itself: it is short.
        let cancel = CancellationToken::new();
        let attempt = || {
            let request = self
                .client
                .head(url.clone())
                .headers(self.headers.clone())
                .send();
            async move { Ok(request.await) }
        };
        let response = retrying(subject, &what, &cancel, attempt).await?;
        match response.status() {
            StatusCode::NOT_FOUND | StatusCode::GONE => Ok(None),
            status if status.is_success() => {
                let bytes = response
                    .headers()
                    .get(CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| {
                        subject.refused(
                            &what,
                            format!("it answered {status} without a Content-Length"),
                        )
                    })?;
                Ok(Some(ObjectInfo {
                    bytes,
                    etag: etag(response.headers()),
                }))
            }
            _ => Err(subject.refused(&what, answered(subject, response).await)),
        }
    }
}

/// An answer that is not a yes, for a message: its status, where a
/// redirect points, and the start of its body (a mirror says why there),
/// scrubbed of the target's credentials should a mirror echo them.
async fn answered(subject: &Subject, response: Response) -> String {
    let status = response.status();
    if status.is_redirection() {
        let to = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("nowhere said");
        let to = subject.scrubber.text(to);
        return format!(
            "it answered {status}, to {to}: berth does not follow a target's redirects (its \
             credentials would go along); set the target's url to where the mirror takes uploads"
        );
    }
    let said = super::quote(response, &subject.scrubber).await;
    if said.is_empty() {
        format!("it answered {status}")
    } else {
        format!("it answered {status}: {said}")
    }
}

/// A file's bytes as a request body, counting them into `sent`; a reading
/// error is kept in `failed` (the request only sees that the body broke).
fn stream(
    reading: Reading,
    sent: Arc<AtomicU64>,
    failed: Arc<Mutex<Option<ReadError>>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures::stream::unfold(Some(reading), move |reading| {
        let (sent, failed) = (sent.clone(), failed.clone());
        async move {
            let mut reading = reading?;
            match reading.next().await {
                Some(Ok(Piece::Data(chunk))) => {
                    sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    Some((Ok(chunk), Some(reading)))
                }
                Some(Ok(Piece::End { .. })) => None,
                Some(Err(e)) => {
                    let words = e.to_string();
                    *failed.lock().expect("never poisoned") = Some(e);
                    Some((Err(std::io::Error::other(words)), None))
                }
                // Cancelled: the request is dropped at once anyway.
                None => Some((Err(std::io::Error::other("the put was cancelled")), None)),
            }
        }
    })
}

/// Waits for `request`'s answer, telling the caller of the bytes sent as
/// they go; dropped (the request with it) when `cancel` is cancelled.
async fn watch(
    request: impl Future<Output = reqwest::Result<Response>>,
    sent: &AtomicU64,
    tally: &Tally<'_>,
    cancel: &CancellationToken,
) -> Result<reqwest::Result<Response>, Error> {
    tokio::pin!(request);
    let mut tell = tokio::time::interval(TELL_EVERY);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            answer = &mut request => {
                tally.reached(sent.load(Ordering::Relaxed));
                return Ok(answer);
            }
            _ = tell.tick() => tally.reached(sent.load(Ordering::Relaxed)),
        }
    }
}

fn etag(headers: &HeaderMap) -> Option<String> {
    headers
        .get(ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}
