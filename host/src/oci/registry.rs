//! One registry's client: requests under `/v2/`, and the authentication the
//! distribution spec asks for when a request is answered 401 — `Basic`
//! with the configured login, or `Bearer`: a token from the realm the
//! challenge names (with the login, if any), for the repository's scope.
//! What was earned is kept per scope and sent with the next requests, so
//! the many connections of one blob authenticate once. A redirect (to
//! blob storage) is followed with no credentials at all.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine;
use reqwest::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use sha2::{Digest, Sha256};

use super::manifest::{ACCEPT, Manifest};
use crate::causes::innermost;
use crate::redirects::{self, MAX_REDIRECTS, Stopped};

/// Registries refuse manifests over 4 MiB; so does berth, before reading more.
pub(crate) const MAX_MANIFEST: usize = 4 << 20;

/// Why a request to a registry did not give what was asked: no answer at
/// all (worth another try), or an answer berth cannot use. Says which
/// registry and why, never a credential.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The connection failed or broke.
    #[error("{0}")]
    Unreachable(String),
    /// Refused, missing, malformed or otherwise unusable.
    #[error("{0}")]
    Answered(String),
}

impl From<Error> for String {
    fn from(e: Error) -> Self {
        e.to_string()
    }
}

/// A user name and password for a registry (basic auth, or the login the
/// token endpoint asks for). `Debug` shows the user only.
#[derive(Clone)]
pub struct Login {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Login({}:***)", self.username)
    }
}

impl Login {
    fn basic(&self) -> HeaderValue {
        let pair = format!("{}:{}", self.username, self.password);
        let mut value = HeaderValue::from_str(&format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        ))
        .expect("base64 is a header value");
        value.set_sensitive(true);
        value
    }
}

/// What a request needs of the repository: to read, or to read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Pull,
    Push,
}

/// A registry's client.
pub struct Registry {
    http: reqwest::Client,
    /// `http(s)://HOST/v2/`.
    api: url::Url,
    /// `host[:port]`, for messages.
    name: String,
    login: Option<Login>,
    /// Where the login comes from ("the sources file's prefix oci://…"),
    /// for "refused" messages.
    origin: Option<String>,
    /// Where a login would be configured, when none is and one is asked
    /// for; by default a `[[source]]` of the sources file.
    login_hint: Option<String>,
    /// An `Authorization` earned per scope (`repository:NAME:pull`).
    earned: Mutex<HashMap<String, HeaderValue>>,
}

impl Registry {
    /// A client of `registry` (`host[:port]`) over `http`, which must not
    /// follow redirects (this client follows them itself, without
    /// credentials).
    pub fn new(
        http: reqwest::Client,
        registry: &str,
        login: Option<Login>,
        origin: Option<String>,
    ) -> Self {
        Self {
            http,
            api: super::reference::api_of(registry),
            name: registry.to_string(),
            login,
            origin,
            login_hint: None,
            earned: Mutex::default(),
        }
    }

    /// Says `hint` (e.g. "the target's options username and password")
    /// instead of a `[[source]]` when the registry asks for a login none
    /// is configured for.
    pub fn with_login_hint(mut self, hint: impl Into<String>) -> Self {
        self.login_hint = Some(hint.into());
        self
    }

    /// `host[:port]`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of `tail` under the repository: `…/v2/REPO/TAIL`.
    pub fn url(&self, repo: &str, tail: &str) -> url::Url {
        self.api
            .join(&format!("{repo}/{tail}"))
            .expect("a checked repository joins")
    }

