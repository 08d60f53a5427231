//! The API's rules: every refusal has its status and its sentence, and
//! leaves nothing recorded. Each rule is a line of a table, checked
//! in-process through the router; rules that reach the records run on both
//! backends. One real server shows what needs a process: a plugins folder
//! loaded at start and the event stream over HTTP.

use axum::body::Body;
use axum::http::{Method, Request};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::events::Event;
use crate::support::files::FileServer;
use crate::support::router::{App, Rule};
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, model, on_both_backends};

// The tables' columns, short.
const GET: Method = Method::GET;
const POST: Method = Method::POST;
const DELETE: Method = Method::DELETE;
const BAD_REQUEST: StatusCode = StatusCode::BAD_REQUEST;
const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
const CONFLICT: StatusCode = StatusCode::CONFLICT;

on_both_backends!(
    registration_refuses_bad_models_with_every_reason,
    deployment_requests_are_checked_before_anything_is_recorded,
    lookups_answer_404_and_400_clearly,
    events_stream_reports_deployments_after_they_are_recorded,
    a_final_loss_may_be_given_or_left_out_in_any_order,
);

async fn registration_refuses_bad_models_with_every_reason(backend: Backend) {
    let files = FileServer::start().await;
    let app = App::start(backend).await;
    let good = model(&files, "job-1", &adapter_files());

    let models = "/v1/models";
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (POST, models, Some(json!({ "name": "x" })), BAD_REQUEST, "job_id is required"),
        (POST, models, Some(with(&good, "job_id", json!("../../etc"))), BAD_REQUEST, "job_id \"../../etc\" cannot be used as a directory name"),
        (POST, models, Some(with(&good, "source", json!("ftp://h/{path}"))), BAD_REQUEST, "scheme ftp is not supported"),
        (POST, models, Some(with(&good, "source", json!("http://h/{job_id}"))), BAD_REQUEST, "must contain {path}"),
        // Found by schemathesis: PostgreSQL cannot store the NUL (a 500).
        (POST, models, Some(with(&good, "source", json!("http://h/{path}\u{0}"))), BAD_REQUEST, "source contains control characters"),
        (POST, models, Some(with(&good, "files", json!([{ "path": "/etc/passwd", "size_bytes": 1 }]))), BAD_REQUEST, "files[0].path \"/etc/passwd\": must be relative"),
        (POST, models, Some(with(&good, "files", json!([{ "path": "a/../../b", "size_bytes": 1 }]))), BAD_REQUEST, "must not contain .."),
        (POST, models, Some(with(&good, "files", json!([{ "path": "a\\b", "size_bytes": 1 }]))), BAD_REQUEST, "backslash"),
        (POST, models, Some(with(&good, "files", json!([{ "path": "a\u{0}b", "size_bytes": 1 }]))), BAD_REQUEST, "NUL"),
        (POST, models, Some(with(&good, "files", json!([{ "path": "a", "size_bytes": 1 }, { "path": "a", "size_bytes": 2 }]))), BAD_REQUEST, "files[1].path \"a\": listed twice"),
        (POST, models, Some(with(&good, "files", json!([{ "path": "a", "size_bytes": 1, "sha256": "xyz" }]))), BAD_REQUEST, "64 hexadecimal"),
        (POST, models, Some(with(&good, "files", json!([{ "path": "a", "size_bytes": -1 }]))), BAD_REQUEST, "invalid value: integer `-1`"),
        (POST, models, Some(with(&good, "num_examples", json!("many"))), BAD_REQUEST, "invalid type: string \"many\""),
        (POST, models, Some(with(&good, "colour", json!("blue"))), BAD_REQUEST, "unknown field `colour`"),
        (POST, models, Some(with(&good, "params", json!([1]))), BAD_REQUEST, "params must be a JSON object"),
        // Several problems are reported at once.
        (POST, models, Some(json!({ "files": [{ "path": "..", "size_bytes": 1 }] })), BAD_REQUEST, "name is required; job_id is required; source is required"),
        // Without files, they are listed where a source can be listed; the
        // other fields are checked before a job id fills in a prefix.
        (POST, models, Some(without(&good, "files")), BAD_REQUEST, "the files of a http: source must be given in the registration (berth lists files itself only at s3://, gs:// and az:// prefixes, oci:// references and mlflow:// model versions)"),
        (POST, models, Some(with(&without(&good, "files"), "job_id", json!("../x"))), BAD_REQUEST, "job_id \"../x\" cannot be used as a directory name"),
    ];
    app.check(&rules).await;
    // Not JSON at all, or without the content type.
    let raw = |request: axum::http::request::Builder| request.body(Body::from("{")).unwrap();
    let without_type = Request::post(models);
    let with_type = Request::post(models).header("content-type", "application/json");
    assert_error(
        &app.send(raw(without_type)).await,
        BAD_REQUEST,
        "Content-Type: application/json",
    );
    let not_json = app.send(raw(with_type)).await;
    assert_error(&not_json, BAD_REQUEST, "the request body is not acceptable");
    assert_eq!(
        not_json.1.get("problems"),
        None,
        "a body that is no registration has no problems to place"
    );
    let (_, listing) = app.get(models).await;
    assert_eq!(
        listing["models"],
        json!([]),
        "no refused registration was recorded"
    );

    let (status, stored) = app.post(models, &good).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(stored["files"].as_array().unwrap().len(), 3);
    assert_eq!(stored["params"], json!({ "lr": 0.0002, "rank": 16 }));
    // The same files from the same source again: the model there, no new one.
    let (status, again) = app.post(models, &good).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, stored);
    // Other bytes under the taken job id: a 409 naming the model and the file.
    let mut other = good.clone();
    other["files"][0]["sha256"] = json!("ab".repeat(32));
    let first = good["files"][0]["path"].as_str().unwrap().to_string();
    assert_error(
        &app.post(models, &other).await,
        CONFLICT,
        &format!(
            "job id \"job-1\" is registered already as model {} and its {first} has other \
             bytes (sha256); register this one under another job id (--job-id), or delete \
             model {} first",
            stored["id"], stored["id"]
        ),
    );
    let other_source = with(&good, "source", json!("http://elsewhere/{path}"));
    let (status, said) = app.post(models, &other_source).await;
    assert_eq!(status, CONFLICT, "{said}");
    assert!(
        said["error"].as_str().unwrap().contains("its source is"),
        "{said}"
    );
    let (_, listing) = app.get(models).await;
    assert_eq!(listing["models"], json!([stored]));
    let (status, one) = app.get(&format!("/v1/models/{}", stored["id"])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one, stored);
}

