//! What the db layer's unit tests share: a SQLite database in a temp dir,
//! and records to put in it. Never used outside tests.

use tempfile::TempDir;

use super::{Db, NewDeployment};
use crate::model::{Deployment, ModelFile, TrainedModel};

/// The URL of the database file in `dir`.
pub fn url(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.path().join("t.db").display())
}

/// A fresh database, in a temp dir that lives as long as the first value.
pub async fn open() -> (TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&url(&dir)).await.unwrap();
    (dir, db)
}

/// A model of one file, to register under `job_id`.
pub fn model(job_id: &str) -> TrainedModel {
    TrainedModel {
        id: 0,
        name: job_id.into(),
        job_id: job_id.into(),
        base_model: Some("b".into()),
        model_size: Some("8B".into()),
        dataset: Some("d".into()),
        num_examples: Some(1),
        num_train_steps: Some(1),
        final_loss: None,
        params_json: "{}".into(),
        source: "file:///{job_id}/{path}".into(),
        files: vec![ModelFile {
            path: "a.bin".into(),
            size_bytes: 1,
            sha256: None,
            format: None,
        }],
        created_at: String::new(),
        created_by: None,
        signature: None,
    }
}

/// Queues a deployment of model `model_id` by `deployer` at `sha256`.
pub async fn queue(db: &Db, model_id: i64, deployer: &str, sha256: &str) -> Deployment {
    let new = NewDeployment {
        model_id,
        deployer,
        options_json: "{}",
        dir: "/m",
        plugin_sha256: sha256,
        created_by: None,
    };
    db.insert_deployment(new, None, None).await.unwrap()
}
