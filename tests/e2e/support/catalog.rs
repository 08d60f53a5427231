//! Plugin uploads as `PUT /v1/deployers/{name}` takes them: a multipart
//! form built byte by byte (the same bytes for the in-process API and a
//! real server), and the calls of the deployer catalog.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::Value;

use super::router::App;
use super::server::Berth;
use super::{answer_body, eventually};

const BOUNDARY: &str = "berth-test-boundary-7MA4YWxkTrZu0gW";

/// A `multipart/form-data` body of `parts` (name, bytes), and its
/// Content-Type.
pub fn form(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let mut body = Vec::new();
    for (name, bytes) in parts {
        body.extend(format!("--{BOUNDARY}\r\n").as_bytes());
        body.extend(
            format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n")
                .as_bytes(),
        );
        body.extend(b"Content-Type: application/octet-stream\r\n\r\n");
        body.extend(*bytes);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{BOUNDARY}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={BOUNDARY}"), body)
}

/// Pushes `parts` as deployer `name` to a real server.
pub async fn push(berth: &Berth, name: &str, parts: &[(&str, &[u8])]) -> (StatusCode, Value) {
    let (content_type, body) = form(parts);
    let response = berth
        .client()
        .put(format!("{}/v1/deployers/{name}", berth.url))
        .header(header::CONTENT_TYPE, content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, answer_body(response.text().await.unwrap()))
}

/// Pushes `parts` as deployer `name` to the in-process API.
pub async fn push_in_process(
    app: &App,
    name: &str,
    parts: &[(&str, &[u8])],
) -> (StatusCode, Value) {
    let (content_type, body) = form(parts);
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("/v1/deployers/{name}"))
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap();
    app.send(request).await
}

/// The served deployer `name` in a `GET /v1/deployers` answer.
pub fn served<'a>(deployers: &'a Value, name: &str) -> Option<&'a Value> {
    deployers["deployers"]
        .as_array()?
        .iter()
        .find(|d| d["name"] == name)
}

/// The rejection of `file` in a `GET /v1/deployers` answer.
pub fn refused<'a>(deployers: &'a Value, file: &str) -> Option<&'a Value> {
    deployers["rejected"]
        .as_array()?
        .iter()
        .find(|r| r["file"] == file)
}

/// Waits until `berth`'s `GET /v1/deployers` answer meets `condition`
/// (the plugins folder or the stored deployers changed), and returns it.
pub async fn wait_for_deployers(berth: &Berth, condition: impl Fn(&Value) -> bool) -> Value {
    eventually(
        || format!("the deployers to change; log:\n{}", berth.log()),
        async || {
            let (_, now) = berth.get("/v1/deployers").await;
            condition(&now).then_some(now)
        },
    )
    .await
}