fn with(base: &Value, key: &str, value: Value) -> Value {
    let mut changed = base.clone();
    changed[key] = value;
    changed
}

fn without(base: &Value, key: &str) -> Value {
    let mut changed = base.clone();
    changed.as_object_mut().unwrap().remove(key);
    changed
}

async fn deployment_requests_are_checked_before_anything_is_recorded(backend: Backend) {
    let files = FileServer::start().await;
    let app = App::start(backend).await;
    let id = app
        .register(&model(&files, "job-1", &adapter_files()))
        .await;
    let empty = app.register(&model(&files, "job-empty", &[])).await;

    let deployments = format!("/v1/models/{id}/deployments");
    let huge = json!({ "deployer": "misbehave", "options": { "blob": "x".repeat(70 * 1024) } });
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (POST, &deployments, Some(json!({})), BAD_REQUEST, "deployer is required"),
        (POST, &deployments, Some(json!({ "deployer": "nope" })), BAD_REQUEST, "unknown deployer \"nope\"; the loaded deployers are: archive, misbehave"),
        (POST, &deployments, Some(json!({ "deployer": "archive", "options": [1] })), BAD_REQUEST, "options must be a JSON object"),
        (POST, &deployments, Some(json!({ "deployer": "archive", "options": { "levle": 3 } })), BAD_REQUEST, "deployer archive refused the options: unknown option \"levle\""),
        (POST, &deployments, Some(huge), BAD_REQUEST, "at most 64 KiB"),
        (POST, "/v1/models/999/deployments", Some(json!({ "deployer": "archive" })), NOT_FOUND, "model 999 does not exist"),
    ];
    app.check(&rules).await;
    let (_, listing) = app.get(&deployments).await;
    assert_eq!(
        listing["deployments"],
        json!([]),
        "no refused deployment was recorded"
    );

    // A model without files is recorded, then fails with the design's words.
    let of_empty = format!("/v1/models/{empty}/deployments");
    let (status, first) = app.post(&of_empty, &json!({ "deployer": "archive" })).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        first["error"],
        format!("fetching model {empty}: the trained model has no recorded files")
    );
    // A model's deployments are listed newest first, as many as asked for.
    let (status, second) = app.post(&of_empty, &json!({ "deployer": "archive" })).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let (status, listing) = app.get(&of_empty).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing["deployments"], json!([second, first]));
    let (status, listing) = app.get(&format!("{of_empty}?limit=1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing["deployments"], json!([second]));

    let limit = |value: &str| format!("{of_empty}?limit={value}");
    let (zero, over, text) = (limit("0"), limit("501"), limit("x"));
    let cancel = format!("/v1/deployments/{}/cancel", first["id"]);
    let ended = format!(
        "deployment {} already ended (failed); only a running deployment can be cancelled",
        first["id"]
    );
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (GET, &zero, None, BAD_REQUEST, "limit must be between 1 and 500, got 0"),
        (GET, &over, None, BAD_REQUEST, "limit must be between 1 and 500, got 501"),
        (GET, &text, None, BAD_REQUEST, "limit: invalid digit found in string"),
        (POST, &cancel, Some(json!({})), CONFLICT, &ended),
    ];
    app.check(&rules).await;
}

