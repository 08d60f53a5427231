//! Starts `tests/moto/serve.py`, moto's S3-compatible server on a free
//! loopback port, and reads what it printed. Included with `#[path]` by the
//! object-store tests (`host/src/fetch/store_tests.rs`), the end-to-end
//! tests (`tests/e2e/support`) and the benchmark
//! (`benches/perf/store.rs`).

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// The running server and the keys of its one user.
pub struct Moto {
    pub endpoint: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Held open: the server stops when it closes, that is when this
    /// process exits, however it exits.
    _stdin: ChildStdin,
    _child: Child,
}

impl Moto {
    /// Starts a server with `buckets`; panics, saying what to run, if moto
    /// is not installed.
    pub fn start(buckets: &[&str]) -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let python = root.join(".venv/bin/python");
        let missing = "run scripts/setup test, which installs moto[server] into .venv";
        let mut child = Command::new(&python)
            .arg(root.join("tests/moto/serve.py"))
            .args(buckets)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {missing}", python.display()));
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("moto's server did not start within 2 minutes"));
        let started: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            panic!("moto's server did not start (its error is above); {missing}")
        });
        let field = |name: &str| {
            started[name]
                .as_str()
                .unwrap_or_else(|| panic!("moto's server did not say its {name}"))
                .to_string()
        };
        Self {
            endpoint: field("endpoint"),
            region: field("region"),
            access_key_id: field("access_key_id"),
            secret_access_key: field("secret_access_key"),
            _stdin: child.stdin.take().expect("piped"),
            _child: child,
        }
    }

    /// Puts `contents` at `key` of `bucket` with boto3, which the server
    /// came with: for a folder marker, a key ending in `/`, which
    /// object_store cannot name; and for an object whose sha256 the store
    /// keeps (`sha256`): moto keeps a checksum only when
    /// `x-amz-sdk-checksum-algorithm` names it, as AWS's SDKs send it,
    /// while object_store's `Checksum::SHA256` sends the checksum alone.
    #[allow(dead_code)] // The benchmark puts with object_store only.
    pub fn put_by_boto3(&self, bucket: &str, key: &str, contents: &[u8], sha256: bool) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut child = Command::new(root.join(".venv/bin/python"))
            .arg("-c")
            .arg(
                "import sys, boto3\n\
                 endpoint, region, key_id, secret, bucket, key, sha256 = sys.argv[1:]\n\
                 boto3.client('s3', endpoint_url=endpoint, region_name=region,\n\
                     aws_access_key_id=key_id, aws_secret_access_key=secret,\n\
                 ).put_object(Bucket=bucket, Key=key, Body=sys.stdin.buffer.read(),\n\
                     **({'ChecksumAlgorithm': 'SHA256'} if sha256 == 'yes' else {}))",
            )
            .args([
                self.endpoint.as_str(),
                &self.region,
                &self.access_key_id,
                &self.secret_access_key,
                bucket,
                key,
                if sha256 { "yes" } else { "no" },
            ])
            .stdin(Stdio::piped())
            .spawn()
            .expect("the server's python runs");
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(contents).unwrap();
        drop(stdin);
        assert!(child.wait().unwrap().success(), "boto3 could not put {key}");
    }
}
