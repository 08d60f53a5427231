//! Sources reached through the proxies of the server's environment:
//! `HTTPS_PROXY` (a `CONNECT` tunnel, inside which the source's certificate
//! is still verified, here against `--ca-file`), `HTTP_PROXY` (requests in
//! absolute form) and `NO_PROXY` (straight to the source). The proxy below
//! sends every host name to loopback, so a source named `*.berth.test`,
//! which resolves nowhere, is reached only through it. Environment
//! variables are the process's: they are given to a `berth serve` child.

use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::tls::TestCa;
use crate::support::{adapter_files, model, on_both_backends};

on_both_backends!(sources_go_through_the_environments_proxies_unless_no_proxy_names_them);

async fn sources_go_through_the_environments_proxies_unless_no_proxy_names_them(backend: Backend) {
    let ca = TestCa::new("sources CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write(dir.path(), "ca.pem");
    let https = FileServer::start_tls(&ca, &["models.berth.test"]).await;
    let http = FileServer::start().await;
    let proxy = Proxy::start().await;
    let berth = Berth::options(backend)
        .arg("--ca-file")
        .arg(ca_file.to_str().unwrap())
        .env("HTTPS_PROXY", &proxy.url)
        .env("HTTP_PROXY", &proxy.url)
        .env("NO_PROXY", "127.0.0.1")
        .start()
        .await;
    let https_port = https.addr.port();
    let http_port = http.addr.port();
    let cases = [
        (
            "job-tunnel",
            https.source_at(&format!("models.berth.test:{https_port}")),
            &https,
            vec![format!("CONNECT models.berth.test:{https_port} HTTP/1.1")],
        ),
        (
            "job-forward",
            http.source_at(&format!("plain.berth.test:{http_port}")),
            &http,
            vec![format!(
                "GET http://plain.berth.test:{http_port}/files/job-forward/adapter_config.json HTTP/1.1"
            )],
        ),
        ("job-direct", http.source(), &http, vec![]),
    ];
    for (job_id, source, files, through_proxy) in cases {
        // Bytes of the job's own: the blob store would link a file another
        // job holds instead of asking the source.
        let contents: Vec<_> = adapter_files()
            .into_iter()
            .map(|(path, mut bytes)| {
                bytes.extend_from_slice(job_id.as_bytes());
                (path, bytes)
            })
            .collect();
        let mut registration = model(files, job_id, &contents);
        registration["source"] = json!(source);
        let id = berth.register(&registration).await;
        let (status, deployment) = berth.deploy(id, "archive", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{job_id}: {deployment}");
        for (path, _) in &contents {
            assert_eq!(files.hits(job_id, path), 1, "{job_id}: {path}");
        }
        let asked = proxy.take();
        for line in &through_proxy {
            assert!(asked.contains(line), "{job_id}: {line} not in {asked:?}");
        }
        if through_proxy.is_empty() {
            assert_eq!(asked, Vec::<String>::new(), "{job_id}: NO_PROXY");
        }
    }
}

/// An HTTP proxy on loopback: `CONNECT` tunnels and absolute-form
/// requests, each connection to 127.0.0.1 at the port asked for, whatever
/// the host. Records the first line of each connection.
struct Proxy {
    url: String,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let record = asked.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                tokio::spawn(relay(client, record.clone()));
            }
        });
        Self { url, asked }
    }

    /// The first lines asked for since the last call.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.asked.lock().unwrap())
    }
}

async fn relay(mut client: TcpStream, asked: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte).await.unwrap_or(0) == 0 {
            return;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let line = text.lines().next().unwrap_or_default().to_string();
    asked.lock().unwrap().push(line.clone());
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let authority = match method {
        "CONNECT" => target.to_string(),
        _ => target
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_default()
            .to_string(),
    };
    let Some(port) = authority.rsplit_once(':').map(|(_, port)| port.to_string()) else {
        return;
    };
    let Ok(mut upstream) = TcpStream::connect(format!("127.0.0.1:{port}")).await else {
        return;
    };
    if method == "CONNECT" {
        if client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    } else if upstream.write_all(&head).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
