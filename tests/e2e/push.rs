//! `berth models push DIR` and the upload API under it (`PUT` and `HEAD
//! /v1/blobs/sha256:…`), against a real server over loopback: a pushed
//! folder is registered with the source `upload:`, pinned, deployed, kept
//! through a dropped copy and a budget's eviction, and unpinned when
//! deleted; an upload cut off resumes at its offset; bytes of another
//! digest, a second upload of the same bytes, a full budget and a caller
//! without the deploy role are each answered with their status and a
//! sentence.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;

use berth::auth::{Role, new_token};

use crate::support::cli::{expect_success, lossy, path};
use crate::support::files::FileServer;
use crate::support::proxy::{Proxy, upstream_of};
use crate::support::server::{Backend, Berth};
use crate::support::{bytes, eventually, model, on_both_backends, sha256_hex};

on_both_backends!(a_pushed_folder_is_pinned_deployed_kept_and_unpinned_when_deleted);

use crate::support::cli::client as berth;

/// A finished LoRA run: the adapter and its config, and a checkpoint that
/// `push` leaves out as `register` does.
fn lora_run(parent: &Path, weights: usize) -> std::path::PathBuf {
    let dir = parent.join("lora-run");
    std::fs::create_dir_all(dir.join("checkpoint-10")).unwrap();
    let write = |p: &str, b: &[u8]| std::fs::write(dir.join(p), b).unwrap();
    write(
        "adapter_config.json",
        br#"{"base_model_name_or_path": "meta-llama/Llama-3.2-1B", "peft_type": "LORA", "r": 8}"#,
    );
    write("adapter_model.safetensors", &bytes(21, weights));
    write("checkpoint-10/optimizer.pt", &bytes(22, 4096));
    write(
        "checkpoint-10/trainer_state.json",
        br#"{"global_step": 10, "log_history": [{"loss": 0.5, "step": 10}]}"#,
    );
    dir
}

/// `HEAD` of a blob's upload: its status and `Upload-Offset`.
async fn offset_of(server: &Berth, sha256: &str, token: Option<&str>) -> (StatusCode, u64) {
    let mut head = server
        .client()
        .head(format!("{}/v1/blobs/sha256:{sha256}", server.url));
    if let Some(token) = token {
        head = head.bearer_auth(token);
    }
    let answer = head.send().await.unwrap();
    let offset = answer
        .headers()
        .get("upload-offset")
        .map_or(u64::MAX, |v| v.to_str().unwrap().parse().unwrap());
    (answer.status(), offset)
}

