//! `GET /metrics`: the server's Prometheus metrics, on the API's address
//! and, with `--metrics-listen`, alone on an address of their own. Only
//! renders them: what they count is recorded where it happens.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::error::Error;

pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/metrics", get(scrape))
}

async fn scrape() -> Result<impl IntoResponse, Error> {
    let text = crate::metrics::render().ok_or_else(|| {
        Error::NotFound("metrics are turned off on this server (--metrics off)".into())
    })?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text))
}
