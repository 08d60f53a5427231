//! The admin web page: an HTML shell at `/`, and under `/page/` its
//! stylesheet and its plain ES modules (`app.js` imports the others, with
//! relative paths), compiled into the binary from `ASSETS`. No build step:
//! each file is served as it is in the source. They hold no data (the
//! script asks `/v1` for everything, with the visitor's token), so
//! `http/auth.rs` lets anyone fetch `/` and all under `PREFIX`; nothing is
//! fetched from anywhere else, at build time or run time. Never routed in
//! `http::routes()`: the page is not API, and the OpenAPI document omits it.

use std::sync::LazyLock;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use super::ApiContext;
use super::error::Error;

/// Where the page's files live; `/` is the page itself.
const PREFIX: &str = "/page/";

/// Whether `path` is one of the page's, open to anyone (`http/auth.rs`).
pub fn is_page(path: &str) -> bool {
    path == "/" || path.starts_with(PREFIX)
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// The asset `file` (a path under this folder) served at the same path
/// under `PREFIX` (spelled out: `concat!` takes literals), so that a URL and
/// its source file cannot disagree.
macro_rules! under_prefix {
    ($content_type:expr, $file:literal) => {
        (concat!("/page/", $file), $content_type, include_str!($file))
    };
}

/// Each file of the page: its path, its content type, its text. A module
/// added to the page is added here (the e2e test `page` checks that every
/// module the page imports is served, and every file here is used).
const ASSETS: &[(&str, &str, &str)] = &[
    ("/", HTML, include_str!("index.html")),
    under_prefix!(CSS, "style.css"),
    under_prefix!(JS, "app.js"),
    under_prefix!(JS, "api.js"),
    under_prefix!(JS, "dom.js"),
    under_prefix!(JS, "format.js"),
    under_prefix!(JS, "state.js"),
    under_prefix!(JS, "stream.js"),
    under_prefix!(JS, "token.js"),
    under_prefix!(JS, "views/approvals.js"),
    under_prefix!(JS, "views/deploy-dialog.js"),
    under_prefix!(JS, "views/deployers.js"),
    under_prefix!(JS, "views/deployment-parts.js"),
    under_prefix!(JS, "views/deployment.js"),
    under_prefix!(JS, "views/model.js"),
    under_prefix!(JS, "views/models.js"),
    under_prefix!(JS, "views/storage.js"),
    under_prefix!(JS, "views/register.js"),
];

/// Each asset's `ETag`: the start of its sha256, so that a browser
/// revalidating an unchanged file (`no-cache`) is answered 304, and a new
/// binary's file is never mistaken for the old one.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|(_, _, body)| format!("\"{}\"", &hex::encode(Sha256::digest(body))[..16]))
        .collect()
});

/// The page at `/` and its files under `PREFIX`; an unknown file is a 404.
pub fn router() -> Router<ApiContext> {
    Router::new()
        .route("/", get(asset))
        .route(&format!("{PREFIX}{{*file}}"), get(asset))
}

async fn asset(uri: Uri, request: HeaderMap) -> Result<Response, Error> {
    let path = uri.path();
    let Some(index) = ASSETS.iter().position(|(p, _, _)| *p == path) else {
        return Err(Error::NotFound(format!(
            "{path}: the web page has no such file (the page is at /)"
        )));
    };
    let (_, content_type, body) = ASSETS[index];
    let etag = ETAGS[index].as_str();
    let headers = [
        // The files change with the binary: always revalidate (the ETag
        // makes that cheap), never use a stale one.
        (header::CACHE_CONTROL, "no-cache"),
        (header::ETAG, etag),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    if unchanged(&request, etag) {
        return Ok((StatusCode::NOT_MODIFIED, headers).into_response());
    }
    Ok((headers, [(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// Whether the browser's copy (`If-None-Match`) is `etag`'s.
fn unchanged(request: &HeaderMap, etag: &str) -> bool {
    request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*")
}
