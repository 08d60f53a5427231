//! The http(s) publishing targets a call's manifest grants, as the outgoing
//! HTTP gate sees them: which one covers a request (same scheme, host and
//! port, a path under the target's: `host_env::under`, the rule sources'
//! credentials follow too), whether the guest set a header the target's
//! credentials set, and adding those headers to a covered request. The
//! headers are added by the host at send time, after the gate: the guest
//! never reads them, and a guest's own header of the same name is refused
//! rather than overwritten, so a plugin never believes it sent what it did
//! not. Never decides alone whether a request passes (`http_gate` does);
//! knows nothing of uploads.

use std::sync::Arc;

use http::HeaderMap;
use http::header::HeaderName;

use crate::host_env::under;
use crate::targets::{Kind, Targets};

/// One granted target of kind http or https.
pub(crate) struct HttpTarget {
    name: String,
    /// Ends with `/`.
    url: url::Url,
    /// Marked sensitive; never logged.
    headers: HeaderMap,
}

/// A call's granted http(s) targets, the most specific URL first, so that
/// of two nested targets the inner one's credentials go under its URL.
#[derive(Default)]
pub(crate) struct HttpTargets {
    /// Shared with the sends under way.
    entries: Vec<Arc<HttpTarget>>,
}

impl HttpTargets {
    /// The targets of `targets` that `granted` (a manifest's `targets`)
    /// names and that are http(s) ones; a name this server does not
    /// configure grants nothing (opening it says why).
    pub(crate) fn granted(targets: &Targets, plugin: &str, granted: &[String]) -> Self {
        let mut entries: Vec<Arc<HttpTarget>> = granted
            .iter()
            .filter_map(|name| targets.open(plugin, granted, name).ok())
            .filter_map(|target| match target.kind() {
                Kind::Http { headers } => Some(Arc::new(HttpTarget {
                    name: target.name().to_string(),
                    url: target.url().clone(),
                    headers: headers.clone(),
                })),
                Kind::S3 { .. } | Kind::Oci { .. } | Kind::File => None,
            })
            .collect();
        entries.sort_by_key(|t| std::cmp::Reverse(t.url.path().len()));
        Self { entries }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The target whose URL covers `uri`, if any. A path that a server
    /// could read as another one is covered by none: `.` and `..`
    /// segments (also percent-encoded; the path as sent must be the path
    /// as resolved), and encoded slashes or backslashes, which some
    /// servers decode into separators. Such a request gets no credentials
    /// and passes only if `allowed_hosts` lets it.
    pub(crate) fn covering(&self, uri: &http::Uri) -> Option<&Arc<HttpTarget>> {
        if self.entries.is_empty() {
            return None;
        }
        let scheme = uri.scheme_str().unwrap_or("https");
        let authority = uri.authority()?.as_str();
        let path = uri.path();
        let lowered = path.to_ascii_lowercase();
        if authority.contains('@') || lowered.contains("%2f") || lowered.contains("%5c") {
            return None;
        }
        let url = url::Url::parse(&format!("{scheme}://{authority}{path}")).ok()?;
        if url.path() != path {
            return None;
        }
        self.entries.iter().find(|t| under(&t.url, &url))
    }

    /// For a refusal: each target as `name (url)`.
    pub(crate) fn listed(&self) -> String {
        let each: Vec<String> = self
            .entries
            .iter()
            .map(|t| format!("{} ({})", t.name, t.url))
            .collect();
        each.join(", ")
    }
}

impl HttpTarget {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn url(&self) -> &url::Url {
        &self.url
    }

    /// The first header of `request` that this target's credentials set.
    pub(crate) fn clash(&self, request: &HeaderMap) -> Option<&HeaderName> {
        self.headers.keys().find(|name| request.contains_key(*name))
    }

