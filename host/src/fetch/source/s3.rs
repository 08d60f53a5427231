//! S3 buckets as sources (`s3://bucket/key`), read through the
//! object_store crate, streamed and ranged like an HTTP source, and listed
//! under a prefix for a registration that leaves its files out (`list`).
//! A store's settings are the environment's
//! (`AmazonS3Builder::from_env`: the standard AWS variables and credential
//! chain) with the sources-file options of the prefix covering the URL on
//! top; one store is built per bucket and options, and shared by every
//! file and connection.

mod list;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};

use super::{Body, Span, innermost};
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
    bucket: String,
    prefix: Option<String>,
}

/// One bucket's client, and what messages say about it.
struct Store {
    s3: AmazonS3,
    /// The same settings, for the HEADs of a listing: each asks for the
    /// object's checksum (`x-amz-checksum-mode: ENABLED`, signed with the
    /// request) and has the answer's headers put where it says
    /// (`list::Answers`), since object_store reads no checksum from an
    /// answer.
    heads: AmazonS3,
    /// Where requests go, for "cannot reach" messages.
    endpoint: String,
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
        bucket: &str,
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
            store.s3.get_opts(
                key,
                GetOptions {
                    range,
                    ..GetOptions::default()
                },
            )
        };
        let result = match get(range.clone()).await {
            Ok(result) => result,
            Err(e) if range.is_some() => match store.s3.head(key).await {
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
    fn store(&self, bucket: &str, credentials: Option<&Credentials>) -> Result<Arc<Store>, String> {
        let id = StoreId {
            bucket: bucket.to_string(),
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
                // A few quick retries: an unreachable endpoint is reported
                // in seconds, not after object_store's default ten.
                .with_retry(RetryConfig {
                    max_retries: 4,
                    retry_timeout: Duration::from_secs(180),
                    ..RetryConfig::default()
                })
                .build()
                .map_err(unusable)
        };
        Ok(Self {
            s3: finish(builder)?,
            heads: finish(heads)?,
            endpoint: endpoint.unwrap_or_else(|| "AWS S3".to_string()),
            credentials,
        })
    }

    /// What went wrong, in words a person can act on.
    fn describe(&self, e: object_store::Error, url: &url::Url) -> String {
        match &e {
            object_store::Error::NotFound { .. }
                if store_said(&innermost(&e)).starts_with("NoSuchBucket") =>
            {
                format!(
                    "the store at {} has no bucket {} ({url})",
                    self.endpoint,
                    url.host_str().unwrap_or_default()
                )
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
}
