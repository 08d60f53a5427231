//! The HTTP boundary's one error type: each variant is a status code, each
//! message a sentence for the client. Internal errors are logged in full and
//! answered without detail.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::json::{ErrorBody, ProblemsBody};
use crate::pipeline::{RunError, StartError};
use crate::validate::Problems;
use crate::{catalog, db};

#[derive(Debug)]
pub enum Error {
    /// 400
    BadRequest(String),
    /// 400, with every problem of a registration and its field.
    InvalidModel(Problems),
    /// 400, with every problem of a rule and its field.
    InvalidRule(Problems),
    /// 401, with `WWW-Authenticate: Bearer`
    Unauthorized(String),
    /// 403
    Forbidden(String),
    /// 404
    NotFound(String),
    /// 409
    Conflict(String),
    /// 413
    TooLarge(String),
    /// 507: no room on the server's disk for what was sent.
    InsufficientStorage(String),
    /// 502: a server berth asked on the request's behalf (a registry)
    /// did not give what was asked for.
    BadGateway(String),
    /// 503, with `Retry-After`: not yet, soon.
    Unavailable(String),
    /// 500
    Internal(String),
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Error::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            Error::InvalidModel(problems) => {
                let body = Json(ProblemsBody::from(problems));
                return (StatusCode::BAD_REQUEST, body).into_response();
            }
            Error::InvalidRule(problems) => {
                let mut body = ProblemsBody::from(problems);
                body.error = body.error.replacen("invalid model", "invalid rule", 1);
                return (StatusCode::BAD_REQUEST, Json(body)).into_response();
            }
            Error::Unauthorized(m) => {
                let body = Json(ErrorBody { error: m });
                let challenge = [(header::WWW_AUTHENTICATE, r#"Bearer realm="berth""#)];
                return (StatusCode::UNAUTHORIZED, challenge, body).into_response();
            }
            Error::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            Error::NotFound(m) => (StatusCode::NOT_FOUND, m),
            Error::Conflict(m) => (StatusCode::CONFLICT, m),
            Error::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, m),
            Error::InsufficientStorage(m) => (StatusCode::INSUFFICIENT_STORAGE, m),
            Error::BadGateway(m) => (StatusCode::BAD_GATEWAY, m),
            Error::Unavailable(m) => {
                let body = Json(ErrorBody { error: m });
                let retry = [(header::RETRY_AFTER, "5")];
                return (StatusCode::SERVICE_UNAVAILABLE, retry, body).into_response();
            }
            Error::Internal(detail) => {
                tracing::error!("internal error: {detail}");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error: the server could not complete the request; its log has the details".to_string(),
                )
            }
        };
        (status, Json(ErrorBody { error: message })).into_response()
    }
}

impl Error {
    /// 404: no model has this id.
    pub fn no_model(id: i64) -> Self {
        Error::NotFound(format!("model {id} does not exist"))
    }

    /// What the answer would say, for a log where nobody is answered (a
    /// registration berth makes by itself).
    pub fn sentence(&self) -> String {
        match self {
            Error::InvalidModel(problems) | Error::InvalidRule(problems) => {
                super::json::invalid_model(problems)
            }
            Error::BadRequest(m)
            | Error::Unauthorized(m)
            | Error::Forbidden(m)
            | Error::NotFound(m)
            | Error::Conflict(m)
            | Error::TooLarge(m)
            | Error::InsufficientStorage(m)
            | Error::BadGateway(m)
            | Error::Unavailable(m)
            | Error::Internal(m) => m.clone(),
        }
    }

    /// 404: no deployment has this id.
    pub fn no_deployment(id: i64) -> Self {
        Error::NotFound(format!("deployment {id} does not exist"))
    }
}

impl From<db::Error> for Error {
    fn from(e: db::Error) -> Self {
        match e {
            db::Error::DuplicateJob(_) => Error::Conflict(e.to_string()),
            db::Error::NoRoom(_) => Error::Unavailable(no_room(&e)),
            db::Error::Unwritten(_) => Error::Unavailable(e.to_string()),
            db::Error::Unreachable(_) => Error::Unavailable(unreachable(&e)),
            e => Error::Internal(e.to_string()),
        }
    }
}

impl From<catalog::Error> for Error {
    fn from(e: catalog::Error) -> Self {
        use catalog::Error as E;
        match e {
            E::Invalid { .. } | E::NotComponent { .. } => Error::BadRequest(e.to_string()),
            E::Unpulled { .. } => Error::BadGateway(e.to_string()),
            E::PullTooLarge { .. } => Error::TooLarge(e.to_string()),
            E::Unknown(_) | E::NoSuchVersion { .. } => Error::NotFound(e.to_string()),
            E::Declared(_)
            | E::Folder { .. }
            | E::TooMany(_)
            | E::NoEarlier { .. }
            | E::Held { .. }
            | E::NothingHeld(_) => Error::Conflict(e.to_string()),
            E::Record(e) => e.into(),
        }
    }
}

impl From<StartError> for Error {
    fn from(e: StartError) -> Self {
        match e {
            StartError::UnknownModel(_) => Error::NotFound(e.to_string()),
            StartError::Unsigned(_) => Error::Forbidden(e.to_string()),
            StartError::StillLoading(_) | StartError::LowOnSpace { .. } => {
                Error::Unavailable(e.to_string())
            }
            StartError::NoDeployers(_)
            | StartError::UnknownDeployer { .. }
            | StartError::BadOptions(_) => Error::BadRequest(e.to_string()),
            StartError::Pickles(_) => Error::Conflict(e.to_string()),
            StartError::Record(e @ db::Error::NoRoom(_)) => Error::Unavailable(no_room(&e)),
            StartError::Record(e @ db::Error::Unreachable(_)) => {
                Error::Unavailable(unreachable(&e))
            }
            StartError::Record(e @ db::Error::Unwritten(_)) => {
                Error::Unavailable(format!("recording a deployment: {e}"))
            }
            StartError::Record(e) => Error::Internal(format!("recording a deployment: {e}")),
        }
    }
}

impl From<RunError> for Error {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Start(e) => e.into(),
            RunError::Record(e @ db::Error::Unreachable(_)) => Error::Unavailable(unreachable(&e)),
            e @ RunError::Record(_) => Error::Internal(e.to_string()),
        }
    }
}

/// A write the database refused for want of space: the client can act on
/// that (try later, tell the operator), so it is said, not hidden as a 500.
fn no_room(e: &db::Error) -> String {
    tracing::error!("{e}");
    "the server's database has no room to write (its disk is full), so nothing can be recorded until space is freed; reads keep working".to_string()
}

/// A request the database could not be reached for: not the client's
/// fault and not a bug, so a 503 saying when to try again, not a 500.
fn unreachable(e: &db::Error) -> String {
    tracing::warn!("{e}");
    UNREACHABLE.to_string()
}

/// The answer to a request made while the database is unreachable.
const UNREACHABLE: &str = "the server cannot reach its database (it is down, restarting or cut off from this server), so the request could not be completed; try again once GET /readyz answers ready";
