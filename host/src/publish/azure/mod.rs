//! Azure Blob containers as targets, through the Blob service's own
//! requests, each signed by object_store's authorizer with the
//! credential object_store's chain finds (`crate::cloud::azure`: account
//! key, SAS token, service principal, workload or managed identity):
//! object_store's Azure client sends no MD5 with a block and cannot drop
//! the blocks of an upload it gives up. A body that fits in one part is
//! one `Put Blob`; a larger file goes up as blocks, a few at once, and is
//! one blob only at `Put Block List`, after the file's own digest was
//! checked. Every request's bytes carry their MD5 (`Content-MD5`), which
//! the service checks. A put that fails or is cancelled drops its
//! uncommitted blocks (`staged`). A SAS token travels in the url, so no
//! url is ever put in words.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use object_store::azure::{AzureAuthorizer, AzureConfigKey, AzureCredentialProvider};
use object_store::client::HttpRequestBody;
use reqwest::header::{CONTENT_LENGTH, ETAG, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Response, StatusCode};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::answers::{quote, retrying};
use super::destination::Destination;
use super::oci::pending::Slot;
use super::parts::{object_name, read_whole, reading, send_parts};
use super::read::Reading;
use super::{Body, Error, Key, ObjectInfo, Put, Subject, Tally, Tuning, look_up_of, upload_of};
use crate::causes::innermost;
use crate::cloud;
use crate::trust::Trust;
use staged::Staged;

mod staged;

/// One container's client, and what messages say about it.
pub(super) struct Container {
    signing: Signing,
    container: String,
    /// The account's blob endpoint, for messages.
    endpoint: url::Url,
    /// Where the credential comes from, for "refused" messages.
    said: String,
    tuning: Tuning,
    /// One per block in flight, shared by the puts to this container.
    parts: Arc<Semaphore>,
}

/// What signs and sends a request to the account: cheap to clone, so a
/// task of its own can drop an upload's blocks.
#[derive(Clone)]
struct Signing {
    client: reqwest::Client,
    credentials: AzureCredentialProvider,
    account: String,
}

impl Signing {
    /// `method` of `url` with `headers` and `body`, signed as the
    /// credential of the moment wants (a header, or a SAS token's query).
    async fn request(
        &self,
        method: Method,
        url: &url::Url,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<reqwest::RequestBuilder, String> {
        let credential = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| format!("no credential could be had: {}", innermost(&e)))?;
        // The signature covers the length; Azure wants it said even when
        // 0, which the client would leave out.
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        let mut signed = http::Request::builder()
            .method(method)
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| format!("cannot make the request: {e}"))?;
        *signed.headers_mut() = headers;
        AzureAuthorizer::new(&credential, &self.account).authorize(&mut signed);
        let (parts, _) = signed.into_parts();
        let url = url::Url::parse(&parts.uri.to_string())
            .map_err(|e| format!("cannot make the request: {e}"))?;
        Ok(self
            .client
            .request(parts.method, url)
            .headers(parts.headers)
            .body(body))
    }

    /// Sends the request, tried again as `retrying` does, signed anew each
    /// time (the signature holds the time). With `tracker`, each try runs
    /// on a task of its own that is let finish when the put stops waiting
    /// for it: a block's request already sent may still be stored, so its
    /// upload's cleanup waits them out (`staged`).
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        subject: &Subject,
        what: &str,
        (method, url): (Method, &url::Url),
        headers: &HeaderMap,
        body: Bytes,
        cancel: &CancellationToken,
        tracker: Option<&TaskTracker>,
    ) -> Result<Response, Error> {
        retrying(subject, what, cancel, || {
            let (method, headers, body) = (method.clone(), headers.clone(), body.clone());
            async move {
                let request = self
                    .request(method, url, headers, body)
                    .await
                    .map_err(|e| subject.refused(what, e))?;
                let answer = async {
                    match tracker {
                        Some(tracker) => tracker
                            .spawn(request.send())
                            .await
                            .expect("a request's task does not panic"),
                        None => request.send().await,
                    }
                };
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => Err(Error::Cancelled),
                    answer = answer => Ok(answer),
                }
            }
        })
        .await
    }
}

impl Container {
    pub(super) fn build(
        name: &str,
        (account, container): (&str, &str),
        options: &[(AzureConfigKey, String)],
        trust: &Trust,
        tuning: Tuning,
    ) -> Result<Self, String> {
        let builder =
            cloud::azure(account, container, trust, options, false).map_err(|e| innermost(&e))?;
        let endpoint = builder
            .get_config_value(&AzureConfigKey::Endpoint)
            .unwrap_or_else(|| format!("https://{account}.blob.core.windows.net"));
        let endpoint =
            url::Url::parse(&endpoint).map_err(|e| format!("endpoint {endpoint:?}: {e}"))?;
        let store = builder.build().map_err(|e| innermost(&e))?;
        Ok(Self {
            signing: Signing {
                client: super::client(trust)?,
                credentials: store.credentials().clone(),
                account: account.to_string(),
            },
            container: container.to_string(),
            endpoint,
            said: cloud::azure_credential(Some(&format!("target {name:?}")), options, false),
            parts: Arc::new(Semaphore::new(tuning.parts_in_flight)),
            tuning,
        })
    }

