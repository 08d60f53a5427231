//! The tracking servers berth follows: the sources file's `[[mlflow]]`
//! entries. Each names a server, the registered models (or a model's
//! alias) whose new versions berth registers by itself, the secret of the
//! webhook MLflow sends for them, and how often the registry is read again
//! to catch up on what a webhook missed. The server's credentials are a
//! `[[source]]` whose prefix covers its URL, like any source's. Values are
//! resolved from the environment (`${VAR}`); the secret is never shown.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::host_env::expand;
use crate::sources_file::{self, Entries};

/// The followed servers; `Default`: none.
#[derive(Default)]
pub struct Servers {
    servers: Vec<Server>,
}

/// One `[[mlflow]]` entry.
pub struct Server {
    /// Its base URL, ending in `/`.
    pub url: url::Url,
    /// The webhook's secret; `None`: this server's webhook is refused.
    secret: Option<String>,
    pub follow: Vec<Followed>,
    /// How often its registry is read again (and once at start).
    pub catch_up: Duration,
}

/// A registered model followed: each new version, or each version its
/// alias is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    pub name: String,
    pub alias: Option<String>,
}

impl std::fmt::Display for Followed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.alias {
            Some(alias) => write!(f, "{}@{alias}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("url", &self.url.as_str())
            .field("secret", &self.secret.as_ref().map(|_| "(redacted)"))
            .field("follow", &self.follow)
            .field("catch_up", &self.catch_up)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    server: String,
    #[serde(default)]
    webhook_secret: Option<String>,
    #[serde(default)]
    follow: Vec<String>,
    #[serde(default)]
    catch_up_s: Option<u64>,
}

/// How often a server's registry is read again unless its entry says.
const CATCH_UP: Duration = Duration::from_secs(300);

impl Servers {
    /// Reads the `[[mlflow]]` entries of the sources file at `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = sources_file::read(path)?;
        Self::parse(&text, |var| std::env::var(var).ok())
            .map_err(|e| anyhow::anyhow!("sources file {}: {e}", path.display()))
    }

