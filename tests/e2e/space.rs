//! Room on disk: below the reserve (`--min-free-mib`) new deployments are
//! refused with the reason and reads keep working; a model that would not
//! fit fails before a byte is downloaded, with the bytes needed and free; a
//! deployer is held to its out-dir quota; a disk that really fills (a small
//! tmpfs holding the data dir) loses no record and keeps reads working.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, eventually, model, on_both_backends};

on_both_backends!(
    a_deployer_is_stopped_past_its_out_quota_and_its_output_removed,
    a_deployer_filling_the_disk_fails_with_the_real_cause,
);

async fn a_deployer_is_stopped_past_its_out_quota_and_its_output_removed(backend: Backend) {
    let berth = Berth::options(backend)
        .plugins_file("misbehave.toml", "out_mib = 4\n")
        .start()
        .await;
    let files = FileServer::start().await;
    let id = berth
        .register(&model(&files, "job-quota", &adapter_files()))
        .await;
    let (_, deployers) = berth.get("/v1/deployers").await;
    let misbehave = deployers["deployers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "misbehave")
        .unwrap();
    assert_eq!(misbehave["out_mib"], 4);

    // Writing without end is stopped while it runs; writing a little too
    // much and returning at once is caught when it returns.
    for bytes in [4_000_000_000u64, (4 << 20) + 1] {
        let (status, failed) = berth
            .deploy(id, "misbehave", json!({"mode": "fill-out", "bytes": bytes}))
            .await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{bytes}: {failed}");
        let error = failed["error"].as_str().unwrap();
        assert!(
            error.starts_with(
                "deployer misbehave: wrote more than its output quota of 4 MiB to /out ("
            ) && error.ends_with(" when it was stopped); out_mib in its manifest raises it"),
            "{bytes}: {error}"
        );
        let out_dir = std::path::Path::new(failed["out_dir"].as_str().unwrap());
        assert!(!out_dir.exists(), "{} is removed", out_dir.display());
    }
    // Up to the quota is fine (the file and /out's entries fit in 4 MiB).
    let (status, done) = berth
        .deploy(
            id,
            "misbehave",
            json!({"mode": "fill-out", "bytes": 3 << 20}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["details"]["written"], 3 << 20);
}

/// A deployer whose quota is more than the disk holds (the data dir on a
/// 64 MiB tmpfs) fails with its own words, its row is stored, its output
/// removed, and the next deployment has the room back.
async fn a_deployer_filling_the_disk_fails_with_the_real_cause(backend: Backend) {
    let berth = on_a_small_disk(backend).await;
    let files = FileServer::start().await;
    let id = berth
        .register(&model(&files, "job-fill", &adapter_files()))
        .await;
    let (status, failed) = berth
        .deploy(
            id,
            "misbehave",
            json!({"mode": "fill-out", "bytes": 4_000_000_000u64}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.starts_with("deployer misbehave: writing /out/fill after ")
            && error.contains(" free when it ended: the disk filled up)"),
        "{error}"
    );
    let (_, stored) = berth
        .get(&format!("/v1/deployments/{}", failed["id"]))
        .await;
    assert_eq!(stored["status"], "failed", "{stored}");
    assert_eq!(stored["error"], failed["error"]);
    let (status, done) = berth.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_eq!(status, StatusCode::OK, "the space came back: {done}");
}

/// The SQLite database on a full disk: a deployment that ends meanwhile is
/// recorded once there is room; new writes are refused with 503 and a
/// reason while reads keep working; `serve` starts on the full disk, and
/// the row a killed server left running is failed once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_and_loses_no_record() {
    let mut berth = on_a_small_disk(Backend::Sqlite).await;
    let files = FileServer::start().await;
    let id = berth
        .register(&model(&files, "job-disk", &adapter_files()))
        .await;
    let (status, fetched) = berth.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the model is on disk before it fills: {fetched}"
    );
    let detached = async |ms: u64| {
        let running = berth
            .deploy_detached(id, "misbehave", json!({"mode": "sleep", "ms": ms}))
            .await;
        format!("/v1/deployments/{}", running["id"])
    };

    // It ends while nothing can be written: its outcome is kept, and
    // stored once there is room.
    let ending = detached(2_000).await;
    let ballast = fill(berth.data_dir());
    let id_of = |path: &str| path.rsplit('/').next().unwrap().to_string();
    eventually(
        || format!("a refused end record; log:\n{}", berth.log()),
        async || {
            let said = format!("could not record the end of deployment {}", id_of(&ending));
            berth.log().contains(&said).then_some(())
        },
    )
    .await;
    let (_, row) = berth.get(&ending).await;
    assert_eq!(row["status"], "running", "{row}");
    let refused = berth.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_error(
        &refused,
        StatusCode::SERVICE_UNAVAILABLE,
        "free some space: reads keep working",
    );
    let registered = berth
        .post("/v1/models", &model(&files, "job-disk-2", &adapter_files()))
        .await;
    assert_error(&registered, StatusCode::SERVICE_UNAVAILABLE, "disk is full");
    std::fs::remove_file(&ballast).unwrap();
    let row: Value = eventually(
        || format!("the kept outcome stored; log:\n{}", berth.log()),
        async || {
            let (_, row) = berth.get(&ending).await;
            (row["status"] != "running").then_some(row)
        },
    )
    .await;
    // Its deployer could not write its own output either, and said so.
    assert_eq!(row["status"], "failed", "{row}");
    let error = row["error"].as_str().unwrap();
    assert!(
        error.starts_with("deployer misbehave: /out/ok.txt: ")
            && error.ends_with(" free when it ended: the disk filled up)"),
        "{error}"
    );

    // Running when the disk fills and the server dies.
    let leftover = detached(600_000).await;
    let ballast = fill(berth.data_dir());
    berth.kill9();
    berth.restart();
    let (status, models) = berth.get("/v1/models").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "reads work on a full disk: {models}"
    );
    let (_, still) = berth.get(&leftover).await;
    assert_eq!(still["status"], "running", "nothing could be written yet");
    assert!(
        berth
            .log()
            .contains("could not mark the deployments left running by the previous run as failed"),
        "{}",
        berth.log()
    );

    std::fs::remove_file(ballast).unwrap();
    let failed: Value = eventually(
        || {
            format!(
                "the leftover row failed once there is room; log:\n{}",
                berth.log()
            )
        },
        async || {
            let (_, row) = berth.get(&leftover).await;
            (row["status"] == "failed").then_some(row)
        },
    )
    .await;
    assert!(
        failed["error"].as_str().unwrap().starts_with("interrupted"),
        "{failed}"
    );
    let (status, done) = berth.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_eq!(status, StatusCode::OK, "{done}");
}

