//! The http(s) publishing targets a call's manifest grants, as the outgoing
//! HTTP gate sees them: which one covers a request (same scheme, host and
//! port, a path under the target's), whether the target's `call` lets the
//! deployer send that request with its credentials, whether the guest set
//! a header the target's credentials set, and adding those headers. A
//! path a server could read as another one (`Key::of_request_path`: `..`,
//! `..;`, `%2e`, an encoded `/`) at a target's host is `Ambiguous`, never
//! under or outside it. The headers are added by the host at send time,
//! after the gate: the guest never reads them, and a guest's own header of
//! the same name is refused rather than overwritten, so a plugin never
//! believes it sent what it did not. Never decides alone whether a
//! request passes (`http_gate` does); knows nothing of uploads.

use std::sync::Arc;

use http::HeaderMap;
use http::header::HeaderName;

use crate::key::Key;
use crate::targets::{Call, Kind, Targets};

/// One granted target of kind http or https.
pub(crate) struct HttpTarget {
    name: String,
    /// Ends with `/`.
    url: url::Url,
    /// Marked sensitive; never logged.
    headers: HeaderMap,
    /// The deployer's own requests its headers go with; `None`: none.
    call: Option<Call>,
}

/// Where a request stands against the call's targets.
pub(crate) enum Covering {
    /// At no target's scheme, host and port, or there outside every
    /// target's path.
    Outside,
    /// Under `target`'s url, at `relative` (past the url, from `/`).
    Under {
        target: Arc<HttpTarget>,
        relative: String,
    },
    /// At a target's host, in a path a server may read as another one.
    Ambiguous { why: String },
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
                Kind::Http { headers, call } => Some(Arc::new(HttpTarget {
                    name: target.name().to_string(),
                    url: target.url().clone(),
                    headers: headers.clone(),
                    call: call.clone(),
                })),
                Kind::S3 { .. }
                | Kind::Gcs { .. }
                | Kind::Azure { .. }
                | Kind::Oci { .. }
                | Kind::File => None,
            })
            .collect();
        entries.sort_by_key(|t| std::cmp::Reverse(t.url.path().len()));
        Self { entries }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Where `uri` stands: under the target whose url covers it (the
    /// most specific), at a target's host in a path that is not plainly
    /// one path, or outside them all.
    pub(crate) fn covering(&self, uri: &http::Uri) -> Covering {
        let scheme = uri.scheme_str().unwrap_or("https");
        let Some(authority) = uri.authority().map(|a| a.as_str()) else {
            return Covering::Outside;
        };
        let Ok(origin) = url::Url::parse(&format!("{scheme}://{authority}/")) else {
            return Covering::Outside;
        };
        let mut at_host = self.entries.iter().filter(|t| {
            t.url.scheme() == origin.scheme()
                && t.url.host_str() == origin.host_str()
                && t.url.port_or_known_default() == origin.port_or_known_default()
        });
        let Some(first) = at_host.next() else {
            return Covering::Outside;
        };
        let path = uri.path();
        // The whole path, so that `/elsewhere/../base/` is no way in either.
        let whole = path.trim_start_matches('/');
        let whole = whole.strip_suffix('/').unwrap_or(whole);
        let problem = if authority.contains('@') {
            Some("it names a user before the host".to_string())
        } else if whole.is_empty() {
            None
        } else {
            Key::of_request_path(whole).err()
        };
        if let Some(why) = problem {
            return Covering::Ambiguous { why };
        }
        for target in std::iter::once(first).chain(at_host) {
            if let Some(rest) = path.strip_prefix(target.url.path()) {
                return Covering::Under {
                    target: target.clone(),
                    relative: format!("/{rest}"),
                };
            }
        }
        Covering::Outside
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

    /// Whether the deployer may send `method` at `relative` with this
    /// target's credentials, or a sentence saying what the target allows.
    pub(crate) fn allows(&self, method: &http::Method, relative: &str) -> Result<(), String> {
        match &self.call {
            Some(call) if call.allows(method, relative) => Ok(()),
            Some(call) => Err(format!(
                "{method} {relative} is not among the requests target {:?} ({}) takes from a \
                 deployer (its call: {}); the operator widens call in the sources file",
                self.name,
                self.url,
                call.said()
            )),
            None => Err(format!(
                "it is under target {:?} ({}), which takes no request of a deployer's own (it has \
                 no call in the sources file); publish through the target instead",
                self.name, self.url
            )),
        }
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
call = { methods = ["POST"], paths = ["/hooks/*/done"] }

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
call = { methods = ["get", "HEAD"] }
"#;

    fn granted(names: &[&str]) -> HttpTargets {
        let targets = Targets::parse(SOURCES, "sources.toml", |_| None).unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        HttpTargets::granted(&targets, "p", &names)
    }

    /// `name` of the covering target, `-` outside, `?` ambiguous.
    #[track_caller]
    fn check(targets: &HttpTargets, uri: &str, expected: &str) {
        let got = match targets.covering(&uri.parse().unwrap()) {
            Covering::Under { target, .. } => target.name().to_string(),
            Covering::Outside => "-".to_string(),
            Covering::Ambiguous { .. } => "?".to_string(),
        };
        assert_eq!(got, expected, "{uri}");
    }

    #[test]
    fn a_target_covers_only_its_scheme_host_port_and_path() {
        let all = granted(&["mirror", "inner", "bucket", "plain", "elsewhere"]);
        for (uri, expected) in [
            ("https://mirror.internal:8443/base/", "mirror"),
            ("https://mirror.internal:8443/base/7/a.bin", "mirror"),
            ("https://MIRROR.internal:8443/base/a?x=1", "mirror"),
            ("https://mirror.internal:8443/base/inner/a", "inner"),
            ("https://mirror.internal:8443/base/innerx", "mirror"),
            ("https://mirror.internal:8443/base", "-"),
            ("https://mirror.internal:8443/basement/a", "-"),
            ("https://mirror.internal:8443/other/a", "-"),
            ("https://mirror.internal:8443/", "-"),
            ("https://mirror.internal/base/a", "-"),
            ("http://mirror.internal:8443/base/a", "-"),
            ("https://evil.internal:8443/base/a", "-"),
            ("https://u@mirror.internal:8443/base/a", "?"),
            // Paths a server could read as another one, in or out of the
            // target's path: at its host, neither under nor outside.
            ("https://mirror.internal:8443/base/../admin", "?"),
            ("https://mirror.internal:8443/other/../base/a", "?"),
            ("https://mirror.internal:8443/base/%2e%2e/admin", "?"),
            ("https://mirror.internal:8443/base/%252e%252e/admin", "?"),
            ("https://mirror.internal:8443/base/./a", "?"),
            ("https://mirror.internal:8443/base/..;/shared/x", "?"),
            ("https://mirror.internal:8443/base/..%3b/shared/x", "?"),
            ("https://mirror.internal:8443/base/a;x=1", "?"),
            ("https://mirror.internal:8443/base//a", "?"),
            ("https://mirror.internal:8443/base/..%2Fadmin", "?"),
            ("https://mirror.internal:8443/base/..%5cadmin", "?"),
            ("http://10.0.0.5/up/a", "plain"),
            ("http://10.0.0.5:80/up/a", "plain"),
            // At no target's host, a path is not berth's to judge.
            ("https://evil.internal:8443/base/../x", "-"),
        ] {
            check(&all, uri, expected);
        }
        // Granted but not configured, an s3 target, or not granted: nothing.
        check(
            &granted(&["elsewhere", "bucket"]),
            "https://mirror.internal:8443/base/a",
            "-",
        );
        assert!(granted(&["bucket"]).is_empty());
        check(
            &granted(&["plain"]),
            "https://mirror.internal:8443/base/a",
            "-",
        );
    }

    #[test]
    fn a_deployers_own_request_takes_the_credentials_only_where_call_allows() {
        let all = granted(&["mirror", "inner", "plain"]);
        let under = |uri: &str| match all.covering(&uri.parse().unwrap()) {
            Covering::Under { target, relative } => (target, relative),
            _ => panic!("{uri} is not under a target"),
        };
        let (mirror, relative) = under("https://mirror.internal:8443/base/hooks/7/done?x=1");
        assert_eq!(relative, "/hooks/7/done");
        assert_eq!(mirror.allows(&http::Method::POST, &relative), Ok(()));
        for (method, path) in [
            (http::Method::GET, "/hooks/7/done"),
            (http::Method::DELETE, "/hooks/7/done"),
            (http::Method::POST, "/models/a"),
            (http::Method::POST, "/"),
        ] {
            let refusal = mirror.allows(&method, path).unwrap_err();
            assert_eq!(
                refusal,
                format!(
                    "{method} {path} is not among the requests target \"mirror\" \
                     (https://mirror.internal:8443/base/) takes from a deployer (its call: POST at \
                     /hooks/*/done); the operator widens call in the sources file"
                )
            );
        }
        let (inner, relative) = under("https://mirror.internal:8443/base/inner/a");
        assert_eq!(
            inner.allows(&http::Method::GET, &relative).unwrap_err(),
            "it is under target \"inner\" (https://mirror.internal:8443/base/inner/), which takes \
             no request of a deployer's own (it has no call in the sources file); publish through \
             the target instead"
        );
        let (plain, relative) = under("http://10.0.0.5/up/");
        assert_eq!(relative, "/");
        assert_eq!(plain.allows(&http::Method::GET, "/"), Ok(()));
        assert_eq!(plain.allows(&http::Method::HEAD, "/a/b"), Ok(()));
        assert!(plain.allows(&http::Method::PUT, "/a").is_err());
    }

    #[test]
    fn the_targets_headers_are_added_and_a_guests_own_one_is_found() {
        let all = granted(&["mirror"]);
        let Covering::Under { target, .. } =
            all.covering(&"https://mirror.internal:8443/base/a".parse().unwrap())
        else {
            panic!("under mirror")
        };
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
