//! A registered model's version read from an MLflow tracking server's REST
//! API, with the credentials of the sources-file prefix covering the
//! server (a Basic or Bearer `Authorization` header): an alias resolved to
//! a version, the version's artifact location (`get-download-uri`), and its
//! files listed through the server's artifact proxy (`mlflow-artifacts:`),
//! or in the bucket behind it (`s3://`, `gs://`, `az://`) with berth's own
//! credentials for that bucket. MLflow lists paths and sizes, no digest;
//! the files are then fetched through the proxy like any HTTP source. Also
//! the versions and aliases of a followed name, for catching up.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::discover::{Discovered, Found, MAX_FILES};
use super::{Sources, innermost};
use crate::mlflow::{Origin, Pin, Reference};

/// A model version as the registry answers it (the fields berth reads).
#[derive(Deserialize)]
struct Version {
    version: String,
    #[serde(default)]
    run_id: Option<String>,
}

#[derive(Deserialize)]
struct OneVersion {
    model_version: Version,
}

#[derive(Deserialize)]
struct DownloadUri {
    artifact_uri: String,
}

#[derive(Deserialize, Default)]
struct Listing {
    #[serde(default)]
    files: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    path: String,
    #[serde(default)]
    is_dir: bool,
    #[serde(default)]
    file_size: Option<u64>,
}

#[derive(Deserialize)]
struct Versions {
    #[serde(default)]
    model_versions: Vec<Version>,
    #[serde(default)]
    next_page_token: Option<String>,
}

#[derive(Deserialize)]
struct Run {
    run: RunBody,
}

#[derive(Deserialize)]
struct RunBody {
    info: RunInfo,
}

#[derive(Deserialize)]
struct RunInfo {
    experiment_id: String,
}

#[derive(Deserialize)]
struct Refusal {
    #[serde(default)]
    message: Option<String>,
}

/// The artifact proxy's route: listings (`?path=`) and downloads (`/PATH`).
const ARTIFACTS: &str = "api/2.0/mlflow-artifacts/artifacts";

/// How deep a version's folders are listed.
const MAX_DEPTH: usize = 32;

impl Sources {
    /// The files of `reference`'s version (an alias resolved now, and pinned)
    /// and where it came from; `alias`, when given, is recorded as the alias
    /// the version was given (a webhook's or a catch-up's). The error is a
    /// sentence for the person registering.
    pub(crate) async fn mlflow(
        &self,
        reference: &Reference,
        alias: Option<&str>,
    ) -> Result<Discovered, String> {
        let server = &reference.server;
        let name = reference.name.as_str();
        let (found, alias) = match &reference.pin {
            Pin::Alias(a) => {
                let one: OneVersion = self
                    .mlflow_get(
                        server,
                        "api/2.0/mlflow/registered-models/alias",
                        &[("name", name), ("alias", a)],
                    )
                    .await?;
                (one.model_version, Some(a.clone()))
            }
            Pin::Version(v) => {
                let one: OneVersion = self
                    .mlflow_get(
                        server,
                        "api/2.0/mlflow/model-versions/get",
                        &[("name", name), ("version", v)],
                    )
                    .await?;
                (one.model_version, alias.map(str::to_string))
            }
        };
        let version = found.version;
        let located: DownloadUri = self
            .mlflow_get(
                server,
                "api/2.0/mlflow/model-versions/get-download-uri",
                &[("name", name), ("version", &version)],
            )
            .await?;
        let uri = located.artifact_uri;
        let (source, files) = match proxied(&uri) {
            Some(path) => {
                let files = self.mlflow_list(server, path).await?;
                let at = server.join(&format!("{ARTIFACTS}/{path}/")).map_err(|e| {
                    format!("version {version} of {name}: its artifact path {path:?} is not a URL path: {e}")
                })?;
                (format!("{at}{{path}}"), files)
            }
            None if matches!(
                uri.split_once(':').map(|(s, _)| s),
                Some("s3" | "gs" | "az")
            ) =>
            {
                let listed = self
                    .list_bucket(&format!("{}/", uri.trim_end_matches('/')), "")
                    .await?;
                (listed.source, listed.files)
            }
            None => {
                return Err(format!(
                    "version {version} of {name} keeps its files at {uri}, which berth cannot \
                     read: serve them through the tracking server (mlflow server \
                     --serve-artifacts) or keep them in s3://, gs:// or az://"
                ));
            }
        };
        if files.is_empty() {
            return Err(format!("version {version} of {name} has no files at {uri}"));
        }
        let run_id = found.run_id.filter(|r| !r.is_empty());
        let run_url = match &run_id {
            Some(run_id) => self.run_url(server, run_id).await,
            None => None,
        };
        Ok(Discovered {
            source,
            files,
            origin: Some(Origin {
                server: server.clone(),
                name: name.to_string(),
                version,
                alias,
                run_id,
                run_url,
            }),
        })
    }

