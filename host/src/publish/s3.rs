//! S3-compatible buckets as targets, through object_store (the client
//! sources use, configured alike: `crate::s3::configured`). A body
//! that fits in one part is one PUT; a larger file goes up in parts, a few
//! at once, read from disk as they go. Every request carries the sha256 of
//! what it sends (`x-amz-checksum-sha256`, per part for multipart), which
//! the store checks; the file's own digest is checked here before the
//! upload is completed. An unfinished multipart upload is aborted however
//! the put ends early: failed, cancelled, or its future dropped
//! (`Unfinished`).

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3ConfigKey, Checksum};
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, MultipartId, ObjectStore, ObjectStoreExt, PutOptions, PutPayload,
    RetryConfig,
};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::destination::Destination;
use super::oci::pending::Slot;
use super::parts::{object_name, read_whole, reading, send_parts};
use super::read::Reading;
use super::{Body, Error, Key, ObjectInfo, Put, Subject, Tally, Tuning, look_up_of, upload_of};
use crate::causes::innermost;
use crate::s3::{configured, store_said, unreachable};
use crate::trust::Trust;

/// How long a failed or cancelled put waits for its abort before leaving
/// it to a task of its own.
const ABORT_WAIT: Duration = Duration::from_secs(5);

/// One bucket's client, and what messages say about it.
pub(super) struct Bucket {
    store: AmazonS3,
    bucket: String,
    /// Where requests go, for messages.
    endpoint: String,
    /// Where the credentials come from, for "refused" messages.
    credentials: String,
    tuning: Tuning,
    /// One per part in flight, shared by the puts to this bucket (a batch
    /// sends files side by side): what they hold in memory stays bounded.
    parts: Arc<Semaphore>,
}

impl Bucket {
    pub(super) fn build(
        url: &url::Url,
        options: &[(AmazonS3ConfigKey, String)],
        trust: &Trust,
        tuning: Tuning,
    ) -> Result<Self, String> {
        let bucket = url.host_str().unwrap_or_default().to_string();
        let builder = configured(trust, options).map_err(|e| innermost(&e))?;
        let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
        let credentials = match (
            builder.get_config_value(&AmazonS3ConfigKey::AccessKeyId),
            options
                .iter()
                .any(|(key, _)| *key == AmazonS3ConfigKey::AccessKeyId),
        ) {
            (Some(_), true) => "the access key in the target's options".to_string(),
            (Some(_), false) => "the access key in AWS_ACCESS_KEY_ID".to_string(),
            (None, _) => "no access key is configured (AWS_ACCESS_KEY_ID or the target's \
                          options), so object_store's credential chain: web identity, \
                          container or instance metadata"
                .to_string(),
        };
        let store = builder
            .with_bucket_name(&bucket)
            .with_checksum_algorithm(Checksum::SHA256)
            // A few quick retries of each request (a part, a PUT): a
            // broken connection or a 5xx is tried again, an unreachable
            // store is reported in seconds.
            .with_retry(RetryConfig {
                max_retries: 4,
                retry_timeout: Duration::from_secs(180),
                ..RetryConfig::default()
            })
            .build()
            .map_err(|e| innermost(&e))?;
        Ok(Self {
            store,
            bucket,
            endpoint: endpoint.unwrap_or_else(|| "AWS S3".to_string()),
            credentials,
            parts: Arc::new(Semaphore::new(tuning.parts_in_flight)),
            tuning,
        })
    }

