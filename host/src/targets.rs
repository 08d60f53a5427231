//! Publishing targets: named destinations a deployer may put models into
//! (a bucket, an HTTP mirror, an OCI registry, a local folder), with their
//! credentials, held
//! by the server and never by a plugin. They are `[[target]]` entries of
//! the operator's sources file (`berth serve --sources-file`), beside its
//! `[[source]]`s and under the same rules: `${VAR}` from berth's
//! environment, every unknown key and missing variable stops `serve` with
//! the file and line, and the values are never logged (`Debug` and
//! `describe` show names only), stored or returned. One file because an
//! `oci://` registry is both a source and a target with the same kind of
//! login (`registry_login`), and an operator keeps one file of secrets,
//! not two.
//!
//! A plugin's manifest grants targets by name (`targets = ["releases"]`);
//! the grant is recorded as written and checked when the target is opened
//! (`Targets::open`), not at load: a deployer stored over the API serves
//! every server on the database, and each may configure other targets.
//! Reads the file and does no other I/O; knows nothing of uploads.

mod call;
mod kind;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde::de::IgnoredAny;
use toml::Spanned;

pub use call::Call;
use call::RawCall;
pub use kind::Kind;

use crate::scrub::{Scrubber, Secret};
use crate::sources_file::{self, Entries};

/// A target name is at most this long.
const MAX_NAME_LEN: usize = 64;
/// `max_gib` above a PiB is a typo.
const MAX_GIB: u64 = 1 << 20;

/// The targets of the sources file, in its order; `Default` is none.
#[derive(Debug, Default)]
pub struct Targets {
    entries: Vec<Target>,
}

/// One destination.
pub struct Target {
    name: String,
    /// Ends with `/`: keys land under it.
    url: url::Url,
    kind: Kind,
    /// The names of its headers or options as the file writes them; their
    /// values are the secrets.
    credential_names: Vec<String>,
    /// What one deployment may publish here, in bytes.
    max_bytes: Option<u64>,
    /// Of its `[[target]]` header, for `berth config`.
    line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Spanned<String>,
    url: Spanned<String>,
    #[serde(default)]
    headers: BTreeMap<Spanned<String>, String>,
    #[serde(default)]
    options: BTreeMap<Spanned<String>, String>,
    max_gib: Option<Spanned<i64>>,
    call: Option<Spanned<RawCall>>,
}

