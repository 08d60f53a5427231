//! `/v1/blobs/sha256:{hex}` and `/v1/blobs/uploads/{id}`: uploading a
//! model's files into the blob store (`berth models push`), one `PUT` per
//! file, resumable by offset.
//!
//! Why a `PUT` per file, addressed by its digest or an id the client
//! chose, and not a session API (`POST /uploads` then `PATCH`es, as OCI's
//! distribution spec and tus do): a cut upload is found again by asking
//! `HEAD` for its offset, with no session to open, keep or expire. A client
//! that knows a file's sha256 names the upload by it: two clients of the
//! same bytes meet at the same partial, and a file the store has already is
//! never sent. One that has not hashed the file names it by an id (from the
//! file's identity, so that a run again finds it), hashes as it sends, and
//! reads the file once: the answer names the sha256 the server computed,
//! which the client checks against its own. The headers are tus's
//! (`Upload-Offset`, `Upload-Length`), a resumable-upload vocabulary
//! clients know. Handlers only translate: the bytes' way into the store is
//! `fetch::upload`.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::Error;
use super::json::{self, ErrorBody};
use super::{ApiContext, drain};
use crate::fetch::{Held, ID_RULE, Upload, UploadError, UploadName, Uploaded};

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(held, put))
        .routes(routes!(held_by_id, put_by_id))
}

/// Where a request's bytes start in the blob; in an answer, how many bytes
/// the server holds.
pub const UPLOAD_OFFSET: HeaderName = HeaderName::from_static("upload-offset");
/// The blob's whole size.
pub const UPLOAD_LENGTH: HeaderName = HeaderName::from_static("upload-length");
/// In a 201's answer: `crc32 HEX`, the CRC-32 (IEEE) of the bytes this
/// request carried, for the client to check the transfer end to end
/// without a second hash of its own. tus names a checksum so.
pub const UPLOAD_CHECKSUM: HeaderName = HeaderName::from_static("upload-checksum");

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
    match digest_hex(&digest) {
        Ok(hex) => offset_of(&ctx, &UploadName::Sha256(hex)).await,
        Err(e) => e.into_response(),
    }
}

/// How far an upload named by an id got.
///
/// Always 404 (an upload by id becomes the blob of its sha256, which
/// `HEAD /v1/blobs/sha256:…` asks about), with `Upload-Offset`: the bytes
/// held (0: none), where the next `PUT` starts.
#[utoipa::path(head, path = "/v1/blobs/uploads/{id}", operation_id = "upload_offset_by_id", tag = "models",
    params(("id" = String, Path, description = "The upload's id: 16 to 64 letters, digits, '-' or '_'")),
    responses(
        (status = NOT_FOUND, description = "The bytes held", headers(("Upload-Offset" = u64, description = "The next PUT starts there"))),
        (status = BAD_REQUEST, description = "Not an upload id"),
    ))]
async fn held_by_id(State(ctx): State<ApiContext>, Path(id): Path<String>) -> Response {
    match upload_id(&id) {
        Ok(name) => offset_of(&ctx, &name).await,
        Err(e) => e.into_response(),
    }
}

