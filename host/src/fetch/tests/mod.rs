//! The fetcher against a loopback file server that can honour or ignore
//! ranges, cut a download off, send slowly, require a header or redirect
//! (`Source`), and a fresh models dir per test (`Setup`). The cases, one
//! file per concern: resuming, the verification record, pieces, refusals,
//! credentials, TLS, uploads.

mod blobs;
mod credentials;
mod formats;
mod pieces;
mod record;
mod refusals;
mod resume;
mod tls;
mod upload;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{Error, Fetcher, Quiet, Split};
use crate::model::{ModelFile, TrainedModel};
use crate::test_tls::{self, TestCa};

#[derive(Default)]
struct Served {
    files: HashMap<String, Vec<u8>>,
    /// Send this many bytes of the answer, then drop the connection.
    cut_after: Option<usize>,
    /// Pause between 64 KiB chunks.
    slow: Option<Duration>,
    /// Pause between 64 KiB chunks of answers from the file's first byte.
    slow_at_start: Option<Duration>,
    ignore_ranges: bool,
    /// Each request: file and the `Range` header it carried.
    requests: Vec<(String, Option<String>)>,
    /// Answers being sent now, and the most there were at once.
    in_flight: usize,
    most_in_flight: usize,
    /// Answer 503 to a request while this many answers are being sent,
    /// as hubs that limit connections per client do.
    most_allowed: Option<usize>,
    /// Each request: file and the `Authorization` header it carried.
    authorizations: Vec<(String, Option<String>)>,
    /// Answer 401 to requests without this `Authorization` header.
    require: Option<String>,
    /// Answer requests for these files with a 302 to the given URL.
    redirects: HashMap<String, String>,
}

/// Counts an answer as in flight until its body is dropped.
struct InFlight(Arc<Mutex<Served>>);

