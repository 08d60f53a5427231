//! `GET /metrics`: the server's Prometheus metrics, on the API's address
//! and, with `--metrics-listen`, alone on an address of their own. Only
//! renders them: what they count is recorded where it happens.

use axum::http::header;
use axum::response::IntoResponse;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::Error;
use super::json::ErrorBody;

pub fn router<S: Clone + Send + Sync + 'static>() -> OpenApiRouter<S> {
    OpenApiRouter::new().routes(routes!(scrape))
}

/// The server's Prometheus metrics, in the text format.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "server",
    responses(
        (status = OK, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"),
        (status = NOT_FOUND, description = "Metrics are turned off on this server (`--metrics off`)", body = ErrorBody),
    ))]
async fn scrape() -> Result<impl IntoResponse, Error> {
    let text = crate::metrics::render().ok_or_else(|| {
        Error::NotFound("metrics are turned off on this server (--metrics off)".into())
    })?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text))
}