/// `HEAD`'s answer for an upload of `name`.
async fn offset_of(ctx: &ApiContext, name: &UploadName) -> Response {
    let (status, offset) = match ctx.fetcher.held(name).await {
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
        (status = CREATED, description = "The last byte came and the sha256 matched: stored, pinned", body = json::Blob,
            headers(("Upload-Checksum" = String, description = "`crc32 HEX`: the CRC-32 of this request's bytes"))),
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
    let name = UploadName::Sha256(digest_hex(&digest)?);
    take(&ctx, name, &headers, body).await
}

/// Uploads a blob the client names by an id, or the rest of it, into the
/// store.
///
/// As `PUT /v1/blobs/{digest}`, for a client that hashes the bytes as it
/// sends them: once the last byte is there, they are stored and pinned as
/// the blob of the sha256 they have, which the answer names; the client
/// checks it against its own. The id is the client's (from the file's
/// identity, say, so that a run again resumes what a cut left); one upload
/// of an id at a time.
#[utoipa::path(put, path = "/v1/blobs/uploads/{id}", operation_id = "upload_blob_by_id", tag = "models",
    params(
        ("id" = String, Path, description = "The upload's id: 16 to 64 letters, digits, '-' or '_'"),
        ("Upload-Length" = u64, Header, description = "The blob's whole size, in bytes"),
        ("Upload-Offset" = Option<u64>, Header, description = "Where the body starts in the blob: the offset `HEAD` answered (default 0)"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = CREATED, description = "The last byte came: stored as the blob of the sha256 named, pinned", body = json::Blob,
            headers(("Upload-Checksum" = String, description = "`crc32 HEX`: the CRC-32 of this request's bytes"))),
        (status = ACCEPTED, description = "The body ended before the blob did: `Upload-Offset` bytes are held",
            headers(("Upload-Offset" = u64, description = "The bytes held"))),
        (status = BAD_REQUEST, description = "Not an upload id, no `Upload-Length`, or a body past it", body = ErrorBody),
        (status = CONFLICT, description = "`Upload-Offset` is not what the server holds (its answer's `Upload-Offset` is)", body = ErrorBody,
            headers(("Upload-Offset" = u64, description = "The bytes held"))),
        (status = PAYLOAD_TOO_LARGE, description = "Larger than the models dir's whole budget (--models-max-gib)", body = ErrorBody),
        (status = INSUFFICIENT_STORAGE, description = "No room: the budget is full of what cannot be dropped, or the volume is below --min-free-mib", body = ErrorBody),
    ))]
async fn put_by_id(
    State(ctx): State<ApiContext>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    take(&ctx, upload_id(&id)?, &headers, body).await
}

/// Takes a `PUT`'s body into the upload `name`.
async fn take(
    ctx: &ApiContext,
    name: UploadName,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    let size = number(headers, &UPLOAD_LENGTH)?.ok_or_else(|| {
        Error::BadRequest("send the blob's whole size in the header Upload-Length".into())
    })?;
    let offset = number(headers, &UPLOAD_OFFSET)?.unwrap_or(0);
    let upload = Upload { name, size, offset };
    let blob = |sha256: String| json::Blob {
        sha256,
        size_bytes: upload.size,
    };
    let mut crc = crc32fast::Hasher::new();
    let mut body = body
        .into_data_stream()
        .inspect_ok(|chunk| crc.update(chunk));
    let answer = match ctx.fetcher.upload(&upload, &mut body).await {
        Ok(Uploaded::Stored { sha256 }) => {
            (StatusCode::CREATED, axum::Json(blob(sha256))).into_response()
        }
        Ok(Uploaded::AlreadyStored { sha256 }) => {
            (StatusCode::OK, axum::Json(blob(sha256))).into_response()
        }
        Ok(Uploaded::Partial { offset }) => (
            StatusCode::ACCEPTED,
            [(UPLOAD_OFFSET, HeaderValue::from(offset))],
        )
            .into_response(),
        Err(e) => refused(e),
    };
    let mut answer = drain::answer(&mut body, answer).await;
    drop(body);
    if answer.status() == StatusCode::CREATED {
        let checksum = format!("crc32 {:08x}", crc.finalize());
        let value = HeaderValue::from_str(&checksum).expect("ASCII");
        answer.headers_mut().insert(UPLOAD_CHECKSUM, value);
    }
    Ok(answer)
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

/// The upload `id` names, if it is one.
fn upload_id(id: &str) -> Result<UploadName, Error> {
    UploadName::id(id)
        .ok_or_else(|| Error::BadRequest(format!("{id:?} is not an upload id: write {ID_RULE}")))
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