    /// Every version of `name` on `server`, as numbers in text.
    pub(crate) async fn mlflow_versions(
        &self,
        server: &url::Url,
        name: &str,
    ) -> Result<Vec<String>, String> {
        let filter = format!("name='{}'", name.replace('\'', "\\'"));
        let mut versions = Vec::new();
        let mut token = String::new();
        loop {
            let mut query = vec![("filter", filter.as_str()), ("max_results", "1000")];
            if !token.is_empty() {
                query.push(("page_token", &token));
            }
            let page: Versions = self
                .mlflow_get(server, "api/2.0/mlflow/model-versions/search", &query)
                .await?;
            versions.extend(page.model_versions.into_iter().map(|v| v.version));
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(next) if versions.len() < MAX_FILES => token = next,
                _ => return Ok(versions),
            }
        }
    }

    /// The version `alias` of `name` points at, if it is set.
    pub(crate) async fn mlflow_alias(
        &self,
        server: &url::Url,
        name: &str,
        alias: &str,
    ) -> Result<String, String> {
        let one: OneVersion = self
            .mlflow_get(
                server,
                "api/2.0/mlflow/registered-models/alias",
                &[("name", name), ("alias", alias)],
            )
            .await?;
        Ok(one.model_version.version)
    }

    /// The files under `path` of the artifact proxy, each folder listed in
    /// turn: at most `MAX_FILES` files in as many folders, `MAX_DEPTH` deep.
    async fn mlflow_list(&self, server: &url::Url, path: &str) -> Result<Vec<Found>, String> {
        let mut files = Vec::new();
        let mut folders = vec![(String::new(), 0)];
        // Each folder is a request: as many as a model may have files.
        let mut listed = 0;
        while let Some((folder, depth)) = folders.pop() {
            listed += 1;
            if listed > MAX_FILES {
                return Err(format!(
                    "{path} has more than the {MAX_FILES} folders berth lists"
                ));
            }
            let at = if folder.is_empty() {
                path.to_string()
            } else {
                format!("{path}/{folder}")
            };
            let listing: Listing = self.mlflow_get(server, ARTIFACTS, &[("path", &at)]).await?;
            for entry in listing.files {
                let relative = match folder.as_str() {
                    "" => entry.path.clone(),
                    _ => format!("{folder}/{}", entry.path),
                };
                if entry.is_dir {
                    if depth + 1 >= MAX_DEPTH {
                        return Err(format!(
                            "{at}: folders nest deeper than the {MAX_DEPTH} levels berth lists"
                        ));
                    }
                    folders.push((relative, depth + 1));
                    continue;
                }
                let size_bytes = entry.file_size.ok_or_else(|| {
                    format!("the MLflow server listed {relative} under {path} without its size")
                })?;
                files.push(Found {
                    path: relative,
                    size_bytes,
                    sha256: None,
                });
                if files.len() > MAX_FILES {
                    return Err(format!(
                        "{path} has more than the {MAX_FILES} files a model may have"
                    ));
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// The run's page in MLflow's UI; `None` when the run cannot be read
    /// (the registration does not need it).
    async fn run_url(&self, server: &url::Url, run_id: &str) -> Option<String> {
        let run: Run = match self
            .mlflow_get(server, "api/2.0/mlflow/runs/get", &[("run_id", run_id)])
            .await
        {
            Ok(run) => run,
            Err(e) => {
                tracing::warn!("MLflow run {run_id} of {server}: {e}; its link is left out");
                return None;
            }
        };
        Some(format!(
            "{server}#/experiments/{}/runs/{run_id}",
            run.run.info.experiment_id
        ))
    }

    /// GETs `route` of the tracking server with `query`, read as JSON; the
    /// error says what the server answered, and whose credentials it
    /// refused (never the credentials).
    async fn mlflow_get<T: DeserializeOwned>(
        &self,
        server: &url::Url,
        route: &str,
        query: &[(&str, &str)],
    ) -> Result<T, String> {
        let mut url = server.join(route).expect("a route joins a base URL");
        url.query_pairs_mut().extend_pairs(query);
        let credentials = self.access.covering(&url);
        let mut request = self.client.get(url.clone());
        if let Some(credentials) = credentials {
            request = request.headers(credentials.headers().clone());
        }
        let response = request.send().await.map_err(|e| {
            format!(
                "cannot reach the MLflow server {server}: {}{}",
                innermost(&e),
                crate::trust::hint(&e)
            )
        })?;
        let status = response.status();
        if matches!(
            status,
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN
        ) {
            return Err(match credentials {
                Some(c) => format!(
                    "the MLflow server {server} answered {status} to the credentials of the \
                     prefix {} in the sources file: check them",
                    c.prefix()
                ),
                None => format!(
                    "the MLflow server {server} answered {status} and no prefix in the sources \
                     file (--sources-file) covers it, so no credentials were sent: add a \
                     [[source]] for it with an Authorization header"
                ),
            });
        }
        let text = response.text().await.map_err(|e| {
            format!(
                "the MLflow server {server} broke off its answer: {}",
                innermost(&e)
            )
        })?;
        if !status.is_success() {
            let said = serde_json::from_str::<Refusal>(&text)
                .ok()
                .and_then(|r| r.message);
            return Err(match said {
                Some(message) => format!("the MLflow server {server} answered: {message}"),
                None => format!("the MLflow server {server} answered {status} to {route}"),
            });
        }
        serde_json::from_str(&text).map_err(|e| {
            format!("the MLflow server {server} answered {route} with something else than MLflow's JSON: {e}")
        })
    }
}

/// The path of an artifact-proxy URI (`mlflow-artifacts:/PATH` or
/// `mlflow-artifacts://HOST/PATH`), without its slashes at either end.
fn proxied(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix("mlflow-artifacts:")?;
    let path = match rest.strip_prefix("//") {
        Some(authority_and_path) => authority_and_path.split_once('/').map_or("", |(_, p)| p),
        None => rest,
    };
    let path = path.trim_matches('/');
    (!path.is_empty()).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_artifact_proxy_uri_gives_its_path() {
        let cases = [
            (
                "mlflow-artifacts:/0/abc/artifacts/model",
                Some("0/abc/artifacts/model"),
            ),
            (
                "mlflow-artifacts://h:5000/1/models/m-1/artifacts/",
                Some("1/models/m-1/artifacts"),
            ),
            ("mlflow-artifacts:/", None),
            ("s3://b/0/abc", None),
            ("file:///srv/mlruns/0", None),
        ];
        for (uri, expected) in cases {
            assert_eq!(proxied(uri), expected, "{uri}");
        }
    }
}
