//! Publishing: puts bytes at a key under one of the operator's targets
//! (`crate::targets`) — an S3 bucket (`s3`), an HTTP mirror that takes
//! `PUT` (`http`), an OCI registry (`oci`: blobs, and the manifests a
//! `Pending` collects until `finish`), a folder (`file`), each a
//! `Destination` (`destination`) — and says what landed where (a
//! `Receipt`). The bytes are streamed from disk a few chunks at a time
//! (`read`), checked against the digest they were verified with, and the
//! destination is given that digest to check in turn; a put that fails or
//! is cancelled leaves nothing behind (no partial file, no unfinished
//! multipart upload). Credentials stay here: every error is scrubbed of
//! the target's (`crate::scrub`), and no `Debug` or receipt carries one;
//! a remote answer is quoted only once scrubbed (`quote`).
//!
//! Knows targets and uploads only: nothing of plugins and their grants
//! (`Targets::open` is the caller's), the database, or berth's API.

mod answers;
mod azure;
mod body;
mod destination;
mod file;
mod gcs;
mod http;
mod oci;
mod parts;
mod read;
mod s3;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests_azure;
#[cfg(test)]
mod tests_file;
#[cfg(test)]
mod tests_gcs;
#[cfg(test)]
mod tests_http;
#[cfg(test)]
mod tests_oci;
#[cfg(test)]
mod tests_oci_conforms;
#[cfg(test)]
mod tests_s3;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

pub use crate::key::{Key, MAX_KEY_BYTES};
pub use answers::Error;
use answers::{quote, start_of, worth_retrying};
pub use body::Body;
use body::{Content, Digested, sha256_hex};
use destination::Destination;
pub use oci::{ARTIFACT_TYPE, Pending};

use crate::targets::{Kind, Targets};
use crate::trust::Trust;

pub use crate::model::Receipt;

/// An object at a key, as the target describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectInfo {
    pub bytes: u64,
    pub etag: Option<String>,
}

/// Files a batch of puts sends at once: the others keep the destination
/// busy while it finishes one (an S3 multipart completion copies every
/// part). Their S3 parts share the bucket's `parts_in_flight`.
pub const FILES_AT_ONCE: usize = 3;

/// Settings of S3 multipart uploads and OCI chunked uploads, chosen by
/// the host.
#[derive(Debug, Clone, Copy)]
struct Tuning {
    /// Bytes per part, and the size up to which a file goes in one PUT.
    part_bytes: u64,
    /// Parts in flight at once, all puts to a bucket together; with two
    /// per file being read, what they hold in memory.
    parts_in_flight: usize,
    /// Bytes per `PATCH` of an OCI blob upload, and the size up to which
    /// a blob goes in one `PUT`; one chunk is in memory per file.
    chunk_bytes: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            part_bytes: 6 << 20,
            parts_in_flight: 8,
            chunk_bytes: 16 << 20,
        }
    }
}

/// S3 refuses parts smaller than this, but for the last.
const MIN_PART_BYTES: u64 = 5 << 20;
/// And more parts than this in one upload.
const MAX_PARTS: u64 = 10_000;

impl Tuning {
    /// The part size for a file of `bytes`: the configured one, grown so
    /// that the file fits in S3's part count, in whole MiB.
    fn part_bytes_for(&self, bytes: u64) -> u64 {
        let fits = bytes.div_ceil(MAX_PARTS).div_ceil(1 << 20) << 20;
        self.part_bytes.max(fits)
    }
}

/// Opens publishers for the configured targets; one client per target,
/// built on first use and shared.
pub struct Publishers {
    targets: Arc<Targets>,
    trust: Trust,
    tuning: Tuning,
    built: Mutex<HashMap<String, Publisher>>,
}

impl Publishers {
    pub fn new(targets: Arc<Targets>, trust: &Trust) -> Self {
        Self {
            targets,
            trust: trust.clone(),
            tuning: Tuning::default(),
            built: Mutex::default(),
        }
    }

    /// Parts of `bytes` (at least S3's 5 MiB) instead of the host's
    /// choice, so tests and benchmarks reach multipart with small files;
    /// OCI chunks of as many.
    pub fn with_part_bytes(mut self, bytes: u64) -> Self {
        self.tuning.part_bytes = bytes.max(MIN_PART_BYTES);
        self.tuning.chunk_bytes = self.tuning.part_bytes;
        self
    }