    /// One PUT; the store checks the payload's sha256, which object_store
    /// sends with it.
    async fn put_one(
        &self,
        subject: &Subject,
        what: &str,
        path: &Path,
        payload: PutPayload,
        attributes: Attributes,
        cancel: &CancellationToken,
    ) -> Result<Option<String>, Error> {
        let options = PutOptions {
            attributes,
            ..PutOptions::default()
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::Cancelled),
            put = self.store.put_opts(path, payload, options) => match put {
                Ok(result) => Ok(result.e_tag),
                Err(e) => Err(self.describe(subject, what, e)),
            },
        }
    }

    /// A multipart upload of the file `reading` reads: its digest and the
    /// object's etag. Aborted unless it completes.
    async fn put_parts(
        &self,
        subject: &Subject,
        key: &Key,
        path: &Path,
        reading: Reading,
        tally: &Tally<'_>,
        cancel: &CancellationToken,
    ) -> Result<(String, Option<String>), Error> {
        let what = upload_of(key);
        let id = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Error::Cancelled),
            id = self.store.create_multipart(path) => id.map_err(|e| self.describe(subject, &what, e))?,
        };
        let mut unfinished = Unfinished {
            store: self.store.clone(),
            path: path.clone(),
            id: id.clone(),
            armed: true,
        };
        let what = what.as_str();
        let sent = send_parts(
            subject,
            key,
            reading,
            &self.parts,
            tally,
            cancel,
            |index, chunk| {
                let (store, path, id) = (self.store.clone(), path.clone(), id.clone());
                async move {
                    store
                        .put_part(&path, &id, index, chunk.into())
                        .await
                        .map_err(|e| self.describe(subject, what, e))
                }
            },
        )
        .await;
        let (parts, sha256) = match sent {
            Ok(sent) => sent,
            Err(e) => {
                unfinished.abort(subject).await;
                return Err(e);
            }
        };
        match self.store.complete_multipart(path, &id, parts).await {
            Ok(result) => {
                unfinished.armed = false;
                Ok((sha256, result.e_tag))
            }
            Err(e) => {
                unfinished.abort(subject).await;
                Err(self.describe(subject, what, e))
            }
        }
    }

    /// What went wrong, in words a person can act on; never the secret
    /// (S3's error documents name the access key id at most).
    fn describe(&self, subject: &Subject, what: &str, e: object_store::Error) -> Error {
        let said = store_said(&innermost(&e));
        match &e {
            object_store::Error::NotFound { .. } if said.starts_with("NoSuchBucket") => subject
                .refused(
                    what,
                    format!(
                        "the store at {} has no bucket {}",
                        self.endpoint, self.bucket
                    ),
                ),
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => subject.refused(
                what,
                format!("{said} (the credentials are {})", self.credentials),
            ),
            _ if unreachable(&e) => subject.unreachable(
                what,
                format!(
                    "the store at {}: {}{}",
                    self.endpoint,
                    innermost(&e),
                    crate::trust::hint(&e)
                ),
            ),
            _ => subject.refused(what, said),
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
        let path = location(&url).map_err(|e| subject.refused(&what, e))?;
        let put = match body {
            Body::Bytes {
                bytes,
                content_type,
            } => {
                let sha256 = super::sha256_hex(&bytes);
                let len = bytes.len() as u64;
                let mut attributes = Attributes::new();
                attributes.insert(Attribute::ContentType, content_type.into());
                let etag = self
                    .put_one(subject, &what, &path, bytes.into(), attributes, cancel)
                    .await?;
                Ok(Put {
                    bytes: len,
                    sha256,
                    etag,
                })
            }
            Body::File {
                path: file,
                bytes,
                sha256,
                vouched,
            } => {
                let (mut reading, whole) =
                    reading(&self.tuning, (file, bytes, sha256, vouched), cancel);
                if whole {
                    let (chunks, sha256) = read_whole(&mut reading, subject, key, cancel).await?;
                    let payload = PutPayload::from_iter(chunks);
                    let etag = self
                        .put_one(subject, &what, &path, payload, Attributes::new(), cancel)
                        .await?;
                    Ok(Put {
                        bytes,
                        sha256,
                        etag,
                    })
                } else {
                    self.put_parts(subject, key, &path, reading, tally, cancel)
                        .await
                        .map(|(sha256, etag)| Put {
                            bytes,
                            sha256,
                            etag,
                        })
                }
            }
        }?;
        Ok((url.to_string(), put))
    }

    async fn stat(&self, subject: &Subject, key: &Key) -> Result<Option<ObjectInfo>, Error> {
        let what = look_up_of(key);
        let path = location(&subject.join(key)).map_err(|e| subject.refused(&what, e))?;
        match self.store.head(&path).await {
            Ok(meta) => Ok(Some(ObjectInfo {
                bytes: meta.size,
                etag: meta.e_tag,
            })),
            Err(e @ object_store::Error::NotFound { .. })
                if !store_said(&innermost(&e)).starts_with("NoSuchBucket") =>
            {
                Ok(None)
            }
            Err(e) => Err(self.describe(subject, &what, e)),
        }
    }
}

/// The object's path in the bucket: the url's path, unescaped, without
/// its leading `/`. The url is the target's joined with a checked key.
fn location(url: &url::Url) -> Result<Path, String> {
    let name = object_name(url, 0)?;
    Path::parse(&name).map_err(|e| format!("{url} does not name an object: {e}"))
}

/// A multipart upload not yet completed: aborted when the put fails or is
/// cancelled (`abort`), or, if its future is dropped first, by a task
/// spawned on drop, so no orphan parts stay in the bucket (they are
/// billed, and invisible to a listing of objects).
struct Unfinished {
    store: AmazonS3,
    path: Path,
    id: MultipartId,
    armed: bool,
}

impl Unfinished {
    /// Aborts now, waiting at most `ABORT_WAIT`; past that, the drop
    /// leaves it to a task.
    async fn abort(&mut self, subject: &Subject) {
        match tokio::time::timeout(ABORT_WAIT, self.store.abort_multipart(&self.path, &self.id))
            .await
        {
            Ok(Ok(())) => self.armed = false,
            Ok(Err(e)) => {
                self.armed = false;
                tracing::warn!(
                    target_name = %subject.target,
                    path = %self.path,
                    "cannot abort an unfinished multipart upload (its parts stay in the bucket \
                     until a lifecycle rule removes them): {}",
                    store_said(&innermost(&e))
                );
            }
            Err(_) => {}
        }
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, path, id) = (self.store.clone(), self.path.clone(), self.id.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = store.abort_multipart(&path, &id).await {
                        tracing::warn!(
                            %path,
                            "cannot abort an unfinished multipart upload (its parts stay in the \
                             bucket until a lifecycle rule removes them): {}",
                            store_said(&innermost(&e))
                        );
                    }
                });
            }
            Err(_) => tracing::warn!(
                %path,
                "an unfinished multipart upload is left in the bucket: no runtime to abort it on"
            ),
        }
    }
}