/// `PUT`s `body` as the bytes of the blob `whole` from `offset` on: the
/// status and the answer's JSON (null if none).
async fn put(
    server: &Berth,
    whole: &[u8],
    offset: usize,
    body: Vec<u8>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = server
        .client()
        .put(format!(
            "{}/v1/blobs/sha256:{}",
            server.url,
            sha256_hex(whole)
        ))
        .header("upload-length", whole.len())
        .header("upload-offset", offset)
        .body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status();
    let text = answer.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn a_pushed_folder_is_pinned_deployed_kept_and_unpinned_when_deleted(backend: Backend) {
    let parent = TempDir::new().unwrap();
    let dir = lora_run(parent.path(), 3 << 20);
    let server = Berth::start(backend).await;

    // A dry run says what would be registered and sends nothing.
    let dry = berth(&server.url, &["models", "push", path(&dir), "--dry-run"]);
    let body: Value = serde_json::from_str(&expect_success(&dry)).unwrap();
    assert_eq!(body["source"], "upload:");
    assert_eq!(body["files"].as_array().unwrap().len(), 2, "{body}");
    let weights = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let hex = sha256_hex(&weights);
    assert_eq!(
        offset_of(&server, &hex, None).await,
        (StatusCode::NOT_FOUND, 0)
    );

    let pushed = berth(
        &server.url,
        &["models", "push", path(&dir), "--job-id", "lora-1"],
    );
    let said = expect_success(&pushed);
    assert!(said.starts_with("registered model "), "{said}");
    assert!(
        lossy(&pushed.stderr).contains("left out a training run's state"),
        "the same choice of files as register: {}",
        lossy(&pushed.stderr)
    );
    let (_, models) = server.get("/v1/models").await;
    let model = &models["models"][0];
    assert_eq!(model["source"], "upload:");
    assert_eq!(model["num_train_steps"], 10, "Trainer's state is read");
    let id = model["id"].as_i64().unwrap();
    assert_eq!(
        offset_of(&server, &hex, None).await,
        (StatusCode::OK, weights.len() as u64)
    );
    let config_len = std::fs::metadata(dir.join("adapter_config.json"))
        .unwrap()
        .len();
    let pinned_bytes = weights.len() as u64 + config_len;
    let (_, storage) = server.get("/v1/storage").await;
    assert_eq!(
        (&storage["pinned_blobs"], &storage["pinned_bytes"]),
        (&json!(2), &json!(pinned_bytes)),
        "{storage}"
    );

    // Pushed again: nothing to upload, the same model.
    let again = berth(
        &server.url,
        &["models", "push", path(&dir), "--job-id", "lora-1"],
    );
    assert!(
        expect_success(&again).starts_with(&format!("already registered as model {id}")),
        "{}",
        lossy(&again.stdout)
    );

    // Deployed from the blob store, its copy dropped, deployed again.
    for round in 0..2 {
        let (status, deployment) = server.deploy(id, "archive", json!({})).await;
        assert_eq!(status, StatusCode::OK, "round {round}: {deployment}");
        assert_eq!(deployment["status"], "completed", "{deployment}");
        let copy = server.model_dir("lora-1").join("adapter_model.safetensors");
        assert_eq!(std::fs::read(copy).unwrap(), weights);
        let (status, dropped) = server.delete(&format!("/v1/models/{id}/files")).await;
        assert!(status.is_success(), "{dropped}");
        assert_eq!(
            offset_of(&server, &hex, None).await.0,
            StatusCode::OK,
            "a dropped copy leaves the pinned blob"
        );
    }
    let du = berth(&server.url, &["models", "du"]);
    assert!(
        expect_success(&du).contains("in 2 uploaded blob(s), pinned"),
        "{}",
        lossy(&du.stdout)
    );

    // A registration naming bytes never uploaded is refused, naming them.
    let missing = json!({
        "name": "ghost", "job_id": "ghost", "source": "upload:",
        "files": [{"path": "w.bin", "size_bytes": 5, "sha256": "0".repeat(64)}],
    });
    let (status, refused) = server.post("/v1/models", &missing).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .starts_with("file w.bin: the server's blob store does not hold sha256 0000"),
        "{refused}"
    );

    // Deleted: unpinned, so the blobs may go.
    let (status, _) = server.delete(&format!("/v1/models/{id}")).await;
    assert!(status.is_success());
    let (_, storage) = server.get("/v1/storage").await;
    assert_eq!(storage["pinned_blobs"], 0, "{storage}");
    assert_eq!(storage["unreferenced_blob_bytes"], pinned_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_resume_after_a_cut_and_refuse_other_bytes_and_offsets() {
    let parent = TempDir::new().unwrap();
    let dir = lora_run(parent.path(), 6 << 20);
    let weights = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let hex = sha256_hex(&weights);
    let server = Berth::start(Backend::Sqlite).await;

    // Other bytes than the digest names: refused, nothing kept.
    let mut other = weights.clone();
    other[12345] ^= 0xff;
    let actual = sha256_hex(&other);
    let (status, refused) = put(&server, &weights, 0, other, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains(&format!("hash to sha256 {actual}, not {hex}")),
        "{refused}"
    );
    assert_eq!(
        offset_of(&server, &hex, None).await,
        (StatusCode::NOT_FOUND, 0)
    );

    // Cut off after 2 MiB and a bit: the server keeps what came.
    let cut = (2 << 20) + 4321;
    let address = server.url.trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "PUT /v1/blobs/sha256:{hex} HTTP/1.1\r\nHost: {address}\r\nUpload-Length: {len}\r\n\
         Content-Length: {len}\r\n\r\n",
        len = weights.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&weights[..cut]).await.unwrap();
    stream.flush().await.unwrap();
    drop(stream);
    eventually(
        || format!("the cut upload to be held at {cut}"),
        async || {
            (offset_of(&server, &hex, None).await == (StatusCode::NOT_FOUND, cut as u64))
                .then_some(())
        },
    )
    .await;

    // Another offset than the one held: 409, naming it.
    let (status, conflict) = put(&server, &weights, 0, weights.clone(), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert!(
        conflict["error"]
            .as_str()
            .unwrap()
            .contains(&format!("send the rest from Upload-Offset {cut}")),
        "{conflict}"
    );

    // The rest from the offset held: stored.
    let (status, stored) = put(&server, &weights, cut, weights[cut..].to_vec(), None).await;
    assert_eq!(status, StatusCode::CREATED, "{stored}");
    assert_eq!(
        offset_of(&server, &hex, None).await,
        (StatusCode::OK, weights.len() as u64)
    );

    // A push stopped halfway goes on, run again, from what the server
    // holds of its upload (named by an id, as push hashes while it sends).
    let slow = Proxy::capped(upstream_of(&server.url), Some(2 << 20)).await;
    let weights = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let mut stopped = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "models",
            "push",
            path(&dir),
            "--job-id",
            "resumed",
            "--server",
        ])
        .arg(format!("http://{}", slow.addr))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let uploads = server.model_dir(".blobs").join("uploads");
    let held = || {
        std::fs::read_dir(&uploads)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("id-push-"))
            .map(|e| e.metadata().map_or(0, |m| m.len()))
            .max()
    };
    eventually(
        || "the stopped push's upload to hold 1 MiB".to_string(),
        async || held().filter(|&n| n >= 1 << 20).map(drop),
    )
    .await;
    stopped.kill().unwrap();
    stopped.wait().unwrap();
    drop(slow);
    let pushed = berth(
        &server.url,
        &["models", "push", path(&dir), "--job-id", "resumed"],
    );
    assert!(expect_success(&pushed).starts_with("registered model "));
    assert!(
        lossy(&pushed.stderr).contains("adapter_model.safetensors: resuming its upload after the"),
        "{}",
        lossy(&pushed.stderr)
    );
    assert_eq!(held(), None, "the finished upload left no partial");
    let pushed = berth(&server.url, &["models", "push", path(&dir)]);
    assert!(expect_success(&pushed).starts_with("registered model "));
    let (_, models) = server.get("/v1/models").await;
    let id = models["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["job_id"] == "lora-run")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    let (status, deployment) = server.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let copy = server
        .model_dir("lora-run")
        .join("adapter_model.safetensors");
    assert_eq!(
        std::fs::read(copy).unwrap(),
        weights,
        "the resumed bytes are whole"
    );

    // Two uploads of the same new bytes at once: stored once, both told so.
    let twin = bytes(23, 3 << 20);
    let (a, b) = tokio::join!(
        put(&server, &twin, 0, twin.clone(), None),
        put(&server, &twin, 0, twin.clone(), None)
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::CREATED],
        "{a:?} {b:?}"
    );
    let expected = json!({"sha256": sha256_hex(&twin), "size_bytes": twin.len()});
    assert_eq!((a.1, b.1), (expected.clone(), expected));

    // An upload by id: the answer names the sha256 the bytes have; an id
    // that could be a path is refused.
    let by_id = |id: &str| format!("{}/v1/blobs/uploads/{id}", server.url);
    let fresh = bytes(24, 100_000);
    let answer = server
        .client()
        .put(by_id("0123456789abcdef0123"))
        .header("upload-length", fresh.len())
        .body(fresh.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let stored: Value = answer.json().await.unwrap();
    assert_eq!(
        stored,
        json!({"sha256": sha256_hex(&fresh), "size_bytes": fresh.len()})
    );
    let refused = server
        .client()
        .head(by_id("..%2F..%2Fetc"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_refuses_what_it_cannot_hold_and_never_evicts_a_pinned_blob() {
    let files = FileServer::start().await;
    // 12 MiB.
    let server = Berth::start_with(Backend::Sqlite, &["--models-max-gib", "0.01171875"]).await;
    let too_big = bytes(31, 13 << 20);
    let (status, refused) = put(&server, &too_big, 0, Vec::new(), None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("more than the models dir's whole budget"),
        "{refused}"
    );

    // The same refused to push: its body is more than the server reads
    // before answering, so push asks again to hear why.
    let parent = TempDir::new().unwrap();
    let big_run = parent.path().join("big");
    std::fs::create_dir_all(&big_run).unwrap();
    std::fs::write(big_run.join("model.safetensors"), &too_big).unwrap();
    let refused = berth(&server.url, &["models", "push", path(&big_run)]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        lossy(&refused.stderr).contains("more than the models dir's whole budget"),
        "{}",
        lossy(&refused.stderr)
    );

    // 5 MiB pushed and deployed, then two fetched models of 4 MiB each:
    // the second needs room, and the budget drops copies for it, never the
    // pinned blob.
    let dir = lora_run(parent.path(), 5 << 20);
    let weights = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    expect_success(&berth(&server.url, &["models", "push", path(&dir)]));
    let (_, models) = server.get("/v1/models").await;
    let pushed = models["models"][0]["id"].as_i64().unwrap();
    let (status, deployment) = server.deploy(pushed, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    for (job, seed) in [("fetched-1", 32), ("fetched-2", 33)] {
        let id = server
            .register(&model(&files, job, &[("w.bin", bytes(seed, 4 << 20))]))
            .await;
        let (status, deployment) = server.deploy(id, "archive", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{job}: {deployment}");
    }
    assert_eq!(
        offset_of(&server, &sha256_hex(&weights), None).await,
        (StatusCode::OK, weights.len() as u64),
        "the pinned blob outlived the eviction"
    );
    let (status, deployment) = server.deploy(pushed, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");

    // More than the budget holds beside the pinned blobs, whatever copies
    // it drops: 507.
    let (_, storage) = server.get("/v1/storage").await;
    let pinned = storage["pinned_bytes"].as_u64().unwrap();
    let filler = bytes(34, ((12 << 20) - pinned) as usize + (1 << 20));
    let (status, refused) = put(&server, &filler, 0, Vec::new(), None).await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("no model's copy can be dropped"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploading_needs_the_deploy_role() {
    let tokens = TempDir::new().unwrap();
    let file = tokens.path().join("tokens");
    let (reader, read_line) = new_token("reader", Role::Read).unwrap();
    let (deployer, deploy_line) = new_token("ci", Role::Deploy).unwrap();
    std::fs::write(&file, format!("{read_line}\n{deploy_line}\n")).unwrap();
    let server = Berth::options(Backend::Sqlite)
        .arg("--api-tokens-file")
        .arg(file.to_str().unwrap())
        .start()
        .await;
    let blob = bytes(41, 100_000);
    let hex = sha256_hex(&blob);

    let (status, refused) = put(&server, &blob, 0, blob.clone(), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    let (status, refused) = put(&server, &blob, 0, blob.clone(), Some(&reader)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("needs a deploy token"),
        "{refused}"
    );
    assert_eq!(
        offset_of(&server, &hex, Some(&reader)).await,
        (StatusCode::NOT_FOUND, 0),
        "reading the offset is for every role"
    );
    let (status, stored) = put(&server, &blob, 0, blob.clone(), Some(&deployer)).await;
    assert_eq!(status, StatusCode::CREATED, "{stored}");

    let parent = TempDir::new().unwrap();
    let dir = lora_run(parent.path(), 1 << 20);
    let refused = berth(
        &server.url,
        &["models", "push", path(&dir), "--token", &reader],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        lossy(&refused.stderr).contains("needs a deploy token"),
        "{}",
        lossy(&refused.stderr)
    );
    let pushed = berth(
        &server.url,
        &["models", "push", path(&dir), "--token", &deployer],
    );
    assert!(expect_success(&pushed).starts_with("registered model "));
}
