//! One blob made present in a repository: looked up, mounted, or sent in
//! one `PUT` or in chunks, each try's session cancelled at the registry
//! when it does not complete.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use reqwest::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, LOCATION};
use reqwest::{Method, Response, StatusCode};
use tokio_util::sync::CancellationToken;

use super::{CANCEL_WAIT, Failed, OCTET_STREAM, READ, Registry, TRIES, said};
use crate::backoff::Backoff;
use crate::oci::{Access, Reference};
use crate::publish::read::{Piece, ReadError, Reading};
use crate::publish::{Content, Error, Key, Subject, Tally};

impl Registry {
    /// Makes the blob `sha256` of `bytes` bytes present in `repository`:
    /// looked up, mounted or uploaded.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn push_blob(
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
                Err(Failed::Again(why)) => why.to_string(),
            };
            crate::publish::wait_to_try_again(subject, what, &why, &mut backoff, cancel).await?;
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
    pub(super) armed: bool,
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
