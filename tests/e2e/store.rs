//! One copy of every file: models that share files download and store
//! them once; the same weights under a new job download nothing; the disk
//! budget drops the least recently deployed copy and never one a queued or
//! running deployment uses, on one server or another on the same
//! PostgreSQL and models volume; a damaged shared file is fetched again
//! for every model that links it.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use reqwest::StatusCode;
use serde_json::json;

use crate::storage::entry;
use crate::support::files::{Fault, FileServer};
use crate::support::server::{Backend, Berth, Shared, servers};
use crate::support::{bytes, eventually, model, on_both_backends, sha256_hex};

on_both_backends!(
    models_that_share_files_download_and_store_them_once,
    the_budget_drops_the_least_recently_deployed_copy_never_a_pinned_one,
);

fn inode(path: &Path) -> (u64, u64) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.dev(), meta.ino())
}

/// What the `read-later` mode of `misbehave` answers for these bytes: the
/// sha256 of every file's bytes, one after another.
fn sha256_of_all(files: &[(&str, Vec<u8>)]) -> String {
    let all: Vec<u8> = files.iter().flat_map(|(_, b)| b.iter().copied()).collect();
    sha256_hex(&all)
}

async fn models_that_share_files_download_and_store_them_once(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let (weights, tokenizer) = (bytes(31, 3 << 20), bytes(32, 20_000));
    let first = [
        ("weights.bin", weights.clone()),
        ("tokenizer.json", tokenizer.clone()),
        ("config.json", br#"{"r": 8}"#.to_vec()),
    ];
    // Same bytes at other paths, one file of its own.
    let second = [
        ("base/model.bin", weights.clone()),
        ("tok.json", tokenizer.clone()),
        ("adapter.bin", bytes(33, 100_000)),
    ];
    let a = berth.register(&model(&files, "job-share-a", &first)).await;
    let b = berth.register(&model(&files, "job-share-b", &second)).await;
    let (status, body) = berth.deploy(a, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, deployed) = berth.deploy(b, "archive", json!({})).await;

    assert_eq!(status, StatusCode::OK, "{deployed}");
    assert_eq!(
        deployed["details"]["files"], 3,
        "the deployer sees every file"
    );
    assert_eq!(files.hits("job-share-b", "base/model.bin"), 0);
    assert_eq!(files.hits("job-share-b", "tok.json"), 0);
    assert_eq!(files.hits("job-share-b", "adapter.bin"), 1);
    let (dir_a, dir_b) = (
        berth.model_dir("job-share-a"),
        berth.model_dir("job-share-b"),
    );
    assert_eq!(
        std::fs::read(dir_b.join("base/model.bin")).unwrap(),
        weights
    );
    assert_eq!(
        inode(&dir_b.join("base/model.bin")),
        inode(&dir_a.join("weights.bin"))
    );
    // Disk use counts the shared bytes once.
    let shared = (weights.len() + tokenizer.len()) as u64;
    let every_file: u64 = first
        .iter()
        .chain(&second)
        .map(|(_, b)| b.len() as u64)
        .sum();
    let (_, storage) = berth.get("/v1/storage").await;
    assert_eq!(storage["bytes_on_disk"], every_file - shared, "{storage}");
    assert_eq!(storage["bytes_saved"], shared, "{storage}");
    assert_eq!(entry(&storage, b)["shared_bytes"], shared);

    // The same weights registered again under a new job id: nothing is
    // downloaded.
    let c = berth.register(&model(&files, "job-share-c", &first)).await;
    let before = files.total_hits();
    let (status, body) = berth.deploy(c, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(files.total_hits(), before, "nothing downloaded");
    assert_eq!(body["details"]["files"], 3);

    // A file damaged on disk (in place, through one model's link) is
    // fetched again, once, and taken from every model that linked it.
    let mut damaged = weights.clone();
    damaged[77] ^= 0x40;
    std::fs::write(dir_a.join("weights.bin"), &damaged).unwrap();
    let (status, body) = berth.deploy(b, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(files.hits("job-share-b", "base/model.bin"), 1);
    assert_eq!(
        std::fs::read(dir_b.join("base/model.bin")).unwrap(),
        weights
    );
    assert!(
        !dir_a.join("weights.bin").exists(),
        "not left in the first model"
    );
    let dir_c = berth.model_dir("job-share-c");
    assert!(
        !dir_c.join("weights.bin").exists(),
        "not left in the third model"
    );
    let (status, body) = berth.deploy(a, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        files.hits("job-share-a", "weights.bin"),
        1,
        "linked from the fresh copy"
    );
    assert_eq!(std::fs::read(dir_a.join("weights.bin")).unwrap(), weights);
}

/// Three models of 4 MiB under a budget of 10 MiB (0.01 GiB): two fit.
fn budget_model(seed: u64) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("weights.bin", bytes(seed, 4 << 20)),
        ("config.json", format!("{{\"seed\": {seed}}}").into_bytes()),
    ]
}

async fn the_budget_drops_the_least_recently_deployed_copy_never_a_pinned_one(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start_with(backend, &["--models-max-gib", "0.01"]).await;
    let (pinned, old, new) = (budget_model(41), budget_model(42), budget_model(43));
    let p = berth.register(&model(&files, "job-pinned", &pinned)).await;
    let o = berth.register(&model(&files, "job-old", &old)).await;
    let n = berth.register(&model(&files, "job-new", &new)).await;

    // The pinned model is the least recently deployed, but its deployment
    // reads every byte only after the others have run.
    let reading = berth
        .deploy_detached(
            p,
            "misbehave",
            json!({ "mode": "read-later", "ms": 10_000 }),
        )
        .await;
    let reading_path = format!("/v1/deployments/{}", reading["id"]);
    eventually(
        || "the pinned model's deployment reaches its deployer".to_string(),
        async || {
            let (_, row) = berth.get(&reading_path).await;
            (row["phase"] == "deploying").then_some(())
        },
    )
    .await;
    let (status, body) = berth.deploy(o, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = berth.deploy(n, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (_, row) = berth.get(&reading_path).await;
    assert_eq!(
        row["status"], "running",
        "the machine is too slow for this test: the pinned deployment ended before the eviction"
    );
    assert!(
        !berth.model_dir("job-old").exists(),
        "the unpinned copy is dropped"
    );
    let done = eventually(
        || "the pinned model's deployment ends".to_string(),
        async || {
            let (_, row) = berth.get(&reading_path).await;
            (row["status"] != "running").then_some(row)
        },
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let every_byte: usize = pinned.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(done["details"]["bytes"], every_byte);
    assert_eq!(done["details"]["sha256"], sha256_of_all(&pinned));

    // The evicted model deploys again, fetched anew; now the pinned one,
    // no longer in use and least recently deployed, makes room.
    let (status, body) = berth.deploy(o, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(files.hits("job-old", "weights.bin"), 2);
    let (_, storage) = berth.get("/v1/storage").await;
    assert_eq!(entry(&storage, p)["local"], false, "{storage}");
    assert_eq!(entry(&storage, o)["local"], true, "{storage}");
    assert_eq!(entry(&storage, n)["local"], true, "{storage}");
    assert!(storage["bytes_on_disk"].as_u64().unwrap() <= 10_737_418);
    assert!(
        berth
            .log()
            .contains("dropped the local copy of the model deployed least recently")
    );

    // With every other copy pinned, a model that does not fit fails
    // before downloading, with the numbers; one larger than the whole
    // budget is refused without dropping anything.
    let mut pins = Vec::new();
    for id in [o, n] {
        let pin = berth
            .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
            .await;
        pins.push(pin["id"].as_i64().unwrap());
    }
    let tight = berth
        .register(&model(
            &files,
            "job-tight",
            &[("w.bin", bytes(44, 3 << 20))],
        ))
        .await;
    let (status, body) = berth.deploy(tight, "archive", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("the missing files need 3 MiB, but the models dir holds")
            && error.contains("in use by a queued or running deployment"),
        "{error}"
    );
    let huge = berth
        .register(&model(
            &files,
            "job-huge",
            &[("w.bin", bytes(45, 11 << 20))],
        ))
        .await;
    let (status, body) = berth.deploy(huge, "archive", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("the missing files need 11 MiB, more than the models dir's whole budget"),
        "{error}"
    );
    assert_eq!(
        files.hits("job-tight", "w.bin") + files.hits("job-huge", "w.bin"),
        0
    );
    for pin in pins {
        let (status, body) = berth
            .post(&format!("/v1/deployments/{pin}/cancel"), &json!({}))
            .await;
        assert!(status.is_success(), "{body}");
    }
}

/// Two servers on one PostgreSQL sharing a models volume: two models
/// that share a file, deployed at once on different servers, download it
/// once; an eviction on one server never drops a copy a deployment on the
/// other is reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_sharing_a_volume_download_a_digest_once_and_respect_each_others_pins() {
    let shared = Shared::new().await;
    let berths = servers(&shared, 2, &["--models-max-gib", "0.01"]).await;
    let files = FileServer::start().await;
    let weights = bytes(51, 3 << 20);
    let a = [("weights.bin", weights.clone()), ("a.json", b"{}".to_vec())];
    let b = [("w.bin", weights.clone()), ("b.json", b"[]".to_vec())];
    let ia = berths[0].register(&model(&files, "job-two-a", &a)).await;
    let ib = berths[0].register(&model(&files, "job-two-b", &b)).await;
    for (job, path) in [("job-two-a", "weights.bin"), ("job-two-b", "w.bin")] {
        files.fault(
            job,
            path,
            Some(Fault::Slow(std::time::Duration::from_millis(5))),
        );
    }

    let (first, second) = tokio::join!(
        berths[0].deploy(ia, "misbehave", json!({ "mode": "read-later", "ms": 0 })),
        berths[1].deploy(ib, "misbehave", json!({ "mode": "read-later", "ms": 0 })),
    );

    assert_eq!(first.0, StatusCode::OK, "{}", first.1);
    assert_eq!(second.0, StatusCode::OK, "{}", second.1);
    assert_eq!(first.1["details"]["sha256"], sha256_of_all(&a));
    assert_eq!(second.1["details"]["sha256"], sha256_of_all(&b));
    assert_eq!(
        files.served("job-two-a", "weights.bin") + files.served("job-two-b", "w.bin"),
        weights.len() as u64,
        "one digest, one download"
    );

    // Server 1 reads model a late; server 0 needs room for two models
    // of 4 MiB: it drops b, never a.
    let reading = berths[1]
        .deploy_detached(
            ia,
            "misbehave",
            json!({ "mode": "read-later", "ms": 8_000 }),
        )
        .await;
    let reading_path = format!("/v1/deployments/{}", reading["id"]);
    for (job, seed) in [("job-two-c", 52), ("job-two-d", 53)] {
        let id = berths[0]
            .register(&model(&files, job, &budget_model(seed)))
            .await;
        let (status, body) = berths[0].deploy(id, "archive", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let models = &shared.models_dir;
    assert!(
        models.join("job-two-a/weights.bin").exists(),
        "the pinned copy stays"
    );
    assert!(
        !models.join("job-two-b").exists(),
        "the unpinned copy is dropped"
    );
    let done = eventually(
        || "the other server's deployment ends".to_string(),
        async || {
            let (_, row) = berths[1].get(&reading_path).await;
            (row["status"] != "running" && row["status"] != "queued").then_some(row)
        },
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["details"]["sha256"], sha256_of_all(&a));
}
