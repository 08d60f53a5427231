//! Shared fixtures: built plugins, a loopback file server, a berth server,
//! the API in-process, event subscriptions; and the expectations tests share.

#[path = "../../azurite/azurite.rs"]
pub mod azurite;
pub mod catalog;
pub mod cli;
pub mod events;
#[path = "../../fake-gcs/fake_gcs.rs"]
pub mod fake_gcs;
pub mod files;
pub mod mirror;
#[path = "../../mlflow/mlflow.rs"]
pub mod mlflow;
#[path = "../../moto/moto.rs"]
pub mod moto;
pub mod plugins;
pub mod postgres;
pub mod prometheus;
pub mod proxy;
pub mod receiver;
#[path = "../../registry/registry.rs"]
pub mod registry;
pub mod router;
pub mod server;
#[path = "../../tls/tls.rs"]
pub mod tls;

use std::collections::BTreeMap;
use std::path::Path;

use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// An API refusal: `status`, and an `error` sentence containing `fragment`.
#[track_caller]
pub fn assert_error(answer: &(StatusCode, Value), status: StatusCode, fragment: &str) {
    let (got, body) = answer;
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        *got == status && error.contains(fragment),
        "expected {status} with {fragment:?} in the error; got {got}: {body}"
    );
}

/// An answer's body: its JSON, or its text when it is not JSON (`/healthz`,
/// a deployment's log).
pub fn answer_body(text: String) -> Value {
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deterministic incompressible bytes, so a failure reproduces; never
/// starting with `\0asm`, so they never pass for a WebAssembly file.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut bytes: Vec<u8> = (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        })
        .collect();
    if let Some(first) = bytes.first_mut() {
        *first |= 1;
    }
    bytes
}

/// Runs each listed `async fn name(backend: Backend)` once on SQLite and
/// once on PostgreSQL, as `sqlite::name` and `postgres::name`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::server::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::server::Backend::Postgres).await
                }
            )*
        }
    };
}
pub(crate) use on_both_backends;

/// Whether a deployment's row is final: completed or failed.
pub fn has_ended(row: &Value) -> bool {
    row["status"] == "completed" || row["status"] == "failed"
}

/// The most of `rows` that overlapped in time, by their claim and end.
pub fn most_at_once<'a>(rows: impl Iterator<Item = &'a Value>) -> usize {
    let mut edges = Vec::new();
    for row in rows {
        let at = |field: &str| {
            humantime::parse_rfc3339(row[field].as_str().unwrap())
                .unwrap_or_else(|e| panic!("{field} of {row}: {e}"))
        };
        // An end sorts before a start at the same instant: a permit is
        // handed back before the next claim takes it.
        edges.push((at("started_at"), 1, 1i64));
        edges.push((at("completed_at"), 0, -1));
    }
    edges.sort();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, _, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// A model of a few files served by `files`: returns its registration.
/// Registered without the source check (`check_source: false`): the
/// tests of fetching count every request the source answers, and some
/// give wrong sizes on purpose; `training_runs` tests the check.
pub fn model(
    files: &files::FileServer,
    job_id: &str,
    contents: &[(&str, Vec<u8>)],
) -> serde_json::Value {
    let mut listed = Vec::new();
    for (path, bytes) in contents {
        files.put(job_id, path, bytes.clone());
        listed.push(serde_json::json!({
            "path": path,
            "size_bytes": bytes.len(),
            "sha256": sha256_hex(bytes),
        }));
    }
    serde_json::json!({
        "name": format!("{job_id} adapter"),
        "job_id": job_id,
        "base_model": "meta-llama/Llama-3.1-8B",
        "model_size": "8B",
        "dataset": "support-tickets",
        "num_examples": 1200,
        "num_train_steps": 300,
        "final_loss": 0.42,
        "params": { "lr": 0.0002, "rank": 16 },
        "source": files.source(),
        "files": listed,
        "check_source": false,
    })
}

/// Three files, one nested, one of a couple of MiB.
pub fn adapter_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "adapter_config.json",
            br#"{"r": 16, "lora_alpha": 32}"#.to_vec(),
        ),
        ("adapter_model.safetensors", bytes(1, 2 * 1024 * 1024 + 17)),
        ("tokenizer/tokenizer.json", bytes(2, 10_000)),
    ]
}

/// Probes every 50 ms until `probe` answers; panics after 30 s saying
/// `what()` never happened (a hang guard, not a timing assertion).
pub async fn eventually<T>(
    what: impl Fn() -> String,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    for _ in 0..600 {
        if let Some(value) = probe().await {
            return value;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{} did not happen within 30 s", what());
}

/// Paths under `dir` (relative), sorted: what is on disk.
pub fn files_under(dir: &Path) -> Vec<String> {
    tree(dir).into_keys().collect()
}

/// Every regular file under `dir` (none if it does not exist), by
/// `/`-separated relative path.
pub fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, files);
            } else {
                let relative = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                files.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    files
}

/// A `.tar.gz`'s regular files by path.
#[track_caller]
pub fn unpack(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
    use std::io::Read;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut files = BTreeMap::new();
    for entry in tar.entries().expect("a tar stream") {
        let mut entry = entry.expect("a tar entry");
        assert_eq!(
            entry.header().entry_type(),
            tar::EntryType::Regular,
            "only regular files"
        );
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        assert!(
            files.insert(path.clone(), bytes).is_none(),
            "{path} is in the archive twice"
        );
    }
    files
}