    /// Every problem at once, each naming its entry's line.
    pub fn parse(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let raw: Entries<IgnoredAny, IgnoredAny, RawServer> =
            sources_file::parse(text).map_err(|(line, e)| match line {
                Some(line) => format!("line {line}: {e}"),
                None => e,
            })?;
        let mut problems = Vec::new();
        let mut servers: Vec<Server> = Vec::new();
        for entry in raw.mlflow {
            let line = sources_file::line_of(text, entry.span().start);
            match Server::resolve(entry.into_inner(), &lookup) {
                Ok(server) if servers.iter().any(|s| s.url == server.url) => {
                    problems.push(format!(
                        "line {line}: [[mlflow]] server {} is listed twice",
                        server.url
                    ))
                }
                Ok(server) => servers.push(server),
                Err(e) => problems.push(format!("line {line}: [[mlflow]] {e}")),
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(Self { servers })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Server> {
        self.servers.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The entries as the sources file would say them, the secrets
    /// redacted (`berth config`).
    pub fn describe(&self) -> String {
        let mut lines = Vec::new();
        for server in &self.servers {
            let follow: Vec<String> = server.follow.iter().map(ToString::to_string).collect();
            lines.push("[[mlflow]]".to_string());
            lines.push(format!("server = {:?}", server.url.as_str()));
            if server.secret.is_some() {
                lines.push("webhook_secret = \"(redacted)\"".to_string());
            }
            lines.push(format!("follow = {follow:?}"));
            lines.push(format!("catch_up_s = {}", server.catch_up.as_secs()));
        }
        lines.join("\n")
    }

    /// Whether any server takes webhooks.
    pub fn hooked(&self) -> bool {
        self.servers.iter().any(|s| s.secret.is_some())
    }

    /// The server whose secret signed a delivery (`sign` says whether a
    /// secret did): nothing in MLflow's payload names its server.
    pub fn signed(&self, sign: impl Fn(&str) -> bool) -> Option<&Server> {
        self.servers
            .iter()
            .find(|s| s.secret.as_deref().is_some_and(&sign))
    }
}

impl Server {
    fn resolve(raw: RawServer, lookup: &impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let named = &raw.server;
        let mut url =
            url::Url::parse(named).map_err(|e| format!("server {named:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https")
            || url.host_str().is_none_or(str::is_empty)
            || !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err(format!(
                "server {named:?} must be an http:// or https:// URL of a host, with no user, \
                 query or fragment (its credentials go in a [[source]] whose prefix covers it)"
            ));
        }
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        let secret = match &raw.webhook_secret {
            Some(template) => {
                let secret = expand(template, lookup)
                    .map_err(|e| format!("server {named:?}: webhook_secret: {e}"))?;
                if secret.is_empty() {
                    return Err(format!("server {named:?}: webhook_secret is empty"));
                }
                Some(secret)
            }
            None => None,
        };
        let mut follow = Vec::new();
        for text in &raw.follow {
            let (name, alias) = match text.split_once('@') {
                Some((name, alias)) => (name, Some(alias.to_string())),
                None => (text.as_str(), None),
            };
            if name.is_empty() || alias.as_deref() == Some("") {
                return Err(format!(
                    "server {named:?}: follow {text:?} is not NAME or NAME@ALIAS"
                ));
            }
            follow.push(Followed {
                name: name.to_string(),
                alias,
            });
        }
        let catch_up = match raw.catch_up_s {
            Some(0) => {
                return Err(format!(
                    "server {named:?}: catch_up_s must be at least 1 (seconds)"
                ));
            }
            Some(s) => Duration::from_secs(s),
            None => CATCH_UP,
        };
        Ok(Self {
            url,
            secret,
            follow,
            catch_up,
        })
    }

    /// Whether a new version of `name`, or one given `alias`, is followed.
    pub fn follows(&self, name: &str, alias: Option<&str>) -> bool {
        self.follow
            .iter()
            .any(|f| f.name == name && f.alias.as_deref() == alias)
    }

    /// The webhook's secret, for checking a signature only.
    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_names_a_server_what_it_follows_and_its_secret() {
        let text = "[[source]]\nprefix = \"http://m:5000/\"\n\n[[mlflow]]\nserver = \"http://m:5000\"\n\
                    webhook_secret = \"${S}\"\nfollow = [\"iris\", \"fraud@champion\"]\ncatch_up_s = 5\n";
        let servers = Servers::parse(text, |v| (v == "S").then(|| "hush".to_string())).unwrap();
        let server = servers.iter().next().unwrap();
        assert_eq!(server.url.as_str(), "http://m:5000/");
        assert_eq!(server.secret(), Some("hush"));
        assert_eq!(server.catch_up, Duration::from_secs(5));
        assert!(server.follows("iris", None));
        assert!(server.follows("fraud", Some("champion")));
        assert!(!server.follows("fraud", None));
        assert!(!server.follows("iris", Some("champion")));
        assert!(servers.hooked());
        assert!(!format!("{server:?}").contains("hush"));
        assert_eq!(
            servers.describe(),
            "[[mlflow]]\nserver = \"http://m:5000/\"\nwebhook_secret = \"(redacted)\"\n\
             follow = [\"iris\", \"fraud@champion\"]\ncatch_up_s = 5"
        );
        assert!(servers.signed(|s| s == "hush").is_some());
        assert!(servers.signed(|s| s == "other").is_none());
    }

    #[test]
    fn bad_entries_are_each_refused_on_their_line() {
        let cases = [
            ("server = \"ftp://m\"", "must be an http:// or https:// URL"),
            (
                "server = \"http://u:p@m\"",
                "its credentials go in a [[source]]",
            ),
            (
                "server = \"http://m\"\nwebhook_secret = \"${NOPE}\"",
                "webhook_secret:",
            ),
            (
                "server = \"http://m\"\nwebhook_secret = \"\"",
                "webhook_secret is empty",
            ),
            (
                "server = \"http://m\"\nfollow = [\"@a\"]",
                "is not NAME or NAME@ALIAS",
            ),
            ("server = \"http://m\"\ncatch_up_s = 0", "at least 1"),
            (
                "server = \"http://m\"\nsecret = \"x\"",
                "unknown field `secret`",
            ),
        ];
        for (entry, expected) in cases {
            let text = format!("\n[[mlflow]]\n{entry}\n");
            let error = Servers::parse(&text, |_| None).err().unwrap();
            assert!(error.contains(expected), "{entry}: {error}");
            assert!(error.starts_with("line "), "{entry}: {error}");
        }
        let twice = "[[mlflow]]\nserver = \"http://m\"\n[[mlflow]]\nserver = \"http://m/\"\n";
        let error = Servers::parse(twice, |_| None).err().unwrap();
        assert!(error.contains("listed twice"), "{error}");
    }
}
