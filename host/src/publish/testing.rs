//! What the publish tests of every kind of target share: keys, a source
//! file, the body of a put of it, the refusal of a file whose bytes are
//! not the verified ones, and a proxy that sees what goes to a server.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tokio_util::sync::CancellationToken;

use super::{Body, Error, Key, Publisher};

pub(super) fn key(text: &str) -> Key {
    Key::parse(text).unwrap()
}

/// A file of `len` varied bytes in `dir`, and its sha256.
pub(super) fn file(dir: &Path, len: usize) -> (PathBuf, Vec<u8>, String) {
    let contents: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let path = dir.join("model.bin");
    std::fs::write(&path, &contents).unwrap();
    let sha256 = hex::encode(Sha256::digest(&contents));
    (path, contents, sha256)
}

/// A put of the file at `path` holding `contents`, expected to have
/// `sha256` when one is given.
pub(super) fn file_body(path: &Path, contents: &[u8], sha256: Option<&str>) -> Body {
    Body::File {
        path: path.to_path_buf(),
        bytes: contents.len() as u64,
        sha256: sha256.map(str::to_string),
        vouched: None,
    }
}

/// `error` says `key` was not published to `target` because the bytes of
/// `path` are not the `wrong` digest given.
#[track_caller]
pub(super) fn assert_not_the_verified_one(
    error: &str,
    target: &str,
    key: &str,
    path: &Path,
    wrong: &str,
) {
    assert!(
        error.starts_with(&format!(
            "target \"{target}\": {key} was not published: {}: its bytes' sha256 is ",
            path.display()
        )) && error.contains(&format!("not the expected {wrong}")),
        "{error}"
    );
}

/// A loopback TCP proxy in front of a test server that keeps every byte
/// sent either way (to look for headers) and can cut a connection.
pub(super) struct Proxy {
    /// `http://127.0.0.1:PORT`.
    pub(super) url: String,
    /// Whether it cut a connection.
    pub(super) cut: Arc<AtomicBool>,
    /// The bytes sent upstream, and those answered.
    pub(super) sent: Arc<Mutex<Vec<u8>>>,
    pub(super) answered: Arc<Mutex<Vec<u8>>>,
}

impl Proxy {
    /// In front of `upstream` (`http://HOST:PORT…`); cuts the first
    /// connection to carry more than `cut_after` bytes upstream, once, if
    /// given.
    pub(super) async fn start(upstream: &str, cut_after: Option<u64>) -> Self {
        let upstream = upstream.trim_start_matches("http://");
        let upstream = upstream.split('/').next().unwrap_or_default().to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let cut = Arc::new(AtomicBool::new(false));
        let sent: Arc<Mutex<Vec<u8>>> = Arc::default();
        let answered: Arc<Mutex<Vec<u8>>> = Arc::default();
        let (cut_flag, record, heard) = (cut.clone(), Arc::clone(&sent), Arc::clone(&answered));
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (cut, record) = (cut_flag.clone(), record.clone());
                let heard: Arc<Mutex<Vec<u8>>> = heard.clone();
                tokio::spawn(async move {
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let down = tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = match server_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            heard.lock().unwrap().extend_from_slice(&buf[..n]);
                            if client_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                    let mut carried = 0u64;
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match client_read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        carried += n as u64;
                        if cut_after.is_some_and(|after| carried > after)
                            && !cut.swap(true, Ordering::SeqCst)
                        {
                            // Both halves dropped: the client's request
                            // breaks off in the middle of its body.
                            down.abort();
                            return;
                        }
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = down.await;
                });
            }
        });
        Self {
            url,
            cut,
            sent,
            answered,
        }
    }

    /// Whether a request went upstream with header `name: value`.
    pub(super) fn saw_header(&self, name: &str, value: &str) -> bool {
        let line = format!("\r\n{name}: {value}\r\n");
        let sent = self.sent.lock().unwrap();
        sent.windows(line.len()).any(|w| w == line.as_bytes())
    }
}

/// Puts a sparse file of `bytes` (its bytes cost no disk) at `key`,
/// cancelled once `cancel_after` bytes went up: the put's error.
pub(super) async fn put_cancelled(
    publisher: &Publisher,
    key: &Key,
    bytes: u64,
    cancel_after: u64,
) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.bin");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    let cancel = CancellationToken::new();
    let told = AtomicU64::new(0);
    let progress = |n: u64| {
        if told.fetch_add(n, Ordering::Relaxed) + n >= cancel_after {
            cancel.cancel();
        }
    };
    let body = Body::File {
        path,
        bytes,
        sha256: None,
        vouched: None,
    };
    let error = publisher
        .put(key, body, &progress, &cancel)
        .await
        .unwrap_err();
    assert!(told.load(Ordering::Relaxed) < bytes, "all of it went up");
    error
}
