//! A model file server on loopback that counts requests and misbehaves on
//! request: wrong status, cut-off bodies, slow bodies.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Answer with this status and no file.
    Status(u16),
    /// Promise the whole file, send this many bytes, then drop the connection.
    CutAfter(usize),
    /// Send 64 KiB chunks with this pause between them.
    Slow(Duration),
}

#[derive(Default)]
struct Inner {
    files: HashMap<String, Vec<u8>>,
    faults: HashMap<String, Fault>,
    hits: HashMap<String, usize>,
}

#[derive(Clone)]
pub struct FileServer {
    pub addr: SocketAddr,
    scheme: &'static str,
    inner: Arc<Mutex<Inner>>,
}

impl FileServer {
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Self::app(&inner);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            addr,
            scheme: "http",
            inner,
        }
    }

    /// The same server over HTTPS, presenting a certificate for `names`
    /// signed by `ca`.
    pub async fn start_tls(ca: &super::tls::TestCa, names: &[&str]) -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let addr = super::tls::serve(Self::app(&inner), ca.server(names)).await;
        Self {
            addr,
            scheme: "https",
            inner,
        }
    }

    fn app(inner: &Arc<Mutex<Inner>>) -> Router {
        Router::new()
            .route("/files/{*key}", get(serve))
            .with_state(inner.clone())
    }

    /// The `source` template of models served here.
    pub fn source(&self) -> String {
        self.source_at(&self.addr.to_string())
    }

    /// The `source` template of models served here, naming the server
    /// `authority` (a host name and this server's port, say).
    pub fn source_at(&self, authority: &str) -> String {
        format!("{}://{authority}/files/{{job_id}}/{{path}}", self.scheme)
    }

    pub fn put(&self, job_id: &str, path: &str, bytes: Vec<u8>) {
        self.inner
            .lock()
            .unwrap()
            .files
            .insert(format!("{job_id}/{path}"), bytes);
    }

    pub fn fault(&self, job_id: &str, path: &str, fault: Option<Fault>) {
        let key = format!("{job_id}/{path}");
        let mut inner = self.inner.lock().unwrap();
        match fault {
            Some(fault) => inner.faults.insert(key, fault),
            None => inner.faults.remove(&key),
        };
    }

    pub fn hits(&self, job_id: &str, path: &str) -> usize {
        let inner = self.inner.lock().unwrap();
        inner
            .hits
            .get(&format!("{job_id}/{path}"))
            .copied()
            .unwrap_or(0)
    }

    pub fn total_hits(&self) -> usize {
        self.inner.lock().unwrap().hits.values().sum()
    }
}

async fn serve(State(inner): State<Arc<Mutex<Inner>>>, Path(key): Path<String>) -> Response {
    let (bytes, fault) = {
        let mut inner = inner.lock().unwrap();
        *inner.hits.entry(key.clone()).or_default() += 1;
        (
            inner.files.get(&key).cloned(),
            inner.faults.get(&key).copied(),
        )
    };
    let Some(bytes) = bytes else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let len = bytes.len();
    let body = match fault {
        None => Body::from(bytes),
        Some(Fault::Status(code)) => return StatusCode::from_u16(code).unwrap().into_response(),
        Some(Fault::CutAfter(n)) => {
            let head = Bytes::from(bytes[..n.min(len)].to_vec());
            // The pause lets the head reach the client before the cut.
            let chunks = futures::stream::iter([Ok(head), Err(())]);
            Body::from_stream(futures::StreamExt::then(chunks, |chunk| async move {
                if chunk.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                chunk.map_err(|()| std::io::Error::other("cut off on purpose"))
            }))
        }
        Some(Fault::Slow(pause)) => {
            let chunks: Vec<Bytes> = bytes
                .chunks(64 * 1024)
                .map(Bytes::copy_from_slice)
                .collect();
            Body::from_stream(futures::StreamExt::then(
                futures::stream::iter(chunks),
                move |chunk| async move {
                    tokio::time::sleep(pause).await;
                    Ok::<_, std::io::Error>(chunk)
                },
            ))
        }
    };
    ([(header::CONTENT_LENGTH, len.to_string())], body).into_response()
}
