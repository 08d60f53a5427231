//! Object stores as sources: S3 buckets (`s3://BUCKET/KEY`), Google Cloud
//! Storage buckets (`gs://BUCKET/KEY`) and Azure Blob containers
//! (`az://ACCOUNT/CONTAINER/KEY`), read through the object_store crate,
//! streamed and ranged like an HTTP source, and listed under a prefix for
//! a registration that leaves its files out (`list`). A store's settings
//! are the environment's (the standard AWS, `GOOGLE_*` or `AZURE_*`
//! variables and each cloud's credential chain) with the sources-file
//! options of the prefix covering the URL on top (`crate::s3`,
//! `crate::cloud`); one store is built per bucket and options, and shared
//! by every file and connection.

mod list;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::list::PaginatedListStore;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use super::{Body, Span, innermost};
use crate::cloud::{self, Bucket, no_credential};
use crate::fetch::source::access::Credentials;
use crate::s3::{configured, configured_over, store_said, unreachable};
use crate::trust::Trust;

/// The stores built so far, and what their clients trust beyond the
/// public roots.
pub(crate) struct Stores {
    built: Mutex<HashMap<StoreId, Arc<Store>>>,
    trust: Trust,
}

/// What tells stores apart: the bucket, and the sources-file prefix whose
/// options it carries.
#[derive(PartialEq, Eq, Hash)]
struct StoreId {
    bucket: Bucket,
    prefix: Option<String>,
}

/// What berth asks of every kind of store: reads and paged listings.
trait Client: ObjectStore + PaginatedListStore {}
impl<T: ObjectStore + PaginatedListStore> Client for T {}

/// One bucket's client, and what messages say about it.
struct Store {
    client: Box<dyn Client>,
    /// For S3, the same settings, for the HEADs of a listing: each asks for
    /// the object's checksum (`x-amz-checksum-mode: ENABLED`, signed with
    /// the request) and has the answer's headers put where it says
    /// (`list::Answers`), since object_store reads no checksum from an
    /// answer. No other kind keeps a sha256 of an object.
    heads: Option<AmazonS3>,
    /// Where requests go, for "cannot reach" messages.
    endpoint: String,
    /// What the store holds the objects in, for "has no" messages:
    /// `bucket NAME` or `container NAME`.
    bucket: String,
    /// Where the credentials come from, for "refused" messages.
    credentials: String,
}

impl Stores {
    pub(crate) fn new(trust: Trust) -> Self {
        Self {
            built: Mutex::default(),
            trust,
        }
    }

    /// Opens the object `key` of `bucket` (shown as `url`) for the bytes
    /// of `span`, with the settings `credentials` add to the environment's.
    pub(crate) async fn open(
        &self,
        url: &url::Url,
        bucket: &Bucket,
        key: &Key,
        span: Span,
        credentials: Option<&Credentials>,
    ) -> Result<Body, String> {
        let store = self.store(bucket, credentials)?;
        let range = match (span.start, span.end) {
            (0, None) => None,
            (start, None) => Some(GetRange::Offset(start)),
            (start, Some(end)) => Some(GetRange::Bounded(start..end)),
        };
        let get = |range| {
            store.client.get_opts(
                key,
                GetOptions {
                    range,
                    ..GetOptions::default()
                },
            )
        };
        let result = match get(range.clone()).await {
            Ok(result) => result,
            Err(e) if range.is_some() => match store.client.head(key).await {
                // What we hold is longer than the store's object: start over.
                Ok(meta) if meta.size <= span.start => {
                    get(None).await.map_err(|e| store.describe(e, url))?
                }
                _ => return Err(store.describe(e, url)),
            },
            Err(e) => return Err(store.describe(e, url)),
        };
        let total = result.meta.size;
        let answered = result.range.clone();
        let ranged = range.is_some()
            && answered.start == span.start
            && answered.end == span.end.unwrap_or(total);
        let stream = result
            .into_stream()
            .map_err(|e| format!("the download broke off: {}", innermost(&e)))
            .boxed();
        Ok(Body {
            stream,
            start: answered.start,
            ranged,
            total: Some(total),
        })
    }

    /// How many stores were built.
    #[cfg(test)]
    pub(crate) fn built(&self) -> usize {
        self.built.lock().unwrap().len()
    }

    /// The store for `bucket` with these credentials, built on first use.
    fn store(
        &self,
        bucket: &Bucket,
        credentials: Option<&Credentials>,
    ) -> Result<Arc<Store>, String> {
        let id = StoreId {
            bucket: bucket.clone(),
            prefix: credentials.map(|c| c.prefix().to_string()),
        };
        let mut built = self
            .built
            .lock()
            .expect("the stores lock is never poisoned");
        if let Some(store) = built.get(&id) {
            return Ok(store.clone());
        }
        let store = Arc::new(Store::build(bucket, credentials, &self.trust)?);
        built.insert(id, store.clone());
        Ok(store)
    }
}