    /// Sends the request `build` makes, authenticated for `repo`; a 401 is
    /// answered once (earning credentials for the scope) and the request
    /// built again. A request whose body cannot be built twice should
    /// follow one that earned its credentials (`build` is then called once).
    pub async fn send(
        &self,
        repo: &str,
        access: Access,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, Error> {
        let scope = scope(repo, access);
        let mut fresh = false;
        loop {
            let earned = self
                .earned
                .lock()
                .expect("not poisoned")
                .get(&scope)
                .cloned();
            let mut request = build(&self.http);
            if let Some(value) = &earned {
                request = request.header(AUTHORIZATION, value.clone());
            }
            let response = request.send().await.map_err(|e| self.unreachable(&e))?;
            if response.status() != StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            if fresh {
                return Err(Error::Answered(self.refused(repo)));
            }
            let challenge = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let value = self.earn(repo, &scope, challenge.as_deref()).await?;
            self.earned
                .lock()
                .expect("not poisoned")
                .insert(scope.clone(), value);
            fresh = true;
        }
    }

    /// What a challenge asks for, earned.
    async fn earn(
        &self,
        repo: &str,
        scope: &str,
        challenge: Option<&str>,
    ) -> Result<HeaderValue, Error> {
        let Some(challenge) = challenge else {
            return Err(Error::Answered(format!(
                "the registry {} answered 401 without saying how to authenticate (no WWW-Authenticate)",
                self.name
            )));
        };
        let (kind, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if kind.eq_ignore_ascii_case("basic") {
            return self
                .login
                .as_ref()
                .map(Login::basic)
                .ok_or_else(|| Error::Answered(self.needs_login(repo)));
        }
        if !kind.eq_ignore_ascii_case("bearer") {
            return Err(Error::Answered(format!(
                "the registry {} asks for {kind} authentication; berth speaks Basic and Bearer",
                self.name
            )));
        }
        let params = challenge_params(params);
        let realm = params.get("realm").ok_or_else(|| {
            Error::Answered(format!(
                "the registry {} asks for a token but names no realm",
                self.name
            ))
        })?;
        let mut realm = url::Url::parse(realm).map_err(|e| {
            Error::Answered(format!(
                "the registry {}'s token realm {realm:?} is not a URL: {e}",
                self.name
            ))
        })?;
        {
            let mut query = realm.query_pairs_mut();
            if let Some(service) = params.get("service") {
                query.append_pair("service", service);
            }
            query.append_pair("scope", params.get("scope").map_or(scope, String::as_str));
        }
        let mut request = self.http.get(realm.clone());
        if let Some(login) = &self.login {
            request = request.header(AUTHORIZATION, login.basic());
        }
        let response = request.send().await.map_err(|e| {
            Error::Unreachable(format!(
                "cannot reach the token service {realm} of the registry {}: {}",
                self.name,
                innermost(&e)
            ))
        })?;
        let status = response.status();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return Err(Error::Answered(self.refused(repo)));
        }
        if !status.is_success() {
            return Err(Error::Answered(format!(
                "the token service of the registry {} answered {status}",
                self.name
            )));
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = response.json().await.map_err(|e| {
            Error::Answered(format!(
                "the token service of the registry {} sent no token: {}",
                self.name,
                innermost(&e)
            ))
        })?;
        let token = token
            .token
            .or(token.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Error::Answered(format!(
                    "the token service of the registry {} sent no token",
                    self.name
                ))
            })?;
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            Error::Answered(format!(
                "the token service of the registry {} sent a token that is no header value",
                self.name
            ))
        })?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// The manifest `reference` (a tag or `sha256:…`) of `repo`: its
    /// digest (the sha256 of the bytes, checked against a digest asked
    /// for), the parsed manifest and its bytes.
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &str,
    ) -> Result<(String, Manifest, Vec<u8>), Error> {
        self.manifest_if_any(repo, reference).await?.ok_or_else(|| {
            Error::Answered(format!(
                "the registry {} has no manifest {}",
                self.name,
                self.named(repo, reference)
            ))
        })
    }

    /// As `manifest`, with `None` when the registry has no such manifest
    /// (for a publisher that looks before it writes).
    pub async fn manifest_if_any(
        &self,
        repo: &str,
        reference: &str,
    ) -> Result<Option<(String, Manifest, Vec<u8>)>, Error> {
        let url = self.url(repo, &format!("manifests/{reference}"));
        let named = self.named(repo, reference);
        let response = self
            .send(repo, Access::Pull, |http| {
                http.get(url.clone())
                    .header(reqwest::header::ACCEPT, ACCEPT)
            })
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => return Ok(None),
            StatusCode::FORBIDDEN => return Err(Error::Answered(self.refused(repo))),
            status if !status.is_success() => {
                return Err(Error::Answered(format!(
                    "the registry {} answered {status} for {named}",
                    self.name
                )));
            }
            _ => {}
        }
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = limited(response, MAX_MANIFEST)
            .await
            .map_err(|e| Error::Answered(format!("reading the manifest {named}: {e}")))?;
        let digest = hex::encode(Sha256::digest(&body));
        if let Some(asked) = reference.strip_prefix("sha256:")
            && asked != digest
        {
            return Err(Error::Answered(format!(
                "the registry {} sent a manifest whose sha256 is {digest} for {named}: refused",
                self.name
            )));
        }
        let manifest = Manifest::parse(&body, media_type.as_deref())
            .map_err(|e| Error::Answered(format!("{named}: {e}")))?;
        Ok(Some((digest, manifest, body)))
    }

    /// `oci://HOST/REPO:TAG` or `…@sha256:…`, for messages.
    fn named(&self, repo: &str, reference: &str) -> String {
        format!("oci://{}/{repo}:{reference}", self.name).replace(":sha256:", "@sha256:")
    }

    /// GETs the blob `sha256:HEX` of `repo` with `range` (an HTTP `Range`
    /// value), following redirects without credentials.
    pub async fn blob(
        &self,
        repo: &str,
        hex: &str,
        range: Option<String>,
    ) -> Result<Response, Error> {
        let url = self.url(repo, &format!("blobs/sha256:{hex}"));
        let with_range = |request: RequestBuilder| match &range {
            Some(range) => request.header(reqwest::header::RANGE, range),
            None => request,
        };
        let followed = redirects::follow(url, |at, hop| {
            let with_range = &with_range;
            async move {
                if hop == 0 {
                    self.send(repo, Access::Pull, |http| with_range(http.get(at.clone())))
                        .await
                } else {
                    // Blob storage gets no credentials of the registry's.
                    with_range(self.http.get(at))
                        .send()
                        .await
                        .map_err(|e| self.unreachable(&e))
                }
            }
        })
        .await;
        match followed {
            Ok((response, _)) => Ok(response),
            Err(Stopped::Send(e)) => Err(e),
            Err(Stopped::Invalid { .. }) => Err(Error::Answered(format!(
                "the registry {} redirected a blob to an invalid location",
                self.name
            ))),
            Err(Stopped::TooMany) => Err(Error::Answered(format!(
                "the registry {} redirected a blob more than {MAX_REDIRECTS} times",
                self.name
            ))),
        }
    }

    /// The size of the blob `sha256:HEX` in `repo`, or `None` if the
    /// registry does not have it there.
    pub async fn blob_size(
        &self,
        repo: &str,
        hex: &str,
        access: Access,
    ) -> Result<Option<u64>, Error> {
        let url = self.url(repo, &format!("blobs/sha256:{hex}"));
        let response = self
            .send(repo, access, |http| http.request(Method::HEAD, url.clone()))
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::FORBIDDEN => Err(Error::Answered(self.refused(repo))),
            // A HEAD's body is empty: its size is in the header alone.
            status if status.is_success() || status.is_redirection() => Ok(Some(
                response
                    .headers()
                    .get(reqwest::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or_default(),
            )),
            status => Err(Error::Answered(format!(
                "the registry {} answered {status} to a look-up of a blob",
                self.name
            ))),
        }
    }

    fn unreachable(&self, e: &reqwest::Error) -> Error {
        Error::Unreachable(format!(
            "cannot reach the registry {} ({}): {}{}",
            self.name,
            self.api,
            innermost(e),
            crate::trust::hint(e)
        ))
    }

    fn needs_login(&self, repo: &str) -> String {
        let hint = self.login_hint.clone().unwrap_or_else(|| {
            format!(
                "the sources file (a [[source]] with prefix \"oci://{}/\" and options username and password)",
                self.name
            )
        });
        format!(
            "the registry {} asks for a login for {repo} and none is configured: give one in {hint}",
            self.name
        )
    }

    /// The credentials were refused: where they came from, never what they are.
    pub fn refused(&self, repo: &str) -> String {
        match &self.origin {
            Some(origin) => format!(
                "the registry {} refused the login of {origin} for {repo}: check them",
                self.name
            ),
            None if self.login.is_none() => self.needs_login(repo),
            None => format!("the registry {} refused the login for {repo}", self.name),
        }
    }
}

/// `repository:REPO:pull` or `…:pull,push`.
fn scope(repo: &str, access: Access) -> String {
    match access {
        Access::Pull => format!("repository:{repo}:pull"),
        Access::Push => format!("repository:{repo}:pull,push"),
    }
}

/// `realm="…",service="…",scope="…"` as pairs (values may hold commas
/// inside their quotes).
fn challenge_params(text: &str) -> HashMap<String, String> {
    let mut params = HashMap::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            },
            None => after.split_once(',').unwrap_or((after, "")),
        };
        params.insert(key, value.to_string());
        rest = next.trim_start_matches([',', ' ']);
    }
    params
}

/// A body read whole, refused past `limit` bytes.
pub(crate) async fn limited(mut response: Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| innermost(&e))? {
        if body.len() + chunk.len() > limit {
            return Err(format!("it is larger than {} MiB", limit >> 20));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_with_commas_inside_quotes() {
        let p = challenge_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "registry.example");
        assert_eq!(p["scope"], "repository:a/b:pull,push");
        let p = challenge_params("realm=r, service=s");
        assert_eq!((p["realm"].as_str(), p["service"].as_str()), ("r", "s"));
    }
}
