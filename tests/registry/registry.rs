//! A real OCI registry for tests: Debian's `docker-registry` (the CNCF
//! distribution registry 2.8) on a free loopback port, over a storage
//! folder of its own, anonymous or behind htpasswd basic auth; and a push
//! by hand over its HTTP API (blobs, then a manifest), as any client does;
//! and the requests it served, from its access log (`requests`).
//! Included with `#[path]` by the unit tests of `host/src/oci` and
//! `host/src/publish`, the end-to-end tests and the benchmark.

#![allow(dead_code)] // each includer uses its part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const USER: &str = "ci";
pub const PASSWORD: &str = "registry-secret";

/// A running registry, stopped when dropped.
pub struct Registry {
    /// `127.0.0.1:PORT`, as `oci://` references name it.
    pub host: String,
    /// Whether it asks for `USER`/`PASSWORD`.
    pub basic_auth: bool,
    dir: tempfile::TempDir,
    child: Child,
}

/// One pushed file: its title, bytes' digest and size.
pub struct Pushed {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

impl Registry {
    /// Starts an anonymous registry.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// Starts a registry that asks for `USER`/`PASSWORD` (basic auth).
    pub fn with_login() -> Self {
        Self::launch(true)
    }

    fn launch(basic_auth: bool) -> Self {
        let missing = "run scripts/setup test, which installs docker-registry and apache2-utils";
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut auth = String::new();
        if basic_auth {
            let out = Command::new("htpasswd")
                .args(["-Bbn", USER, PASSWORD])
                .output()
                .unwrap_or_else(|e| panic!("cannot run htpasswd: {e}; {missing}"));
            assert!(out.status.success(), "htpasswd failed");
            std::fs::write(dir.path().join("htpasswd"), out.stdout).unwrap();
            auth = format!(
                "auth:\n  htpasswd:\n    realm: berth-tests\n    path: {}\n",
                dir.path().join("htpasswd").display()
            );
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n{auth}",
            dir.path().join("storage").display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        // Its access log goes to stdout, its own log (refused logins are
        // logged as errors) to a file, shown if it does not start.
        let access = std::fs::File::create(dir.path().join("access.log")).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::from(access))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start docker-registry: {e}; {missing}"));
        let registry = Self {
            host: format!("127.0.0.1:{port}"),
            basic_auth,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// `http://127.0.0.1:PORT/v2/`.
    pub fn api(&self) -> String {
        format!("http://{}/v2/", self.host)
    }

    /// Where the registry keeps the bytes of the blob `sha256:HEX`, for
    /// tests that damage them.
    pub fn blob_file(&self, hex: &str) -> PathBuf {
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    pub fn storage(&self) -> &Path {
        self.dir.path()
    }

    /// Every request it answered before this call, in order, as `METHOD
    /// PATH STATUS` (the path with its query), from its access log. The
    /// log is written as each answer ends: a marker request made now is
    /// waited for, so that every answer the caller already had is in it.
    pub async fn requests(&self) -> Vec<String> {
        static MARKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mark = format!(
            "/v2/?mark={}",
            MARKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        reqwest::get(format!("http://{}{mark}", self.host))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap();
            let lines: Vec<String> = log
                .lines()
                .filter_map(|line| {
                    // `… "POST /v2/a/blobs/uploads/ HTTP/1.1" 202 0 "" "agent"`
                    let (_, rest) = line.split_once('"')?;
                    let (request, rest) = rest.split_once('"')?;
                    let status = rest.split_whitespace().next()?;
                    let mut words = request.split_whitespace();
                    Some(format!("{} {} {status}", words.next()?, words.next()?))
                })
                .collect();
            if let Some(at) = lines.iter().position(|l| l.contains(&mark)) {
                return lines[..at]
                    .iter()
                    .filter(|l| !l.contains("/v2/?mark="))
                    .cloned()
                    .collect();
            }
            assert!(
                Instant::now() < deadline,
                "the registry's access log has no line for {mark}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn request(
        &self,
        client: &reqwest::Client,
        method: reqwest::Method,
        url: &str,
    ) -> reqwest::RequestBuilder {
        let request = client.request(method, url);
        if self.basic_auth {
            request.basic_auth(USER, Some(PASSWORD))
        } else {
            request
        }
    }

    /// Uploads `bytes` as a blob of `repo` (monolithic: POST, then PUT
    /// with the digest); answers its sha256 hex.
    pub async fn push_blob(&self, repo: &str, bytes: Vec<u8>) -> String {
        let client = reqwest::Client::new();
        let hex = hex::encode(Sha256::digest(&bytes));
        let started = self
            .request(
                &client,
                reqwest::Method::POST,
                &format!("{}{repo}/blobs/uploads/", self.api()),
            )
            .header("content-length", "0")
            .send()
            .await
            .unwrap();
        assert_eq!(
            started.status(),
            202,
            "starting an upload: {:?}",
            started.text().await
        );
        let location = started.headers()["location"].to_str().unwrap().to_string();
        let mut url = reqwest::Url::parse(&self.api())
            .unwrap()
            .join(&location)
            .unwrap();
        url.query_pairs_mut()
            .append_pair("digest", &format!("sha256:{hex}"));
        let put = self
            .request(&client, reqwest::Method::PUT, url.as_str())
            .header("content-type", "application/octet-stream")
            .body(bytes)
            .send()
            .await
            .unwrap();
        assert_eq!(
            put.status(),
            201,
            "finishing an upload: {:?}",
            put.text().await
        );
        hex
    }

    /// Puts `manifest` under `reference` (a tag); answers the manifest's
    /// sha256 hex.
    pub async fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        manifest: &serde_json::Value,
    ) -> String {
        let body = serde_json::to_vec(manifest).unwrap();
        let hex = hex::encode(Sha256::digest(&body));
        let media_type = manifest["mediaType"]
            .as_str()
            .unwrap_or("application/vnd.oci.image.manifest.v1+json");
        let put = self
            .request(
                &reqwest::Client::new(),
                reqwest::Method::PUT,
                &format!("{}{repo}/manifests/{reference}", self.api()),
            )
            .header("content-type", media_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            put.status(),
            201,
            "putting a manifest: {:?}",
            put.text().await
        );
        hex
    }

    /// Pushes `files` (path, bytes) as an OCI artifact in ORAS's layout
    /// (an empty config, one layer per file titled with its path) under
    /// `repo:tag`; answers the manifest's sha256 hex and what was pushed.
    pub async fn push_model(
        &self,
        repo: &str,
        tag: &str,
        files: &[(&str, Vec<u8>)],
    ) -> (String, Vec<Pushed>) {
        let config = self.push_blob(repo, b"{}".to_vec()).await;
        let mut pushed = Vec::new();
        let mut layers = Vec::new();
        for (path, bytes) in files {
            let size = bytes.len() as u64;
            let sha256 = self.push_blob(repo, bytes.clone()).await;
            layers.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": format!("sha256:{sha256}"),
                "size": size,
                "annotations": {"org.opencontainers.image.title": path},
            }));
            pushed.push(Pushed {
                path: path.to_string(),
                sha256,
                size,
            });
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": "application/vnd.berth.test.model",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{config}"), "size": 2},
            "layers": layers,
        });
        (self.push_manifest(repo, tag, &manifest).await, pushed)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
