//! A registered model's version as a source names it, in the spelling of
//! MLflow's own `models:/` URIs with the tracking server in front:
//! `mlflow://SERVER/NAME/VERSION` or `mlflow://SERVER/NAME@ALIAS` (HTTPS),
//! `mlflow+http://…` for a server on plain HTTP. `SERVER` is a host, a
//! port and any path the server is mounted under. Pure.

use percent_encoding::percent_decode_str;

/// A version of a registered model on a tracking server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The tracking server's base URL, ending in `/`.
    pub server: url::Url,
    pub name: String,
    pub pin: Pin,
}

/// Which version: a number, or the one an alias points at now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    Version(String),
    Alias(String),
}

/// What a refusal shows as the spellings to use.
const SPELLING: &str = "write mlflow://SERVER/NAME/VERSION or mlflow://SERVER/NAME@ALIAS \
                        (mlflow+http:// for a server on plain HTTP)";

impl Reference {
    /// Reads `source`; the error is a sentence for the person registering.
    pub fn parse(source: &str) -> Result<Self, String> {
        let (scheme, rest) = source
            .split_once("://")
            .ok_or_else(|| format!("source {source:?} is not an MLflow reference: {SPELLING}"))?;
        let http = match scheme.to_ascii_lowercase().as_str() {
            "mlflow" => "https",
            "mlflow+http" => "http",
            _ => {
                return Err(format!(
                    "source {source:?} is not an MLflow reference: {SPELLING}"
                ));
            }
        };
        let refused = |why: &str| format!("source {source:?}: {why}; {SPELLING}");
        if rest.contains(['?', '#']) {
            return Err(refused("an MLflow reference has no query or fragment"));
        }
        let rest = rest.trim_end_matches('/');
        let (before, last) = rest
            .rsplit_once('/')
            .ok_or_else(|| refused("it names no registered model"))?;
        let (server, name, pin) = match last.split_once('@') {
            Some((name, alias)) => (before, name, Pin::Alias(decode(alias)?)),
            None => {
                let (server, name) = before
                    .rsplit_once('/')
                    .ok_or_else(|| refused("it names no version or alias"))?;
                if last.is_empty() || !last.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(refused(&format!("version {last:?} is not a number")));
                }
                (
                    server,
                    name,
                    Pin::Version(last.trim_start_matches('0').to_string()),
                )
            }
        };
        let name = decode(name)?;
        if name.is_empty() {
            return Err(refused("the registered model's name is empty"));
        }
        if matches!(&pin, Pin::Alias(a) if a.is_empty())
            || matches!(&pin, Pin::Version(v) if v.is_empty())
        {
            return Err(refused(
                "the alias or version is empty (versions start at 1)",
            ));
        }
        let server = url::Url::parse(&format!("{http}://{server}/"))
            .map_err(|e| refused(&format!("the server is not a host: {e}")))?;
        if server.host_str().is_none_or(str::is_empty)
            || !server.username().is_empty()
            || server.password().is_some()
        {
            return Err(refused(
                "the server must be a host (credentials go in the sources file, never in a source)",
            ));
        }
        Ok(Self { server, name, pin })
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.server.scheme() == "http" {
            "mlflow+http"
        } else {
            "mlflow"
        };
        let server = &self.server.as_str()[self.server.scheme().len() + 3..];
        match &self.pin {
            Pin::Version(v) => write!(f, "{scheme}://{server}{}/{v}", self.name),
            Pin::Alias(a) => write!(f, "{scheme}://{server}{}@{a}", self.name),
        }
    }
}

fn decode(text: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|t| t.into_owned())
        .map_err(|_| format!("{text:?} is not UTF-8 once its %-escapes are decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_a_server_a_model_and_a_version_or_alias() {
        let cases = [
            (
                "mlflow+http://127.0.0.1:5000/iris@champion",
                "http://127.0.0.1:5000/",
                "iris",
                Pin::Alias("champion".into()),
            ),
            (
                "mlflow://mlflow.internal/iris/12",
                "https://mlflow.internal/",
                "iris",
                Pin::Version("12".into()),
            ),
            (
                "mlflow://mlflow.internal/ml/iris/007/",
                "https://mlflow.internal/ml/",
                "iris",
                Pin::Version("7".into()),
            ),
            (
                "MLflow+HTTP://h:1/fraud%20model@a%2Fb",
                "http://h:1/",
                "fraud model",
                Pin::Alias("a/b".into()),
            ),
        ];
        for (source, server, name, pin) in cases {
            let reference = Reference::parse(source).unwrap();
            assert_eq!(
                (
                    reference.server.as_str(),
                    reference.name.as_str(),
                    &reference.pin
                ),
                (server, name, &pin),
                "{source}"
            );
        }
        assert_eq!(
            Reference::parse("mlflow://h/ml/iris/7")
                .unwrap()
                .to_string(),
            "mlflow://h/ml/iris/7"
        );
        assert_eq!(
            Reference::parse("mlflow+http://h:5/iris@prod")
                .unwrap()
                .to_string(),
            "mlflow+http://h:5/iris@prod"
        );
    }

    #[test]
    fn a_reference_that_names_no_version_is_refused_with_the_spelling() {
        let cases = [
            ("mlflow://h/iris", "names no version or alias"),
            (
                "mlflow://h/iris/latest",
                "version \"latest\" is not a number",
            ),
            ("mlflow://h/iris/0", "the alias or version is empty"),
            ("mlflow://h/@prod", "the registered model's name is empty"),
            ("mlflow://h/iris@", "the alias or version is empty"),
            ("mlflow://h/iris@a?x=1", "no query or fragment"),
            (
                "mlflow://user:pw@h/iris@a",
                "credentials go in the sources file",
            ),
            ("mlflow:///iris@a", "the server"),
            ("mlflow://iris", "names no registered model"),
            ("mlflow+ftp://h/iris/1", "is not an MLflow reference"),
        ];
        for (source, expected) in cases {
            let error = Reference::parse(source).unwrap_err();
            assert!(error.contains(expected), "{source}: {error}");
            assert!(
                error.contains("mlflow://SERVER/NAME/VERSION"),
                "{source}: {error}"
            );
        }
    }
}