    /// The publisher of target `name`. The caller has checked the grant
    /// (`Targets::open`); this only builds the client, once.
    pub fn get(&self, name: &str) -> Result<Publisher, Error> {
        let mut built = self.built.lock().expect("never poisoned");
        if let Some(publisher) = built.get(name) {
            return Ok(publisher.clone());
        }
        let target = self.targets.get(name).ok_or_else(|| Error::NotConfigured {
            name: name.to_string(),
        })?;
        let setup = |reason: String| Error::Setup {
            target: name.to_string(),
            url: target.url().to_string(),
            reason,
        };
        let backend = match target.kind() {
            Kind::S3 { options } => Backend::S3(
                s3::Bucket::build(target.url(), options, &self.trust, self.tuning)
                    .map_err(setup)?,
            ),
            Kind::Gcs { options } => Backend::Gcs(
                gcs::Bucket::build(name, target.url(), options, &self.trust, self.tuning)
                    .map_err(setup)?,
            ),
            Kind::Azure {
                account,
                container,
                options,
            } => Backend::Azure(
                azure::Container::build(
                    name,
                    (account, container),
                    options,
                    &self.trust,
                    self.tuning,
                )
                .map_err(setup)?,
            ),
            Kind::Http { headers, .. } => {
                Backend::Http(http::Mirror::build(headers.clone(), &self.trust).map_err(setup)?)
            }
            Kind::Oci {
                registry,
                namespace,
                login,
            } => Backend::Oci(
                oci::Registry::build(
                    name,
                    registry,
                    namespace,
                    login.clone(),
                    &self.trust,
                    self.tuning,
                )
                .map_err(setup)?,
            ),
            Kind::File => Backend::File(file::Folder::new(target.url()).map_err(setup)?),
        };
        let publisher = Publisher {
            inner: Arc::new(Inner {
                subject: Subject {
                    target: name.to_string(),
                    url: target.url().clone(),
                    scrubber: target.scrubber(),
                },
                backend,
            }),
        };
        built.insert(name.to_string(), publisher.clone());
        Ok(publisher)
    }
}

/// One target.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    subject: Subject,
    backend: Backend,
}

/// The target's kind of destination; each is a `Destination`.
enum Backend {
    S3(s3::Bucket),
    Gcs(gcs::Bucket),
    Azure(azure::Container),
    Http(http::Mirror),
    Oci(oci::Registry),
    File(file::Folder),
}

/// `$then` with `$d` bound to `$backend`'s destination, whatever its kind.
macro_rules! on_destination {
    ($backend:expr, $d:ident => $then:expr) => {
        match $backend {
            Backend::S3($d) => $then,
            Backend::Gcs($d) => $then,
            Backend::Azure($d) => $then,
            Backend::Http($d) => $then,
            Backend::Oci($d) => $then,
            Backend::File($d) => $then,
        }
    };
}

impl Publisher {
    pub fn name(&self) -> &str {
        &self.inner.subject.target
    }

    /// Where `key` lands, for people (never credentials: a target's url
    /// has none): the target's url joined with the key, each segment
    /// appended to the url's path, so the key stays under it whatever it
    /// holds (`a:b` is no scheme, a space is escaped). On an oci target,
    /// `oci://REGISTRY/NAMESPACE/REPO:TAG#PATH`, and a key not of that
    /// shape is refused.
    pub fn url(&self, key: &Key) -> Result<String, Error> {
        on_destination!(&self.inner.backend, d => d.url(&self.inner.subject, key))
    }

    /// Where the keys under the folder `key` land (`key/…`), for people:
    /// `url` of the folder, ending in `/`. On an oci target a folder
    /// `REPO:TAG` is the artifact, `oci://REGISTRY/NAMESPACE/REPO:TAG`,
    /// and `REPO:TAG/DIR` is `oci://REGISTRY/NAMESPACE/REPO:TAG#DIR/`.
    pub fn folder_url(&self, key: &Key) -> Result<String, Error> {
        on_destination!(&self.inner.backend, d => d.folder_url(&self.inner.subject, key))
    }

