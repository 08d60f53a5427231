//! Credentials for sources, held by the server and never by a model: the
//! sources file (`berth serve --sources-file`) gives HTTP headers, or
//! object-store options, or a registry login (`oci://` prefixes: options
//! `username` and `password`; `gs://` and `az://` prefixes: GCS or Azure
//! options, or `anonymous = true`), to the source URLs under a prefix. **The
//! credentials of a prefix go only to URLs under that prefix**: same scheme,
//! host and port, a path under the prefix's path; the longest prefix that
//! covers a URL wins. A model's `source` is visible to every API reader, so
//! no secret can live there. Values are resolved from the environment at
//! load (`${VAR}`); they are never logged (`Debug` redacts them) and never
//! reach a row. The same file holds the publishing targets (`[[target]]`,
//! read by `crate::targets`). Does no I/O but reading the file.

use std::collections::BTreeMap;
use std::path::Path;

use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::cloud::{azure_option, gcs_option};
use crate::host_env::{expand, header_value, registry_login, s3_option, under};
use crate::oci::Login;
use crate::sources_file::{self, Entries};

/// The parsed sources file; `Default` is no file: no source gets
/// credentials.
#[derive(Debug, Default)]
pub struct Access {
    /// Longest prefix first, so the first that covers a URL is the one.
    entries: Vec<Credentials>,
}

/// What the sources file gives the URLs under one prefix.
pub(crate) struct Credentials {
    prefix: url::Url,
    /// For `http`/`https` prefixes; values marked sensitive.
    headers: HeaderMap,
    /// For `s3` prefixes: object_store settings applied on top of the
    /// environment's.
    options: Vec<(AmazonS3ConfigKey, String)>,
    /// For `gs` prefixes: object_store GCS settings.
    gcs: Vec<(GoogleConfigKey, String)>,
    /// For `az` prefixes: object_store Azure settings.
    azure: Vec<(AzureConfigKey, String)>,
    /// For `gs` and `az` prefixes: read without credentials, as the entry
    /// says; never otherwise.
    anonymous: bool,
    /// For `oci` prefixes: the registry login.
    login: Option<Login>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    prefix: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    options: BTreeMap<String, String>,
    #[serde(default)]
    anonymous: bool,
}

impl Access {
    /// Reads the sources file at `path`, resolving `${VAR}` from berth's
    /// environment.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = sources_file::read(path)?;
        Self::parse(&text, |var| std::env::var(var).ok())
            .map_err(|e| anyhow::anyhow!("sources file {}: {e}", path.display()))
    }

    /// Parses a sources file's text; every problem is reported at once.
    /// `lookup` reads the host environment.
    pub fn parse(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let raw: Entries<RawSource, IgnoredAny> =
            sources_file::parse(text).map_err(|(line, e)| match line {
                Some(line) => format!("line {line}: {e}"),
                None => e,
            })?;
        let mut problems = Vec::new();
        let mut entries: Vec<Credentials> = Vec::new();
        for source in raw.source {
            match Credentials::resolve(source.into_inner(), &lookup) {
                Ok(entry) if entries.iter().any(|e| e.prefix == entry.prefix) => {
                    problems.push(format!(
                        "prefix {:?} is listed twice",
                        entry.prefix.as_str()
                    ));
                }
                Ok(entry) => entries.push(entry),
                Err(mut each) => problems.append(&mut each),
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.prefix.path().len()));
        Ok(Self { entries })
    }

    /// The credentials for `url`: those of the longest prefix covering it.
    pub(crate) fn covering(&self, url: &url::Url) -> Option<&Credentials> {
        self.entries.iter().find(|e| e.covers(url))
    }

    /// The prefixes that have credentials, for the log.
    pub fn prefixes(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.prefix.to_string()).collect()
    }
}

