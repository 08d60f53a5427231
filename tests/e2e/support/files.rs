//! A model file server on loopback that counts requests and the bytes it
//! sends, honours `Range: bytes=A-[B]`, and misbehaves on request: wrong
//! status, cut-off bodies, slow bodies.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures::StreamExt;

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
    /// Body bytes sent per file by requests made since the last
    /// `forget_served`.
    served: HashMap<String, u64>,
    /// Bumped by `forget_served`: a body still streaming from a request
    /// made before no longer counts.
    epoch: u64,
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

    /// Body bytes of this file sent to requests made since the last
    /// `forget_served` (a chunk counts once handed to the connection).
    pub fn served(&self, job_id: &str, path: &str) -> u64 {
        let inner = self.inner.lock().unwrap();
        inner
            .served
            .get(&format!("{job_id}/{path}"))
            .copied()
            .unwrap_or(0)
    }

    /// Starts counting served bytes afresh; bodies of earlier requests that
    /// are still streaming (to a killed client, say) are not counted.
    pub fn forget_served(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.served.clear();
        inner.epoch += 1;
    }
}

/// The span `Range: bytes=A-` or `bytes=A-B` asks for, if it is one this
/// server can answer from a file of `len` bytes.
fn range(headers: &HeaderMap, len: usize) -> Option<(usize, usize)> {
    let spec = headers.get(header::RANGE)?.to_str().ok()?;
    let (start, end) = spec.strip_prefix("bytes=")?.split_once('-')?;
    let start: usize = start.parse().ok()?;
    let end = match end {
        "" => len,
        end => end.parse::<usize>().ok()?.saturating_add(1).min(len),
    };
    (start < end).then_some((start, end))
}

async fn serve(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let (bytes, fault, epoch) = {
        let mut inner = inner.lock().unwrap();
        *inner.hits.entry(key.clone()).or_default() += 1;
        (
            inner.files.get(&key).cloned(),
            inner.faults.get(&key).copied(),
            inner.epoch,
        )
    };
    let Some(bytes) = bytes else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let total = bytes.len();
    let span = range(&headers, total);
    let bytes = match span {
        Some((start, end)) => bytes[start..end].to_vec(),
        None => bytes,
    };
    let len = bytes.len();
    let count = move |chunk: &Bytes| {
        let mut inner = inner.lock().unwrap();
        if inner.epoch == epoch {
            *inner.served.entry(key.clone()).or_default() += chunk.len() as u64;
        }
    };
    let body = match fault {
        None => {
            let chunks: Vec<Bytes> = bytes
                .chunks(64 * 1024)
                .map(Bytes::copy_from_slice)
                .collect();
            Body::from_stream(futures::stream::iter(chunks).map(move |chunk| {
                count(&chunk);
                Ok::<_, std::io::Error>(chunk)
            }))
        }
        Some(Fault::Status(code)) => return StatusCode::from_u16(code).unwrap().into_response(),
        Some(Fault::CutAfter(n)) => {
            let head = Bytes::from(bytes[..n.min(len)].to_vec());
            count(&head);
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
                move |chunk| {
                    let count = count.clone();
                    async move {
                        tokio::time::sleep(pause).await;
                        count(&chunk);
                        Ok::<_, std::io::Error>(chunk)
                    }
                },
            ))
        }
    };
    let mut response = ([(header::CONTENT_LENGTH, len.to_string())], body).into_response();
    if let Some((start, end)) = span {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let value = format!("bytes {start}-{}/{total}", end - 1);
        response
            .headers_mut()
            .insert(header::CONTENT_RANGE, value.parse().unwrap());
    }
    response
}