    /// Puts `body` at `key`; `progress(n)` is told of each `n` more bytes
    /// sent (bytes sent again by a retry are not told twice). Stops within
    /// a second of `cancel`, leaving nothing behind, as does a failure. On
    /// an oci target the blob is pushed and no manifest names it: see
    /// `put_into`.
    pub async fn put(
        &self,
        key: &Key,
        body: Body,
        progress: &(dyn Fn(u64) + Send + Sync),
        cancel: &CancellationToken,
    ) -> Result<Receipt, Error> {
        let alone = Pending::default();
        self.put_into(&alone, key, body, progress, cancel).await
    }

    /// Puts `body` at `key` as `put` does, its error scrubbed; on an oci
    /// target, also records
    /// its layer in `pending`, for `finish`. The layer's place among its
    /// manifest's is taken when this is called, not when the future is
    /// first polled or ends: puts made in an order and run at once keep
    /// that order in the manifest.
    pub fn put_into<'a>(
        &'a self,
        pending: &'a Pending,
        key: &'a Key,
        body: Body,
        progress: &'a (dyn Fn(u64) + Send + Sync),
        cancel: &'a CancellationToken,
    ) -> impl Future<Output = Result<Receipt, Error>> + Send + 'a {
        let (subject, backend) = (&self.inner.subject, &self.inner.backend);
        let layer = on_destination!(backend, d => d.reserve(subject, pending, key));
        let put = async move {
            let layer = layer?;
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            if let Body::Bytes { content_type, .. } = &body
                && ::http::HeaderValue::from_str(content_type).is_err()
            {
                return Err(subject.source(
                    key,
                    format!("the content type {content_type:?} is not a valid header value"),
                ));
            }
            let tally = Tally::new(progress);
            let (url, put) = on_destination!(backend, d => {
                d.put(subject, key, layer, body, &tally, cancel).await?
            });
            tally.reached(put.bytes);
            Ok(Receipt {
                target: subject.target.clone(),
                key: key.as_str().to_string(),
                url,
                bytes: put.bytes,
                sha256: put.sha256,
                etag: put.etag,
            })
        };
        async move { put.await.map_err(|e| e.scrubbed(&subject.scrubber)) }
    }

    /// Writes what `pending` holds: on an oci target, one image manifest
    /// per `REPO:TAG` put to (its layers the puts', in their order), each
    /// with a receipt (key `REPO:TAG`, url `oci://…/REPO:TAG@sha256:…`,
    /// the manifest's size and sha256). Nothing on other targets. What is
    /// written is no longer pending; after a failure the rest still is.
    pub async fn finish(
        &self,
        pending: &Pending,
        cancel: &CancellationToken,
    ) -> Result<Vec<Receipt>, Error> {
        let subject = &self.inner.subject;
        let written =
            on_destination!(&self.inner.backend, d => d.finish(subject, pending, cancel).await)
                .map_err(|e| e.scrubbed(&subject.scrubber))?;
        Ok(written
            .into_iter()
            .map(|(key, url, put)| Receipt {
                target: subject.target.clone(),
                key,
                url,
                bytes: put.bytes,
                sha256: put.sha256,
                etag: put.etag,
            })
            .collect())
    }

    /// Attaches `signature` (an OpenSSF model signature) to the artifact
    /// whose manifest `finish` wrote (`manifest`, its receipt), as its OCI
    /// referrer: the receipt of the signature's manifest. Only an oci
    /// target keeps one thing with another; any other refuses.
    pub async fn attach(
        &self,
        manifest: &Receipt,
        signature: bytes::Bytes,
        cancel: &CancellationToken,
    ) -> Result<Receipt, Error> {
        let subject = &self.inner.subject;
        let Backend::Oci(registry) = &self.inner.backend else {
            return Err(subject.refused(
                "a signature",
                "only an oci target keeps a signature with what it signs",
            ));
        };
        let key = Key::parse(&manifest.key).map_err(|reason| Error::Key {
            target: subject.target.clone(),
            reason,
        })?;
        let (url, put) = registry
            .refer(
                subject,
                &key,
                (&manifest.sha256, manifest.bytes),
                signature,
                cancel,
            )
            .await
            .map_err(|e| e.scrubbed(&subject.scrubber))?;
        Ok(Receipt {
            target: subject.target.clone(),
            key: format!("{}/{}", manifest.key, crate::signing::SIGNATURE_FILE),
            url,
            bytes: put.bytes,
            sha256: put.sha256,
            etag: put.etag,
        })
    }

    /// The object at `key`, if there is one; on an oci target, the layer
    /// titled PATH in the manifest `REPO:TAG` as the registry has it
    /// (`etag`: its digest), not one still pending.
    pub async fn stat(&self, key: &Key) -> Result<Option<ObjectInfo>, Error> {
        let subject = &self.inner.subject;
        let stat = on_destination!(&self.inner.backend, d => d.stat(subject, key).await);
        stat.map_err(|e| e.scrubbed(&subject.scrubber))
    }
}