impl Credentials {
    /// Checks one `[[source]]` entry and resolves its values; the problems
    /// each name the prefix.
    fn resolve(
        raw: RawSource,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Vec<String>> {
        let name = &raw.prefix;
        let prefix = url::Url::parse(name)
            .map_err(|e| vec![format!("prefix {name:?} is not a URL: {e}")])?;
        let is_http = matches!(prefix.scheme(), "http" | "https");
        let is_oci = prefix.scheme() == "oci";
        let is_cloud = matches!(prefix.scheme(), "gs" | "az");
        if !is_http && !is_oci && !is_cloud && prefix.scheme() != "s3" {
            return Err(vec![format!(
                "prefix {name:?}: scheme {} takes no credentials (use http, https, s3, gs, az \
                 or oci)",
                prefix.scheme()
            )]);
        }
        if is_http && let Some(Ok((_, written, _))) = crate::cloud::Bucket::locate(&prefix) {
            return Err(vec![format!(
                "prefix {name:?}: berth reads Azure Blob URLs with its Azure client; write the \
                 prefix as {written}"
            )]);
        }
        // The host is what keeps the credentials on the server they are for.
        if prefix.host_str().is_none_or(str::is_empty) {
            return Err(vec![format!(
                "prefix {name:?} names no host (or bucket): credentials must say where they go"
            )]);
        }
        if prefix.query().is_some()
            || prefix.fragment().is_some()
            || !prefix.username().is_empty()
            || prefix.password().is_some()
        {
            return Err(vec![format!(
                "prefix {name:?} must not have a query, fragment or user name (put credentials in headers or options)"
            )]);
        }

        let mut problems = Vec::new();
        let mut headers = HeaderMap::new();
        let mut options = Vec::new();
        if is_http && !raw.options.is_empty() {
            problems.push(format!(
                "prefix {name:?}: options are for object stores; an http source takes headers"
            ));
        }
        if !is_http && !raw.headers.is_empty() {
            let takes = if is_oci {
                "a registry takes options username and password"
            } else {
                "an object store takes options"
            };
            problems.push(format!(
                "prefix {name:?}: headers are for http and https sources; {takes}"
            ));
        }
        for (header, template) in &raw.headers {
            match header_value(header, template, lookup) {
                Ok((header_name, value)) => {
                    headers.append(header_name, value);
                }
                Err(e) => problems.push(format!("prefix {name:?}: {e}")),
            }
        }
        if raw.anonymous && !is_cloud {
            problems.push(format!(
                "prefix {name:?}: anonymous is for gs:// and az:// prefixes"
            ));
        }
        let mut login = None;
        let (mut gcs, mut azure) = (Vec::new(), Vec::new());
        if is_cloud {
            for (option, template) in &raw.options {
                let resolved = expand(template, lookup)
                    .map_err(|e| format!("options.{option}: {e}"))
                    .and_then(|value| match prefix.scheme() {
                        "gs" => gcs_option(option, value).map(|pair| gcs.push(pair)),
                        _ => azure_option(option, value).map(|pair| azure.push(pair)),
                    });
                if let Err(e) = resolved {
                    problems.push(format!("prefix {name:?}: {e}"));
                }
            }
        } else if is_oci {
            match registry_login(&raw.options, lookup) {
                Ok(found) => login = found,
                Err(e) => problems.push(format!("prefix {name:?}: {e}")),
            }
        } else {
            for (option, template) in &raw.options {
                match s3_option(option, template, "the source URL", lookup) {
                    Ok(pair) => options.push(pair),
                    Err(e) => problems.push(format!("prefix {name:?}: {e}")),
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Self {
            prefix,
            headers,
            options,
            gcs,
            azure,
            anonymous: raw.anonymous,
            login,
        })
    }

    /// Whether `url` is under this prefix: same scheme, host and port, and
    /// a path that is the prefix's or continues it (`/models` covers
    /// `/models/a`, not `/models2`).
    fn covers(&self, url: &url::Url) -> bool {
        under(&self.prefix, url)
    }

    /// The prefix as written in messages.
    pub(crate) fn prefix(&self) -> &url::Url {
        &self.prefix
    }

    pub(crate) fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    pub(crate) fn options(&self) -> &[(AmazonS3ConfigKey, String)] {
        &self.options
    }

    pub(crate) fn gcs(&self) -> &[(GoogleConfigKey, String)] {
        &self.gcs
    }

    pub(crate) fn azure(&self) -> &[(AzureConfigKey, String)] {
        &self.azure
    }

    pub(crate) fn anonymous(&self) -> bool {
        self.anonymous
    }

    pub(crate) fn login(&self) -> Option<&Login> {
        self.login.as_ref()
    }
}

/// Names only: the values are secrets.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<_> = self.headers.keys().map(|k| format!("{k}: ***")).collect();
        let options: Vec<_> = (self.options.iter().map(|(k, _)| format!("{k:?}")))
            .chain(self.gcs.iter().map(|(k, _)| format!("{k:?}")))
            .chain(self.azure.iter().map(|(k, _)| format!("{k:?}")))
            .map(|k| format!("{k} = ***"))
            .collect();
        f.debug_struct("Credentials")
            .field("prefix", &self.prefix.as_str())
            .field("headers", &headers)
            .field("options", &options)
            .field("anonymous", &self.anonymous)
            .field("login", &self.login)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "HUB_TOKEN").then(|| "s3cret".to_string())
    }

