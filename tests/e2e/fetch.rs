//! Resuming through the real server: a download cut short by `kill -9`
//! continues after the restart with a range request, and the file that
//! lands is the source's, byte for byte. (The fetcher's own tests cover
//! resuming in finer detail: host/src/fetch/tests.rs.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::server::{Backend, Berth};
use crate::support::{bytes, files_under, sha256_hex};

/// A file server that honours `Range: bytes=N-` and can send slowly.
#[derive(Clone, Default)]
struct RangeServer {
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    slow: Arc<AtomicBool>,
    /// The `Range` header of each request, in order.
    ranges: Arc<Mutex<Vec<Option<String>>>>,
}

async fn serve(
    State(server): State<RangeServer>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let range = headers
        .get(header::RANGE)
        .map(|v| v.to_str().unwrap().to_string());
    server.ranges.lock().unwrap().push(range.clone());
    let Some(file) = server.files.lock().unwrap().get(&key).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let from: usize = range
        .as_deref()
        .map(|r| {
            r.trim_start_matches("bytes=")
                .trim_end_matches('-')
                .parse()
                .unwrap()
        })
        .unwrap_or(0);
    let body = file[from..].to_vec();
    let promised = body.len();
    let slow = server.slow.load(Ordering::Relaxed);
    let chunks: Vec<Bytes> = body.chunks(64 * 1024).map(Bytes::copy_from_slice).collect();
    let stream = futures::StreamExt::then(futures::stream::iter(chunks), move |chunk| async move {
        if slow {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok::<_, std::io::Error>(chunk)
    });
    let mut response = Response::new(Body::from_stream(stream));
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, promised.into());
    if range.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let value = format!("bytes {from}-{}/{}", file.len() - 1, file.len());
        response
            .headers_mut()
            .insert(header::CONTENT_RANGE, value.parse().unwrap());
    }
    response
}

impl RangeServer {
    async fn start(&self) -> String {
        let app = Router::new()
            .route("/files/{*key}", get(serve))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}/files/{{job_id}}/{{path}}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cut_by_kill_9_continues_after_the_restart() {
    let source = RangeServer::default();
    let template = source.start().await;
    let contents = bytes(21, 4 * 1024 * 1024);
    source
        .files
        .lock()
        .unwrap()
        .insert("job-resume/big.bin".into(), contents.clone());
    source.slow.store(true, Ordering::Relaxed);

    let mut berth = Berth::start(Backend::Sqlite).await;
    let registration = json!({
        "name": "resume", "job_id": "job-resume", "base_model": "b", "model_size": "s", "dataset": "d",
        "num_examples": 1, "num_train_steps": 1, "source": template,
        "files": [{ "path": "big.bin", "size_bytes": contents.len(), "sha256": sha256_hex(&contents) }],
        // The source cuts every connection on purpose.
        "check_source": false,
    });
    let id = berth.register(&registration).await;
    let url = format!("{}/v1/models/{id}/deployments", berth.url);
    let client = berth.client().clone();
    let pending = tokio::spawn(async move {
        client
            .post(url)
            .json(&json!({ "deployer": "archive" }))
            .send()
            .await
    });

    let dir = berth.model_dir("job-resume");
    let partial = dir.join(".fetch-big.bin");
    for _ in 0..600 {
        if std::fs::metadata(&partial).map_or(0, |m| m.len()) >= 512 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    berth.kill9();
    assert!(
        pending.await.unwrap().is_err(),
        "the client saw the connection drop"
    );
    let kept = std::fs::metadata(&partial)
        .expect("the partial download survives the kill")
        .len();
    assert!(
        kept >= 512 * 1024 && kept < contents.len() as u64,
        "kept {kept} bytes"
    );
    assert!(
        !dir.join("big.bin").exists(),
        "no half file under the real name"
    );

    berth.restart();
    source.slow.store(false, Ordering::Relaxed);
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        std::fs::read(dir.join("big.bin")).unwrap() == contents,
        "the file is the source's"
    );
    assert_eq!(files_under(&dir), ["big.bin"]);
    let ranges = source.ranges.lock().unwrap().clone();
    assert_eq!(
        ranges,
        [None, Some(format!("bytes={kept}-"))],
        "one request before the kill, one range after"
    );
}
