//! Where a model's files come from: the model's `source` template filled in
//! for one file (`locate`), and a byte stream of it (`Sources::open`), from
//! an HTTP server (`http`), an object store (`buckets`: S3, Google Cloud
//! Storage, Azure Blob) or a local file (`file`),
//! each with the credentials of the sources-file prefix covering it
//! (`access`). The backends share `Body` and `Span` from here and know
//! nothing of each other. A registration that leaves its files out has
//! them listed at its source (`Sources::discover`, `discover`). Knows
//! nothing of verification.

pub(crate) mod access;
mod answers;
pub(crate) mod buckets;
#[cfg(test)]
mod cloud_tests;
mod discover;
pub(crate) use discover::Discovered;
mod file;
mod http;
mod mlflow;
mod oci;
#[cfg(test)]
mod s3_list_tests;
#[cfg(test)]
mod s3_tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::Stream;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

pub(crate) use crate::causes::innermost;
use crate::cloud::Bucket;
use crate::trust::Trust;
use access::Access;
use buckets::Stores;
pub(crate) use file::open_file;

/// Characters escaped in a filled-in `{path}` or `{job_id}`: everything but
/// unreserved characters and `/`, so nested paths stay nested.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'+')
    .add(b',')
    .add(b';')
    .add(b'<')
    .add(b'=')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}')
    .add(b':')
    .add(b'\'');

/// The location of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    Http(url::Url),
    /// `s3://BUCKET/KEY`, `gs://BUCKET/KEY` or `az://ACCOUNT/CONTAINER/KEY`:
    /// the URL (for messages and credentials), the bucket and the
    /// object's key.
    Store {
        url: url::Url,
        bucket: Bucket,
        key: object_store::path::Path,
    },
    File(PathBuf),
    /// A blob of a registry's repository, by its sha256: `url` is
    /// `oci://REGISTRY/REPO@sha256:BLOB`, for messages.
    Oci {
        url: String,
        reference: crate::oci::Reference,
        sha256: String,
    },
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Http(url) | Location::Store { url, .. } => write!(f, "{url}"),
            Location::File(path) => write!(f, "{}", path.display()),
            Location::Oci { url, .. } => write!(f, "{url}"),
        }
    }
}

/// Where one file of a model is: its blob when the source is a registry's
/// manifest (`oci://…@sha256:…`, files by digest), nowhere for an uploaded
/// model (its files are in the blob store or lost), else the template
/// filled in. The source was validated at registration, so a failure here
/// means the filled-in URL is broken, which is reported.
pub(crate) fn locate(
    source: &str,
    job_id: &str,
    file: &crate::model::ModelFile,
) -> Result<Location, String> {
    if source == crate::model::UPLOADED {
        // Only asked when the store has no intact blob of the file.
        return Err(format!(
            "it was uploaded (source upload:), and the blob store no longer holds its sha256 {}: \
             it was found damaged and removed; push the model again (berth models push)",
            file.sha256.as_deref().unwrap_or("(none)")
        ));
    }
    if source.starts_with("oci://") {
        let reference = crate::oci::Reference::parse(source)?;
        let sha256 = file.sha256.clone().ok_or_else(|| {
            format!(
                "file {} has no sha256, and a registry serves files by digest",
                file.path
            )
        })?;
        let url = format!(
            "oci://{}/{}@sha256:{sha256}",
            reference.registry, reference.repository
        );
        return Ok(Location::Oci {
            url,
            reference,
            sha256,
        });
    }
    fill(source, job_id, &file.path)
}

/// Fills the template.
fn fill(template: &str, job_id: &str, path: &str) -> Result<Location, String> {
    let filled = template
        .replace(
            "{job_id}",
            &utf8_percent_encode(job_id, SEGMENT).to_string(),
        )
        .replace("{path}", &utf8_percent_encode(path, SEGMENT).to_string());
    let url = url::Url::parse(&filled)
        .map_err(|e| format!("the source URL {filled} is not valid: {e}"))?;
    if let Some(located) = Bucket::locate(&url) {
        let (bucket, url, key) = located?;
        return Ok(Location::Store { url, bucket, key });
    }
    match url.scheme() {
        "http" | "https" => Ok(Location::Http(url)),
        "file" => url
            .to_file_path()
            .map(Location::File)
            .map_err(|()| format!("the source URL {filled} is not a local file path")),
        other => Err(format!(
            "the source scheme {other}: is not supported (http, https, s3, gs, az, file)"
        )),
    }
}

pub(crate) type ByteStream = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

/// An open file at the source: its bytes from `start` on.
pub(crate) struct Body {
    pub(crate) stream: ByteStream,
    /// Where the stream begins: the offset that was asked for when the
    /// source honours ranges, 0 when it sends the whole file instead.
    pub(crate) start: u64,
    /// Whether the source answered the range asked for (rather than the
    /// whole file): only such a source can be read in pieces.
    pub(crate) ranged: bool,
    /// The whole file's size as the source tells it, when it does.
    pub(crate) total: Option<u64>,
}

