//! Deployers stored over the API: pushed, versioned, rolled back and
//! removed; checked as folder plugins are, with nothing stored when
//! refused; the plugins folder's names win; only admin tokens change them.
//! The API's rules run in-process; a real server where a process matters
//! (deployments running across a push, restarts, the folder changing).

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, header};
use reqwest::StatusCode;
use serde_json::{Value, json};

use berth::auth::{Role, Tokens, new_token};

use crate::support::catalog::{push, push_in_process, refused, served, wait_for_deployers};
use crate::support::files::FileServer;
use crate::support::plugins::{example, test_plugin};
use crate::support::router::{App, MAX_PLUGIN_BYTES, Rule};
use crate::support::server::{Backend, Berth};
use crate::support::{
    adapter_files, assert_error, eventually, has_ended, model, on_both_backends, sha256_hex,
};

on_both_backends!(
    a_refused_push_stores_nothing,
    versions_are_kept_and_rolled_back_by_the_rules,
    a_pushed_deployer_serves_new_deployments_while_old_ones_finish_on_theirs,
    a_queued_deployment_runs_the_version_it_was_accepted_for,
);

/// One part of an upload form: its name and bytes.
type Part<'a> = (&'a str, &'a [u8]);

fn read(path: impl AsRef<Path>) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

async fn a_refused_push_stores_nothing(backend: Backend) {
    let app = App::start(backend).await;
    let archive = read(example("archive"));
    let other_world = read(test_plugin("other-world"));
    let future = read(test_plugin("future-version"));
    let oversized = vec![7u8; MAX_PLUGIN_BYTES + 1];
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<Part>, StatusCode, &str)> = vec![
        ("corrupt", vec![("wasm", b"not a plugin")], StatusCode::BAD_REQUEST,
         "deployer corrupt was not stored: is not a WebAssembly file"),
        ("core", vec![("wasm", b"\0asm\x01\0\0\0")], StatusCode::BAD_REQUEST,
         "is a core WebAssembly module, not a component"),
        ("wrong-world", vec![("wasm", &other_world)], StatusCode::BAD_REQUEST,
         "exports no berth:deployer/plugin interface (this server speaks berth:deployer@0.1.0 and 0.2.0"),
        ("future", vec![("wasm", &future)], StatusCode::BAD_REQUEST,
         "but this server speaks 0.1.0 and 0.2.0"),
        ("bad-manifest", vec![("wasm", &archive), ("manifest", b"memory_mib = \"lots\"")], StatusCode::BAD_REQUEST,
         "deployer bad-manifest was not stored: manifest bad-manifest.toml:"),
        ("-dash", vec![("wasm", &archive)], StatusCode::BAD_REQUEST,
         "name \"-dash\" must start with a letter or digit"),
        ("huge", vec![("wasm", &oversized)], StatusCode::PAYLOAD_TOO_LARGE,
         "the plugin is larger than this server takes (4 MiB, --max-plugin-mib)"),
        ("archive", vec![("wasm", &archive)], StatusCode::CONFLICT,
         "deployer archive is declared in this server's plugins folder, which wins over the API"),
        ("no-wasm", vec![("manifest", b"")], StatusCode::BAD_REQUEST,
         "the form has no wasm part"),
        ("extra", vec![("wasm", &archive), ("readme", b"hi")], StatusCode::BAD_REQUEST,
         "the form has a part \"readme\"; its parts are wasm, manifest and signature"),
        ("twice", vec![("wasm", &archive), ("wasm", &archive)], StatusCode::BAD_REQUEST,
         "the form has two wasm parts"),
    ];
    for (name, parts, status, fragment) in &cases {
        let answer = push_in_process(&app, name, parts).await;
        assert_error(&answer, *status, fragment);
    }
    // The `.wasm` as the body: the same checks, the signature in a header.
    let raw = |name: &str, body: Vec<u8>, signature: Option<&str>| {
        let mut request = Request::put(format!("/v1/deployers/{name}"))
            .header(header::CONTENT_TYPE, "application/wasm");
        if let Some(signature) = signature {
            request = request.header("x-berth-plugin-signature", signature);
        }
        request.body(Body::from(body)).unwrap()
    };
    let answer = app.send(raw("raw-huge", oversized.clone(), None)).await;
    assert_error(
        &answer,
        StatusCode::PAYLOAD_TOO_LARGE,
        "(4 MiB, --max-plugin-mib)",
    );
    let answer = app.send(raw("raw-corrupt", b"MZ".to_vec(), None)).await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "deployer raw-corrupt was not stored: is not a WebAssembly file",
    );
    let answer = app
        .send(raw("raw-sig", archive.clone(), Some("not base64!")))
        .await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "x-berth-plugin-signature must be the base64 of the signature file's text",
    );

    // Nothing of any of them was stored: no version, no deployer, and a
    // name refused before is version 1 when it is finally pushed.
    for (name, ..) in cases.iter().filter(|(name, ..)| *name != "archive") {
        let answer = app.get(&format!("/v1/deployers/{name}/versions")).await;
        assert_error(&answer, StatusCode::NOT_FOUND, "there is no deployer");
    }
    let (_, listing) = app.get("/v1/deployers").await;
    let origins: Vec<&Value> = listing["deployers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["origin"])
        .collect();
    assert!(origins.iter().all(|o| *o == "folder"), "{listing}");
    assert_eq!(listing["rejected"], json!([]), "{listing}");
    let (status, pushed) = push_in_process(&app, "corrupt", &[("wasm", &archive)]).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    assert_eq!(pushed["version"], 1, "{pushed}");
}

