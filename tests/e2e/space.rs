//! Room on disk: below the reserve (`--min-free-mib`) new deployments are
//! refused with the reason and reads keep working; a model that would not
//! fit fails before a byte is downloaded, with the bytes needed and free.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, model};

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
