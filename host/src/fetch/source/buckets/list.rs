//! Listing a prefix of an object store, for a registration that leaves
//! its files out: every object under it, walked a folder at a time, each
//! with its size as listed and, from a HEAD, the sha256 the store keeps of
//! it if any: S3's `x-amz-checksum-sha256` of a whole object. Google Cloud
//! Storage keeps an MD5 and a CRC32C, Azure a Content-MD5 (and CRC64 of
//! blocks): none is a sha256, so their files are listed with sizes only.
//! Never reads an object's bytes.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::list::PaginatedListOptions;
use object_store::path::Path as Key;
use object_store::{ClientOptions, Extensions, GetOptions, HeaderMap, HeaderValue, ObjectStore};

use super::{Store, Stores, innermost};
use crate::cloud::{Bucket, no_credential};
use crate::fetch::source::access::Credentials;
use crate::fetch::source::discover::{Found, MAX_FILES};
use crate::s3::{store_said, unreachable};

/// How many objects a listing asks about (HEAD) at once.
const HEADS_AT_ONCE: usize = 16;

impl Stores {
    /// Every object under the prefix `key` of `bucket` (shown as `url`,
    /// ending in `/`), with the settings `credentials` add to the
    /// environment's: its path below the prefix, its size as listed and
    /// the sha256 the store keeps of it, if any. Folder markers (keys
    /// ending in `/`) are left out; none left, or more than `MAX_FILES`,
    /// is refused.
    pub(crate) async fn list(
        &self,
        url: &url::Url,
        bucket: &Bucket,
        key: &Key,
        credentials: Option<&Credentials>,
    ) -> Result<Vec<Found>, String> {
        self.list_at_most(url, bucket, key, credentials, MAX_FILES)
            .await
    }

    /// `list`, refusing more than `limit` objects.
    pub(crate) async fn list_at_most(
        &self,
        url: &url::Url,
        bucket: &Bucket,
        key: &Key,
        credentials: Option<&Credentials>,
        limit: usize,
    ) -> Result<Vec<Found>, String> {
        let store = self.store(bucket, credentials)?;
        let listed = store.walk(url, key, limit).await?;
        if listed.is_empty() {
            return Err(format!(
                "the store has no objects under {url}: check the prefix, or give the files in \
                 the registration"
            ));
        }
        futures::stream::iter(listed)
            .map(|(path, meta)| {
                let store = &store;
                async move {
                    let mut object = url.clone();
                    object.set_path(&format!("{}{path}", url.path()));
                    let sha256 = store.kept_sha256(&meta.location, &object).await?;
                    Ok(Found {
                        path,
                        size_bytes: meta.size,
                        sha256,
                    })
                }
            })
            .buffered(HEADS_AT_ONCE)
            .try_collect()
            .await
    }
}

impl Store {
    /// The objects under the prefix `key` (shown as `url`), each with its
    /// path below it, sorted by path; more than `limit` is refused. Walked
    /// a folder at a time (`/` as the delimiter), since object_store reads
    /// a key without its last `/`: a folder marker is then the one key a
    /// folder's listing finds at the folder's own name.
    async fn walk(
        &self,
        url: &url::Url,
        key: &Key,
        limit: usize,
    ) -> Result<Vec<(String, object_store::ObjectMeta)>, String> {
        let folder = |key: &str| match key {
            "" => String::new(),
            key => format!("{key}/"),
        };
        let root = folder(key.as_ref());
        let mut folders = vec![root.clone()];
        let mut found = Vec::new();
        while let Some(listed) = folders.pop() {
            let mut page_token = None;
            loop {
                let page = self
                    .client
                    .list_paginated(
                        Some(listed.as_str()).filter(|prefix| !prefix.is_empty()),
                        PaginatedListOptions {
                            delimiter: Some("/".into()),
                            page_token,
                            ..PaginatedListOptions::default()
                        },
                    )
                    .await
                    .map_err(|e| self.describe_listing(e, url))?;
                for meta in page.result.objects {
                    let key = meta.location.as_ref();
                    if folder(key) == listed {
                        continue;
                    }
                    let path = key
                        .strip_prefix(&root)
                        .filter(|path| !path.is_empty())
                        .ok_or_else(|| strange(url, key))?;
                    found.push((path.to_string(), meta));
                    if found.len() > limit {
                        return Err(format!(
                            "the store holds more than {limit} objects under {url}: berth lists \
                             at most {limit}; register a narrower prefix, or give the files in \
                             the registration"
                        ));
                    }
                }
                for sub in page.result.common_prefixes {
                    let sub = folder(sub.as_ref());
                    // A key object_store reads otherwise (`a//b`, `/a`)
                    // would have the walk go round.
                    if sub.len() <= listed.len() || !sub.starts_with(&listed) {
                        return Err(strange(url, &sub));
                    }
                    folders.push(sub);
                }
                page_token = page.page_token;
                if page_token.is_none() {
                    break;
                }
            }
        }
        found.sort_by(|(a, _), (b, _)| a.cmp(b));
        Ok(found)
    }

