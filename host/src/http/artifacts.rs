//! `/v1/deployments/{id}/files`: a deployment's artifacts, listed and
//! streamed (`Range`, `Content-Disposition`). The path rules are
//! `artifacts`'; this module translates HTTP and never reads a whole file
//! into memory.

use std::io::SeekFrom;
use std::path::PathBuf;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::extract::{Id, IdAndPath};
use super::json::{self, ErrorBody};
use crate::artifacts;

/// `download`'s route takes the rest of the URL as its path (`{*path}`),
/// which OpenAPI cannot spell: it is routed by hand and documented as
/// `{path}` (the router test knows the two are one).
#[derive(utoipa::OpenApi)]
#[openapi(paths(download))]
struct DownloadDoc;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::with_openapi(DownloadDoc::openapi())
        .routes(routes!(list))
        .route("/v1/deployments/{id}/files/{*path}", get(download))
}

async fn out_dir(ctx: &ApiContext, id: i64) -> Result<PathBuf, Error> {
    match ctx.db.deployment(id).await? {
        Some(d) => Ok(PathBuf::from(d.out_dir)),
        None => Err(Error::no_deployment(id)),
    }
}

/// Lists the files the deployer wrote to its output directory.
#[utoipa::path(get, path = "/v1/deployments/{id}/files", operation_id = "list_artifacts", tag = "deployments",
    params(("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id")),
    responses(
        (status = OK, description = "The regular files of the output directory", body = json::Artifacts),
        (status = BAD_REQUEST, description = "The id is not a positive integer", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment, or its output directory is gone", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records or the directory could not be read", body = ErrorBody),
    ))]
async fn list(State(ctx): State<ApiContext>, Id(id): Id) -> Result<Json<json::Artifacts>, Error> {
    let dir = out_dir(&ctx, id).await?;
    let listing = tokio::task::spawn_blocking(move || artifacts::list(&dir))
        .await
        .map_err(|e| Error::Internal(format!("listing artifacts: {e}")))?
        .map_err(|e| artifact_error(id, e))?;
    Ok(Json(json::Artifacts::from(&listing)))
}

/// Streams one file of the output directory; honours one `Range`.
#[utoipa::path(get, path = "/v1/deployments/{id}/files/{path}", operation_id = "download_artifact", tag = "deployments",
    params(
        ("id" = i64, Path, minimum = 1, example = 1, description = "The deployment's id"),
        ("path" = String, Path, description = "The file, relative to the output directory (`/`-separated)"),
        ("Range" = Option<String>, Header, description = "One range, `bytes=FIRST-LAST`"),
    ),
    responses(
        (status = OK, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = PARTIAL_CONTENT, description = "The range asked for", content_type = "application/octet-stream", body = Vec<u8>),
        (status = BAD_REQUEST, description = "A bad id, or a path with `..`, `.`, a backslash or a leading `/`", body = ErrorBody),
        (status = NOT_FOUND, description = "No such deployment or file, or one that is not a regular file with one link (symlinks are never followed)", body = ErrorBody),
        (status = RANGE_NOT_SATISFIABLE, description = "The range is outside the file", body = ErrorBody),
        (status = INTERNAL_SERVER_ERROR, description = "The records or the file could not be read", body = ErrorBody),
    ))]
async fn download(
    State(ctx): State<ApiContext>,
    IdAndPath(id, path): IdAndPath,
    headers: HeaderMap,
) -> Result<Response, Error> {
    let dir = out_dir(&ctx, id).await?;
    let name = path.rsplit('/').next().unwrap_or_default().to_string();
    let opened = tokio::task::spawn_blocking(move || artifacts::open(&dir, &path))
        .await
        .map_err(|e| Error::Internal(format!("opening an artifact: {e}")))?
        .map_err(|e| artifact_error(id, e))?;
    let size = opened.size_bytes;
    let range = match headers.get(header::RANGE).map(|v| range(v, size)) {
        None | Some(Range::Ignored) => None,
        Some(Range::Span(start, end)) => Some((start, end)),
        Some(Range::Unsatisfiable) => {
            let answer = (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{size}"))],
                Json(ErrorBody {
                    error: format!("the range asked for is outside the file's {size} bytes"),
                }),
            );
            return Ok(answer.into_response());
        }
    };
    let mut file = tokio::fs::File::from_std(opened.file);
    let (status, start, len) = match range {
        Some((start, end)) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        None => (StatusCode::OK, 0, size),
    };
    if start > 0 {
        file.seek(SeekFrom::Start(start))
            .await
            .map_err(|e| Error::Internal(format!("seeking in an artifact: {e}")))?;
    }
    // `take`: a file still growing is served as it was when opened.
    let body = Body::from_stream(ReaderStream::new(file.take(len)));
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(
        header::LAST_MODIFIED,
        header_value(&httpdate::fmt_http_date(opened.modified)),
    );
    headers.insert(header::CONTENT_DISPOSITION, disposition(&name));
    if status == StatusCode::PARTIAL_CONTENT {
        let value = format!("bytes {start}-{}/{size}", start + len - 1);
        headers.insert(header::CONTENT_RANGE, header_value(&value));
    }
    Ok(response)
}