/// A server whose data dir is a 64 MiB tmpfs, keeping 4 MiB free.
/// An event published while the SQLite database cannot write (a plugin
/// appearing in the folder) is kept, offered again, and stored once there
/// is room: a subscriber receives it, with its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_published_on_a_full_disk_is_stored_once_there_is_room() {
    let berth = on_a_small_disk(Backend::Sqlite).await;
    let mut events = berth.events().await;
    let ballast = fill(berth.data_dir());
    std::fs::copy(
        crate::support::plugins::example("archive"),
        berth.plugins_dir().join("archive-again.wasm"),
    )
    .unwrap();
    eventually(
        || format!("a refused append; log:\n{}", berth.log()),
        async || {
            berth
                .log()
                .contains("could not store events (the database has no room to write")
                .then_some(())
        },
    )
    .await;
    std::fs::remove_file(ballast).unwrap();
    let received = events
        .until(|e| {
            e.iter()
                .any(|e| e.kind == "plugin.loaded" && e.data["name"] == "archive-again")
        })
        .await;
    assert!(received.last().unwrap().id.is_some());
    // Logged by the appender after the commit that readers already see.
    eventually(
        || format!("the appender saying it caught up; log:\n{}", berth.log()),
        async || {
            berth
                .log()
                .contains("the database takes events again: those held back are stored")
                .then_some(())
        },
    )
    .await;
}

async fn on_a_small_disk(backend: Backend) -> Berth {
    Berth::options(backend)
        .data_volume_mib(64)
        .arg("--min-free-mib")
        .arg("4")
        .start()
        .await
}

/// Fills the volume of `dir` to the last byte; returns the file to remove.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("ballast");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 1 << 16];
    while file.write_all(&chunk).is_ok() {}
    let mut byte = [0u8; 1];
    while file.write_all(&byte[..]).is_ok() {
        byte[0] = 1;
    }
    let _ = file.sync_all();
    path
}

#[tokio::test]
async fn below_the_reserve_deployments_are_refused_and_reads_work() {
    // A reserve no volume has: as if the disk were full.
    let berth = Berth::start_with(Backend::Sqlite, &["--min-free-mib", "1000000000000"]).await;
    let files = FileServer::start().await;
    let id = berth
        .register(&model(&files, "job-full", &adapter_files()))
        .await;
    let refused = berth.deploy(id, "archive", json!({})).await;
    assert_error(
        &refused,
        StatusCode::SERVICE_UNAVAILABLE,
        "berth keeps to record the end of every deployment (--min-free-mib); free some space: reads keep working",
    );
    let (status, listed) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["deployments"], json!([]), "nothing was recorded");
    let (status, _) = berth.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_model_too_large_for_the_volume_fails_before_downloading() {
    let berth = Berth::start(Backend::Sqlite).await;
    let files = FileServer::start().await;
    let mut registration = model(&files, "job-huge", &adapter_files());
    registration["files"][0]["size_bytes"] = json!(1u64 << 50);
    let id = berth.register(&registration).await;
    let (status, failed) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("the missing files need 1.0 PiB, but the volume has"),
        "{error}"
    );
    assert_eq!(failed["status"], "failed");
}
