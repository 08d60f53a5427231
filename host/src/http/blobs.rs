//! `/v1/blobs/sha256:{hex}`: uploading a model's files into the blob store
//! (`berth models push`), one `PUT` per file, resumable by offset.
//!
//! Why a `PUT` per file, addressed by its digest, and not a session API
//! (`POST /uploads` then `PATCH`es, as OCI's distribution spec and tus
//! do): the client knows each file's sha256 before it sends a byte (a
//! registration records it), so the digest names the upload. Two clients
//! of the same bytes meet at the same partial; a cut upload is found again
//! by asking `HEAD` for its offset, with no session id for the client to
//! keep; a file the store has already is never sent; and there is no
//! session record on the server to expire. The headers are tus's
//! (`Upload-Offset`, `Upload-Length`), a resumable-upload vocabulary
//! clients know. Handlers only translate: the bytes' way into the store is
//! `fetch::upload`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::Error;
use super::json::{self, ErrorBody};
use super::{ApiContext, drain};
use crate::fetch::{Held, Upload, UploadError, Uploaded};

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(held, put))
}

/// Where a request's bytes start in the blob; in an answer, how many bytes
/// the server holds.
pub const UPLOAD_OFFSET: HeaderName = HeaderName::from_static("upload-offset");
/// The blob's whole size.
pub const UPLOAD_LENGTH: HeaderName = HeaderName::from_static("upload-length");

/// How far the upload of a blob got.
///
/// 200: the store holds the blob (`Upload-Offset` is its size). 404: it
/// does not; `Upload-Offset` says how many bytes of an upload the server
/// holds (0: none), where the next `PUT` starts.
#[utoipa::path(head, path = "/v1/blobs/{digest}", operation_id = "blob_upload_offset", tag = "models",
    params(("digest" = String, Path, description = "`sha256:` and 64 lowercase hex digits")),
    responses(
        (status = OK, description = "Stored", headers(("Upload-Offset" = u64, description = "The blob's size"))),
        (status = NOT_FOUND, description = "Not stored", headers(("Upload-Offset" = u64, description = "The bytes of an upload held; the next PUT starts there"))),
        (status = BAD_REQUEST, description = "Not a digest"),
    ))]
async fn held(State(ctx): State<ApiContext>, Path(digest): Path<String>) -> Response {
    let sha256 = match digest_hex(&digest) {
        Ok(hex) => hex,
        Err(e) => return e.into_response(),
    };
    let (status, offset) = match ctx.fetcher.held(&sha256).await {
        Held::Stored { size } => (StatusCode::OK, size),
        Held::Partial { offset } => (StatusCode::NOT_FOUND, offset),
    };
    (status, [(UPLOAD_OFFSET, HeaderValue::from(offset))]).into_response()
}

/// Uploads a blob, or the rest of it, into the store.
///
/// The body is the blob's bytes from `Upload-Offset` (0 if left out) on;
/// `Upload-Length` is its whole size. They are hashed as they arrive and
/// written to the models volume; once the last one is there and the
/// sha256 is the one named, the blob is stored and pinned (uploaded bytes
/// have no source to fetch them again from, so no budget drops them). A
/// body cut off keeps what arrived: `HEAD` says the offset to go on from.
/// One upload of a digest at a time: another waits for it.
#[utoipa::path(put, path = "/v1/blobs/{digest}", operation_id = "upload_blob", tag = "models",
    params(
        ("digest" = String, Path, description = "`sha256:` and 64 lowercase hex digits"),
        ("Upload-Length" = u64, Header, description = "The blob's whole size, in bytes"),
        ("Upload-Offset" = Option<u64>, Header, description = "Where the body starts in the blob: the offset `HEAD` answered (default 0)"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = CREATED, description = "The last byte came and the sha256 matched: stored, pinned", body = json::Blob),
        (status = OK, description = "The store held it already (now pinned); the body was not read", body = json::Blob),
        (status = ACCEPTED, description = "The body ended before the blob did: `Upload-Offset` bytes are held",
            headers(("Upload-Offset" = u64, description = "The bytes held"))),
        (status = BAD_REQUEST, description = "Not a digest, no `Upload-Length`, a body past it, or bytes whose sha256 is another (nothing is kept)", body = ErrorBody),
        (status = CONFLICT, description = "`Upload-Offset` is not what the server holds (its answer's `Upload-Offset` is), or the store holds the digest with another size", body = ErrorBody,
            headers(("Upload-Offset" = u64, description = "The bytes held"))),
        (status = PAYLOAD_TOO_LARGE, description = "Larger than the models dir's whole budget (--models-max-gib)", body = ErrorBody),
        (status = INSUFFICIENT_STORAGE, description = "No room: the budget is full of what cannot be dropped, or the volume is below --min-free-mib", body = ErrorBody),
    ))]