    /// The blob `key` lands at, and its url (which a SAS token is added
    /// to only when signed).
    fn blob(&self, subject: &Subject, key: &Key, what: &str) -> Result<url::Url, Error> {
        // A target's url is az://ACCOUNT/CONTAINER/PREFIX/.
        let name = object_name(&subject.join(key), 1).map_err(|e| subject.refused(what, e))?;
        let mut url = self.endpoint.clone();
        url.path_segments_mut()
            .expect("an http(s) endpoint")
            .pop_if_empty()
            .push(&self.container)
            .extend(name.split('/'));
        Ok(url)
    }

    /// The blob's size and etag, if there is one.
    async fn head(
        &self,
        subject: &Subject,
        what: &str,
        url: &url::Url,
        cancel: &CancellationToken,
    ) -> Result<Option<ObjectInfo>, Error> {
        let answer = self
            .signing
            .send(
                subject,
                what,
                (Method::HEAD, url),
                &HeaderMap::new(),
                Bytes::new(),
                cancel,
                None,
            )
            .await?;
        let status = answer.status();
        let code = error_code(&answer);
        match status {
            StatusCode::NOT_FOUND if code.as_deref() != Some("ContainerNotFound") => Ok(None),
            _ if status.is_success() => Ok(Some(ObjectInfo {
                // (A HEAD's body is empty: its length is the header's.)
                bytes: header(&answer, CONTENT_LENGTH)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_default(),
                etag: header(&answer, ETAG),
            })),
            _ => Err(self.refusal(subject, what, answer).await),
        }
    }

    /// One `Put Blob` of `chunks`, with their MD5.
    async fn put_blob(
        &self,
        subject: &Subject,
        what: &str,
        url: &url::Url,
        (chunks, content_type): (Vec<Bytes>, &str),
        cancel: &CancellationToken,
    ) -> Result<Option<String>, Error> {
        let body: Bytes = match chunks.len() {
            1 => chunks.into_iter().next().expect("one"),
            _ => chunks.concat().into(),
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            name("x-ms-blob-type"),
            HeaderValue::from_static("BlockBlob"),
        );
        headers.insert(name("content-md5"), md5_of(body.clone()).await);
        headers.insert(name("x-ms-blob-content-type"), value(content_type));
        let answer = self
            .signing
            .send(
                subject,
                what,
                (Method::PUT, url),
                &headers,
                body,
                cancel,
                None,
            )
            .await?;
        if !answer.status().is_success() {
            return Err(self.refusal(subject, what, answer).await);
        }
        Ok(header(&answer, ETAG))
    }

