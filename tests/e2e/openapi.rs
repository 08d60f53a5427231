//! The OpenAPI document (`GET /openapi.json`): complete against the router
//! that serves it, checked in-process; and kept by a live server under
//! schemathesis.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use berth::auth::{Role, new_token};

use crate::support::files::FileServer;
use crate::support::router::App;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model, on_both_backends, plugins};

on_both_backends!(schemathesis_finds_no_server_error_and_no_answer_the_document_lacks);

/// The methods a route could be given; HEAD comes with GET by axum's rule
/// and is not listed in the document.
const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

/// Every path the router holds is in the document and every path in the
/// document is routed; on each path the router serves exactly the methods
/// the document lists; every operation lists its answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_describes_every_route_the_router_serves() {
    let app = App::start(Backend::Sqlite).await;
    let (status, document) = app.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK, "{document}");
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        document["openapi"]
    );
    let paths = document["paths"].as_object().expect("paths");

    let documented: BTreeSet<String> = paths.keys().cloned().collect();
    assert_eq!(
        routed_paths(&app.router()),
        documented,
        "the router's paths (left) and the document's (right) differ: \
         route a handler with utoipa_axum's routes! and its #[utoipa::path]"
    );

    for (path, item) in paths {
        let uri = path.replace("{id}", "1");
        for method in METHODS {
            let status = status_of(&app, method.clone(), &uri).await;
            let name = method.as_str().to_ascii_lowercase();
            match item.get(&name) {
                Some(operation) => {
                    assert_ne!(
                        status,
                        StatusCode::METHOD_NOT_ALLOWED,
                        "{method} {path} is documented but not served"
                    );
                    check_operation(&document, path, &method, operation);
                }
                None => assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is served but not documented"
                ),
            }
        }
    }
    check_refs(&document, &document);

    let mut operation_ids = BTreeSet::new();
    for (path, item) in paths {
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"].as_str().unwrap_or_default();
            assert!(
                operation_ids.insert(id),
                "{method} {path}: operationId {id:?} is not unique"
            );
        }
    }
}

/// A refused registration's `problems`, and each event kind's data, are
/// in the document as the server sends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_describes_registration_problems_and_event_data() {
    let app = App::start(Backend::Sqlite).await;
    let (_, document) = app.get("/openapi.json").await;
    let schemas = &document["components"]["schemas"];
    let refused = &document["paths"]["/v1/models"]["post"]["responses"]["400"];
    assert_eq!(
        refused["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/RegistrationError",
        "{refused}"
    );
    let refusal = &schemas["RegistrationError"];
    assert_eq!(refusal["required"], json!(["error"]), "{refusal}");
    assert_eq!(
        refusal["properties"]["problems"]["items"]["$ref"], "#/components/schemas/Problem",
        "{refusal}"
    );
    assert_eq!(
        schemas["Problem"]["required"],
        json!(["field", "message"]),
        "{}",
        schemas["Problem"]
    );
    // plugin.rejected carries a file and a reason, not a `Rejected`.
    assert_eq!(
        schemas["PluginRejected"]["required"],
        json!(["file", "reason"]),
        "{}",
        schemas["PluginRejected"]
    );
}

/// The paths of the router's routes. axum offers no list of them but its
/// `Debug` names each (`RouteId(N): "/path"`) before the fallback's; if
/// that text changes this finds none, and the comparison fails loudly.
fn routed_paths(router: &axum::Router) -> BTreeSet<String> {
    let text = format!("{router:?}");
    let routes = text
        .split("fallback_router")
        .next()
        .expect("the router's Debug text");
    routes
        .split("): \"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        // The page (`/` and all under `/page/`, `http/page/mod.rs`) is
        // served, not documented: it is not API.
        .filter(|path| *path != "/" && !path.starts_with("/page/"))
        // A route taking the rest of the URL (`{*path}`) is documented as
        // the one parameter OpenAPI can spell (`{path}`).
        .map(|path| path.replace("{*", "{"))
        .collect()
}

/// The status of a bodiless request, without waiting for the whole body
/// (`/v1/events` never ends); an unrouted request answers the fallback's
/// 404, which no documented operation may.
async fn status_of(app: &App, method: Method, uri: &str) -> StatusCode {
    let request = Request::builder()
        .method(method.clone())
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    let response = app.router().oneshot(request).await.unwrap();
    let status = response.status();
    if status == StatusCode::NOT_FOUND {
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&body);
        assert!(
            !body.contains("no such endpoint"),
            "{method} {uri} reached the fallback: {body}"
        );
    }
    status
}

/// What anyone may call when the server has tokens (docs/src/operating/security/tokens.md).
const OPEN: [&str; 4] = ["/healthz", "/readyz", "/openapi.json", "/v1/hooks/mlflow"];

/// An operation lists a success and its refusals, each described and
/// carrying the request's id; unless
/// it is open it needs the bearer token: 401 everywhere, 403 on what
/// changes something.
#[track_caller]
fn check_operation(document: &Value, path: &str, method: &Method, operation: &Value) {
    let responses = operation["responses"].as_object().unwrap();
    assert!(
        responses.keys().any(|status| status.starts_with('2')),
        "{method} {path} documents no success: {responses:?}"
    );
    for (status, response) in responses {
        assert!(
            response["description"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{method} {path} {status} has no description"
        );
        assert!(
            response["headers"]["x-request-id"].is_object(),
            "{method} {path} {status} does not say it carries the request's id"
        );
    }
    if OPEN.contains(&path) {
        assert!(operation.get("security").is_none(), "{method} {path}");
        return;
    }
    assert_eq!(
        operation["security"],
        serde_json::json!([{ "bearer": [] }]),
        "{method} {path}"
    );
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"],
        serde_json::json!({ "type": "http", "scheme": "bearer" })
    );
    let mut refusals = vec!["401"];
    if *method != Method::GET {
        refusals.push("403");
    }
    for status in refusals {
        assert_eq!(
            responses[status]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Error",
            "{method} {path} {status}"
        );
    }
}