fn artifact_error(id: i64, e: artifacts::Error) -> Error {
    let message = format!("deployment {id}: {e}");
    match e {
        artifacts::Error::BadPath { .. } => Error::BadRequest(message),
        artifacts::Error::Missing { .. } | artifacts::Error::Refused { .. } => {
            Error::NotFound(message)
        }
        artifacts::Error::Io { .. } => Error::Internal(message),
    }
}

/// What a `Range` header asks of a file of `size` bytes.
#[derive(Debug, PartialEq)]
enum Range {
    /// Inclusive byte positions.
    Span(u64, u64),
    Unsatisfiable,
    /// Not one byte range berth understands (several ranges, other units):
    /// RFC 9110 lets a server answer with the whole file.
    Ignored,
}

fn range(value: &HeaderValue, size: u64) -> Range {
    let Some(spec) = value.to_str().ok().and_then(|v| v.strip_prefix("bytes=")) else {
        return Range::Ignored;
    };
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Range::Ignored;
    };
    if spec.contains(',') {
        return Range::Ignored;
    }
    let (first, last) = (first.trim(), last.trim());
    match (first.parse::<u64>(), last.parse::<u64>()) {
        // `bytes=-N`: the last N bytes.
        (Err(_), Ok(suffix)) if first.is_empty() => {
            if suffix == 0 || size == 0 {
                Range::Unsatisfiable
            } else {
                Range::Span(size.saturating_sub(suffix), size - 1)
            }
        }
        (Ok(start), Err(_)) if last.is_empty() => {
            if start >= size {
                Range::Unsatisfiable
            } else {
                Range::Span(start, size - 1)
            }
        }
        (Ok(start), Ok(end)) if start <= end => {
            if start >= size {
                Range::Unsatisfiable
            } else {
                Range::Span(start, end.min(size - 1))
            }
        }
        _ => Range::Ignored,
    }
}

/// `attachment` with the name in ASCII and, exactly, in RFC 8187's UTF-8.
fn disposition(name: &str) -> HeaderValue {
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let exact = utf8_percent_encode(name, NON_ALPHANUMERIC);
    header_value(&format!(
        "attachment; filename=\"{ascii}\"; filename*=UTF-8''{exact}"
    ))
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One `Range` header a line, on a file of 100 bytes.
    #[rustfmt::skip]
    const RANGES: &[(&str, Range)] = &[
        ("bytes=0-9", Range::Span(0, 9)),
        ("bytes=90-", Range::Span(90, 99)),
        ("bytes=-10", Range::Span(90, 99)),
        ("bytes=-500", Range::Span(0, 99)),
        ("bytes=50-500", Range::Span(50, 99)),
        ("bytes=100-", Range::Unsatisfiable),
        ("bytes=100-200", Range::Unsatisfiable),
        ("bytes=-0", Range::Unsatisfiable),
        ("bytes=9-0", Range::Ignored),
        ("bytes=0-1,5-6", Range::Ignored),
        ("items=0-1", Range::Ignored),
        ("bytes=x-y", Range::Ignored),
    ];

    #[test]
    fn ranges() {
        for (header, expected) in RANGES {
            let got = range(&HeaderValue::from_static(header), 100);
            assert_eq!(&got, expected, "{header}");
        }
    }

    #[test]
    fn disposition_keeps_the_exact_name() {
        assert_eq!(
            disposition("model card ü.md"),
            "attachment; filename=\"model_card__.md\"; filename*=UTF-8''model%20card%20%C3%BC%2Emd"
        );
    }
}