/// The bytes `start..end` of a file (`end` exclusive; `None`: to the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u64,
    pub(crate) end: Option<u64>,
}

impl Span {
    pub(crate) fn from(start: u64) -> Self {
        Self { start, end: None }
    }

    /// Whether this asks for anything but the whole file.
    fn is_partial(&self) -> bool {
        self.start > 0 || self.end.is_some()
    }

    /// The value of an HTTP `Range` header asking for this span.
    fn header(&self) -> String {
        match self.end {
            Some(end) => format!("bytes={}-{}", self.start, end.saturating_sub(1)),
            None => format!("bytes={}-", self.start),
        }
    }
}

/// Where files are read from: the connections to the sources, and the
/// credentials the server holds for them.
#[derive(Clone)]
pub(crate) struct Sources {
    client: reqwest::Client,
    access: Arc<Access>,
    trust: Trust,
    stores: Arc<Stores>,
    registries: Arc<Registries>,
}

/// One client per registry and sources-file prefix (whose login it has).
type Registries = Mutex<HashMap<(String, Option<String>), Arc<crate::oci::Registry>>>;

impl Sources {
    /// Sources over HTTPS trusting the public roots and `trust`'s
    /// certificates; through the proxies of the environment
    /// (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, less `NO_PROXY`), which
    /// reqwest reads when a client is built, as object_store's does.
    pub(crate) fn new(trust: Trust) -> anyhow::Result<Self> {
        let builder = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .read_timeout(std::time::Duration::from_secs(120))
            // Followed by `send`, which decides the credentials of each hop.
            .redirect(reqwest::redirect::Policy::none());
        Ok(Self {
            client: trust.reqwest(builder)?.build()?,
            access: Arc::default(),
            stores: Arc::new(Stores::new(trust.clone())),
            registries: Arc::default(),
            trust,
        })
    }

    /// The same sources with clients that trust `trust` instead.
    pub(crate) fn with_trust(self, trust: Trust) -> anyhow::Result<Self> {
        Ok(Self {
            access: self.access,
            ..Self::new(trust)?
        })
    }

    /// Gives the sources the credentials of `access`.
    pub(crate) fn with_access(self, access: Access) -> Self {
        Self {
            access: Arc::new(access),
            // Stores and registries are built with the credentials they
            // were first asked with.
            stores: Arc::new(Stores::new(self.trust.clone())),
            registries: Arc::default(),
            ..self
        }
    }

    /// Opens the file at `location` for the bytes of `span` (an HTTP
    /// `Range` request unless the span is the whole file); the error says
    /// what the source answered. A source that ignores the range, or finds
    /// it unsatisfiable, is read whole from the start.
    pub(crate) async fn open(&self, location: &Location, span: Span) -> Result<Body, String> {
        match location {
            Location::Http(url) => self.open_http(url, span).await,
            Location::Store { url, bucket, key } => {
                let credentials = self.access.covering(url);
                self.stores.open(url, bucket, key, span, credentials).await
            }
            Location::File(path) => open_file(path, span).await,
            Location::Oci {
                url,
                reference,
                sha256,
            } => self.open_blob(url, reference, sha256, span).await,
        }
    }