/// Every `$ref` points at a schema the document has.
#[track_caller]
fn check_refs(document: &Value, value: &Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                let name = target
                    .strip_prefix("#/components/schemas/")
                    .unwrap_or_else(|| panic!("{target} is not a schema of the document"));
                assert!(
                    document["components"]["schemas"].get(name).is_some(),
                    "{target} is not in the document"
                );
            }
            map.values().for_each(|v| check_refs(document, v));
        }
        Value::Array(items) => items.iter().for_each(|v| check_refs(document, v)),
        _ => {}
    }
}

/// How long schemathesis may run before the test gives up on it: a guard
/// against a hang. A run takes 10 to 25 s on an idle machine and was seen
/// taking 100 s on a loaded one (load average 15 on 2 cores), so the guard
/// is far above both.
const SCHEMATHESIS_LIMIT: Duration = Duration::from_secs(300);

/// schemathesis (`scripts/setup test` installs it into `.venv`), configured by
/// `tests/e2e/schemathesis.toml`, against a live server with an API token,
/// the example deployers and two models, one that deploys and one whose
/// deployment fails. It calls with the token, and without one where the
/// document says one is needed.
async fn schemathesis_finds_no_server_error_and_no_answer_the_document_lacks(backend: Backend) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let schemathesis = root.join(".venv/bin/schemathesis");
    assert!(
        schemathesis.is_file(),
        "{} is missing: run scripts/setup test (make test does)",
        schemathesis.display()
    );
    let files = FileServer::start().await;
    let proxy = refusing_proxy();
    let (token, _) = new_token("schemathesis", Role::Deploy).unwrap();
    let berth = ["archive", "http-publish", "model-card", "safetensors-check"]
        .into_iter()
        .fold(Berth::bare(backend), |o, name| {
            o.plugin(name, plugins::example(name))
        })
        .env("BERTH_API_TOKEN", &token)
        // Generated models name any host as their source: their fetches
        // go to a proxy that refuses them, so that the test talks to
        // loopback only.
        .env("HTTP_PROXY", &proxy)
        .env("HTTPS_PROXY", &proxy)
        .env("NO_PROXY", "127.0.0.1")
        .start()
        .await;
    let post = async |path: &str, body: &Value| {
        let response = berth
            .client()
            .post(format!("{}{path}", berth.url))
            .bearer_auth(&token)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json::<Value>().await.unwrap())
    };
    let mut bad = model(&files, "job-bad", &adapter_files());
    bad["files"][0]["size_bytes"] = json!(1);
    for (registration, expected) in [
        (model(&files, "job-good", &adapter_files()), StatusCode::OK),
        (bad, StatusCode::BAD_GATEWAY),
    ] {
        let (status, stored) = post("/v1/models", &registration).await;
        assert_eq!(status, StatusCode::CREATED, "{stored}");
        let deploy = format!("/v1/models/{}/deployments", stored["id"]);
        let (status, deployment) = post(&deploy, &json!({ "deployer": "archive" })).await;
        assert_eq!(status, expected, "{deployment}");
    }

    let work = tempfile::tempdir().unwrap();
    let output = work.path().join("schemathesis.out");
    let started = Instant::now();
    // In a directory of its own: schemathesis keeps its example database
    // in the working directory.
    let mut run = tokio::process::Command::new(&schemathesis)
        .arg("--config-file")
        .arg(root.join("tests/e2e/schemathesis.toml"))
        .args(["--no-color", "run", &format!("{}/openapi.json", berth.url)])
        .current_dir(work.path())
        .env("BERTH_SCHEMATHESIS_TOKEN", &token)
        .stdout(std::fs::File::create(&output).unwrap())
        .stderr(std::process::Stdio::from(
            std::fs::File::options().append(true).open(&output).unwrap(),
        ))
        .kill_on_drop(true)
        .spawn()
        .expect("starting schemathesis");
    let status = tokio::time::timeout(SCHEMATHESIS_LIMIT, run.wait()).await;
    let report = std::fs::read_to_string(&output).unwrap_or_default();
    match status {
        Ok(Ok(status)) => assert!(
            status.success(),
            "schemathesis found problems ({status}):\n{report}\nberth's log:\n{}",
            berth.log()
        ),
        Ok(Err(e)) => panic!("waiting for schemathesis: {e}"),
        Err(_) => {
            panic!("schemathesis did not finish within {SCHEMATHESIS_LIMIT:?}; so far:\n{report}")
        }
    }
    eprintln!(
        "schemathesis ({backend:?}) took {:.1?}:\n{report}",
        started.elapsed()
    );
    // Every answer a 401 would conform too: its requests must have been
    // let in, and registered models of their own (which it may have
    // deleted since: the log counts them).
    assert!(
        berth.log().matches("model registered").count() > 2,
        "schemathesis registered no model: was its token refused?\n{report}"
    );
}

/// A loopback port that closes every connection at once: an HTTP proxy
/// through which nothing gets anywhere, and at once.
fn refusing_proxy() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            drop(connection);
        }
    });
    url
}
