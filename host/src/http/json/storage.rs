//! `/v1/storage`'s shape: what the models dir holds on disk, what sharing
//! saves, and each model's part of it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The models dir: its bytes on disk, what sharing saves, and every model.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Storage {
    /// `--models-max-gib` in bytes; null without a budget.
    #[schema(required = true)]
    pub budget_bytes: Option<u64>,
    /// The model directories and the blobs, each file (inode) once.
    pub bytes_on_disk: u64,
    /// What the models' files would take beyond `bytes_on_disk` as
    /// separate copies: what sharing (hard links) saves.
    pub bytes_saved: u64,
    /// Every registered model, least recently deployed first (never
    /// deployed first): the order a budget drops local copies in.
    pub models: Vec<ModelStorage>,
    /// The server's models dir, where each model's copy is
    /// `MODELS_DIR/<job_id>/`.
    pub models_dir: String,
    /// The blobs that came by upload (`berth models push`): there is no
    /// source to fetch them again from, so no budget drops them.
    pub pinned_blobs: u64,
    /// Their bytes, part of `bytes_on_disk`.
    pub pinned_bytes: u64,
    /// Bytes of blobs no model links any more.
    pub unreferenced_blob_bytes: u64,
}

/// One model's local copy.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct ModelStorage {
    /// The bytes of its directory's files (partial downloads included);
    /// 0 without a copy.
    pub bytes: u64,
    pub id: i64,
    pub job_id: String,
    /// When its newest deployment was made; null if it was never deployed.
    #[schema(required = true, format = DateTime)]
    pub last_deployed: Option<String>,
    /// Whether its verification record vouches for every file as it is
    /// now: a deployment would start without fetching.
    pub local: bool,
    pub name: String,
    /// The part of `bytes` whose files another model holds too (one copy
    /// on disk, hard linked).
    pub shared_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::*;

    #[test]
    fn storage_keeps_its_bytes() {
        check(
            Storage {
                budget_bytes: None,
                bytes_on_disk: 1500,
                bytes_saved: 1000,
                models: vec![ModelStorage {
                    bytes: 1200,
                    id: 3,
                    job_id: "ft-3".into(),
                    last_deployed: Some("2026-12-03T17:00:00.000Z".into()),
                    local: true,
                    name: "support-bot".into(),
                    shared_bytes: 1000,
                }],
                models_dir: "/data/models".into(),
                pinned_blobs: 2,
                pinned_bytes: 200,
                unreferenced_blob_bytes: 300,
            },
            r#"{"budget_bytes":null,"bytes_on_disk":1500,"bytes_saved":1000,"models":[{"bytes":1200,"id":3,"job_id":"ft-3","last_deployed":"2026-12-03T17:00:00.000Z","local":true,"name":"support-bot","shared_bytes":1000}],"models_dir":"/data/models","pinned_blobs":2,"pinned_bytes":200,"unreferenced_blob_bytes":300}"#,
        );
    }
}