impl InFlight {
    fn new(served: &Arc<Mutex<Served>>) -> Self {
        let mut s = served.lock().unwrap();
        s.in_flight += 1;
        s.most_in_flight = s.most_in_flight.max(s.in_flight);
        Self(served.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap().in_flight -= 1;
    }
}

#[derive(Clone)]
struct Source {
    base: String,
    served: Arc<Mutex<Served>>,
}

impl Source {
    async fn start() -> Self {
        let served = Arc::new(Mutex::new(Served::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = Self::app(&served);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base, served }
    }

    /// The same source over HTTPS on 127.0.0.1, with a certificate for that
    /// address signed by `ca`.
    async fn start_tls(ca: &TestCa) -> Self {
        let served = Arc::new(Mutex::new(Served::default()));
        let addr = test_tls::serve(Self::app(&served), ca.server(&["127.0.0.1"])).await;
        let base = format!("https://{addr}");
        Self { base, served }
    }

    fn app(served: &Arc<Mutex<Served>>) -> Router {
        Router::new()
            .route("/{*key}", get(serve))
            .with_state(served.clone())
    }

    fn with<T>(&self, f: impl FnOnce(&mut Served) -> T) -> T {
        f(&mut self.served.lock().unwrap())
    }

    /// Requests so far for `path`, with their ranges.
    fn requests(&self, path: &str) -> Vec<Option<String>> {
        self.with(|s| {
            s.requests
                .iter()
                .filter(|(p, _)| p == path)
                .map(|(_, r)| r.clone())
                .collect()
        })
    }

    /// The `Authorization` header of each request so far for `path`.
    fn authorizations(&self, path: &str) -> Vec<Option<String>> {
        self.with(|s| {
            s.authorizations
                .iter()
                .filter(|(p, _)| p == path)
                .map(|(_, a)| a.clone())
                .collect()
        })
    }
}

async fn serve(
    State(served): State<Arc<Mutex<Served>>>,
    UrlPath(key): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let range = headers
        .get(header::RANGE)
        .map(|v| v.to_str().unwrap().to_string());
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap().to_string());
    let (bytes, cut_after, slow, slow_at_start, ignore_ranges) = {
        let mut served = served.lock().unwrap();
        served.requests.push((key.clone(), range.clone()));
        served
            .authorizations
            .push((key.clone(), authorization.clone()));
        if served.require.is_some() && served.require != authorization {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        if served
            .most_allowed
            .is_some_and(|most| served.in_flight >= most)
        {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        if let Some(to) = served.redirects.get(&key) {
            return (StatusCode::FOUND, [(header::LOCATION, to.clone())]).into_response();
        }
        let Some(bytes) = served.files.get(&key).cloned() else {
            return StatusCode::NOT_FOUND.into_response();
        };
        (
            bytes,
            served.cut_after,
            served.slow,
            served.slow_at_start,
            served.ignore_ranges,
        )
    };
    let len = bytes.len();
    // `bytes=FROM-` or `bytes=FROM-LAST`.
    let span = match range.as_deref().filter(|_| !ignore_ranges) {
        None => None,
        Some(range) => {
            let (from, last) = range
                .strip_prefix("bytes=")
                .unwrap()
                .split_once('-')
                .unwrap();
            let from: usize = from.parse().unwrap();
            let end = match last {
                "" => len,
                last => (last.parse::<usize>().unwrap() + 1).min(len),
            };
            if from >= len {
                return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
            }
            Some((from, end))
        }
    };
    let body = span
        .map_or(&bytes[..], |(from, end)| &bytes[from..end])
        .to_vec();
    let slow = match span {
        None | Some((0, _)) => slow_at_start.or(slow),
        Some(_) => slow,
    };
    let in_flight = InFlight::new(&served);
    let promised = body.len();
    let sent = cut_after.map_or(body.len(), |n| n.min(body.len()));
    let mut chunks: Vec<Result<Bytes, std::io::Error>> = body[..sent]
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    if sent < promised {
        chunks.push(Err(std::io::Error::other("cut off on purpose")));
    }
    let stream = futures::StreamExt::then(futures::stream::iter(chunks), move |chunk| {
        let _in_flight = &in_flight;
        async move {
            match (&chunk, slow) {
                (Ok(_), Some(pause)) => tokio::time::sleep(pause).await,
                // The pause lets what was sent reach the client before the cut.
                (Err(_), _) => tokio::time::sleep(Duration::from_millis(100)).await,
                _ => {}
            }
            chunk
        }
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, promised.into());
    if let Some((from, end)) = span {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let value = format!("bytes {from}-{}/{len}", end - 1);
        response
            .headers_mut()
            .insert(header::CONTENT_RANGE, value.parse().unwrap());
    }
    response
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

struct Setup {
    source: Source,
    _models: tempfile::TempDir,
    fetcher: Fetcher,
    model: TrainedModel,
}

impl Setup {
    /// A model `job` whose files are served by a fresh source.
    async fn new(files: &[(&str, Vec<u8>)]) -> Self {
        Self::on(Source::start().await, files)
    }

    /// A model `job` whose files are served by `source`.
    fn on(source: Source, files: &[(&str, Vec<u8>)]) -> Self {
        let models = tempfile::tempdir().unwrap();
        let fetcher = Fetcher::new(models.path().to_path_buf(), Duration::from_secs(60)).unwrap();
        let mut model_files = Vec::new();
        for (path, contents) in files {
            source.with(|s| s.files.insert(format!("job/{path}"), contents.clone()));
            model_files.push(ModelFile {
                path: path.to_string(),
                size_bytes: contents.len() as u64,
                sha256: Some(sha(contents)),
                format: None,
            });
        }
        let model = TrainedModel::from_files(
            "job",
            format!("{}/{{job_id}}/{{path}}", source.base),
            model_files,
        );
        Self {
            source,
            _models: models,
            fetcher,
            model,
        }
    }

    async fn fetch(&self) -> Result<PathBuf, Error> {
        self.fetcher
            .fetch(&self.model, Arc::new(Quiet), &CancellationToken::new())
            .await
    }

    fn path(&self, file: &str) -> PathBuf {
        self.fetcher.dir_of("job").join(file)
    }

    /// Every entry under the model directory, relative, sorted.
    fn on_disk(&self) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                if entry.file_type().unwrap().is_dir() {
                    walk(&entry.path(), base, out);
                } else {
                    out.push(
                        entry
                            .path()
                            .strip_prefix(base)
                            .unwrap()
                            .display()
                            .to_string(),
                    );
                }
            }
        }
        let mut out = Vec::new();
        let dir = self.fetcher.dir_of("job");
        walk(&dir, &dir, &mut out);
        out.sort();
        out
    }
}

#[track_caller]
fn assert_file(setup: &Setup, path: &str, expected: &[u8]) {
    let actual = std::fs::read(setup.path(path)).unwrap();
    assert!(
        actual == expected,
        "{path} holds other bytes than the source's"
    );
}

const BIG: usize = 3 * 1024 * 1024 + 17;

/// Pieces small enough that `BIG` is read over several connections.
const PIECE: u64 = 256 * 1024;

/// A fetch of `big.bin` over `connections` connections of `PIECE` bytes.
async fn in_pieces(seed: u8, connections: usize) -> (Setup, Vec<u8>) {
    let contents = bytes(seed, BIG);
    let mut setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.fetcher = setup.fetcher.clone().split(Split {
        connections,
        piece_bytes: PIECE,
    });
    (setup, contents)
}