/// Waits the backoff's next wait before another try at `what`, saying
/// why in the log; `Error::Cancelled` if the put is cancelled meanwhile.
async fn wait_to_try_again(
    subject: &Subject,
    what: &str,
    why: &str,
    backoff: &mut crate::backoff::Backoff,
    cancel: &CancellationToken,
) -> Result<(), Error> {
    let wait = backoff.next_wait();
    tracing::info!(
        target_name = %subject.target,
        "{what}: trying again in {} ms ({why})",
        wait.as_millis()
    );
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::Cancelled),
        _ = tokio::time::sleep(wait) => Ok(()),
    }
}

/// An HTTP client for a target: trusting `trust` too, following no
/// redirect (a backend decides what one means).
fn client(trust: &Trust) -> Result<reqwest::Client, String> {
    let builder = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none());
    trust
        .reqwest(builder)
        .and_then(|b| b.build())
        .map_err(|e| crate::causes::innermost(&e))
}

/// What a backend's put did.
struct Put {
    bytes: u64,
    sha256: String,
    etag: Option<String>,
}

/// A target as error sentences name it.
struct Subject {
    target: String,
    /// Ends with `/`.
    url: url::Url,
    /// Finds its credentials in what a destination says.
    scrubber: crate::scrub::Scrubber,
}

impl Subject {
    /// The url of `key`: the target's with each of the key's segments
    /// appended to its path.
    fn join(&self, key: &Key) -> url::Url {
        let mut url = self.url.clone();
        url.path_segments_mut()
            .expect("a target's url has a path (targets.rs checks it ends with /)")
            .pop_if_empty()
            .extend(key.segments());
        url
    }

    fn source(&self, key: &Key, reason: impl ToString) -> Error {
        Error::Source {
            target: self.target.clone(),
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }

    fn refused(&self, what: &str, reason: impl ToString) -> Error {
        Error::Refused {
            target: self.target.clone(),
            url: self.url.to_string(),
            what: what.to_string(),
            reason: reason.to_string(),
        }
    }

    fn unreachable(&self, what: &str, reason: impl ToString) -> Error {
        Error::Unreachable {
            target: self.target.clone(),
            url: self.url.to_string(),
            what: what.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// What a request is, in error sentences.
fn upload_of(key: &Key) -> String {
    format!("the upload of {key}")
}

fn look_up_of(key: &Key) -> String {
    format!("the look-up of {key}")
}

/// Bytes sent, told to the caller's `progress` only beyond the most told
/// so far: a retried request sends bytes again that were already told.
struct Tally<'a> {
    progress: &'a (dyn Fn(u64) + Send + Sync),
    told: AtomicU64,
}

impl<'a> Tally<'a> {
    fn new(progress: &'a (dyn Fn(u64) + Send + Sync)) -> Self {
        Self {
            progress,
            told: AtomicU64::new(0),
        }
    }

    /// `sent` bytes of the body have gone, in all.
    fn reached(&self, sent: u64) {
        let told = self.told.fetch_max(sent, Ordering::Relaxed);
        if sent > told {
            (self.progress)(sent - told);
        }
    }

    /// `more` bytes went, beyond those told.
    fn add(&self, more: u64) {
        self.told.fetch_add(more, Ordering::Relaxed);
        (self.progress)(more);
    }
}

#[cfg(test)]
mod tests;
