//! A loopback HTTP server standing in for a model mirror: takes any
//! request, records it (method, path as sent, headers, body), answers as
//! told. Over HTTP, or HTTPS with a test CA's certificate.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::tls::{self, TestCa};

/// How the mirror answers a request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Keep it: 201.
    Store,
    /// 307 to the same path on this `http://host:port`.
    Redirect(String),
    /// This status, with this text as the body.
    Status(u16, &'static str),
    /// This status, echoing the request as servers that quote it do: a
    /// body of `pad` bytes of `x`, then every header as `name: value`, the
    /// `Authorization` value's token bare and base64-encoded; the
    /// `Authorization` header echoed back as `x-echo-authorization`.
    Echo { status: u16, pad: usize },
    /// A registry that asks for Basic credentials (401 without them), then
    /// has no blob (404 to a `HEAD`) and refuses everything else with an
    /// error document whose message quotes the request's `Authorization`.
    RegistryEcho,
}

/// One request as the mirror saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    /// As sent: percent-escapes kept.
    pub path: String,
    pub authorization: Option<String>,
    pub content_type: Option<String>,
    pub content_length: Option<u64>,
    /// Every header, for what the fields above leave out.
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

struct MirrorState {
    default: Answer,
    /// Answers for requests whose path ends with the key.
    by_suffix: Vec<(String, Answer)>,
    received: Vec<Received>,
}

/// The running mirror.
pub struct Mirror {
    pub addr: SocketAddr,
    state: Arc<Mutex<MirrorState>>,
}

impl Mirror {
    pub async fn start(default: Answer) -> Self {
        let state = Self::state(default);
        let app = Self::app(&state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, state }
    }

    /// A mirror over HTTPS on 127.0.0.1, its certificate for that address
    /// signed by `ca`.
    pub async fn start_tls(default: Answer, ca: &TestCa) -> Self {
        let state = Self::state(default);
        let addr = tls::serve(Self::app(&state), ca.server(&["127.0.0.1"])).await;
        Self { addr, state }
    }

    fn state(default: Answer) -> Arc<Mutex<MirrorState>> {
        Arc::new(Mutex::new(MirrorState {
            default,
            by_suffix: Vec::new(),
            received: Vec::new(),
        }))
    }

    fn app(state: &Arc<Mutex<MirrorState>>) -> Router {
        Router::new()
            .fallback(receive)
            .layer(DefaultBodyLimit::disable())
            .with_state(state.clone())
    }

    /// `127.0.0.1:PORT`, as a manifest and a base_url name it.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn answer(&self, path_suffix: &str, answer: Answer) {
        self.state
            .lock()
            .unwrap()
            .by_suffix
            .push((path_suffix.to_string(), answer));
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }
}

async fn receive(
    State(state): State<Arc<Mutex<MirrorState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let path = uri.path().to_string();
    let mut state = state.lock().unwrap();
    state.received.push(Received {
        method: method.to_string(),
        path: path.clone(),
        authorization: text(header::AUTHORIZATION),
        content_type: text(header::CONTENT_TYPE),
        content_length: text(header::CONTENT_LENGTH).and_then(|v| v.parse().ok()),
        headers: headers.clone(),
        body: body.to_vec(),
    });
    let answer = state
        .by_suffix
        .iter()
        .find(|(suffix, _)| path.ends_with(suffix.as_str()))
        .map_or(&state.default, |(_, answer)| answer);
    match answer {
        Answer::Store => StatusCode::CREATED.into_response(),
        Answer::Redirect(to) => (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, format!("{to}{path}"))],
        )
            .into_response(),
        Answer::Status(code, text) => (StatusCode::from_u16(*code).unwrap(), *text).into_response(),
        Answer::Echo { status, pad } => {
            let authorization = text(header::AUTHORIZATION).unwrap_or_default();
            let token = authorization
                .split_once(' ')
                .map_or(authorization.as_str(), |(_, t)| t);
            // The Authorization first, so that `pad` places it.
            let mut body = "x".repeat(*pad);
            body.push_str(&format!("authorization: {authorization}\n"));
            for (name, value) in &headers {
                body.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
            }
            body.push_str(&format!("{method} {path}\ntoken: {token}\n"));
            body.push_str(&format!("b64: {}\n", base64(&authorization)));
            (
                StatusCode::from_u16(*status).unwrap(),
                [("x-echo-authorization", authorization)],
                body,
            )
                .into_response()
        }
        Answer::RegistryEcho => match text(header::AUTHORIZATION) {
            None => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"echo\"")],
            )
                .into_response(),
            Some(_) if method == Method::HEAD => StatusCode::NOT_FOUND.into_response(),
            Some(authorization) => (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "application/json")],
                format!(
                    r#"{{"errors":[{{"code":"BLOB_UPLOAD_INVALID","message":"you sent Authorization: {authorization}","detail":"{authorization}"}}]}}"#
                ),
            )
                .into_response(),
        },
    }
}

fn base64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