    /// The file `reading` reads, as blocks committed at once: its digest
    /// and the blob's etag. Its blocks are dropped unless it is committed.
    async fn put_blocks(
        &self,
        subject: &Subject,
        (key, what): (&Key, &str),
        url: &url::Url,
        reading: Reading,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Option<String>), Error> {
        let existed = self.head(subject, what, url, cancel).await?.is_some();
        let tracker = TaskTracker::new();
        let mut staged = Staged {
            signing: self.signing.clone(),
            url: url.clone(),
            existed,
            tracker: tracker.clone(),
            armed: true,
        };
        let tracker = &tracker;
        // One upload's ids: all of one length, as Azure wants, and none
        // another upload to the same blob would use.
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| subject.refused(what, e))?;
        let nonce = hex::encode(nonce);
        let sent = send_parts(
            subject,
            key,
            reading,
            &self.parts,
            tally,
            cancel,
            |index, chunk| {
                let id = BASE64.encode(format!("{nonce}-{index:08}"));
                let mut block = url.clone();
                block
                    .query_pairs_mut()
                    .append_pair("comp", "block")
                    .append_pair("blockid", &id);
                async move {
                    let mut headers = HeaderMap::new();
                    headers.insert(name("content-md5"), md5_of(chunk.clone()).await);
                    let answer = self
                        .signing
                        .send(
                            subject,
                            what,
                            (Method::PUT, &block),
                            &headers,
                            chunk,
                            cancel,
                            Some(tracker),
                        )
                        .await?;
                    match answer.status().is_success() {
                        true => Ok(id),
                        false => Err(self.refusal(subject, what, answer).await),
                    }
                }
            },
        )
        .await;
        let committed = match sent {
            Ok((ids, sha256)) => self
                .commit(subject, what, url, &ids, cancel)
                .await
                .map(|etag| (sha256, etag)),
            Err(e) => Err(e),
        };
        match committed {
            Ok(done) => {
                staged.armed = false;
                Ok(done)
            }
            Err(e) => {
                staged.drop_blocks(subject).await;
                Err(e)
            }
        }
    }

    /// `Put Block List` of `ids`, in order: the blob is whole from here.
    async fn commit(
        &self,
        subject: &Subject,
        what: &str,
        url: &url::Url,
        ids: &[String],
        cancel: &CancellationToken,
    ) -> Result<Option<String>, Error> {
        let mut list = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
        for id in ids {
            list.push_str(&format!("<Latest>{id}</Latest>"));
        }
        list.push_str("</BlockList>");
        let body = Bytes::from(list);
        let mut url = url.clone();
        url.query_pairs_mut().append_pair("comp", "blocklist");
        let mut headers = HeaderMap::new();
        headers.insert(name("content-md5"), md5_of(body.clone()).await);
        headers.insert(
            name("x-ms-blob-content-type"),
            HeaderValue::from_static("application/octet-stream"),
        );
        let answer = self
            .signing
            .send(
                subject,
                what,
                (Method::PUT, &url),
                &headers,
                body,
                cancel,
                None,
            )
            .await?;
        if !answer.status().is_success() {
            return Err(self.refusal(subject, what, answer).await);
        }
        Ok(header(&answer, ETAG))
    }

    /// The service's refusal, in words a person can act on: its error code
    /// and the first sentence of its message, never a signature it quotes
    /// back.
    async fn refusal(&self, subject: &Subject, what: &str, answer: Response) -> Error {
        let status = answer.status();
        let code = error_code(&answer).unwrap_or_default();
        let body = quote(answer, &subject.scrubber).await;
        let message = body
            .split_once("<Message>")
            .and_then(|(_, m)| m.split(['.', '<']).next())
            .filter(|_| code != "AuthenticationFailed")
            .map(|m| format!(": {}", m.trim()))
            .unwrap_or_default();
        let reason = match (status, code.as_str()) {
            (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, _) => format!(
                "{status} {code}{message} (the credentials are {})",
                self.said
            ),
            (_, "ContainerNotFound") => format!(
                "the account at {} has no container {}",
                self.endpoint.origin().ascii_serialization(),
                self.container
            ),
            _ => format!("{status} {code}{message}"),
        };
        subject.refused(what, reason)
    }
}

impl Destination for Container {
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
        let url = self.blob(subject, key, &what)?;
        let put = match body {
            Body::Bytes {
                bytes,
                content_type,
            } => {
                let sha256 = super::sha256_hex(&bytes);
                let len = bytes.len() as u64;
                let etag = self
                    .put_blob(subject, &what, &url, (vec![bytes], &content_type), cancel)
                    .await?;
                Put {
                    bytes: len,
                    sha256,
                    etag,
                }
            }
            Body::File {
                path,
                bytes,
                sha256,
                vouched,
            } => {
                let (mut reading, whole) =
                    reading(&self.tuning, (path, bytes, sha256, vouched), cancel);
                let (sha256, etag) = if whole {
                    let (chunks, sha256) = read_whole(&mut reading, subject, key, cancel).await?;
                    let content_type = "application/octet-stream";
                    let etag = self
                        .put_blob(subject, &what, &url, (chunks, content_type), cancel)
                        .await?;
                    (sha256, etag)
                } else {
                    self.put_blocks(subject, (key, &what), &url, reading, tally, cancel)
                        .await?
                };
                Put {
                    bytes,
                    sha256,
                    etag,
                }
            }
        };
        Ok((subject.join(key).to_string(), put))
    }

    async fn stat(&self, subject: &Subject, key: &Key) -> Result<Option<ObjectInfo>, Error> {
        let what = look_up_of(key);
        let url = self.blob(subject, key, &what)?;
        self.head(subject, &what, &url, &CancellationToken::new())
            .await
    }
}

/// The base64 MD5 of `bytes`, as `Content-MD5` says it, computed off the
/// runtime's threads.
async fn md5_of(bytes: Bytes) -> HeaderValue {
    let digest =
        tokio::task::spawn_blocking(move || <md5::Md5 as md5::Digest>::digest(&bytes).to_vec())
            .await
            .expect("hashing does not panic");
    HeaderValue::from_str(&BASE64.encode(digest)).expect("base64 is a header value")
}

fn error_code(answer: &Response) -> Option<String> {
    header(answer, HeaderName::from_static("x-ms-error-code"))
}

fn header(answer: &Response, name: HeaderName) -> Option<String> {
    answer
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn name(text: &'static str) -> HeaderName {
    HeaderName::from_static(text)
}

/// A content type checked as a header value by `Publisher::put_into`.
fn value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or(HeaderValue::from_static("application/octet-stream"))
}