    /// The client of `reference`'s registry, with the login of the
    /// sources-file prefix covering its repository (`oci://REG/REPO`).
    pub(crate) fn registry(&self, reference: &crate::oci::Reference) -> Arc<crate::oci::Registry> {
        let credentials = self.access.covering(&reference.url());
        let prefix = credentials.map(|c| c.prefix().to_string());
        let key = (reference.registry.clone(), prefix.clone());
        let mut built = self.registries.lock().expect("not poisoned");
        built
            .entry(key)
            .or_insert_with(|| {
                Arc::new(crate::oci::Registry::new(
                    self.client.clone(),
                    &reference.registry,
                    credentials.and_then(|c| c.login()).cloned(),
                    prefix.map(|p| format!("the sources file's prefix {p}")),
                ))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled_with_escaped_values() {
        let http = |u: &str| Location::Http(url::Url::parse(u).unwrap());
        let cases = [
            (
                "http://files.local/{job_id}/{path}",
                "job-1",
                "a/b.bin",
                http("http://files.local/job-1/a/b.bin"),
            ),
            (
                "http://sidecar:8787/models/file?model_path=trained/{job_id}&file={path}",
                "j",
                "w x&y.bin",
                http("http://sidecar:8787/models/file?model_path=trained/j&file=w%20x%26y.bin"),
            ),
            (
                "file:///srv/models/{job_id}/{path}",
                "j",
                "sub/w x.bin",
                Location::File("/srv/models/j/sub/w x.bin".into()),
            ),
        ];
        for (template, job, path, expected) in cases {
            assert_eq!(fill(template, job, path).unwrap(), expected, "{template}");
        }
    }
}

/// Filling a template over generated job ids and paths: the file lands
/// exactly where the template points, under its host, bucket or directory,
/// whatever characters its path holds.
#[cfg(test)]
mod props {
    use percent_encoding::percent_decode_str;
    use proptest::prelude::*;

    use super::*;
    use crate::strategies::{self, job_id, path};

    /// Where a template puts the job id and the path.
    #[derive(Debug, Clone)]
    enum Shape {
        /// `…/PREFIX/{job_id}/{path}`
        InPath,
        /// `…/PREFIX/file?job={job_id}&file={path}`
        InQuery,
    }

    #[derive(Debug, Clone)]
    struct Template {
        scheme: &'static str,
        /// Host and port, bucket, or empty for `file`.
        authority: String,
        prefix: String,
        shape: Shape,
    }

    impl Template {
        fn text(&self) -> String {
            let Template {
                scheme,
                authority,
                prefix,
                ..
            } = self;
            match self.shape {
                Shape::InPath => format!("{scheme}://{authority}{prefix}/{{job_id}}/{{path}}"),
                Shape::InQuery => {
                    format!("{scheme}://{authority}{prefix}/file?job={{job_id}}&file={{path}}")
                }
            }
        }
    }

    fn template() -> impl Strategy<Value = Template> {
        // No hyphens: `xn--` would start a punycode label, which most
        // text after it is not (registration refuses such a template).
        let host = "[a-z][a-z0-9]{0,8}(\\.[a-z][a-z0-9]{0,8}){0,2}";
        // `/a/b`, or empty.
        let prefix = prop::collection::vec("[a-zA-Z0-9_-]{1,6}", 0..3)
            .prop_map(|segments| segments.iter().map(|s| format!("/{s}")).collect::<String>());
        let http = (
            prop_oneof![Just("http"), Just("https")],
            host,
            prop::option::of(1..=u16::MAX),
            prefix.clone(),
            prop_oneof![Just(Shape::InPath), Just(Shape::InQuery)],
        )
            .prop_map(|(scheme, host, port, prefix, shape)| Template {
                scheme,
                authority: match port {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                },
                prefix,
                shape,
            });
        let s3 =
            ("[a-z0-9][a-z0-9.-]{2,20}", prefix.clone()).prop_map(|(bucket, prefix)| Template {
                scheme: "s3",
                authority: bucket,
                prefix,
                shape: Shape::InPath,
            });
        let file = prefix.prop_map(|prefix| Template {
            scheme: "file",
            authority: String::new(),
            prefix,
            shape: Shape::InPath,
        });
        prop_oneof![http, s3, file]
    }

    fn decoded(text: &str) -> String {
        percent_decode_str(text).decode_utf8().unwrap().into_owned()
    }

    proptest! {
        #![proptest_config(strategies::cases(256))]

        #[test]
        fn a_file_is_located_exactly_where_its_template_points(
            template in template(),
            job in job_id(),
            path in path(),
        ) {
            let text = template.text();
            let location = fill(&text, &job, &path).map_err(TestCaseError::fail)?;
            prop_assert_eq!(&fill(&text, &job, &path).unwrap(), &location, "not deterministic");
            let prefix = &template.prefix;
            match (location, template.scheme) {
                (Location::Http(url), "http" | "https") => {
                    let wanted = url::Url::parse(&text.replace(['{', '}'], "")).unwrap();
                    prop_assert_eq!(url.scheme(), template.scheme);
                    prop_assert_eq!(url.host_str(), wanted.host_str());
                    prop_assert_eq!(url.port_or_known_default(), wanted.port_or_known_default());
                    prop_assert!(url.username().is_empty() && url.password().is_none());
                    prop_assert!(url.fragment().is_none());
                    match template.shape {
                        Shape::InPath => {
                            prop_assert_eq!(decoded(url.path()), format!("{prefix}/{job}/{path}"));
                            prop_assert!(url.query().is_none());
                        }
                        Shape::InQuery => {
                            prop_assert_eq!(url.path(), format!("{prefix}/file"));
                            let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
                            prop_assert_eq!(pairs, [("job".into(), job), ("file".into(), path)]);
                        }
                    }
                }
                (Location::Store { url, bucket, key }, "s3") => {
                    prop_assert_eq!(&bucket, &Bucket::S3(template.authority.clone()));
                    prop_assert_eq!(url.host_str(), Some(template.authority.as_str()));
                    let wanted = format!("{prefix}/{job}/{path}");
                    prop_assert_eq!(key.as_ref(), &wanted[1..]);
                }
                (Location::File(file), "file") => {
                    prop_assert_eq!(file, PathBuf::from(format!("{prefix}/{job}/{path}")));
                }
                (location, scheme) => prop_assert!(false, "{scheme} became {location:?}"),
            }
        }

        /// Whatever the template and values, filling it answers, never
        /// panics.
        #[test]
        fn any_template_is_answered(
            template in prop_oneof![
                template().prop_map(|t| t.text()),
                strategies::text().prop_map(|t| format!("http://h/{t}{{path}}")),
                strategies::text(),
            ],
            job in prop_oneof![job_id(), strategies::text()],
            path in prop_oneof![path(), strategies::text()],
        ) {
            let _ = fill(&template, &job, &path);
        }
    }
}
