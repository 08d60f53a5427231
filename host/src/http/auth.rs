//! Who may call: each request's bearer token, checked against the
//! configured tokens. No known token: 401 with `WWW-Authenticate`; a read
//! token asking to change something: 403. `/healthz`, `/readyz` and
//! `/openapi.json` stay open, so probes and tooling need no secret, and so
//! do MLflow's webhook (its signature is its authentication) and the web
//! page (`/` and all under `/page/`: `page::is_page`), whose
//! files hold no data. With no
//! tokens configured everyone is let in (`serve` allows that on loopback
//! only). The caller is handed to the handlers, which record its name.

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::Error;
use super::page;
use super::{ApiContext, drain};
use crate::auth::{Caller, Role, Tokens};

/// Paths anyone may call, tokens or not (MLflow's webhook is authenticated
/// by its signature, as MLflow cannot send a token).
pub const OPEN: [&str; 4] = ["/healthz", "/readyz", "/openapi.json", "/v1/hooks/mlflow"];

pub async fn require(State(ctx): State<ApiContext>, mut request: Request, next: Next) -> Response {
    let Some(tokens) = &ctx.tokens else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    if OPEN.contains(&path) || page::is_page(path) {
        return next.run(request).await;
    }
    match caller(tokens, &request) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refusal) => {
            let mut body = request.into_body().into_data_stream();
            drain::answer(&mut body, refusal.into_response()).await
        }
    }
}

/// The caller a request's token names, if it may make the request.
fn caller(tokens: &Tokens, request: &Request) -> Result<Caller, Error> {
    let path = request.uri().path();
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.to_str().unwrap_or_default());
    let Some(presented) = presented else {
        return Err(Error::Unauthorized(
            "this server needs an API token: send the header Authorization: Bearer TOKEN (the CLI: --token or BERTH_TOKEN)".into(),
        ));
    };
    let Some(token) = presented
        .strip_prefix("Bearer ")
        .or_else(|| presented.strip_prefix("bearer "))
        .map(str::trim)
    else {
        return Err(Error::Unauthorized(
            "the Authorization header must be `Bearer TOKEN`".into(),
        ));
    };
    let Some(caller) = tokens.caller(token) else {
        return Err(Error::Unauthorized(
            "the API token is not accepted: it is unknown or was revoked".into(),
        ));
    };
    let needs = needed_role(request.method(), path);
    if caller.role < needs {
        return Err(Error::Forbidden(format!(
            "token {} has the {} role, which may {}; {} {} needs a{} {} token",
            caller.name,
            caller.role.as_str(),
            caller.role.may(),
            request.method(),
            path,
            if needs == Role::Admin { "n" } else { "" },
            needs.as_str()
        )));
    }
    Ok(caller)
}

/// Reading is for every role; changing the deployer catalog (pushing,
/// removing, rolling back a deployer) or the rules, and approving or
/// rejecting a deployment, need `admin`; changing anything else needs
/// `deploy`. `path` may be a route template.
pub fn needed_role(method: &Method, path: &str) -> Role {
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        Role::Read
    } else if under("/v1/deployers")
        || under("/v1/rules")
        || (path.starts_with("/v1/deployments/")
            && (path.ends_with("/approve") || path.ends_with("/reject")))
    {
        Role::Admin
    } else {
        Role::Deploy
    }
}