    /// The sha256 the store keeps of the whole object `key` (shown as
    /// `url`), as lowercase hex: asked for with a HEAD, never the bytes.
    async fn kept_sha256(&self, key: &Key, url: &url::Url) -> Result<Option<String>, String> {
        let Some(heads) = &self.heads else {
            return Ok(None);
        };
        let answered = Answered::default();
        let mut extensions = Extensions::new();
        extensions.insert(answered.clone());
        let options = GetOptions {
            head: true,
            extensions,
            ..GetOptions::default()
        };
        heads
            .get_opts(key, options)
            .await
            .map_err(|e| self.describe(e, url))?;
        let headers = answered.0.lock().expect("never poisoned").take();
        Ok(headers.as_ref().and_then(whole_object_sha256))
    }

    /// What went wrong with a listing, in the words of `describe`: a
    /// listing's error reaches here as object_store's generic one, told
    /// apart by the store's answer.
    fn describe_listing(&self, e: object_store::Error, url: &url::Url) -> String {
        let text = innermost(&e);
        let said = store_said(&text);
        if no_credential(&e) {
            self.no_credential(&e, url)
        } else if let Some(missing) = self.no_bucket(&said, url) {
            missing
        } else if text.contains(" 403 Forbidden") || text.contains(" 401 Unauthorized") {
            format!(
                "the store refused the credentials for {url} ({said}); they are {}",
                self.credentials
            )
        } else if unreachable(&e) {
            format!(
                "cannot reach the store at {} ({url}): {text}{}",
                self.endpoint,
                crate::trust::hint(&e)
            )
        } else {
            format!("the store could not list {url}: {said}")
        }
    }
}

/// A listing that found a key berth cannot take as a path below the prefix.
fn strange(url: &url::Url, key: &str) -> String {
    format!(
        "the store holds a key under {url} that is no file path ({key:?}): give the files in the \
         registration"
    )
}

/// The sha256 of a whole object in a store's answer: `x-amz-checksum-sha256`
/// (base64 of the digest), unless the answer says it is a checksum of the
/// parts' checksums (a multipart upload's, `x-amz-checksum-type:
/// COMPOSITE`, written `…-N`).
fn whole_object_sha256(headers: &HeaderMap) -> Option<String> {
    if headers
        .get("x-amz-checksum-type")
        .is_some_and(|kind| kind != "FULL_OBJECT")
    {
        return None;
    }
    let value = headers.get("x-amz-checksum-sha256")?.to_str().ok()?;
    let digest = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()?;
    (digest.len() == 32).then(|| hex::encode(digest))
}

/// Where the headers of a request's answer go: handed in with the request
/// (its extensions), filled by `Answers`.
#[derive(Clone, Default)]
struct Answered(Arc<Mutex<Option<HeaderMap>>>);

/// object_store's own connector, filling the `Answered` of each request
/// that carries one.
#[derive(Debug)]
pub(super) struct Answers;

impl HttpConnector for Answers {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let client = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Answering(client)))
    }
}

#[derive(Debug)]
struct Answering(HttpClient);

impl HttpService for Answering {
    // The shape `#[async_trait]` gives the trait's method.
    fn call<'life0, 'async_trait>(
        &'life0 self,
        request: HttpRequest,
    ) -> Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let answered = request.extensions().get::<Answered>().cloned();
            let response = self.0.execute(request).await?;
            if let Some(Answered(slot)) = answered {
                *slot.lock().expect("never poisoned") = Some(response.headers().clone());
            }
            Ok(response)
        })
    }
}

/// Client options whose requests ask for the object's checksum
/// (`x-amz-checksum-mode: ENABLED`): object_store signs its default
/// headers with each GET and HEAD, as S3 wants of every `x-amz-` header.
pub(super) fn asking_for_checksums() -> ClientOptions {
    ClientOptions::new().with_default_headers(HeaderMap::from_iter([(
        http::header::HeaderName::from_static("x-amz-checksum-mode"),
        HeaderValue::from_static("ENABLED"),
    )]))
}

#[cfg(test)]
mod tests {
    use object_store::{HeaderMap, HeaderValue};

    #[test]
    fn a_kept_sha256_is_the_whole_objects_only() {
        // sha256("hello world"), as S3 writes it and as berth records it.
        const BASE64: &str = "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek=";
        const HEX: &str = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9";
        let headers = |pairs: &[(&'static str, &'static str)]| {
            HeaderMap::from_iter(
                pairs
                    .iter()
                    .map(|(name, value)| (name.parse().unwrap(), HeaderValue::from_static(value))),
            )
        };
        // An answer's headers, and the sha256 recorded.
        type Case = (
            &'static [(&'static str, &'static str)],
            Option<&'static str>,
        );
        let cases: [Case; 6] = [
            (&[("x-amz-checksum-sha256", BASE64)], Some(HEX)),
            (
                &[
                    ("x-amz-checksum-sha256", BASE64),
                    ("x-amz-checksum-type", "FULL_OBJECT"),
                ],
                Some(HEX),
            ),
            // A multipart upload's: the checksum of its parts' checksums.
            (
                &[
                    (
                        "x-amz-checksum-sha256",
                        "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek=-3",
                    ),
                    ("x-amz-checksum-type", "COMPOSITE"),
                ],
                None,
            ),
            (&[("x-amz-checksum-crc32", "DUoRhQ==")], None),
            // Not 32 bytes, or not base64.
            (&[("x-amz-checksum-sha256", "DUoRhQ==")], None),
            (&[("x-amz-checksum-sha256", "not base64!")], None),
        ];
        for (pairs, expected) in cases {
            assert_eq!(
                super::whole_object_sha256(&headers(pairs)).as_deref(),
                expected,
                "{pairs:?}"
            );
        }
    }
}
