//! Starts `tests/moto/serve.py`, moto's S3-compatible server on a free
//! loopback port, and reads what it printed. Included with `#[path]` by the
//! object-store tests (`host/src/fetch/store_tests.rs`), the end-to-end
//! tests (`tests/e2e/support`) and the benchmark
//! (`benches/perf/store.rs`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

// Each server's file stands alone (a test crate includes only those it
// starts), so one that starts several loads this more than once.
#[allow(clippy::duplicate_mod)]
#[path = "../served.rs"]
mod served;

/// The running server and the keys of its one user.
pub struct Moto {
    pub endpoint: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    _served: served::Served,
}

impl Moto {
    /// Starts a server with `buckets`; panics, saying what to run, if moto
    /// is not installed.
    pub fn start(buckets: &[&str]) -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut command = Command::new(root.join(".venv/bin/python"));
        command.arg(root.join("tests/moto/serve.py")).args(buckets);
        let served = served::Served::start(
            command,
            "moto's server",
            "run scripts/setup test, which installs moto[server] into .venv",
        );
        Self {
            endpoint: served.field("endpoint"),
            region: served.field("region"),
            access_key_id: served.field("access_key_id"),
            secret_access_key: served.field("secret_access_key"),
            _served: served,
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