/// Models without a loss, then with one (found by schemathesis: on
/// PostgreSQL a loss was a 500 on any pooled connection that had recorded a
/// model without one). Sixteen of each, so that every connection of the
/// pool, taken in turn, sees both.
async fn a_final_loss_may_be_given_or_left_out_in_any_order(backend: Backend) {
    let files = FileServer::start().await;
    let app = App::start(backend).await;
    let losses: Vec<Value> = [Value::Null, json!(0.42)]
        .into_iter()
        .flat_map(|loss| std::iter::repeat_n(loss, 16))
        .collect();
    for (i, loss) in losses.iter().enumerate() {
        let registration = with(
            &model(&files, &format!("job-loss-{i}"), &adapter_files()),
            "final_loss",
            loss.clone(),
        );
        app.register(&registration).await;
    }
    let (_, listing) = app.get("/v1/models").await;
    let stored: Vec<&Value> = listing["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["final_loss"])
        .collect();
    assert_eq!(stored, losses.iter().collect::<Vec<_>>());
}

/// A refused registration lists each problem on its own with the field it
/// is about (for a form to place beside that field), and its sentence is
/// their messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_names_the_field_of_each_problem() {
    let app = App::start(Backend::Sqlite).await;
    let several = json!({
        "job_id": "../x",
        "files": [
            { "path": "/etc/passwd", "size_bytes": 1 },
            { "path": "a", "size_bytes": 1, "sha256": "xyz" },
            { "path": "b" },
        ],
    });
    let (status, refused) = app.post("/v1/models", &several).await;
    assert_eq!(status, BAD_REQUEST, "{refused}");
    let problems = refused["problems"].as_array().expect("problems");
    let fields: Vec<&str> = problems
        .iter()
        .map(|p| p["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "name",
            "job_id",
            "source",
            "files[0].path",
            "files[1].sha256",
            "files[2].size_bytes"
        ]
    );
    assert_eq!(
        problems[3],
        json!({
            "field": "files[0].path",
            "message": "files[0].path \"/etc/passwd\": must be relative, not absolute",
        })
    );
    let messages: Vec<&str> = problems
        .iter()
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        refused["error"],
        format!("invalid model: {}", messages.join("; "))
    );
    assert_eq!(refused.as_object().unwrap().len(), 2, "{refused}");
}

