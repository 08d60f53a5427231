//! The API's rules over real HTTP: every refusal has its status and its
//! sentence, and leaves nothing recorded.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::events::Event;
use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, model, on_both_backends};

on_both_backends!(
    registration_refuses_bad_models_with_every_reason,
    deployment_requests_are_checked_before_anything_is_recorded,
    listing_and_lookups_answer_404_and_400_clearly,
    deployers_lists_loaded_and_rejected_plugins,
    events_stream_reports_deployments_after_they_are_recorded,
);

async fn registration_refuses_bad_models_with_every_reason(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let good = model(&files, "job-1", &adapter_files());

    let cases: Vec<(Value, &str)> = vec![
        (json!({ "name": "x" }), "job_id is required"),
        (
            with(&good, "job_id", json!("../../etc")),
            "job_id \"../../etc\" cannot be used as a directory name",
        ),
        (
            with(&good, "source", json!("ftp://h/{path}")),
            "scheme ftp is not supported",
        ),
        (
            with(&good, "source", json!("http://h/{job_id}")),
            "must contain {path}",
        ),
        (
            with(
                &good,
                "files",
                json!([{ "path": "/etc/passwd", "size_bytes": 1 }]),
            ),
            "files[0].path \"/etc/passwd\": must be relative",
        ),
        (
            with(
                &good,
                "files",
                json!([{ "path": "a/../../b", "size_bytes": 1 }]),
            ),
            "must not contain ..",
        ),
        (
            with(&good, "files", json!([{ "path": "a\\b", "size_bytes": 1 }])),
            "backslash",
        ),
        (
            with(
                &good,
                "files",
                json!([{ "path": "a\u{0}b", "size_bytes": 1 }]),
            ),
            "NUL",
        ),
        (
            with(
                &good,
                "files",
                json!([{ "path": "a", "size_bytes": 1 }, { "path": "a", "size_bytes": 2 }]),
            ),
            "files[1].path \"a\": listed twice",
        ),
        (
            with(
                &good,
                "files",
                json!([{ "path": "a", "size_bytes": 1, "sha256": "xyz" }]),
            ),
            "64 hexadecimal",
        ),
        (
            with(&good, "files", json!([{ "path": "a", "size_bytes": -1 }])),
            "invalid value: integer `-1`",
        ),
        (
            with(&good, "num_examples", json!("many")),
            "invalid type: string \"many\"",
        ),
        (
            with(&good, "colour", json!("blue")),
            "unknown field `colour`",
        ),
        (
            with(&good, "params", json!([1])),
            "params must be a JSON object",
        ),
    ];
    for (body, message) in cases {
        let answer = berth.post("/v1/models", &body).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, message);
    }
    // Not JSON at all, or without the content type.
    let raw = berth
        .client()
        .post(format!("{}/v1/models", berth.url))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    assert!(
        raw.text()
            .await
            .unwrap()
            .contains("Content-Type: application/json")
    );

    // Several problems are reported at once.
    let answer = berth
        .post(
            "/v1/models",
            &json!({ "files": [{ "path": "..", "size_bytes": 1 }] }),
        )
        .await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "name is required; job_id is required; source is required",
    );
    let (_, listing) = berth.get("/v1/models").await;
    assert_eq!(
        listing["models"],
        json!([]),
        "no refused registration was recorded"
    );

    let (status, stored) = berth.post("/v1/models", &good).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(stored["files"].as_array().unwrap().len(), 3);
    assert_eq!(stored["params"], json!({ "lr": 0.0002, "rank": 16 }));
    let answer = berth.post("/v1/models", &good).await;
    assert_error(
        &answer,
        StatusCode::CONFLICT,
        "a model with job id \"job-1\" is already registered",
    );
    let (_, listing) = berth.get("/v1/models").await;
    assert_eq!(listing["models"], json!([stored]));
    let (status, one) = berth.get(&format!("/v1/models/{}", stored["id"])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one, stored);
}

fn with(base: &Value, key: &str, value: Value) -> Value {
    let mut changed = base.clone();
    changed[key] = value;
    changed
}