async fn versions_are_kept_and_rolled_back_by_the_rules(backend: Backend) {
    let app = App::start(backend).await;
    let archive = read(example("archive"));
    let misbehave = read(test_plugin("misbehave"));
    let (archive_sha, misbehave_sha) = (sha256_hex(&archive), sha256_hex(&misbehave));

    let (status, first) = push_in_process(&app, "alpha", &[("wasm", &archive)]).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(
        (&first["origin"], &first["version"], &first["sha256"]),
        (&json!("api"), &json!(1), &json!(archive_sha)),
        "{first}"
    );
    let manifest: &[u8] = b"memory_mib = 64\n";
    let (status, second) = push_in_process(
        &app,
        "alpha",
        &[("wasm", &misbehave), ("manifest", manifest)],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(
        (&second["version"], &second["memory_mib"]),
        (&json!(2), &json!(64))
    );
    // The same bytes and manifest again: nothing new.
    let (status, again) = push_in_process(
        &app,
        "alpha",
        &[("wasm", &misbehave), ("manifest", manifest)],
    )
    .await;
    assert_eq!((status, &again["version"]), (StatusCode::OK, &json!(2)));

    let (status, versions) = app.get("/v1/deployers/alpha/versions").await;
    assert_eq!(status, StatusCode::OK, "{versions}");
    let summary: Vec<(Value, Value, Value, Value)> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["number"].clone(),
                v["sha256"].clone(),
                v["current"].clone(),
                v["manifest"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (json!(1), json!(archive_sha), json!(false), json!(false)),
            (json!(2), json!(misbehave_sha), json!(true), json!(true)),
        ]
    );
    assert_eq!(versions["versions"][0]["size"], archive.len());

    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (Method::POST, "/v1/deployers/alpha/rollback", Some(json!({ "sha256": "00" })), StatusCode::NOT_FOUND,
         "deployer alpha has no version with sha256 00"),
        (Method::POST, "/v1/deployers/alpha/rollback", Some(json!({ "to": 1 })), StatusCode::BAD_REQUEST,
         "give {\"sha256\": \"…\"} or nothing"),
        (Method::POST, "/v1/deployers/nope/rollback", None, StatusCode::NOT_FOUND,
         "there is no deployer nope stored over the API"),
        (Method::GET, "/v1/deployers/nope/versions", None, StatusCode::NOT_FOUND,
         "there is no deployer nope stored over the API (see GET /v1/deployers)"),
        (Method::DELETE, "/v1/deployers/nope", None, StatusCode::NOT_FOUND,
         "there is no deployer nope stored"),
        (Method::GET, "/v1/deployers/archive/versions", None, StatusCode::CONFLICT,
         "deployer archive comes from this server's plugins folder: its versions are the folder's"),
        (Method::POST, "/v1/deployers/archive/rollback", None, StatusCode::CONFLICT,
         "comes from this server's plugins folder: put the version you want back in the folder"),
        (Method::DELETE, "/v1/deployers/archive", None, StatusCode::CONFLICT,
         "comes from this server's plugins folder: remove its file from the folder"),
    ];
    app.check(&rules).await;

    // Back one version, then no further; forward again by sha256.
    let (status, back) = app
        .request(Method::POST, "/v1/deployers/alpha/rollback", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{back}");
    assert_eq!(
        (&back["version"], &back["sha256"], &back["memory_mib"]),
        (&json!(1), &json!(archive_sha), &json!(512))
    );
    let (_, listing) = app.get("/v1/deployers").await;
    assert_eq!(
        served(&listing, "alpha").unwrap()["version"],
        1,
        "{listing}"
    );
    let answer = app
        .request(Method::POST, "/v1/deployers/alpha/rollback", None)
        .await;
    assert_error(
        &answer,
        StatusCode::CONFLICT,
        "deployer alpha has no version before the one it serves (version 1)",
    );
    let (status, forward) = app
        .post(
            "/v1/deployers/alpha/rollback",
            &json!({ "sha256": misbehave_sha }),
        )
        .await;
    assert_eq!(
        (status, &forward["version"]),
        (StatusCode::OK, &json!(2)),
        "{forward}"
    );

    // Removed: gone from the listing, with its versions.
    let (status, _) = app
        .request(Method::DELETE, "/v1/deployers/alpha", None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, listing) = app.get("/v1/deployers").await;
    assert!(served(&listing, "alpha").is_none(), "{listing}");
    let answer = app.get("/v1/deployers/alpha/versions").await;
    assert_error(&answer, StatusCode::NOT_FOUND, "there is no deployer alpha");
}