    const FILE: &str = r#"
        [[source]]
        prefix = "https://hub.internal/models/"
        headers = { Authorization = "Bearer ${HUB_TOKEN}" }

        [[source]]
        prefix = "https://hub.internal/models/private"
        headers = { "X-Key" = "k" }

        [[source]]
        prefix = "s3://team-models/"
        options = { endpoint = "http://127.0.0.1:9000", region = "us-east-1", secret_access_key = "${HUB_TOKEN}" }
    "#;

    #[test]
    fn a_registry_prefix_gives_its_login_to_its_repositories_only() {
        let text = "[[source]]\nprefix = \"oci://127.0.0.1:5000/team/\"\n\
                    options = { username = \"ci\", password = \"${HUB_TOKEN}\" }";
        let access = Access::parse(text, env).unwrap();
        let login = |url: &str| {
            access
                .covering(&url::Url::parse(url).unwrap())
                .and_then(Credentials::login)
                .map(|l| (l.username.clone(), l.password.clone()))
        };
        let ci = Some(("ci".to_string(), "s3cret".to_string()));
        assert_eq!(login("oci://127.0.0.1:5000/team/model"), ci);
        assert_eq!(login("oci://127.0.0.1:5000/other/model"), None);
        assert_eq!(login("oci://127.0.0.1:5001/team/model"), None);
        assert!(!format!("{access:?}").contains("s3cret"));
    }

    #[test]
    fn the_longest_prefix_covering_a_url_wins_and_only_on_its_host() {
        let access = Access::parse(FILE, env).unwrap();
        let covering = |url: &str| {
            access
                .covering(&url::Url::parse(url).unwrap())
                .map(|c| c.prefix().to_string())
        };
        let hub = Some("https://hub.internal/models/".to_string());
        let private = Some("https://hub.internal/models/private".to_string());
        let cases = [
            ("https://hub.internal/models/a/b.bin", hub.clone()),
            ("https://HUB.internal:443/models/a", hub.clone()),
            ("https://hub.internal/models/private/x", private.clone()),
            ("https://hub.internal/models/private", private),
            ("https://hub.internal/models/privateer/x", hub),
            ("https://hub.internal/other/a", None),
            ("http://hub.internal/models/a", None),
            ("https://hub.internal:8443/models/a", None),
            ("https://hub.internal.evil.example/models/a", None),
            ("https://evil.example/hub.internal/models/a", None),
            (
                "s3://team-models/job/a.bin",
                Some("s3://team-models/".to_string()),
            ),
            ("s3://team-models-2/job/a.bin", None),
        ];
        for (url, expected) in cases {
            assert_eq!(covering(url), expected, "{url}");
        }
    }

