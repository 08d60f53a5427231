//! Request ids and the JSON log: every answer carries an `X-Request-Id`
//! (the client's when well-formed), and that id is on the log lines of the
//! request and of the deployment it started, in the foreground or not.

use axum::body::Body;
use axum::http::Request;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::router::App;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, eventually, model, on_both_backends};

on_both_backends!(json_logs_carry_each_request_id_into_its_deployment);

#[tokio::test]
async fn a_request_id_is_echoed_when_well_formed_and_replaced_otherwise() {
    let app = App::start(Backend::Sqlite).await;
    let too_long = "x".repeat(129);
    #[rustfmt::skip]
    let cases: [(Option<&str>, bool); 6] = [
        (Some("3f2a-77_client.trace"), true),
        (Some(&too_long[1..]), true),
        (Some(&too_long), false),
        (Some("two words"), false),
        (Some(""), false),
        (None, false),
    ];
    let mut generated = Vec::new();
    for (given, kept) in cases {
        let mut request = Request::get("/healthz");
        if let Some(id) = given {
            request = request.header("x-request-id", id);
        }
        let response = app.response(request.body(Body::empty()).unwrap()).await;
        let answered = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        if kept {
            assert_eq!(Some(answered.as_str()), given);
        } else {
            assert!(
                answered.len() == 16 && answered.chars().all(|c| c.is_ascii_hexdigit()),
                "{given:?} answered with {answered:?}"
            );
            generated.push(answered);
        }
    }
    // Refusals carry one too.
    let response = app
        .response(Request::get("/nowhere").body(Body::empty()).unwrap())
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    generated.push(
        response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_string(),
    );
    let distinct: std::collections::BTreeSet<_> = generated.iter().collect();
    assert_eq!(distinct.len(), generated.len(), "{generated:?}");
}

/// Every stderr line, each asserted to be one JSON object.
#[track_caller]
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(object @ Value::Object(_)) => object,
            _ => panic!("a log line that is not a JSON object: {line}"),
        })
        .collect()
}

/// The lines logged inside the request span of `request_id`.
fn lines_of<'a>(lines: &'a [Value], request_id: &'a str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|line| {
            line["spans"]
                .as_array()
                .is_some_and(|spans| spans.iter().any(|s| s["request_id"] == request_id))
        })
        .collect()
}

fn messages(lines: &[&Value]) -> Vec<String> {
    lines
        .iter()
        .map(|line| {
            line["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

async fn json_logs_carry_each_request_id_into_its_deployment(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::options(backend)
        .arg("--log-format")
        .arg("json")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-logs", &adapter_files()))
        .await;
    let deploy = |query: &'static str, request_id: &'static str| {
        berth
            .client()
            .post(format!("{}/v1/models/{id}/deployments{query}", berth.url))
            .header("x-request-id", request_id)
            .json(&json!({ "deployer": "archive", "options": {} }))
            .send()
    };
    let attached = deploy("", "attached-1").await.unwrap();
    assert_eq!(attached.status(), StatusCode::OK);
    assert_eq!(attached.headers()["x-request-id"], "attached-1");
    let detached = deploy("?wait=false", "detached-2").await.unwrap();
    assert_eq!(detached.status(), StatusCode::ACCEPTED);
    assert_eq!(detached.headers()["x-request-id"], "detached-2");

    // The background deployment ends after its response was sent.
    let lines = eventually(
        || {
            format!(
                "the end of the background deployment in the log:\n{}",
                berth.log()
            )
        },
        async || {
            let lines = json_lines(&berth.log());
            messages(&lines_of(&lines, "detached-2"))
                .iter()
                .any(|m| m == "deployment completed")
                .then_some(lines)
        },
    )
    .await;
    for request_id in ["attached-1", "detached-2"] {
        let mine = lines_of(&lines, request_id);
        let said = messages(&mine);
        for expected in ["deployment started", "deployment completed"] {
            assert!(said.iter().any(|m| m == expected), "{request_id}: {said:?}");
        }
        // The guest's own log line, under its target.
        assert!(
            mine.iter().any(|line| line["target"] == "berth::plugin"
                && line["fields"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("wrote ")),
            "{request_id}: no line of the deployer's in {said:?}"
        );
        // Each line is in one request's span only.
        let other = if request_id == "attached-1" {
            "detached-2"
        } else {
            "attached-1"
        };
        assert!(mine.iter().all(|line| !line.to_string().contains(other)));
    }
    // A request without an id gets one all the same: the registration's.
    let registered = lines
        .iter()
        .find(|line| line["fields"]["message"] == "model registered")
        .expect("the registration's log line");
    let generated = registered["span"]["request_id"].as_str().unwrap();
    assert_eq!(generated.len(), 16, "{registered}");
}