async fn a_pushed_deployer_serves_new_deployments_while_old_ones_finish_on_theirs(
    backend: Backend,
) {
    let files = FileServer::start().await;
    let mut berth = Berth::options(backend)
        .arg("--plugins-poll-ms")
        .arg("200")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-catalog", &adapter_files()))
        .await;
    let archive = read(example("archive"));
    let misbehave = read(test_plugin("misbehave"));
    let (archive_sha, misbehave_sha) = (sha256_hex(&archive), sha256_hex(&misbehave));

    // Version 1 (misbehave's bytes), and a deployment of it that runs
    // until it is cancelled: the push below comes while it runs, however
    // slow the machine.
    let (status, first) = push(&berth, "trial", &[("wasm", &misbehave)]).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let sleeping = berth
        .deploy_detached(id, "trial", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    assert_eq!(sleeping["plugin_sha256"], misbehave_sha, "{sleeping}");

    // Version 2 (archive's bytes, with a manifest) serves the next one at
    // once, while the first sleeps on in version 1.
    let (status, second) = push(
        &berth,
        "trial",
        &[("wasm", &archive), ("manifest", b"out_mib = 64\n")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(
        (&second["version"], &second["out_mib"]),
        (&json!(2), &json!(64))
    );
    let (status, packed) = berth.deploy(id, "trial", json!({ "level": 1 })).await;
    assert_eq!(status, StatusCode::OK, "{packed}");
    assert_eq!(packed["plugin_sha256"], archive_sha, "{packed}");
    // The first ran on version 1 all along: still running, then
    // cancelled.
    let (_, still) = berth
        .get(&format!("/v1/deployments/{}", sleeping["id"]))
        .await;
    assert_eq!(
        (&still["status"], &still["plugin_sha256"]),
        (&json!("running"), &json!(misbehave_sha)),
        "{still}"
    );
    let (status, cancelled) = berth.cancel(&sleeping).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(
        (&cancelled["status"], &cancelled["plugin_sha256"]),
        (&json!("failed"), &json!(misbehave_sha)),
        "{cancelled}"
    );

    // Rolled back: version 1 deploys again.
    let (status, back) = berth.post("/v1/deployers/trial/rollback", &json!({})).await;
    assert_eq!(
        (status, &back["version"]),
        (StatusCode::OK, &json!(1)),
        "{back}"
    );
    let (status, again) = berth
        .deploy(id, "trial", json!({ "mode": "sleep", "ms": 10 }))
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["plugin_sha256"], misbehave_sha, "{again}");

    // The database keeps it: served after a restart, at the version chosen.
    berth.terminate();
    berth.restart();
    let (_, listing) = berth.get("/v1/deployers").await;
    let trial = served(&listing, "trial").unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(
        (&trial["origin"], &trial["version"]),
        (&json!("api"), &json!(1))
    );

    // The folder gains the name: it wins, the stored one is refused and a
    // push is refused; when the file goes, the stored one serves again.
    let folder_file = berth.plugins_dir().join("trial.wasm");
    let temp = berth.plugins_dir().join(".trial.tmp");
    std::fs::write(&temp, &archive).unwrap();
    std::fs::rename(&temp, &folder_file).unwrap();
    let listing = wait_for_deployers(&berth, |l| {
        served(l, "trial").is_some_and(|d| d["origin"] == "folder")
    })
    .await;
    let shadowed = refused(&listing, "trial.wasm").unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(
        (&shadowed["origin"], &shadowed["sha256"]),
        (&json!("api"), &json!(misbehave_sha))
    );
    assert!(
        shadowed["reason"]
            .as_str()
            .unwrap()
            .starts_with("declared in this server's plugins folder, which wins"),
        "{shadowed}"
    );
    let answer = push(&berth, "trial", &[("wasm", &misbehave)]).await;
    assert_error(
        &answer,
        StatusCode::CONFLICT,
        "deployer trial is declared in this server's plugins folder",
    );
    let (status, folder_run) = berth.deploy(id, "trial", json!({})).await;
    assert_eq!(
        (status, &folder_run["plugin_sha256"]),
        (StatusCode::OK, &json!(archive_sha))
    );
    std::fs::remove_file(&folder_file).unwrap();
    let listing = wait_for_deployers(&berth, |l| {
        served(l, "trial").is_some_and(|d| d["origin"] == "api")
    })
    .await;
    assert_eq!(served(&listing, "trial").unwrap()["version"], 1);
    assert!(refused(&listing, "trial.wasm").is_none(), "{listing}");
}

/// A deployment waiting in the queue when its deployer gets a new version
/// runs the version it was accepted for, as a running one does; the next
/// one runs the new version. The one running holds the only slot until it
/// is cancelled, so the new version surely lands while the other waits.
async fn a_queued_deployment_runs_the_version_it_was_accepted_for(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::options(backend)
        .arg("--max-running")
        .arg("1")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-queued-version", &adapter_files()))
        .await;
    let archive = read(example("archive"));
    let misbehave = read(test_plugin("misbehave"));
    let (archive_sha, misbehave_sha) = (sha256_hex(&archive), sha256_hex(&misbehave));
    let (status, _) = push(&berth, "trial", &[("wasm", &misbehave)]).await;
    assert_eq!(status, StatusCode::CREATED);
    // Running until cancelled: the queued one waits however long the
    // push takes.
    let running = berth
        .deploy_detached(id, "trial", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    assert_eq!(running["status"], "running", "{running}");
    let queued = berth
        .deploy_detached(id, "trial", json!({ "mode": "sleep", "ms": 10 }))
        .await;
    assert_eq!(
        (&queued["status"], &queued["plugin_sha256"]),
        (&json!("queued"), &json!(misbehave_sha)),
        "{queued}"
    );

    let (status, _) = push(&berth, "trial", &[("wasm", &archive)]).await;
    assert_eq!(status, StatusCode::OK);
    let queued_id = queued["id"].as_i64().unwrap();
    let (_, still) = berth.get(&format!("/v1/deployments/{queued_id}")).await;
    assert_eq!(
        still["status"], "queued",
        "the new version was served while it waited: {still}"
    );
    let (status, cancelled) = berth.cancel(&running).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["plugin_sha256"], misbehave_sha, "{cancelled}");
    let ended = ended(&berth, queued_id).await;
    assert_eq!(
        (&ended["status"], &ended["plugin_sha256"]),
        (&json!("completed"), &json!(misbehave_sha)),
        "{ended}"
    );
    let (status, next) = berth.deploy(id, "trial", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(next["plugin_sha256"], archive_sha, "{next}");
    // The listing shows only the version served.
    let (_, listing) = berth.get("/v1/deployers").await;
    assert_eq!(served(&listing, "trial").unwrap()["sha256"], archive_sha);
}

async fn ended(berth: &Berth, id: i64) -> Value {
    eventually(
        || format!("deployment {id} ending"),
        async || {
            let (_, row) = berth.get(&format!("/v1/deployments/{id}")).await;
            has_ended(&row).then_some(row)
        },
    )
    .await
}

/// Only an admin token changes the catalog; a deploy token still deploys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_admin_tokens_change_the_deployers() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    let mut token = |name: &str, role: Role| {
        let (token, line) = new_token(name, role).unwrap();
        lines.push_str(&format!("{line}\n"));
        token
    };
    let (reader, deployer, admin) = (
        token("viewer", Role::Read),
        token("ci", Role::Deploy),
        token("ops", Role::Admin),
    );
    std::fs::write(dir.path().join("tokens"), lines).unwrap();
    let tokens = Tokens::load(Some(&dir.path().join("tokens")), None)
        .unwrap()
        .unwrap();
    let app = App::start_with_tokens(Backend::Sqlite, Some(Arc::new(tokens))).await;
    let archive = read(example("archive"));
    for (token, expected) in [
        (
            &reader,
            "token viewer has the read role, which may only read; PUT /v1/deployers/beta needs an admin token",
        ),
        (
            &deployer,
            "token ci has the deploy role, which may register, deploy, cancel and delete, but not change the deployers; PUT /v1/deployers/beta needs an admin token",
        ),
    ] {
        let answer =
            push_in_process(&app.with_token(Some(token)), "beta", &[("wasm", &archive)]).await;
        assert_error(&answer, StatusCode::FORBIDDEN, expected);
    }
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (Method::DELETE, "/v1/deployers/beta", None, StatusCode::FORBIDDEN, "DELETE /v1/deployers/beta needs an admin token"),
        (Method::POST, "/v1/deployers/beta/rollback", None, StatusCode::FORBIDDEN, "POST /v1/deployers/beta/rollback needs an admin token"),
    ];
    app.with_token(Some(&deployer)).check(&rules).await;
    let (status, pushed) =
        push_in_process(&app.with_token(Some(&admin)), "beta", &[("wasm", &archive)]).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    assert_eq!(pushed["added_by"], "ops", "{pushed}");
    // Reading the versions is for every role.
    let (status, versions) = app
        .with_token(Some(&reader))
        .get("/v1/deployers/beta/versions")
        .await;
    assert_eq!(status, StatusCode::OK, "{versions}");
    assert_eq!(versions["versions"][0]["added_by"], "ops");
}