impl Targets {
    /// Reads the targets of the sources file at `path`, resolving `${VAR}`
    /// from berth's environment.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = sources_file::read(path)?;
        Self::parse(&text, &path.display().to_string(), |var| {
            std::env::var(var).ok()
        })
        .map_err(anyhow::Error::msg)
    }

    /// Parses a sources file's text; every problem is reported at once,
    /// each as `FILE:LINE: …`. `lookup` reads the host environment.
    pub fn parse(
        text: &str,
        file: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let line_of = |offset: usize| sources_file::line_of(text, offset);
        let raw: Entries<IgnoredAny, RawTarget> =
            sources_file::parse(text).map_err(|(line, e)| match line {
                Some(line) => format!("{file}:{line}: {e}"),
                None => format!("{file}: {e}"),
            })?;
        let mut problems = Vec::new();
        let mut entries: Vec<Target> = Vec::new();
        for raw in raw.target {
            let line = line_of(raw.span().start);
            match Target::resolve(raw.into_inner(), line, &line_of, &lookup) {
                Ok(target) => match entries.iter().find(|t| t.name == target.name) {
                    Some(first) => problems.push((
                        line,
                        format!(
                            "target {:?} is already defined on line {}: names are unique",
                            target.name, first.line
                        ),
                    )),
                    None => entries.push(target),
                },
                Err(mut each) => problems.append(&mut each),
            }
        }
        if !problems.is_empty() {
            let sentences: Vec<String> = problems
                .into_iter()
                .map(|(line, problem)| format!("{file}:{line}: {problem}"))
                .collect();
            return Err(sentences.join("; "));
        }
        Ok(Self { entries })
    }

    /// What finds the credentials of the targets `names` (those this
    /// server configures) in text.
    pub fn scrubber(&self, names: &[String]) -> Scrubber {
        Scrubber::new(
            self.entries
                .iter()
                .filter(|t| names.contains(&t.name))
                .flat_map(Target::secrets),
        )
    }

    /// The target named `name`, if this server configures it.
    pub fn get(&self, name: &str) -> Option<&Target> {
        self.entries.iter().find(|t| t.name == name)
    }

    /// The target `name` for `plugin`, whose manifest grants `granted`:
    /// deny by default, so a name the manifest does not grant, or that this
    /// server does not configure, is refused with a sentence naming both.
    pub fn open(&self, plugin: &str, granted: &[String], name: &str) -> Result<&Target, String> {
        if !granted.iter().any(|g| g == name) {
            return Err(format!(
                "plugin {plugin}: target {name:?} is not granted to it (its manifest's targets: {})",
                listed(granted)
            ));
        }
        self.get(name).ok_or_else(|| {
            format!(
                "plugin {plugin}: target {name:?} is granted but this server does not configure it \
                 (its targets: {}); add a [[target]] to its sources file",
                listed(&self.names())
            )
        })
    }

    fn names(&self) -> Vec<String> {
        self.entries.iter().map(|t| t.name.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// For the log: each name and URL.
    pub fn summary(&self) -> String {
        let each: Vec<String> = self
            .entries
            .iter()
            .map(|t| format!("{}={}", t.name, t.url))
            .collect();
        each.join(" ")
    }

    /// The targets as the sources file would say them, for `berth config`:
    /// names, URLs, limits, and the names of the headers and options with
    /// their values redacted; each with the line it comes from.
    pub fn describe(&self, file: &str) -> String {
        let redacted = |names: &[String]| {
            let pairs: Vec<String> = names
                .iter()
                .map(|n| format!("{} = \"(redacted)\"", key(n)))
                .collect();
            format!("{{ {} }}", pairs.join(", "))
        };
        let mut lines = Vec::new();
        for t in &self.entries {
            lines.push(format!("{:<48} # file {file}:{}", "[[target]]", t.line));
            lines.push(format!("name = {}", quoted(&t.name)));
            lines.push(format!("url = {}", quoted(t.url.as_str())));
            if !t.credential_names.is_empty() {
                let table = t.kind.table();
                lines.push(format!("{table} = {}", redacted(&t.credential_names)));
            }
            if let Kind::Http {
                call: Some(call), ..
            } = &t.kind
            {
                lines.push(call.as_toml());
            }
            if let Some(bytes) = t.max_bytes {
                lines.push(format!("max_gib = {}", bytes >> 30));
            }
        }
        lines.join("\n")
    }
}

impl Target {
    /// Checks one `[[target]]` entry and resolves its values; each problem
    /// has its line and names the target.
    fn resolve(
        raw: RawTarget,
        line: usize,
        line_of: &impl Fn(usize) -> usize,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Vec<(usize, String)>> {
        let name = raw.name.get_ref().clone();
        let at = |spanned: &Spanned<String>| line_of(spanned.span().start);
        check_name(&name).map_err(|e| vec![(at(&raw.name), e)])?;
        let subject = format!("target {name:?}");
        let url = parse_url(raw.url.get_ref())
            .map_err(|e| vec![(at(&raw.url), format!("{subject}: {e}"))])?;

        let mut problems = Vec::new();
        let kind_name = url.scheme().to_string();
        let mut kind = Kind::of(&url);
        if let Some((about_headers, why)) =
            kind.refuses(&kind_name, !raw.headers.is_empty(), !raw.options.is_empty())
        {
            let first = match about_headers {
                true => raw.headers.keys().next(),
                false => raw.options.keys().next(),
            };
            problems.push((first.map_or(line, at), format!("{subject}: {why}")));
        }
        if let Some(call) = raw.call {
            let at = line_of(call.span().start);
            match &mut kind {
                Kind::Http { call: slot, .. } => match Call::parse(call.into_inner()) {
                    Ok(parsed) => *slot = Some(parsed),
                    Err(e) => problems.push((at, format!("{subject}: {e}"))),
                },
                _ => problems.push((
                    at,
                    format!(
                        "{subject}: call is for http and https targets: a deployer reaches a \
                         {kind_name} target through the publish interface only"
                    ),
                )),
            }
        }
        for (key, e) in kind.resolve(&raw.headers, &raw.options, lookup) {
            let at = key.map_or_else(|| raw.options.keys().next().map_or(line, at), at);
            problems.push((at, format!("{subject}: {e}")));
        }
        let max_bytes = match raw.max_gib {
            Some(gib) => match u64::try_from(*gib.get_ref()) {
                Ok(g) if (1..=MAX_GIB).contains(&g) => Some(g << 30),
                _ => {
                    problems.push((
                        line_of(gib.span().start),
                        format!(
                            "{subject}: max_gib = {}: must be between 1 and {MAX_GIB}",
                            gib.get_ref()
                        ),
                    ));
                    None
                }
            },
            None => None,
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let credential_names = match kind.table() {
            "headers" => raw.headers.keys(),
            _ => raw.options.keys(),
        }
        .map(|k| k.get_ref().clone())
        .collect();
        Ok(Self {
            name,
            url,
            kind,
            credential_names,
            max_bytes,
            line,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where its keys land: a URL ending with `/`.
    pub fn url(&self) -> &url::Url {
        &self.url
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    pub fn max_bytes(&self) -> Option<u64> {
        self.max_bytes
    }

    /// Its credentials, each in the forms `crate::scrub` looks for.
    fn secrets(&self) -> Vec<Secret<'_>> {
        self.kind.secrets()
    }

    /// What finds this target's credentials in text.
    pub fn scrubber(&self) -> Scrubber {
        Scrubber::new(self.secrets())
    }
}

/// Names only: the values are secrets.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secrets: Vec<String> = self
            .credential_names
            .iter()
            .map(|n| format!("{n} = ***"))
            .collect();
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("credentials", &secrets)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

/// A target's name: a plain identifier (a letter, then letters, digits,
/// `_` and `-`), as manifests name it.
pub fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let starts = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if !(starts && rest) || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "target name {name:?} is not a plain name: a letter, then letters, digits, _ and -, \
             at most {MAX_NAME_LEN} characters"
        ));
    }
    Ok(())
}

/// A target's `url`: s3, http(s), oci or file, naming where keys land.
fn parse_url(text: &str) -> Result<url::Url, String> {
    let mut url = url::Url::parse(text).map_err(|e| format!("url {text:?} is not a URL: {e}"))?;
    match url.scheme() {
        "s3" | "gs" | "az" | "http" | "https" | "oci" | "file" => {}
        other => {
            return Err(format!(
                "url {text:?}: scheme {other} is not a target kind (use s3://, gs://, az://, \
                 https://, http://, oci:// or file://)"
            ));
        }
    }
    // An Azure container's https:// url, as users paste it, is its az://
    // target: a blob takes Azure's own requests, not a plain PUT.
    if let Some(located) = crate::cloud::Bucket::locate(&url)
        && matches!(url.scheme(), "az" | "https")
    {
        let (_, written, _) = located.map_err(|e| format!("url {text:?}: {e}"))?;
        url = written;
    }
    let host = url.host_str().is_some_and(|h| !h.is_empty());
    if url.scheme() == "file" && host {
        return Err(format!(
            "url {text:?}: a file target is a folder on this server, written file:///abs/dir/ (no host)"
        ));
    }
    if url.scheme() != "file" && !host {
        return Err(format!(
            "url {text:?} names no host (or bucket): a target must say where it is"
        ));
    }
    if url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(format!(
            "url {text:?} must not have a query, fragment or user name (put credentials in headers or options)"
        ));
    }
    if !url.path().ends_with('/') {
        return Err(format!("url {text:?} must end with /: keys land under it"));
    }
    if url.scheme() == "oci" {
        let namespace = url.path().trim_matches('/');
        if !namespace.is_empty() {
            crate::oci::reference::check_repository(namespace).map_err(|e| {
                format!("url {text:?}: its namespace is a repository prefix, and {e}")
            })?;
        }
    }
    Ok(url)
}

/// An `oci://` url's `host[:port]`, lowercased, as references name it.
fn registry_of(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// A table key as TOML writes it: bare when it may be.
fn key(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if bare { name.to_string() } else { quoted(name) }
}

#[cfg(test)]
#[path = "targets_tests.rs"]
mod tests;
