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

use std::collections::BTreeMap;
use std::path::Path;

use object_store::aws::AmazonS3ConfigKey;
use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde::de::IgnoredAny;
use toml::Spanned;

pub use call::Call;
use call::RawCall;

use crate::host_env::{header_value, registry_login, s3_option};
use crate::oci::Login;
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

/// How a target is written to, with the credentials of its kind.
pub enum Kind {
    /// An S3-compatible bucket: object_store settings applied on top of
    /// the environment's, as `[[source]]` options are.
    S3 {
        options: Vec<(AmazonS3ConfigKey, String)>,
    },
    /// A mirror that takes `PUT`; the values are marked sensitive.
    /// `call`: the deployer's own requests under the url that carry the
    /// headers; none unless the operator says so.
    Http {
        headers: HeaderMap,
        call: Option<Call>,
    },
    /// An OCI registry (`oci://REGISTRY/NAMESPACE/`): keys are
    /// `REPO:TAG/PATH`, repositories under the namespace; the login, if
    /// any, from the options `username` and `password`.
    Oci {
        /// `host[:port]`, lowercased.
        registry: String,
        /// The repositories' common prefix, without `/` at either end;
        /// empty for the registry's top level.
        namespace: String,
        login: Option<Login>,
    },
    /// A folder on this server.
    File,
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
                let table = match t.kind {
                    Kind::S3 { .. } | Kind::Oci { .. } => "options",
                    Kind::Http { .. } | Kind::File => "headers",
                };
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
        let mut kind = match kind_name.as_str() {
            "s3" => Kind::S3 {
                options: Vec::new(),
            },
            "oci" => Kind::Oci {
                registry: registry_of(&url),
                namespace: url.path().trim_matches('/').to_string(),
                login: None,
            },
            "http" | "https" => Kind::Http {
                headers: HeaderMap::new(),
                call: None,
            },
            _ => Kind::File,
        };
        if let (Kind::S3 { .. } | Kind::Oci { .. } | Kind::File, Some((header, _))) =
            (&kind, raw.headers.first_key_value())
        {
            let takes = match kind {
                Kind::Oci { .. } => "an oci target takes options username and password".into(),
                _ => format!("a {kind_name} target takes none"),
            };
            problems.push((
                at(header),
                format!("{subject}: headers are for http and https targets; {takes}"),
            ));
        }
        if let (Kind::Http { .. } | Kind::File, Some((option, _))) =
            (&kind, raw.options.first_key_value())
        {
            problems.push((
                at(option),
                format!(
                    "{subject}: options are for s3 and oci targets; a {kind_name} target takes none"
                ),
            ));
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
        match &mut kind {
            Kind::Http { headers, .. } => {
                for (header, template) in &raw.headers {
                    match header_value(header.get_ref(), template, lookup) {
                        Ok((header_name, value)) => {
                            headers.append(header_name, value);
                        }
                        Err(e) => problems.push((at(header), format!("{subject}: {e}"))),
                    }
                }
            }
            Kind::S3 { options } => {
                for (option, template) in &raw.options {
                    match s3_option(option.get_ref(), template, "the target's url", lookup) {
                        Ok(pair) => options.push(pair),
                        Err(e) => problems.push((at(option), format!("{subject}: {e}"))),
                    }
                }
            }
            Kind::Oci { login, .. } => {
                let options: BTreeMap<String, String> = raw
                    .options
                    .iter()
                    .map(|(k, v)| (k.get_ref().clone(), v.clone()))
                    .collect();
                match registry_login(&options, lookup) {
                    Ok(found) => *login = found,
                    Err(e) => {
                        let line = raw.options.keys().next().map_or(line, at);
                        problems.push((line, format!("{subject}: {e}")));
                    }
                }
            }
            Kind::File => {}
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
        let credential_names = match kind {
            Kind::S3 { .. } | Kind::Oci { .. } => raw.options.keys(),
            Kind::Http { .. } | Kind::File => raw.headers.keys(),
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
        match &self.kind {
            Kind::Http { headers, .. } => headers
                .values()
                .map(|v| Secret::Header(v.as_bytes()))
                .collect(),
            Kind::S3 { options } => options
                .iter()
                .filter(|(key, _)| {
                    matches!(
                        key,
                        AmazonS3ConfigKey::SecretAccessKey | AmazonS3ConfigKey::Token
                    )
                })
                .map(|(_, value)| Secret::Value(value))
                .collect(),
            Kind::Oci { login, .. } => login
                .iter()
                .map(|l| Secret::Login {
                    username: &l.username,
                    password: &l.password,
                })
                .collect(),
            Kind::File => Vec::new(),
        }
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
    let url = url::Url::parse(text).map_err(|e| format!("url {text:?} is not a URL: {e}"))?;
    match url.scheme() {
        "s3" | "http" | "https" | "oci" | "file" => {}
        // Read as sources through object_store, which cannot publish to
        // them with a checksum per part and nothing left after a cancel.
        "gs" | "az" => {
            return Err(format!(
                "url {text:?}: {}:// is a source only: berth does not publish to Google Cloud \
                 Storage or Azure Blob yet (use s3://, https://, http://, oci:// or file://)",
                url.scheme()
            ));
        }
        other => {
            return Err(format!(
                "url {text:?}: scheme {other} is not a target kind (use s3://, https://, http://, oci:// or file://)"
            ));
        }
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