    /// Adds the target's headers to `request`; `clash` found none set.
    pub(crate) fn add_headers(&self, request: &mut HeaderMap) {
        for (name, value) in &self.headers {
            request.append(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCES: &str = r#"
[[target]]
name = "mirror"
url = "https://mirror.internal:8443/base/"
headers = { Authorization = "Bearer s3cret", X-Team = "ml" }

[[target]]
name = "inner"
url = "https://mirror.internal:8443/base/inner/"
headers = { Authorization = "Bearer inner" }

[[target]]
name = "bucket"
url = "s3://bucket/models/"

[[target]]
name = "plain"
url = "http://10.0.0.5/up/"
headers = { Authorization = "Bearer plain" }
"#;

    fn granted(names: &[&str]) -> HttpTargets {
        let targets = Targets::parse(SOURCES, "sources.toml", |_| None).unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        HttpTargets::granted(&targets, "p", &names)
    }

    #[track_caller]
    fn check(targets: &HttpTargets, uri: &str, expected: Option<&str>) {
        let covering = targets.covering(&uri.parse().unwrap());
        assert_eq!(covering.map(|t| t.name()), expected, "{uri}");
    }

    #[test]
    fn a_target_covers_only_its_scheme_host_port_and_path() {
        let all = granted(&["mirror", "inner", "bucket", "plain", "elsewhere"]);
        for (uri, expected) in [
            ("https://mirror.internal:8443/base/", Some("mirror")),
            ("https://mirror.internal:8443/base/7/a.bin", Some("mirror")),
            ("https://MIRROR.internal:8443/base/a?x=1", Some("mirror")),
            ("https://mirror.internal:8443/base/inner/a", Some("inner")),
            ("https://mirror.internal:8443/base/innerx", Some("mirror")),
            ("https://mirror.internal:8443/base", None),
            ("https://mirror.internal:8443/basement/a", None),
            ("https://mirror.internal:8443/other/a", None),
            ("https://mirror.internal/base/a", None),
            ("http://mirror.internal:8443/base/a", None),
            ("https://evil.internal:8443/base/a", None),
            ("https://u@mirror.internal:8443/base/a", None),
            // Paths a server could read as another one.
            ("https://mirror.internal:8443/base/../admin", None),
            ("https://mirror.internal:8443/base/%2e%2e/admin", None),
            ("https://mirror.internal:8443/base/./a", None),
            ("https://mirror.internal:8443/base/..%2Fadmin", None),
            ("https://mirror.internal:8443/base/..%5cadmin", None),
            ("http://10.0.0.5/up/a", Some("plain")),
            ("http://10.0.0.5:80/up/a", Some("plain")),
        ] {
            check(&all, uri, expected);
        }
        // Granted but not configured, an s3 target, or not granted: nothing.
        check(
            &granted(&["elsewhere", "bucket"]),
            "https://mirror.internal:8443/base/a",
            None,
        );
        assert!(granted(&["bucket"]).is_empty());
        check(
            &granted(&["plain"]),
            "https://mirror.internal:8443/base/a",
            None,
        );
    }

    #[test]
    fn the_targets_headers_are_added_and_a_guests_own_one_is_found() {
        let all = granted(&["mirror"]);
        let target = all
            .covering(&"https://mirror.internal:8443/base/a".parse().unwrap())
            .unwrap();
        let mut request = HeaderMap::new();
        request.insert("content-type", "application/octet-stream".parse().unwrap());
        assert_eq!(target.clash(&request), None);
        target.add_headers(&mut request);
        assert_eq!(request["authorization"], "Bearer s3cret");
        assert_eq!(request["x-team"], "ml");
        assert!(request["authorization"].is_sensitive());

        let mut own = HeaderMap::new();
        own.insert("Authorization", "Bearer mine".parse().unwrap());
        assert_eq!(
            target.clash(&own).map(HeaderName::as_str),
            Some("authorization")
        );
        assert_eq!(all.listed(), "mirror (https://mirror.internal:8443/base/)");
    }
}