async fn lookups_answer_404_and_400_clearly(backend: Backend) {
    let app = App::start(backend).await;
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (GET, "/v1/models/42", None, NOT_FOUND, "model 42 does not exist"),
        (GET, "/v1/models/43/deployments", None, NOT_FOUND, "model 43 does not exist"),
        (DELETE, "/v1/models/44", None, NOT_FOUND, "model 44 does not exist"),
        (GET, "/v1/deployments/45", None, NOT_FOUND, "deployment 45 does not exist"),
        (POST, "/v1/deployments/46/cancel", Some(json!({})), NOT_FOUND, "deployment 46 does not exist"),
        (GET, "/v1/deployments/47/logs", None, NOT_FOUND, "deployment 47 does not exist"),
        (GET, "/v1/deployments/48/files", None, NOT_FOUND, "deployment 48 does not exist"),
        (GET, "/v1/deployments/49/files/a.txt", None, NOT_FOUND, "deployment 49 does not exist"),
        // No [[mlflow]] entry with a webhook_secret: MLflow's webhook is no route here.
        (POST, "/v1/hooks/mlflow", Some(json!({})), NOT_FOUND, "this server takes no MLflow webhook: give an [[mlflow]] entry of the sources file (--sources-file) a webhook_secret"),
        // An id that is not one is refused before anything is looked up.
        (GET, "/v1/models/abc", None, BAD_REQUEST, "\"abc\" is not an id: ids are positive integers"),
        (GET, "/v1/models/-1/deployments", None, BAD_REQUEST, "\"-1\" is not an id"),
        (DELETE, "/v1/models/1.5", None, BAD_REQUEST, "\"1.5\" is not an id"),
        (GET, "/v1/deployments/0", None, BAD_REQUEST, "\"0\" is not an id"),
        (POST, "/v1/deployments/x/cancel", Some(json!({})), BAD_REQUEST, "\"x\" is not an id"),
        (GET, "/v1/deployments/0x1/logs", None, BAD_REQUEST, "\"0x1\" is not an id"),
        (GET, "/v1/deployments/two/files", None, BAD_REQUEST, "\"two\" is not an id"),
        (GET, "/v1/deployments/three/files/a.txt", None, BAD_REQUEST, "\"three\" is not an id"),
    ];
    app.check(&rules).await;
}

/// What never reaches a record, on SQLite only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_endpoints_answer_clearly() {
    let app = App::start(Backend::Sqlite).await;
    assert_error(&app.get("/v1/nothing").await, NOT_FOUND, "no such endpoint");
    let (status, body) = app.get("/healthz").await;
    assert_eq!((status, body), (StatusCode::OK, json!("ok")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployers_lists_loaded_and_rejected_plugins() {
    let app = App::start(Backend::Sqlite).await;
    let (status, body) = app.get("/v1/deployers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(names(&body), ["archive", "misbehave"]);
    assert_eq!(body["deployers"][0]["wit_version"], "0.1.0");
    assert_eq!(
        body["deployers"][0]["options_schema"]["properties"]["level"]["maximum"],
        9
    );
    assert_eq!(body["rejected"], json!([]));
}

fn names(deployers: &Value) -> Vec<Value> {
    deployers["deployers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].clone())
        .collect()
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
    let app = App::start(backend).await;
    let id = app
        .register(&model(&files, "job-events", &adapter_files()))
        .await;
    let mut events = app.events().await;
    let deployments = format!("/v1/models/{id}/deployments");

    let (_, ok) = app
        .post(&deployments, &json!({ "deployer": "archive" }))
        .await;
    let (_, failed) = app
        .post(
            &deployments,
            &json!({ "deployer": "misbehave", "options": { "mode": "error" } }),
        )
        .await;

    // An idle server takes each at once: never queued.
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

/// A real server: the plugins folder it loaded at start, each plugin
/// logged, and a deployment's events reaching a subscriber over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_loads_its_plugins_and_streams_events_over_http() {
    let files = FileServer::start().await;
    let berth = Berth::start(Backend::Sqlite).await;
    let (status, deployers) = berth.get("/v1/deployers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(names(&deployers), ["archive", "misbehave"]);
    assert!(
        berth.log().contains("loaded deployer"),
        "each loaded plugin is logged"
    );

    let id = berth
        .register(&model(&files, "job-events", &adapter_files()))
        .await;
    let mut events = berth.events().await;
    let (status, ok) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{ok}");
    let received = events.until(|e| lifecycle(e).len() >= 2).await;
    let events = lifecycle(received);
    let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["deployment.started", "deployment.completed"]);
    assert_eq!(events[1].data["deploy_id"], ok["id"]);
    assert_eq!(events[1].data["ref"], ok["ref"]);
}
