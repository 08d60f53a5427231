//! `berth backup`: a consistent copy of a running server's SQLite
//! database, taken while it writes, restored into a new server with every
//! record there; and the refusals (an existing file, PostgreSQL, no
//! database).

use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::cli::{expect_success, lossy, path};
use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{bytes, model};

fn backup(args: &[&str]) -> Command {
    let mut berth = Command::new(env!("CARGO_BIN_EXE_berth"));
    berth
        .arg("backup")
        .args(args)
        .env_remove("BERTH_DATA_DIR")
        .env_remove("BERTH_DATABASE_URL");
    berth
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_every_record_it_had() {
    let files = FileServer::start().await;
    let berth = Berth::start(Backend::Sqlite).await;
    let mut models = Vec::new();
    let mut deployments = Vec::new();
    for i in 0..5u64 {
        let job = format!("job-backup-{i}");
        let id = berth
            .register(&model(&files, &job, &[("a.json", bytes(i, 200))]))
            .await;
        let (status, row) = berth.deploy(id, "archive", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{row}");
        models.push(id);
        deployments.push(row);
    }

    // Writes go on while the copy is taken.
    let busy = {
        let url = berth.url.clone();
        let client = berth.client().clone();
        let body = model(&files, "job-during", &[("a.json", bytes(99, 200))]);
        tokio::spawn(async move {
            for i in 0..40 {
                let mut body = body.clone();
                body["job_id"] = json!(format!("job-during-{i}"));
                let answer = client
                    .post(format!("{url}/v1/models"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(answer.status(), StatusCode::CREATED);
            }
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("berth-backup.db");
    let data_dir = berth.data_dir().to_path_buf();
    let mut command = backup(&[path(&copy), "--data-dir", path(&data_dir)]);
    let said = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let said = expect_success(&said);
    assert!(said.starts_with("backed up "), "{said}");
    assert!(said.contains("deployments"), "{said}");
    busy.await.unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["berth-backup.db"], "no partial file is left");

    let restored = Berth::options(Backend::Sqlite)
        .restored_from(&copy)
        .start()
        .await;
    for (id, before) in models.iter().zip(&deployments) {
        let (status, listed) = restored.get(&format!("/v1/models/{id}/deployments")).await;
        assert_eq!(status, StatusCode::OK, "{listed}");
        let rows = listed["deployments"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{listed}");
        for field in ["id", "status", "ref", "details", "completed_at", "deployer"] {
            assert_eq!(rows[0][field], before[field], "{field} of {}", rows[0]);
        }
    }
    // What was registered while the copy was taken: a consistent prefix
    // of the writes, never a model without its files.
    let (_, all) = restored.get("/v1/models").await;
    let during: Vec<&Value> = all["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["job_id"].as_str().unwrap().starts_with("job-during-"))
        .collect();
    for m in &during {
        assert_eq!(m["files"].as_array().unwrap().len(), 1, "{m}");
    }
    let mut numbers: Vec<u64> = during
        .iter()
        .map(|m| {
            m["job_id"].as_str().unwrap()["job-during-".len()..]
                .parse()
                .unwrap()
        })
        .collect();
    numbers.sort();
    assert_eq!(numbers, (0..numbers.len() as u64).collect::<Vec<_>>());
    // The restored server writes on.
    let (status, row) = restored.deploy(models[0], "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{row}");
}

#[test]
fn a_backup_refuses_to_overwrite_to_copy_postgres_or_to_copy_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("there.db");
    std::fs::write(&existing, b"keep me").unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // A database to copy, for the overwrite case.
    std::fs::write(data.join("berth.db"), b"").unwrap();
    for (args, words) in [
        (
            vec![path(&existing), "--data-dir", path(&data)],
            "exists: berth backup writes a new file and never overwrites one",
        ),
        (
            vec!["x.db", "--database-url", "postgres://u@127.0.0.1:1/db"],
            "this one is PostgreSQL: back it up with pg_dump",
        ),
        (
            vec!["x.db", "--data-dir", path(&dir.path().join("nowhere"))],
            "there is no database at",
        ),
    ] {
        let out = backup(&args).current_dir(dir.path()).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let said = lossy(&out.stderr);
        assert!(said.contains(words), "{args:?}: {said}");
    }
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");
    assert!(!dir.path().join("x.db").exists());
}