async fn put(
    State(ctx): State<ApiContext>,
    Path(digest): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    let sha256 = digest_hex(&digest)?;
    let size = number(&headers, &UPLOAD_LENGTH)?.ok_or_else(|| {
        Error::BadRequest("send the blob's whole size in the header Upload-Length".into())
    })?;
    let offset = number(&headers, &UPLOAD_OFFSET)?.unwrap_or(0);
    let upload = Upload {
        sha256,
        size,
        offset,
    };
    let blob = || json::Blob {
        sha256: upload.sha256.clone(),
        size_bytes: upload.size,
    };
    let mut body = body.into_data_stream();
    let answer = match ctx.fetcher.upload(&upload, &mut body).await {
        Ok(Uploaded::Stored) => (StatusCode::CREATED, axum::Json(blob())).into_response(),
        Ok(Uploaded::AlreadyStored) => (StatusCode::OK, axum::Json(blob())).into_response(),
        Ok(Uploaded::Partial { offset }) => (
            StatusCode::ACCEPTED,
            [(UPLOAD_OFFSET, HeaderValue::from(offset))],
        )
            .into_response(),
        Err(e) => refused(e),
    };
    Ok(drain::answer(&mut body, answer).await)
}

/// An upload's refusal, with the offset to go on from where there is one.
fn refused(e: UploadError) -> Response {
    let message = e.to_string();
    match e {
        UploadError::Offset { held, .. } => {
            let offset = [(UPLOAD_OFFSET, HeaderValue::from(held))];
            (offset, Error::Conflict(message)).into_response()
        }
        UploadError::OtherSize { .. } => Error::Conflict(message).into_response(),
        UploadError::TooLong { .. } | UploadError::Mismatch { .. } | UploadError::Cut { .. } => {
            Error::BadRequest(message).into_response()
        }
        UploadError::LargerThanBudget { .. } => Error::TooLarge(message).into_response(),
        UploadError::OverBudget { .. } | UploadError::NoRoom { .. } => {
            Error::InsufficientStorage(message).into_response()
        }
        UploadError::Disk { .. } => Error::Internal(message).into_response(),
    }
}

/// The hex of `sha256:HEX`, lowercase.
fn digest_hex(digest: &str) -> Result<String, Error> {
    digest
        .strip_prefix("sha256:")
        .filter(|hex| {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
        .map(str::to_string)
        .ok_or_else(|| {
            Error::BadRequest(format!(
                "{digest:?} is not a blob's digest: write sha256: and 64 lowercase hex digits"
            ))
        })
}

/// A header holding a number of bytes, if sent.
fn number(headers: &HeaderMap, name: &HeaderName) -> Result<Option<u64>, Error> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| Error::BadRequest(format!("the header {name} must be a number of bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_sha256_and_64_lowercase_hex_digits() {
        let hex = "0a".repeat(32);
        for (digest, ok) in [
            (format!("sha256:{hex}"), true),
            (hex.clone(), false),
            (format!("sha256:{}", hex.to_uppercase()), false),
            (format!("sha512:{hex}"), false),
            (format!("sha256:{}", &hex[1..]), false),
            (format!("sha256:{hex}/x"), false),
        ] {
            assert_eq!(digest_hex(&digest).is_ok(), ok, "{digest}");
        }
    }
}
