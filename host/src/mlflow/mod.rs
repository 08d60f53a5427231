//! MLflow's model registry as berth reads it: a registered model's version
//! named by a source (`reference`), what a registration records of where it
//! came from (`Origin`), the tracking servers the sources file follows
//! (`servers`) and the webhook MLflow sends them (`hook`). Does no I/O: the
//! registry's REST API is read by `fetch::source` with the sources file's
//! credentials, and registrations are made by `http`.

pub mod hook;
pub mod reference;
pub mod servers;

use serde_json::{Map, Value, json};

pub use reference::{Pin, Reference};
pub use servers::{Followed, Server, Servers};

/// Where a registered model came from, recorded in its `params` under
/// `mlflow` (so rules can match it: `params.mlflow_alias`, …, and
/// templates name it: `${model.params.mlflow_version}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The tracking server's base URL (`http://mlflow.internal:5000/`).
    pub server: url::Url,
    pub name: String,
    /// The version pinned at registration.
    pub version: String,
    /// The alias the version was found by, when it was.
    pub alias: Option<String>,
    /// The run that logged it, when MLflow knows one.
    pub run_id: Option<String>,
    /// The run's page in MLflow's UI, when its experiment is known.
    pub run_url: Option<String>,
}

/// What a registration from MLflow says of its files' digests, in its
/// params: MLflow lists paths and sizes only (its artifact proxy's ETag is
/// no content hash), so each file is checked by its size; berth's own
/// verification record keeps the sha256 of what it downloaded.
pub const DIGESTS: &str = "none from MLflow: each file is checked by its size";

impl Origin {
    /// The keys a registration's params get (flat, so that a rule's
    /// `match.params` can name each one).
    pub fn params(&self) -> Map<String, Value> {
        let mut params = Map::new();
        params.insert("mlflow_server".into(), json!(self.server.as_str()));
        params.insert("mlflow_name".into(), json!(self.name));
        params.insert("mlflow_version".into(), json!(self.version));
        if let Some(alias) = &self.alias {
            params.insert("mlflow_alias".into(), json!(alias));
        }
        if let Some(run_id) = &self.run_id {
            params.insert("mlflow_run_id".into(), json!(run_id));
        }
        if let Some(run_url) = &self.run_url {
            params.insert("mlflow_run_url".into(), json!(run_url));
        }
        params.insert("mlflow_digests".into(), json!(DIGESTS));
        params
    }
}

/// The job id berth gives `version` of `name` when it registers it by
/// itself (from the webhook or a catch-up): one per version, and one per
/// alias the version was given, so that each fires the rules once.
/// Characters a job id cannot hold become `_`.
pub fn job_id(name: &str, version: &str, alias: Option<&str>) -> String {
    let text = match alias {
        Some(alias) => format!("mlflow-{name}-{alias}-v{version}"),
        None => format!("mlflow-{name}-v{version}"),
    };
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(name: &str, alias: Option<&str>) -> Origin {
        Origin {
            server: url::Url::parse("http://127.0.0.1:5000/").unwrap(),
            name: name.into(),
            version: "3".into(),
            alias: alias.map(str::to_string),
            run_id: Some("abc".into()),
            run_url: None,
        }
    }

    #[test]
    fn a_job_id_names_the_version_and_the_alias_it_came_by() {
        let cases = [
            (origin("iris", None), "mlflow-iris-v3"),
            (origin("iris", Some("champion")), "mlflow-iris-champion-v3"),
            (
                origin("team/fraud model", None),
                "mlflow-team_fraud_model-v3",
            ),
            (origin("ünï", Some("a b")), "mlflow-_n_-a_b-v3"),
        ];
        for (origin, expected) in cases {
            assert_eq!(
                job_id(&origin.name, &origin.version, origin.alias.as_deref()),
                expected
            );
            assert!(crate::validate::job_id_rule(expected).is_ok(), "{expected}");
        }
    }

    #[test]
    fn params_are_flat_and_say_what_is_verified() {
        let params = origin("iris", Some("champion")).params();
        assert_eq!(params["mlflow_name"], "iris");
        assert_eq!(params["mlflow_version"], "3");
        assert_eq!(params["mlflow_alias"], "champion");
        assert_eq!(params["mlflow_run_id"], "abc");
        assert_eq!(params["mlflow_server"], "http://127.0.0.1:5000/");
        assert_eq!(params["mlflow_digests"], DIGESTS);
        assert!(!params.contains_key("mlflow_run_url"));
    }
}
