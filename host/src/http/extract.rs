//! The extractors the handlers take their input with — a JSON body, an
//! `{id}`, an `{id}` and a `{*path}`, query parameters — each turning a
//! malformed request into a 400 with a sentence. Never names a wire field:
//! the shapes they read are `json`'s.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::Error;
/// `Json<T>` whose rejection is a 400 with serde's explanation.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Body(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(Error::BadRequest(
                "send the body as JSON with the header Content-Type: application/json".into(),
            )),
            Err(e) => Err(Error::BadRequest(format!(
                "the request body is not acceptable: {}",
                e.body_text()
            ))),
        }
    }
}

/// An `{id}` path segment: a positive integer.
pub struct Id(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let raw = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e: PathRejection| Error::BadRequest(e.body_text()))?;
        match raw.0.parse::<i64>() {
            Ok(id) if id > 0 => Ok(Id(id)),
            _ => Err(Error::BadRequest(format!(
                "{:?} is not an id: ids are positive integers",
                raw.0
            ))),
        }
    }
}

/// `{id}` and a `{*path}` after it: an artifact of a deployment.
pub struct IdAndPath(pub i64, pub String);

impl<S: Send + Sync> FromRequestParts<S> for IdAndPath {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path((raw, path)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e: PathRejection| Error::BadRequest(e.body_text()))?;
        match raw.parse::<i64>() {
            Ok(id) if id > 0 => Ok(IdAndPath(id, path)),
            _ => Err(Error::BadRequest(format!(
                "{raw:?} is not an id: ids are positive integers"
            ))),
        }
    }
}

/// Query parameters, with a 400 that names the bad one.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Params(q.0))
            .map_err(|e: QueryRejection| Error::BadRequest(e.body_text()))
    }
}