    #[test]
    fn values_are_resolved_from_the_environment_and_never_shown() {
        let access = Access::parse(FILE, env).unwrap();
        let hub = access
            .covering(&url::Url::parse("https://hub.internal/models/a").unwrap())
            .unwrap();
        assert_eq!(hub.headers()["authorization"], "Bearer s3cret");
        assert!(hub.headers()["authorization"].is_sensitive());
        let store = access
            .covering(&url::Url::parse("s3://team-models/a").unwrap())
            .unwrap();
        assert!(
            store
                .options()
                .contains(&(AmazonS3ConfigKey::SecretAccessKey, "s3cret".to_string()))
        );
        let shown = format!("{access:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("authorization: ***"), "{shown}");
    }

    #[test]
    fn each_bad_sources_file_says_what_is_wrong() {
        let source = |body: &str| format!("[[source]]\n{body}");
        let cases = [
            (
                source("prefix = \"https://h/\"\nheaders = { A = \"${MISSING}\" }"),
                "prefix \"https://h/\": headers.A: the host environment variable MISSING is not set",
            ),
            (
                source("prefix = \"https://h/\"\nheders = { A = \"b\" }"),
                "line 3: unknown field `heders`",
            ),
            (
                "[[sources]]\nprefix = \"https://h/\"".to_string(),
                "unknown field `sources`",
            ),
            (
                source("prefix = \"s3://b/\"\noptions = { endpoint_url_x = \"b\" }"),
                "prefix \"s3://b/\": options.endpoint_url_x is not an S3 setting",
            ),
            (
                source("prefix = \"s3://b/\"\noptions = { bucket = \"other\" }"),
                "the bucket comes from the source URL",
            ),
            (
                source("prefix = \"gs://b/\"\noptions = { skip_signature = \"true\" }"),
                "prefix \"gs://b/\": options.skip_signature: write anonymous = true",
            ),
            (
                source("prefix = \"az://a/c/\"\noptions = { use_emulator = \"true\" }"),
                "options.use_emulator: it signs with the emulator's built-in key",
            ),
            (
                source("prefix = \"az://a/c/\"\noptions = { account_key = \"${MISSING}\" }"),
                "options.account_key: the host environment variable MISSING is not set",
            ),
            (
                source("prefix = \"s3://b/\"\nanonymous = true"),
                "anonymous is for gs:// and az:// prefixes",
            ),
            (
                source("prefix = \"https://a.blob.core.windows.net/c/\""),
                "write the prefix as az://a/c/",
            ),
            (source("prefix = \"hub.internal/models/\""), "is not a URL"),
            (
                source("prefix = \"file:///srv/\""),
                "scheme file takes no credentials",
            ),
            (source("prefix = \"s3:///\""), "names no host"),
            (
                source("prefix = \"https://h/?a=b\""),
                "must not have a query",
            ),
            (
                source("prefix = \"https://u@h/\""),
                "must not have a query, fragment or user",
            ),
            (
                source("prefix = \"https://h/\"\noptions = { region = \"r\" }"),
                "options are for object stores",
            ),
            (
                source("prefix = \"s3://b/\"\nheaders = { A = \"b\" }"),
                "headers are for http and https sources",
            ),
            (
                source("prefix = \"oci://r.io/\"\nheaders = { A = \"b\" }"),
                "a registry takes options username and password",
            ),
            (
                source("prefix = \"oci://r.io/\"\noptions = { username = \"u\" }"),
                "needs both options.username and options.password",
            ),
            (
                source("prefix = \"oci://r.io/\"\noptions = { region = \"r\" }"),
                "options.region is not a registry option (username, password)",
            ),
            (
                source("prefix = \"https://h/\"\nheaders = { \"a b\" = \"c\" }"),
                "headers.a b is not a valid header name",
            ),
            (
                source("prefix = \"https://h/\"\nheaders = { A = \"x\\ny\" }"),
                "headers.A: is not a valid header value",
            ),
            (
                format!(
                    "{}\n{}",
                    source("prefix = \"https://h/a\""),
                    source("prefix = \"https://H/a\"")
                ),
                "prefix \"https://h/a\" is listed twice",
            ),
        ];
        for (text, expected) in cases {
            let err = Access::parse(&text, env).unwrap_err();
            assert!(err.contains(expected), "{text}\n=> {err}");
        }
        // Every problem at once.
        let two = format!(
            "{}\n{}",
            source("prefix = \"https://h/\"\nheaders = { A = \"${X}\" }"),
            source("prefix = \"https://g/\"\nheaders = { A = \"${Y}\" }")
        );
        let err = Access::parse(&two, env).unwrap_err();
        assert!(
            err.contains("variable X") && err.contains("variable Y"),
            "{err}"
        );
    }
}
