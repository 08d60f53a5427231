//! The plugins folder while the server runs: hot add, replace, remove, and
//! restarts that reuse compiled code.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::catalog::wait_for_deployers;
use crate::support::files::FileServer;
use crate::support::plugins;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model};

/// Copies like an operator should: to a temp name, then rename.
fn install(dir: &Path, name: &str, wasm: &[u8]) {
    let temp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temp, wasm).unwrap();
    std::fs::rename(temp, dir.join(format!("{name}.wasm"))).unwrap();
}

async fn deployers(berth: &Berth) -> Value {
    berth.get("/v1/deployers").await.1
}

fn sha_of(deployers: &Value, name: &str) -> Option<String> {
    deployers["deployers"]
        .as_array()?
        .iter()
        .find(|d| d["name"] == name)
        .map(|d| d["sha256"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_are_added_replaced_and_removed_while_deployments_run() {
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .arg("--plugins-poll-ms")
        .arg("200")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-hot", &adapter_files()))
        .await;
    let dir = berth.plugins_dir().to_path_buf();
    let archive = std::fs::read(plugins::example("archive")).unwrap();
    let mut events = berth.events().await;

    // Add.
    install(&dir, "packer", &archive);
    wait_for_deployers(&berth, |d| sha_of(d, "packer").is_some()).await;
    let (status, body) = berth.deploy(id, "packer", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Replace misbehave with archive while a misbehave deployment runs
    // (until it is cancelled: the swap comes while it runs, however slow
    // the machine).
    let before = sha_of(&deployers(&berth).await, "misbehave").unwrap();
    let running = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    install(&dir, "misbehave", &archive);
    wait_for_deployers(&berth, |d| {
        sha_of(d, "misbehave").is_some_and(|s| s != before)
    })
    .await;
    let (_, still) = berth
        .get(&format!("/v1/deployments/{}", running["id"]))
        .await;
    assert_eq!(
        (&still["status"], &still["plugin_sha256"]),
        (&json!("running"), &json!(before)),
        "the running deployment goes on in the version it started with: {still}"
    );
    let (status, cancelled) = berth.cancel(&running).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["plugin_sha256"], json!(before), "{cancelled}");
    let (status, replaced) = berth.deploy(id, "misbehave", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    assert!(
        replaced["ref"].as_str().unwrap().ends_with(".tar.gz"),
        "new deployments use the new version"
    );

    // A bad replacement keeps the previous version serving and says why.
    let serving = sha_of(&deployers(&berth).await, "packer").unwrap();
    install(&dir, "packer", b"this is not wasm");
    let now = wait_for_deployers(&berth, |d| !d["rejected"].as_array().unwrap().is_empty()).await;
    assert_eq!(sha_of(&now, "packer"), Some(serving.clone()));
    let reason = now["rejected"][0]["reason"].as_str().unwrap();
    assert_eq!(now["rejected"][0]["file"], "packer.wasm");
    assert!(reason.starts_with("is not a WebAssembly file"), "{reason}");
    assert!(
        reason.contains(&format!(
            "still serving the previous version, sha256 {serving}"
        )),
        "{reason}"
    );
    assert_eq!(
        berth.deploy(id, "packer", json!({})).await.0,
        StatusCode::OK
    );

    // Remove.
    std::fs::remove_file(dir.join("packer.wasm")).unwrap();
    let now = wait_for_deployers(&berth, |d| sha_of(d, "packer").is_none()).await;
    assert_eq!(
        now["rejected"],
        json!([]),
        "the rejection left with its file"
    );
    let (status, body) = berth.deploy(id, "packer", json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Each change was announced.
    let received = events
        .until(|e| e.iter().any(|e| e.kind == "plugin.removed"))
        .await;
    let announced = |kind: &str, about: fn(&Value) -> bool| {
        received.iter().any(|e| e.kind == kind && about(&e.data))
    };
    assert!(
        announced("plugin.loaded", |d| *d == json!({ "name": "packer" })),
        "{received:?}"
    );
    assert!(
        announced("plugin.rejected", |d| d["file"] == "packer.wasm"),
        "{received:?}"
    );
    assert!(
        announced("plugin.removed", |d| *d == json!({ "name": "packer" })),
        "{received:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_in_plugin_serves_at_once_and_its_optimized_code_follows() {
    // A hang guard far above a debug build's background compiles, which
    // run at a low priority behind a busy test run.
    const OPTIMIZE_GUARD: std::time::Duration = std::time::Duration::from_secs(180);
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .private_cache()
        .arg("--plugins-poll-ms")
        .arg("100")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-tiers", &adapter_files()))
        .await;
    let archive = std::fs::read(plugins::example("archive")).unwrap();
    install(berth.plugins_dir(), "packer", &archive);
    wait_for_deployers(&berth, |d| sha_of(d, "packer").is_some()).await;
    let (status, body) = berth.deploy(id, "packer", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "completed", "{body}");

    let tier = |d: &Value| {
        d["deployers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "packer")
            .unwrap()["tier"]
            .clone()
    };
    let waiting = std::time::Instant::now();
    while tier(&deployers(&berth).await) != "optimized" {
        assert!(
            waiting.elapsed() < OPTIMIZE_GUARD,
            "packer's optimized code did not arrive within {OPTIMIZE_GUARD:?}; log:\n{}",
            berth.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        berth.log().contains("deployer optimized"),
        "{}",
        berth.log()
    );
    let (status, body) = berth.deploy(id, "packer", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "completed", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_with_their_own_data_dirs_share_one_cache_dir() {
    let cache = tempfile::tempdir().unwrap();
    let first = Berth::options(Backend::Sqlite)
        .cache_dir(cache.path())
        .start()
        .await;
    assert!(
        first.log().contains("compiled=2 from_cache=0"),
        "{}",
        first.log()
    );
    let second = Berth::options(Backend::Sqlite)
        .cache_dir(cache.path())
        .start()
        .await;
    assert_ne!(first.data_dir(), second.data_dir());
    assert!(
        second.log().contains("compiled=0 from_cache=2"),
        "the second server compiles nothing: {}",
        second.log()
    );
    assert!(
        !second.data_dir().join("cache").exists(),
        "nothing is written to DATA_DIR/cache when --cache-dir is given"
    );
    assert!(
        sha_of(&deployers(&second).await, "archive").is_some(),
        "code from the shared cache serves"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reuses_compiled_code_and_rebuilds_a_tampered_entry() {
    // One tier, so the cache holds one entry per plugin (the tiered cache
    // is `runtime::tiers`').
    let mut berth = Berth::options(Backend::Sqlite)
        .private_cache()
        .arg("--compiler=optimized")
        .start()
        .await;
    assert!(
        berth.log().contains("compiled=2 from_cache=0"),
        "{}",
        berth.log()
    );

    berth.kill9();
    berth.restart();
    assert!(
        berth.log().contains("compiled=0 from_cache=2"),
        "{}",
        berth.log()
    );

    let cache = berth.data_dir().join("cache");
    let entries: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    assert_eq!(entries.len(), 2);
    let mut bytes = std::fs::read(&entries[0]).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&entries[0], bytes).unwrap();

    berth.kill9();
    berth.restart();
    let log = berth.log();
    assert!(log.contains("does not match its recorded hash"), "{log}");
    assert!(log.contains("compiled=1 from_cache=1"), "{log}");
    assert!(
        sha_of(&deployers(&berth).await, "archive").is_some(),
        "the rebuilt plugin serves"
    );
}
