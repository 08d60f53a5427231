//! An http(s) target's `call`: which of a deployer's own requests under
//! the target's url carry its credentials (methods and paths, none by
//! default; TRACE and CONNECT never), read from the sources file and
//! asked by the HTTP gate.

use serde::Deserialize;

use crate::key::Key;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCall {
    methods: Vec<String>,
    paths: Option<Vec<String>>,
}

/// Methods a deployer may be let call a target's url with, its
/// credentials added. `TRACE` echoes the request, credentials and all, and
/// `CONNECT` opens a tunnel past the gate: never.
const CALL_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// The requests of a deployer's own that an http(s) target's credentials
/// go with (`call = { methods = [...], paths = [...] }`): these methods, at
/// these paths relative to the target's url (`/` is the url itself; `*`
/// is any text, `/` included).
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    methods: Vec<http::Method>,
    paths: Vec<String>,
}

impl Call {
    pub(super) fn parse(raw: RawCall) -> Result<Self, String> {
        if raw.methods.is_empty() {
            return Err(
                "call.methods is empty: name the methods the deployer may send (e.g. [\"POST\"]), \
                 or leave call out"
                    .into(),
            );
        }
        let mut methods = Vec::new();
        for method in &raw.methods {
            let upper = method.to_ascii_uppercase();
            if upper == "TRACE" || upper == "CONNECT" {
                return Err(format!(
                    "call.methods: {method} is never allowed (TRACE echoes the request with its \
                     credentials; CONNECT tunnels past berth's gate)"
                ));
            }
            if !CALL_METHODS.contains(&upper.as_str()) {
                return Err(format!(
                    "call.methods: {method:?} is not one of {}",
                    CALL_METHODS.join(", ")
                ));
            }
            methods.push(http::Method::from_bytes(upper.as_bytes()).expect("a known method"));
        }
        let paths = raw.paths.unwrap_or_else(|| vec!["/*".to_string()]);
        if paths.is_empty() {
            return Err("call.paths is empty: leave it out to allow every path".into());
        }
        for path in &paths {
            let relative = path.strip_prefix('/').ok_or_else(|| {
                format!("call.paths: {path:?} must start with / (the target's url)")
            })?;
            // `*` stands for text of the key's own kind.
            if !relative.is_empty() {
                Key::parse(&relative.replace('*', "x"))
                    .map_err(|e| format!("call.paths: {path:?}: {e}"))?;
            }
        }
        Ok(Self { methods, paths })
    }

    /// Whether `method` at `relative` (the request's path past the
    /// target's url, starting with `/`) is allowed.
    pub fn allows(&self, method: &http::Method, relative: &str) -> bool {
        self.methods.contains(method) && self.paths.iter().any(|p| glob(p, relative))
    }

    /// As the sources file says it, for `berth config`.
    pub(super) fn as_toml(&self) -> String {
        let methods: Vec<String> = self
            .methods
            .iter()
            .map(|m| super::quoted(m.as_str()))
            .collect();
        let paths: Vec<String> = self.paths.iter().map(|p| super::quoted(p)).collect();
        format!(
            "call = {{ methods = [{}], paths = [{}] }}",
            methods.join(", "),
            paths.join(", ")
        )
    }

    /// As a sentence: `POST, PUT at /hooks/*`.
    pub fn said(&self) -> String {
        let methods: Vec<&str> = self.methods.iter().map(http::Method::as_str).collect();
        format!("{} at {}", methods.join(", "), self.paths.join(", "))
    }
}

/// Whether `text` matches `pattern`, where `*` is any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}
