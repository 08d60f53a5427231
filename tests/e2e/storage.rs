//! What the models dir holds, as `GET /v1/storage`, `berth models du`, the
//! metrics and the page show it: a model's copy after a deployment and
//! after it is dropped; the order copies would be evicted in, on both
//! databases; and `--models-max-gib`, refused when it is not above 0.
//! Sharing between models is checked by `fetch::usage`'s unit tests.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};

use berth::db::{Db, NewDeployment};

use crate::support::files::FileServer;
use crate::support::prometheus::Scrape;
use crate::support::server::{Backend, Berth, fresh_postgres_database};
use crate::support::{adapter_files, model, on_both_backends};

on_both_backends!(
    storage_shows_a_deployed_copy_and_a_dropped_one,
    models_come_least_recently_deployed_first,
);

/// The model `id`'s entry in a `/v1/storage` answer.
#[track_caller]
pub(crate) fn entry(storage: &Value, id: i64) -> &Value {
    storage["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("model {id} is not in {storage}"))
}

async fn storage_shows_a_deployed_copy_and_a_dropped_one(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start_with(backend, &["--models-max-gib", "0.5"]).await;
    let contents = adapter_files();
    let model_bytes: usize = contents.iter().map(|(_, b)| b.len()).sum();
    let id = berth
        .register(&model(&files, "job-storage", &contents))
        .await;

    let (status, before) = berth.get("/v1/storage").await;
    assert_eq!(status, StatusCode::OK, "{before}");
    assert_eq!(
        entry(&before, id),
        &json!({
            "bytes": 0, "id": id, "job_id": "job-storage", "last_deployed": null,
            "local": false, "name": "job-storage adapter", "shared_bytes": 0,
        })
    );
    assert_eq!(before["budget_bytes"], 512 << 20);
    assert_eq!(before["bytes_on_disk"], 0);

    let (status, deployment) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let (_, after) = berth.get("/v1/storage").await;
    assert_eq!(
        entry(&after, id),
        &json!({
            "bytes": model_bytes, "id": id, "job_id": "job-storage",
            "last_deployed": deployment["created_at"], "local": true,
            "name": "job-storage adapter", "shared_bytes": 0,
        })
    );
    assert_eq!(after["bytes_on_disk"], model_bytes);
    assert_eq!(after["bytes_saved"], 0);
    assert_eq!(after["unreferenced_blob_bytes"], 0);
    let models_dir = berth.model_dir("job-storage");
    assert_eq!(
        after["models_dir"],
        models_dir.parent().unwrap().to_str().unwrap()
    );

    // The scan set the gauges.
    let scrape = berth
        .client()
        .get(format!("{}/metrics", berth.url))
        .send()
        .await
        .unwrap();
    let scrape = Scrape::parse(&scrape.text().await.unwrap());
    assert_eq!(
        scrape.value("berth_models_stored_bytes", &[]),
        model_bytes as f64
    );
    assert_eq!(scrape.value("berth_models_saved_bytes", &[]), 0.0);
    assert_eq!(scrape.value("berth_model_copies_evicted_total", &[]), 0.0);

    // `berth models du`: the copy, then the total.
    let table = du(&berth.url, &[]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "SIZE", "SHARED", "LOCAL", "LAST", "DEPLOYED", "(UTC)", "JOB", "ID", "NAME"
        ],
        "{table}"
    );
    let size = berth::human::size(model_bytes as u64);
    let row = lines
        .iter()
        .find(|l| l.contains("job-storage"))
        .unwrap_or_else(|| panic!("no row for the model in:\n{table}"));
    assert!(
        row.trim_start()
            .starts_with(&format!("{size}  0 bytes  yes")),
        "{table}"
    );
    assert_eq!(
        lines.last().unwrap(),
        &format!(
            "{size} on disk of a 512 MiB budget in {}, 0 bytes saved by sharing",
            after["models_dir"].as_str().unwrap()
        )
    );
    let json: Value = serde_json::from_str(&du_json(&berth.url)).unwrap();
    assert_eq!(entry(&json, id)["local"], true);

    // Dropped: no longer local, nothing on disk, still last deployed then.
    let (status, body) = berth.delete(&format!("/v1/models/{id}/files")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, dropped) = berth.get("/v1/storage").await;
    let mine = entry(&dropped, id);
    assert_eq!(
        (&mine["local"], &mine["bytes"], &mine["last_deployed"]),
        (&json!(false), &json!(0), &deployment["created_at"])
    );
    assert_eq!(dropped["bytes_on_disk"], 0);
    let table = du(&berth.url, &[]);
    let row = table.lines().find(|l| l.contains("job-storage")).unwrap();
    assert!(row.starts_with("0 bytes  0 bytes  no"), "{table}");
}

/// `berth models du` against `server`: its stdout, asserting success.
#[track_caller]
fn du(server: &str, extra: &[&str]) -> String {
    let run = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["models", "du", "--server", server])
        .args(extra)
        .env_remove("BERTH_SERVER")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}

fn du_json(server: &str) -> String {
    du(server, &["--json"])
}

/// The order a budget would drop copies in: never-deployed models first,
/// then by their newest deployment, whichever status it has.
async fn models_come_least_recently_deployed_first(backend: Backend) {
    let temp = tempfile::tempdir().unwrap();
    let url = match backend {
        Backend::Sqlite => format!("sqlite://{}", temp.path().join("berth.db").display()),
        Backend::Postgres => fresh_postgres_database().await,
    };
    let db = Db::connect(&url).await.unwrap();
    let files = FileServer::start().await;
    let mut ids = Vec::new();
    for job in ["old", "never", "new", "also-never"] {
        let registration: Value = model(&files, job, &adapter_files());
        let model = berth::http::registration(&registration.to_string()).unwrap();
        ids.push(db.insert_model(&model).await.unwrap().id);
    }
    let [old, never, new, also_never] = ids[..] else {
        unreachable!()
    };
    let deploy = async |model_id| {
        let new = NewDeployment {
            model_id,
            deployer: "archive",
            options_json: "{}",
            dir: "/m",
            plugin_sha256: "0",
            created_by: None,
        };
        let row = db.insert_deployment(new, None, None).await.unwrap();
        // Timestamps have milliseconds: the next one is later.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        row.created_at
    };
    deploy(new).await;
    let old_at = deploy(old).await;
    let new_at = deploy(new).await;

    let order: Vec<(i64, String, Option<String>)> = db
        .models_by_last_deployed()
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.model_id, m.job_id, m.last_deployed))
        .collect();
    assert_eq!(
        order,
        [
            (never, "never".into(), None),
            (also_never, "also-never".into(), None),
            (old, "old".into(), Some(old_at)),
            (new, "new".into(), Some(new_at)),
        ]
    );
    db.close().await;
}

/// `--models-max-gib` takes a positive number of GiB; 0, a negative
/// number or a word stop the start with a sentence.
#[test]
fn a_budget_that_is_not_above_zero_is_refused() {
    for (args, env) in [
        (&["--models-max-gib", "0"][..], None),
        (&["--models-max-gib=-1"][..], None),
        (&[][..], Some("lots")),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
        command
            .arg("serve")
            .args(args)
            .env_remove("BERTH_MODELS_MAX_GIB");
        if let Some(value) = env {
            command.env("BERTH_MODELS_MAX_GIB", value);
        }
        let run = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("--models-max-gib")
                && stderr.contains("give a number of GiB above 0, like 0.5 or 200"),
            "{args:?} {env:?}: {stderr}"
        );
    }
}