async fn deployment_requests_are_checked_before_anything_is_recorded(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-1", &adapter_files()))
        .await;
    let empty = berth.register(&model(&files, "job-empty", &[])).await;

    let path = format!("/v1/models/{id}/deployments");
    assert_error(
        &berth.post(&path, &json!({})).await,
        StatusCode::BAD_REQUEST,
        "deployer is required",
    );
    assert_error(
        &berth.deploy(id, "nope", json!({})).await,
        StatusCode::BAD_REQUEST,
        "unknown deployer \"nope\"; the loaded deployers are: archive, misbehave",
    );
    assert_error(
        &berth.deploy(id, "archive", json!([1])).await,
        StatusCode::BAD_REQUEST,
        "options must be a JSON object",
    );
    assert_error(
        &berth.deploy(id, "archive", json!({ "levle": 3 })).await,
        StatusCode::BAD_REQUEST,
        "deployer archive refused the options: unknown option \"levle\"",
    );
    let huge = json!({ "blob": "x".repeat(70 * 1024) });
    assert_error(
        &berth.deploy(id, "misbehave", huge).await,
        StatusCode::BAD_REQUEST,
        "at most 64 KiB",
    );
    assert_error(
        &berth.deploy(999, "archive", json!({})).await,
        StatusCode::NOT_FOUND,
        "model 999 does not exist",
    );
    let (_, listing) = berth.get(&path).await;
    assert_eq!(
        listing["deployments"],
        json!([]),
        "no refused deployment was recorded"
    );

    // A model without files is recorded, then fails with the design's words.
    let (status, deployment) = berth.deploy(empty, "archive", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        deployment["error"],
        format!("fetching model {empty}: the trained model has no recorded files")
    );
}

async fn listing_and_lookups_answer_404_and_400_clearly(backend: Backend) {
    let berth = Berth::start(backend).await;
    assert_error(
        &berth.get("/v1/models/42").await,
        StatusCode::NOT_FOUND,
        "model 42 does not exist",
    );
    assert_error(
        &berth.get("/v1/deployments/42").await,
        StatusCode::NOT_FOUND,
        "deployment 42 does not exist",
    );
    assert_error(
        &berth.get("/v1/models/abc").await,
        StatusCode::BAD_REQUEST,
        "\"abc\" is not an id",
    );
    assert_error(
        &berth.get("/v1/models/42/deployments").await,
        StatusCode::NOT_FOUND,
        "model 42 does not exist",
    );
    assert_error(
        &berth.get("/v1/nothing").await,
        StatusCode::NOT_FOUND,
        "no such endpoint",
    );
    let files = FileServer::start().await;
    let id = berth
        .register(&model(&files, "job-1", &adapter_files()))
        .await;
    for limit in ["0", "501", "x"] {
        let answer = berth
            .get(&format!("/v1/models/{id}/deployments?limit={limit}"))
            .await;
        assert_eq!(
            answer.0,
            StatusCode::BAD_REQUEST,
            "limit={limit}: {}",
            answer.1
        );
    }
    let (status, body) = berth.get("/healthz").await;
    assert_eq!((status, body), (StatusCode::OK, json!("ok")));
}

async fn deployers_lists_loaded_and_rejected_plugins(backend: Backend) {
    let berth = Berth::start(backend).await;
    let (status, body) = berth.get("/v1/deployers").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<_> = body["deployers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].clone())
        .collect();
    assert_eq!(names, ["archive", "misbehave"]);
    assert_eq!(body["deployers"][0]["wit_version"], "0.1.0");
    assert_eq!(
        body["deployers"][0]["options_schema"]["properties"]["level"]["maximum"],
        9
    );
    assert_eq!(body["rejected"], json!([]));
    assert!(
        berth.log().contains("loaded deployer"),
        "each loaded plugin is logged"
    );
}

/// The lifecycle of deployments, without the progress in between.
fn lifecycle(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| e.kind.starts_with("deployment.") && e.kind != "deployment.progress")
        .collect()
}

async fn events_stream_reports_deployments_after_they_are_recorded(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-events", &adapter_files()))
        .await;
    let mut events = berth.events().await;

    let (_, ok) = berth.deploy(id, "archive", json!({})).await;
    let (_, failed) = berth
        .deploy(id, "misbehave", json!({ "mode": "error" }))
        .await;

    let received = events.until(|e| lifecycle(e).len() >= 4).await;
    let events = lifecycle(received);
    let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "deployment.started",
            "deployment.completed",
            "deployment.started",
            "deployment.failed"
        ]
    );
    assert_eq!(events[1].data["deploy_id"], ok["id"]);
    assert_eq!(events[1].data["ref"], ok["ref"]);
    assert_eq!(events[3].data["deploy_id"], failed["id"]);
    assert_eq!(
        events[3].data["error"],
        "deployer misbehave: the deployer said no"
    );
    assert_eq!(events[3].data["model_id"], id);
    assert!(events[3].data["duration_ms"].is_number());
}
