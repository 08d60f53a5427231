//! The client's side of the HTTP API: requests to a running server, its
//! answers read into the server's own wire types (`http::json`), and its
//! server-sent event stream. Never prints.

use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::http::json::ErrorBody;

/// A dead address should fail fast; a slow answer is the server's business
/// (a deploy may take minutes), so requests themselves have no deadline.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a command could not get what it asked the server for.
#[derive(Debug)]
pub enum Error {
    /// No connection, or it broke mid-answer. Exit status 2.
    Unreachable { server: String, reason: String },
    /// The server answered with an error sentence. Exit status 1.
    Refused { status: StatusCode, message: String },
    /// Anything else the person has to fix (a bad flag, an unknown model).
    /// Exit status 1.
    Invalid(String),
    /// A folder still being written (a training run saving a checkpoint):
    /// worth looking again later. Exit status 1.
    Unfinished(String),
}

impl Error {
    /// The process's exit status when this ends a command.
    pub fn exit_status(&self) -> u8 {
        match self {
            Error::Unreachable { .. } => 2,
            Error::Refused { .. } | Error::Invalid(_) | Error::Unfinished(_) => 1,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unreachable { server, reason } => {
                write!(
                    f,
                    "cannot reach berth at {server}: {reason} (is `berth serve` running?)"
                )
            }
            Error::Refused { message, .. } => f.write_str(message),
            Error::Invalid(message) | Error::Unfinished(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

/// A JSON answer: read into the wire type `T`, and as sent, which
/// `--json` prints whole (with any field a newer server added).
pub struct Answer<T> {
    pub body: T,
    pub raw: Value,
}

/// A running berth server, by its base URL.
pub struct Api {
    /// Without a trailing `/`, as people type it and as messages show it.
    server: String,
    http: reqwest::Client,
}

impl Api {
    /// `token`, if given, goes with every request as `Authorization:
    /// Bearer`.
    pub fn new(server: &str, token: Option<&str>) -> Result<Self, Error> {
        let server = server.trim_end_matches('/').to_string();
        match url::Url::parse(&server) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
            _ => {
                return Err(Error::Invalid(format!(
                    "--server {server:?} is not a server address: give one like http://127.0.0.1:7878"
                )));
            }
        }
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| {
                    Error::Invalid(
                        "--token (BERTH_TOKEN) holds characters a header cannot carry".into(),
                    )
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .default_headers(headers)
            .build()
            .map_err(|e| Error::Invalid(format!("cannot set up an HTTP client: {e}")))?;
        Ok(Self { server, http })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Answer<T>, Error> {
        let request = self.http.get(format!("{}{path}", self.server));
        self.answer(Method::GET, path, request).await
    }

    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<Answer<T>, Error> {
        let request = self.http.post(format!("{}{path}", self.server)).json(body);
        self.answer(Method::POST, path, request).await
    }

    pub async fn put<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<Answer<T>, Error> {
        let request = self.http.put(format!("{}{path}", self.server)).json(body);
        self.answer(Method::PUT, path, request).await
    }

    /// For an answer without a body (204).
    pub async fn delete(&self, path: &str) -> Result<(), Error> {
        let request = self.http.delete(format!("{}{path}", self.server));
        self.send(&Method::DELETE, path, request).await.map(drop)
    }

    /// PUTs a multipart form.
    pub async fn put_form<T: DeserializeOwned>(
        &self,
        path: &str,
        form: reqwest::multipart::Form,
    ) -> Result<Answer<T>, Error> {
        let request = self
            .http
            .put(format!("{}{path}", self.server))
            .multipart(form);
        self.answer(Method::PUT, path, request).await
    }

    /// `HEAD` of an upload (`/v1/blobs/sha256:…` or `/v1/blobs/uploads/ID`):
    /// whether the server stores the blob, and how many bytes of it it holds.
    pub async fn upload_offset(&self, path: &str) -> Result<(bool, u64), Error> {
        let request = self.http.head(format!("{}{path}", self.server));
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let offset = response
            .headers()
            .get("upload-offset")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        match (status, offset) {
            (StatusCode::OK | StatusCode::NOT_FOUND, Some(offset)) => {
                Ok((status == StatusCode::OK, offset))
            }
            _ => Err(Error::Refused {
                status,
                message: format!(
                    "{} answered HEAD {path} with {status} and no Upload-Offset (is it a berth server of this version?)",
                    self.server
                ),
            }),
        }
    }

    /// `PUT`s `body`, `len` bytes of an upload from `offset` on, of a blob
    /// of `size` bytes: the answer's status, `Upload-Checksum` and text, or
    /// the server's refusal.
    pub async fn upload(
        &self,
        path: &str,
        (size, offset, len): (u64, u64, u64),
        body: reqwest::Body,
    ) -> Result<(StatusCode, Option<String>, String), Error> {
        let request = self
            .http
            .put(format!("{}{path}", self.server))
            .header("upload-length", size)
            .header("upload-offset", offset)
            .header(reqwest::header::CONTENT_LENGTH, len)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        self.send_for_answer(&Method::PUT, path, request)
            .await
            .map(|(status, headers, text)| {
                let checksum = headers
                    .get("upload-checksum")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                (status, checksum, text)
            })
    }

    /// Sends `request`: its JSON answer read as `T`, or the server's
    /// refusal.
    async fn answer<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Answer<T>, Error> {
        let text = self.send(&method, path, request).await?;
        let raw: Value = serde_json::from_str(&text).map_err(|_| {
            Error::Invalid(format!(
                "{} answered {method} {path} with something that is not JSON (is it a berth server?)",
                self.server
            ))
        })?;
        match T::deserialize(&raw) {
            Ok(body) => Ok(Answer { body, raw }),
            Err(e) => Err(Error::Invalid(format!(
                "{} answered {method} {path} with JSON this berth cannot read ({e}): is the server of another version?",
                self.server
            ))),
        }
    }

    /// Sends `request`: the text of a successful answer, or the server's
    /// refusal.
    async fn send(
        &self,
        method: &Method,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<String, Error> {
        self.send_for_status(method, path, request)
            .await
            .map(|(_, text)| text)
    }

    /// `send`, with the status of a successful answer.
    async fn send_for_status(
        &self,
        method: &Method,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, String), Error> {
        self.send_for_answer(method, path, request)
            .await
            .map(|(status, _, text)| (status, text))
    }

    /// `send_for_status`, with the answer's headers.
    async fn send_for_answer(
        &self,
        method: &Method,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, reqwest::header::HeaderMap, String), Error> {
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.map_err(|e| self.unreachable(&e))?;
        if status.is_success() {
            return Ok((status, headers, text));
        }
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(refusal) => Err(Error::Refused {
                status,
                message: refusal.error,
            }),
            Err(_) => Err(Error::Refused {
                status,
                message: format!(
                    "{} answered {method} {path} with {status} and no explanation (is it a berth server?)",
                    self.server
                ),
            }),
        }
    }

    /// Subscribes to `GET /v1/events`. Once this returns, every later event
    /// is delivered: the server subscribes before it answers.
    pub async fn events(&self) -> Result<Events, Error> {
        let path = "/v1/events";
        let response = self
            .http
            .get(format!("{}{path}", self.server))
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if !response.status().is_success() {
            return Err(Error::Refused {
                status: response.status(),
                message: format!(
                    "{} answered GET {path} with {}",
                    self.server,
                    response.status()
                ),
            });
        }
        Ok(Events {
            chunks: Box::pin(response.bytes_stream()),
            buffer: Vec::new(),
        })
    }

    fn unreachable(&self, error: &reqwest::Error) -> Error {
        Error::Unreachable {
            server: self.server.clone(),
            reason: transport_reason(error),
        }
    }
}

/// The innermost cause in words, "connection refused" rather than reqwest's
/// "error sending request for url (…)".
fn transport_reason(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "no answer in time".to_string();
    }
    for cause in crate::causes::causes(error) {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return "connection refused".to_string(),
                std::io::ErrorKind::ConnectionReset => {
                    return "the connection was reset".to_string();
                }
                _ => {}
            }
        }
    }
    crate::causes::causes(error)
        .last()
        .unwrap_or(error)
        .to_string()
}

/// One server-sent event, or the server's note that this subscriber fell
/// behind and lost some.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    Event { kind: String, data: Value },
    Missed,
}

/// The open `GET /v1/events` stream.
pub struct Events {
    chunks: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    /// Bytes of an event not complete yet (a chunk may end anywhere).
    buffer: Vec<u8>,
}

impl Events {
    /// The next event; `None` when the server closed the stream.
    pub async fn next(&mut self) -> Option<Result<Received, String>> {
        loop {
            while let Some(block) = take_block(&mut self.buffer) {
                if let Some(sse) = parse_block(&block) {
                    return Some(Ok(sse));
                }
            }
            match self.chunks.next().await? {
                Ok(chunk) => self.buffer.extend(chunk.iter().filter(|&&b| b != b'\r')),
                Err(e) => return Some(Err(transport_reason(&e))),
            }
        }
    }
}

/// Removes and returns the first complete block (up to a blank line).
fn take_block(buffer: &mut Vec<u8>) -> Option<String> {
    let end = buffer.windows(2).position(|w| w == b"\n\n")?;
    let block: Vec<u8> = buffer.drain(..end + 2).collect();
    Some(String::from_utf8_lossy(&block[..end]).into_owned())
}

/// An event with JSON data, a lag note, or nothing worth reporting
/// (keep-alives, events whose data is not JSON).
fn parse_block(block: &str) -> Option<Received> {
    let mut kind = None;
    let mut data: Vec<&str> = Vec::new();
    let mut missed = false;
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "" => missed |= value.starts_with("missed "),
            "event" => kind = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    if missed {
        return Some(Received::Missed);
    }
    let data = serde_json::from_str(&data.join("\n")).ok()?;
    Some(Received::Event {
        kind: kind.unwrap_or_else(|| "message".to_string()),
        data,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn blocks_are_split_at_blank_lines_and_keep_the_rest() {
        let mut buffer = b"event: a\ndata: 1\n\nevent: b\nda".to_vec();
        assert_eq!(
            take_block(&mut buffer).as_deref(),
            Some("event: a\ndata: 1")
        );
        assert_eq!(take_block(&mut buffer), None);
        assert_eq!(buffer, b"event: b\nda");
    }

    #[test]
    fn blocks_parse_into_events() {
        let check = |block: &str, expected: Option<Received>| {
            assert_eq!(parse_block(block), expected, "{block:?}")
        };
        check(
            "event: deployment.started\ndata: {\"deploy_id\": 3}",
            Some(Received::Event {
                kind: "deployment.started".into(),
                data: json!({"deploy_id": 3}),
            }),
        );
        check(
            "data: {\"a\":\ndata: 1}",
            Some(Received::Event {
                kind: "message".into(),
                data: json!({"a": 1}),
            }),
        );
        check(": missed 12 events", Some(Received::Missed));
        check(":", None);
        check("event: x\ndata: not json", None);
    }
}
