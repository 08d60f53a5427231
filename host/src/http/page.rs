//! The admin web page at `/`: an HTML shell, its stylesheet and its script,
//! compiled into the binary. They hold no data (the script asks `/v1` for
//! everything, with the visitor's token), so they are served without one;
//! nothing is fetched from anywhere else, at build time or run time.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::ApiContext;

/// The page's own paths, open to anyone (`http/auth.rs`).
pub const PATHS: [&str; 3] = ["/", "/page/app.js", "/page/style.css"];

const HTML: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

pub fn router() -> Router<ApiContext> {
    Router::new()
        .route(
            PATHS[0],
            get(|| async { asset("text/html; charset=utf-8", HTML) }),
        )
        .route(
            PATHS[1],
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            PATHS[2],
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // The assets change with the binary: revalidate, never guess.
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}
