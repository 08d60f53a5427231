//! Deploy rules and approvals over the real server: a registration fires a
//! check whose completion fires the next step with its result in the
//! options, each deployment naming its cause; a model that does not match
//! fires nothing; a step held for approval is approved by an admin (a
//! deploy token is refused), another rejected, another expired; bad rules
//! are refused with their field; and three servers on one PostgreSQL fire
//! each rule once per event, one of them killed on the way.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use berth::auth::{Role, new_token};

use crate::support::events::ended;
use crate::support::files::FileServer;
use crate::support::plugins;
use crate::support::router::App;
use crate::support::server::{Backend, Berth, Shared, servers};
use crate::support::{answer_body, assert_error, eventually, has_ended, model, on_both_backends};

/// A safetensors file of one F32 tensor of `n` values.
fn safetensors(n: u64) -> Vec<u8> {
    let mut header =
        json!({ "t": { "dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n] } }).to_string();
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header.as_bytes());
    file.extend(vec![0u8; 4 * n as usize]);
    file
}

/// `method path` with `token` (none: no header) and a JSON body.
async fn call(
    berth: &Berth,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = berth
        .client()
        .request(method, format!("{}{path}", berth.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, answer_body(response.text().await.unwrap()))
}

/// The model's deployments, oldest first.
/// The model's first deployment, once it has ended; `what` names the
/// wait if it never does.
async fn first_ended(berth: &Berth, model: i64, what: &str) -> Value {
    eventually(
        || what.to_string(),
        async || {
            let rows = deployments_of(berth, model).await;
            rows.first().filter(|r| has_ended(r)).cloned()
        },
    )
    .await
}

async fn deployments_of(berth: &Berth, model_id: i64) -> Vec<Value> {
    let (status, list) = berth
        .get(&format!("/v1/models/{model_id}/deployments?limit=500"))
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let mut rows = list["deployments"].as_array().unwrap().clone();
    rows.reverse();
    rows
}

fn registered_rule(name: &str, deployer: &str, options: Value) -> Value {
    json!({
        "name": name,
        "when": { "event": "model_registered" },
        "deploy": { "deployer": deployer, "options": options },
    })
}

on_both_backends!(
    a_registration_fires_a_check_and_its_completion_the_next_step,
    bad_rules_are_refused_with_their_field,
);

async fn a_registration_fires_a_check_and_its_completion_the_next_step(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::options(backend)
        .plugin("safetensors-check", plugins::example("safetensors-check"))
        .start()
        .await;
    let mut check = registered_rule("check", "safetensors-check", json!({}));
    check["match"] = json!({ "base_model": "meta-llama/*", "final_loss": { "max": 0.5 } });
    let next = json!({
        "name": "publish",
        "when": { "event": "deployment_completed", "deployer": "safetensors-check" },
        "match": { "details": { "files": 1 } },
        "deploy": { "deployer": "misbehave", "options": {
            "mode": "ok",
            "checked": "${previous.details.tensors} tensors of ${model.job_id}",
            "ref": "${previous.ref}",
        } },
    });
    let missing = json!({
        "name": "needs-url",
        "when": { "event": "deployment_completed", "deployer": "safetensors-check" },
        "deploy": { "deployer": "misbehave", "options": { "url": "${previous.details.url}" } },
    });
    for rule in [&check, &next, &missing] {
        let (status, body) = berth.post("/v1/rules", rule).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let contents = [("adapter_model.safetensors", safetensors(4))];
    // Registered first: by the time the other's chain ends, its event was
    // looked at too (the rules follow the log in order).
    let mut other = model(&files, "job-rules-other", &contents);
    other["base_model"] = json!("mistralai/Mistral-7B");
    let other = berth.register(&other).await;
    let matching = berth
        .register(&model(&files, "job-rules-match", &contents))
        .await;

    let rows = eventually(
        || "the check and the next step to complete".into(),
        async || {
            let rows = deployments_of(&berth, matching).await;
            (rows.len() == 2 && rows.iter().all(has_ended)).then_some(rows)
        },
    )
    .await;
    let (first, second) = (&rows[0], &rows[1]);
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["deployer"], "safetensors-check");
    assert_eq!(first["created_by"], "rule:check");
    assert_eq!(first["cause"]["rule"], "check");
    assert_eq!(first["cause"]["previous_deployment_id"], Value::Null);
    assert_eq!(second["status"], "completed", "{second}");
    assert_eq!(second["created_by"], "rule:publish");
    assert_eq!(second["cause"]["rule"], "publish");
    assert_eq!(second["cause"]["previous_deployment_id"], first["id"]);
    assert!(second["cause"]["event_id"].as_i64() > first["cause"]["event_id"].as_i64());
    assert_eq!(
        second["options"]["checked"], "1 tensors of job-rules-match",
        "{second}"
    );
    assert_eq!(second["options"]["ref"], first["ref"]);
    // Every event of a deployment a rule caused names the rule and the
    // event that fired it, so a stream client can follow the chain.
    let mut events = berth.events_from("?after=0", None).await;
    let seen = events.until(|e| ended(e, &second["id"])).await;
    for kind in [
        "deployment.queued",
        "deployment.started",
        "deployment.completed",
    ] {
        let of_second: Vec<_> = seen
            .iter()
            .filter(|e| e.kind == kind && e.data["deploy_id"] == second["id"])
            .collect();
        assert_eq!(of_second.len(), 1, "{kind}");
        assert_eq!(of_second[0].data["cause"], second["cause"], "{kind}");
    }
    assert_eq!(
        deployments_of(&berth, other).await,
        Vec::<Value>::new(),
        "a model that does not match fires nothing"
    );

    // The rule whose value is missing fired once, recording why it made
    // no deployment.
    let (_, rule) = berth.get("/v1/rules/needs-url").await;
    let firings = rule["firings"].as_array().unwrap();
    assert_eq!(firings.len(), 1, "{rule}");
    assert_eq!(firings[0]["deployment_id"], Value::Null);
    let error = firings[0]["error"].as_str().unwrap();
    assert!(
        error.contains("${previous.details.url} has no value")
            && error.contains("reported no details.url"),
        "{error}"
    );
    let (_, check) = berth.get("/v1/rules/check").await;
    assert_eq!(check["firings"][0]["deployment_id"], first["id"], "{check}");
    assert_eq!(check["origin"], "api");
}

/// A tokens file with an `admin` and a `deploy` token: their tokens.
fn tokens(dir: &std::path::Path) -> (String, String, std::path::PathBuf) {
    let (admin, admin_line) = new_token("ops", Role::Admin).unwrap();
    let (deployer, deployer_line) = new_token("ci", Role::Deploy).unwrap();
    let file = dir.join("tokens");
    std::fs::write(&file, format!("{admin_line}\n{deployer_line}\n")).unwrap();
    (admin, deployer, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_step_runs_once_an_admin_approves_and_fails_when_rejected_or_expired() {
    let files = FileServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (admin, deployer, file) = tokens(dir.path());
    let berth = Berth::options(Backend::Sqlite)
        .arg("--api-tokens-file")
        .arg(file.to_str().unwrap())
        .start()
        .await;
    let mut prod = registered_rule("prod", "misbehave", json!({ "mode": "ok" }));
    prod["require_approval"] = json!(true);
    let (status, body) = call(
        &berth,
        Method::POST,
        "/v1/rules",
        Some(&deployer),
        Some(prod.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "rules need an admin: {body}");
    let (status, body) = call(&berth, Method::POST, "/v1/rules", Some(&admin), Some(prod)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let contents = [("a.bin", b"weights".to_vec())];
    let mut held = Vec::new();
    for job in ["job-held-1", "job-held-2", "job-held-cancelled"] {
        let (status, body) = call(
            &berth,
            Method::POST,
            "/v1/models",
            Some(&deployer),
            Some(model(&files, job, &contents)),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        held.push(body["id"].as_i64().unwrap());
    }
    let pending = eventually(
        || "the three deployments to await approval".into(),
        async || {
            let (_, list) = call(&berth, Method::GET, "/v1/approvals", Some(&deployer), None).await;
            let rows = list["deployments"].as_array().cloned().unwrap_or_default();
            (rows.len() == 3).then_some(rows)
        },
    )
    .await;
    for row in &pending {
        assert_eq!(row["status"], "awaiting_approval", "{row}");
        assert_eq!(row["created_by"], "rule:prod");
    }
    let (approved, rejected) = (
        pending[0]["id"].as_i64().unwrap(),
        pending[1]["id"].as_i64().unwrap(),
    );
    // Nothing runs it meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, still) = call(
        &berth,
        Method::GET,
        &format!("/v1/deployments/{approved}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(still["status"], "awaiting_approval");

    let approve = format!("/v1/deployments/{approved}/approve");
    let (status, body) = call(&berth, Method::POST, &approve, Some(&deployer), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let answer = call(
        &berth,
        Method::POST,
        &approve,
        Some(&admin),
        Some(json!({ "comment": "ship it" })),
    )
    .await;
    assert_eq!(answer.0, StatusCode::OK, "{}", answer.1);
    assert_eq!(answer.1["approval"]["decision"], "approved");
    assert_eq!(answer.1["approval"]["by"], "ops");
    assert_eq!(answer.1["approval"]["comment"], "ship it");
    let ran = eventually(
        || "the approved deployment to end".into(),
        async || {
            let (_, row) = call(
                &berth,
                Method::GET,
                &format!("/v1/deployments/{approved}"),
                Some(&admin),
                None,
            )
            .await;
            has_ended(&row).then_some(row)
        },
    )
    .await;
    assert_eq!(ran["status"], "completed", "{ran}");
    assert_error(
        &call(&berth, Method::POST, &approve, Some(&admin), None).await,
        StatusCode::CONFLICT,
        &format!("deployment {approved} is completed, not awaiting approval"),
    );

    let reject = format!("/v1/deployments/{rejected}/reject");
    assert_error(
        &call(
            &berth,
            Method::POST,
            &reject,
            Some(&admin),
            Some(json!({ "comment": "a\u{0}b" })),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "comment holds a control character",
    );
    let (status, row) = call(
        &berth,
        Method::POST,
        &reject,
        Some(&admin),
        Some(json!({ "comment": "not this one" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{row}");
    assert_eq!(row["status"], "failed");
    assert_eq!(row["error"], "rejected by ops: not this one");
    assert_eq!(row["approval"]["decision"], "rejected");
    // One held can be cancelled, as a queued one can: it never runs.
    let cancelled = pending[2]["id"].as_i64().unwrap();
    let cancel = format!("/v1/deployments/{cancelled}/cancel");
    let (status, row) = call(&berth, Method::POST, &cancel, Some(&deployer), None).await;
    assert_eq!(status, StatusCode::OK, "{row}");
    assert_eq!(row["status"], "failed");
    assert_eq!(row["error"], "cancelled (before it started)");
    assert_error(
        &call(
            &berth,
            Method::POST,
            "/v1/deployments/999999/approve",
            Some(&admin),
            None,
        )
        .await,
        StatusCode::NOT_FOUND,
        "deployment 999999 does not exist",
    );

    // A server whose approvals expire at once: the held step fails, saying so.
    let short = Berth::options(Backend::Sqlite)
        .arg("--approval-expiry-s")
        .arg("1")
        .arg("--lease-ms")
        .arg("600")
        .start()
        .await;
    let (status, body) = short
        .post("/v1/rules", &{
            let mut rule = registered_rule("prod", "misbehave", json!({}));
            rule["require_approval"] = json!(true);
            rule
        })
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = short
        .register(&model(&files, "job-held-3", &contents))
        .await;
    let expired = first_ended(&short, id, "the held deployment to expire").await;
    assert_eq!(expired["status"], "failed");
    assert!(
        expired["error"]
            .as_str()
            .unwrap()
            .starts_with("expired: nobody approved it within 1s"),
        "{expired}"
    );
}

async fn bad_rules_are_refused_with_their_field(backend: Backend) {
    let app = App::start(backend).await;
    let completed = |name: &str, after: &str, deployer: &str| {
        json!({
            "name": name,
            "when": { "event": "deployment_completed", "deployer": after },
            "deploy": { "deployer": deployer },
        })
    };
    let with = |mut rule: Value, pointer: &str, value: Value| {
        *rule.pointer_mut(pointer).unwrap() = value;
        rule
    };
    let good = registered_rule("good", "misbehave", json!({ "mode": "ok" }));
    #[rustfmt::skip]
    let cases: Vec<(Value, &str, &str)> = vec![
        (with(good.clone(), "/name", json!("Bad Name")), "name", "is not a rule name"),
        (with(good.clone(), "/when", json!({ "event": "model_deleted" })), "when.event", "not an event rules fire on"),
        (with(good.clone(), "/when", json!({ "event": "deployment_completed" })), "when.deployer", "needs the deployer whose completion"),
        (with(good.clone(), "/deploy", json!({ "deployer": "nope" })), "deploy.deployer", "unknown deployer \"nope\""),
        (with(good.clone(), "/deploy/options", json!({ "mode": "dance" })), "deploy.options", "deployer misbehave refused the options: unknown mode"),
        (with(good.clone(), "/deploy/options", json!({ "x": "${model.colour}" })), "deploy.options", "${model.colour} is not a value rules know"),
        (with(good.clone(), "/deploy/options", json!({ "x": "${previous.ref}" })), "deploy.options", "has no previous deployment"),
        (with(good.clone(), "/deploy/options", json!({ "x": "${model.job_id" })), "deploy.options", "never closes"),
        (json!({ "name": "m", "when": { "event": "model_registered" }, "match": { "final_loss": { "min": 1, "max": 0 } }, "deploy": { "deployer": "archive" } }), "match.final_loss", "no model would match"),
        (completed("loop", "archive", "archive"), "deploy.deployer", "cycle (loop → loop)"),
    ];
    for (rule, field, fragment) in cases {
        let (status, body) = app.post("/v1/rules", &rule).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{rule}: {body}");
        let problems = body["problems"].as_array().unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p["field"] == field && p["message"].as_str().unwrap().contains(fragment)),
            "{rule}: expected {field}: {fragment}; got {body}"
        );
        assert!(
            body["error"].as_str().unwrap().starts_with("invalid rule"),
            "{body}"
        );
    }
    // A field the body does not know is refused, naming it, as the rules
    // file does: a misspelt require_approval stores no unheld step.
    let mut misspelt = good.clone();
    misspelt["require_aproval"] = json!(true);
    let (status, body) = app.post("/v1/rules", &misspelt).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `require_aproval`"),
        "{body}"
    );
    let (_, listed) = app.get("/v1/rules").await;
    assert_eq!(listed["rules"], json!([]), "nothing refused was stored");

    // A cycle through two rules: the second one closes it.
    let (status, body) = app
        .post("/v1/rules", &completed("a", "misbehave", "archive"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app
        .post("/v1/rules", &completed("b", "archive", "misbehave"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("a → b → a"),
        "{body}"
    );
    // Disabled, it makes no cycle; enabling it again is refused.
    let mut disabled = completed("b", "archive", "misbehave");
    disabled["disabled"] = json!(true);
    let (status, body) = app.post("/v1/rules", &disabled).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["disabled"], true);
    let enabled = completed("b", "archive", "misbehave");
    let (status, body) = app
        .request(Method::PUT, "/v1/rules/b", Some(&enabled))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error(
        &app.post("/v1/rules", &completed("a", "misbehave", "archive"))
            .await,
        StatusCode::CONFLICT,
        "a rule named a exists already",
    );
    // `enabled` is no field of a rule (`disabled` is): refused, nothing
    // changed.
    let mut enabled_field = completed("a", "misbehave", "archive");
    enabled_field["enabled"] = json!(false);
    let (status, body) = app
        .request(Method::PUT, "/v1/rules/a", Some(&enabled_field))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `enabled`"),
        "{body}"
    );
    let (status, _) = app.request(Method::DELETE, "/v1/rules/a", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = app.get("/v1/rules/a").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = app
        .request(Method::PUT, "/v1/rules/b", Some(&enabled))
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "once a is gone, b makes no cycle: {body}"
    );
}

/// Nine deployers (one plugin under nine names) in a line: a chain of
/// eight rules is taken, a ninth step is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_deeper_than_eight_steps_is_refused() {
    let names: Vec<String> = (0..9).map(|i| format!("d{i}")).collect();
    let served: Vec<(&str, std::path::PathBuf)> = names
        .iter()
        .map(|n| (n.as_str(), plugins::test_plugin("misbehave")))
        .collect();
    let app = App::start_with_plugins(Backend::Sqlite, None, Default::default(), &served).await;
    let step = |i: usize| match i {
        0 => registered_rule("r0", "d0", json!({})),
        _ => json!({
            "name": format!("r{i}"),
            "when": { "event": "deployment_completed", "deployer": format!("d{}", i - 1) },
            "deploy": { "deployer": format!("d{i}") },
        }),
    };
    for i in 0..8 {
        let (status, body) = app.post("/v1/rules", &step(i)).await;
        assert_eq!(status, StatusCode::CREATED, "step {i}: {body}");
    }
    let (status, body) = app.post("/v1/rules", &step(8)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["problems"][0]["field"], "when", "{body}");
    assert!(
        body["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("r0 → r1 → r2 → r3 → r4 → r5 → r6 → r7 → r8 is 9 steps deep; at most 8"),
        "{body}"
    );
}

/// Three servers on one PostgreSQL, 50 registrations spread over them at
/// once, one server killed while they fire: each registration fires the
/// first rule once, and each completed first step the second rule once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_fire_each_rule_once_per_event_though_one_is_killed() {
    const MODELS: usize = 50;
    let files = FileServer::start().await;
    let shared = Shared::new().await;
    let mut berths = servers(&shared, 3, &["--lease-ms", "1500"]).await;
    let first = registered_rule("first", "misbehave", json!({ "mode": "ok" }));
    let second = json!({
        "name": "second",
        "when": { "event": "deployment_completed", "deployer": "misbehave" },
        "deploy": { "deployer": "archive", "options": { "level": 1 } },
    });
    for rule in [first, second] {
        let (status, body) = berths[1].post("/v1/rules", &rule).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let contents = [("a.bin", b"weights".to_vec())];
    let registrations = (0..MODELS).map(|i| {
        let body = model(&files, &format!("job-once-{i}"), &contents);
        let (client, url) = (berths[i % 3].client().clone(), berths[i % 3].url.clone());
        async move {
            let response = client
                .post(format!("{url}/v1/models"))
                .json(&body)
                .send()
                .await;
            response
                .ok()
                .filter(|r| r.status() == StatusCode::CREATED)?
                .json::<Value>()
                .await
                .ok()
        }
    });
    let (registered, _) = tokio::join!(futures::future::join_all(registrations), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        berths[0].kill9();
    });
    // Those sent to the killed server may or may not have been recorded.
    let models: Vec<i64> = registered
        .iter()
        .flatten()
        .map(|m| m["id"].as_i64().unwrap())
        .collect();
    assert!(
        models.len() >= 2 * MODELS / 3,
        "{} registered",
        models.len()
    );
    let (_, all_models) = berths[1].get("/v1/models").await;
    let models: Vec<i64> = all_models["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect();

    let started = std::time::Instant::now();
    let rows = eventually(
        || "every model's chain to end".into(),
        async || {
            let mut rows = BTreeMap::new();
            for &m in &models {
                let list = deployments_of(&berths[2], m).await;
                let firsts = list
                    .iter()
                    .filter(|r| r["cause"]["rule"] == "first")
                    .count();
                let done = list
                    .iter()
                    .filter(|r| r["cause"]["rule"] == "first" && r["status"] == "completed")
                    .count();
                let seconds = list
                    .iter()
                    .filter(|r| r["cause"]["rule"] == "second")
                    .count();
                if firsts == 0 || !list.iter().all(has_ended) || seconds < done {
                    return None;
                }
                rows.insert(m, list);
            }
            Some(rows)
        },
    )
    .await;
    let took = started.elapsed();
    for (model, list) in &rows {
        let by_rule = |rule: &str| {
            list.iter()
                .filter(|r| r["cause"]["rule"] == rule)
                .collect::<Vec<_>>()
        };
        assert_eq!(by_rule("first").len(), 1, "model {model}: {list:?}");
        let first = by_rule("first")[0];
        let expected = usize::from(first["status"] == "completed");
        assert_eq!(by_rule("second").len(), expected, "model {model}: {list:?}");
        if let Some(second) = by_rule("second").first() {
            assert_eq!(second["cause"]["previous_deployment_id"], first["id"]);
        }
    }
    // The killed server comes back alone and doubles nothing. Its
    // follower reads the log in order: once it has fired the rule for a
    // model registered after the restart, it has been through every
    // event before that one.
    berths[1].terminate();
    berths[2].terminate();
    berths[0].restart();
    let marker = berths[0]
        .register(&model(&files, "job-once-marker", &contents))
        .await;
    eventually(
        || "the restarted server firing the rule for a new model".to_string(),
        async || {
            let list = deployments_of(&berths[0], marker).await;
            list.iter()
                .any(|r| r["cause"]["rule"] == "first")
                .then_some(())
        },
    )
    .await;
    for (model, list) in &rows {
        assert_eq!(
            deployments_of(&berths[0], *model).await.len(),
            list.len(),
            "model {model}"
        );
    }
    eprintln!(
        "{} models: chains ended {took:?} after the registrations",
        rows.len()
    );
}

/// A pushed deployer version whose manifest grants more than the one
/// served is stored but held: the old version keeps serving until an
/// admin approves it; a version asking for no more is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployer_version_that_asks_for_more_is_held_until_approved() {
    use crate::support::catalog::{push_in_process, served};
    let app = App::start(Backend::Sqlite).await;
    let wasm = std::fs::read(plugins::example("archive")).unwrap();
    let (status, body) = push_in_process(&app, "packer", &[("wasm", &wasm)]).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let wider = b"allowed_hosts = [\"models.example.com\"]\nmemory_mib = 1024\n";
    let (status, held) =
        push_in_process(&app, "packer", &[("wasm", &wasm), ("manifest", wider)]).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held}");
    assert_eq!(
        held["adds"],
        json!([
            "allowed host models.example.com",
            "memory 1024 MiB (was 512 MiB)"
        ]),
        "{held}"
    );
    assert_eq!(held["number"], 2);
    let (_, deployers) = app.get("/v1/deployers").await;
    let packer = served(&deployers, "packer").unwrap();
    assert_eq!(
        packer["version"], 1,
        "the old version keeps serving: {packer}"
    );
    assert_eq!(packer["allowed_hosts"], json!([]));
    let (_, versions) = app.get("/v1/deployers/packer/versions").await;
    assert_eq!(versions["versions"][1]["held"], held["adds"], "{versions}");
    assert_eq!(versions["versions"][1]["current"], false);
    // A rollback cannot serve it past the approval.
    assert_error(
        &app.post(
            "/v1/deployers/packer/rollback",
            &json!({ "sha256": held["sha256"] }),
        )
        .await,
        StatusCode::CONFLICT,
        "version 2 of deployer packer is held: it grants more than the version it would replace (allowed host models.example.com",
    );

    let (status, approved) = app.post("/v1/deployers/packer/approve", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["version"], 2);
    assert_eq!(approved["allowed_hosts"], json!(["models.example.com"]));
    assert_error(
        &app.post("/v1/deployers/packer/approve", &json!({})).await,
        StatusCode::CONFLICT,
        "deployer packer has no version held for approval",
    );
    let (_, versions) = app.get("/v1/deployers/packer/versions").await;
    assert_eq!(versions["versions"][1]["held"], Value::Null);

    // Asking for less is served at once.
    let (status, narrower) = push_in_process(&app, "packer", &[("wasm", &wasm)]).await;
    assert_eq!(status, StatusCode::OK, "{narrower}");
    assert_eq!(narrower["version"], 3);
    assert_eq!(narrower["allowed_hosts"], json!([]));
}

/// `berth …` against `server`: its stdout, asserting it exited 0.
#[track_caller]
fn cli(server: &Berth, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env("BERTH_SERVER", &server.url)
        .env("BERTH_LOG", "warn")
        .output()
        .unwrap();
    crate::support::cli::expect_success(&output)
}

/// A rule declared in `--rules-file` fires, wins over the API (which may
/// not change it), and the CLI lists rules and approves what a stored rule
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_rule_fires_and_wins_and_the_cli_approves() {
    let files = FileServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    std::fs::write(
        &file,
        r#"
[[rule]]
name = "declared"
when = { event = "model_registered" }
match = { job_id = "job-file-*" }
deploy = { deployer = "misbehave", options = { mode = "ok", job = "${model.job_id}" } }
"#,
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--rules-file")
        .arg(file.to_str().unwrap())
        .start()
        .await;
    let contents = [("a.bin", b"weights".to_vec())];
    let id = berth
        .register(&model(&files, "job-file-1", &contents))
        .await;
    let fired = first_ended(&berth, id, "the declared rule's deployment to end").await;
    assert_eq!(fired["status"], "completed", "{fired}");
    assert_eq!(fired["created_by"], "rule:declared");
    assert_eq!(fired["options"]["job"], "job-file-1");
    assert_error(
        &berth
            .post(
                "/v1/rules",
                &registered_rule("declared", "archive", json!({})),
            )
            .await,
        StatusCode::CONFLICT,
        "rule declared is declared in this server's rules file",
    );
    let (_, listed) = berth.get("/v1/rules/declared").await;
    assert_eq!(listed["origin"], "file");

    // The CLI: store a held rule from a file, list, approve.
    let held = dir.path().join("held.toml");
    std::fs::write(
        &held,
        r#"
[[rule]]
name = "held"
when = { event = "model_registered" }
match = { job_id = "job-cli-*" }
deploy = { deployer = "archive" }
require_approval = true
"#,
    )
    .unwrap();
    let held = held.to_str().unwrap();
    assert!(cli(&berth, &["rules", "add", held]).contains("stored rule held"));
    let listed = cli(&berth, &["rules"]);
    assert!(
        listed.contains("declared") && listed.contains("file"),
        "{listed}"
    );
    assert!(
        listed.contains("held") && listed.contains("required"),
        "{listed}"
    );
    let id = berth.register(&model(&files, "job-cli-1", &contents)).await;
    let waiting = eventually(
        || "the held deployment".into(),
        async || deployments_of(&berth, id).await.first().cloned(),
    )
    .await;
    let deploy_id = waiting["id"].to_string();
    assert!(cli(&berth, &["approvals"]).contains(&deploy_id));
    let approved = cli(&berth, &["approve", &deploy_id, "--comment", "fine"]);
    assert_eq!(approved.trim(), format!("deployment {deploy_id} is queued"));
    assert!(cli(&berth, &["rules", "disable", "held"]).contains("rule held is disabled"));
    let done = eventually(
        || "the approved deployment to end".into(),
        async || {
            deployments_of(&berth, id)
                .await
                .first()
                .filter(|r| has_ended(r))
                .cloned()
        },
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["approval"]["comment"], "fine");
}