impl Store {
    fn build(
        bucket: &Bucket,
        credentials: Option<&Credentials>,
        trust: &Trust,
    ) -> Result<Self, String> {
        let entry = credentials.map(|c| c.prefix().to_string());
        let entry = entry.as_deref();
        let anonymous = credentials.is_some_and(Credentials::anonymous);
        let unusable = |at: String, e: object_store::Error| {
            format!("the store for {at} cannot be set up: {}", innermost(&e))
        };
        match bucket {
            Bucket::S3(bucket) => Self::build_s3(bucket, credentials, trust),
            Bucket::Gcs(bucket) => {
                let options = credentials.map_or(&[][..], |c| c.gcs());
                let at = format!("gs://{bucket}/");
                let builder = cloud::gcs(bucket, trust, options, anonymous)
                    .map_err(|e| unusable(at.clone(), e))?;
                let endpoint = builder
                    .get_config_value(&object_store::gcp::GoogleConfigKey::BaseUrl)
                    .unwrap_or_else(|| "Google Cloud Storage".into());
                Ok(Self {
                    client: Box::new(builder.build().map_err(|e| unusable(at, e))?),
                    heads: None,
                    endpoint,
                    bucket: format!("bucket {bucket}"),
                    credentials: cloud::gcs_credential(entry, options, anonymous),
                })
            }
            Bucket::Azure { account, container } => {
                let options = credentials.map_or(&[][..], |c| c.azure());
                let at = format!("az://{account}/{container}/");
                let builder = cloud::azure(account, container, trust, options, anonymous)
                    .map_err(|e| unusable(at.clone(), e))?;
                let endpoint = builder
                    .get_config_value(&object_store::azure::AzureConfigKey::Endpoint)
                    .unwrap_or_else(|| format!("https://{account}.blob.core.windows.net"));
                Ok(Self {
                    client: Box::new(builder.build().map_err(|e| unusable(at, e))?),
                    heads: None,
                    endpoint,
                    bucket: format!("container {container}"),
                    credentials: cloud::azure_credential(entry, options, anonymous),
                })
            }
        }
    }

    fn build_s3(
        bucket: &str,
        credentials: Option<&Credentials>,
        trust: &Trust,
    ) -> Result<Self, String> {
        let options = credentials.map_or(&[][..], |c| c.options());
        let unusable = |e: object_store::Error| {
            format!(
                "the store for s3://{bucket}/ cannot be set up: {}",
                innermost(&e)
            )
        };
        let builder = configured(trust, options).map_err(unusable)?;
        let heads = configured_over(list::asking_for_checksums(), trust, options)
            .map_err(unusable)?
            .with_http_connector(list::Answers);
        let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
        let credentials = match (
            builder.get_config_value(&AmazonS3ConfigKey::AccessKeyId),
            credentials.filter(|c| {
                c.options()
                    .iter()
                    .any(|(key, _)| *key == AmazonS3ConfigKey::AccessKeyId)
            }),
        ) {
            (Some(_), Some(c)) => format!("the access key of {} in the sources file", c.prefix()),
            (Some(_), None) => "the access key in AWS_ACCESS_KEY_ID".to_string(),
            (None, _) => "no access key is configured (AWS_ACCESS_KEY_ID or the sources file), \
                          so object_store's credential chain: web identity, container or instance metadata"
                .to_string(),
        };
        let finish = |builder: AmazonS3Builder| {
            builder
                .with_bucket_name(bucket)
                .with_retry(cloud::retries())
                .build()
                .map_err(unusable)
        };
        Ok(Self {
            client: Box::new(finish(builder)?),
            heads: Some(finish(heads)?),
            endpoint: endpoint.unwrap_or_else(|| "AWS S3".to_string()),
            bucket: format!("bucket {bucket}"),
            credentials,
        })
    }

    /// What went wrong, in words a person can act on.
    fn describe(&self, e: object_store::Error, url: &url::Url) -> String {
        match &e {
            _ if no_credential(&e) => self.no_credential(&e, url),
            object_store::Error::NotFound { .. }
                if let Some(missing) = self.no_bucket(&store_said(&innermost(&e)), url) =>
            {
                missing
            }
            object_store::Error::NotFound { .. } => format!("the store has no object {url}"),
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => format!(
                "the store refused the credentials for {url} ({}); they are {}",
                store_said(&innermost(&e)),
                self.credentials
            ),
            _ if unreachable(&e) => format!(
                "cannot reach the store at {} ({url}): {}{}",
                self.endpoint,
                innermost(&e),
                crate::trust::hint(&e)
            ),
            _ => format!(
                "the store could not serve {url}: {}",
                store_said(&innermost(&e))
            ),
        }
    }

    /// The store's answer that the bucket or container itself is missing
    /// (S3's and GCS's `NoSuchBucket`, Azure's `ContainerNotFound`), in
    /// words.
    fn no_bucket(&self, said: &str, url: &url::Url) -> Option<String> {
        (said.starts_with("NoSuchBucket") || said.starts_with("ContainerNotFound")).then(|| {
            format!(
                "the store at {} has no {} ({url})",
                self.endpoint, self.bucket
            )
        })
    }

    /// A credential the client could not get: where it looked, and what
    /// to write.
    fn no_credential(&self, e: &object_store::Error, url: &url::Url) -> String {
        format!(
            "no credential for {url}: {} did not give one ({}); name one in the sources-file \
             entry whose prefix covers it, or write anonymous = true there for a public bucket",
            self.credentials,
            innermost(e)
        )
    }
}
