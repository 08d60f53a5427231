//! Readiness: berth listens at once and loads its plugins folder after;
//! `/readyz` answers 503 with what is still loading until the first load is
//! done, deployers appear one by one as they compile, and a deployment for
//! one still compiling answers 503 with a sentence saying so.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::json;

use crate::support::files::FileServer;
use crate::support::router::{App, Rule};
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, eventually, model, plugins};

#[tokio::test]
async fn while_deployers_load_readyz_and_deploys_answer_503_with_what_is_missing() {
    let app = App::start_still_loading(&["archive", "model-card"]).await;
    let request = Request::get("/readyz").body(Body::empty()).unwrap();
    let (status, headers, body) = app.send_for_headers(request).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers[header::RETRY_AFTER], "5");
    assert_eq!(
        body["error"],
        "not ready: still loading 2 of the plugins folder's deployers (archive, model-card)"
    );
    let (status, _) = app.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "alive while loading");
    let (status, listed) = app.get("/v1/deployers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["loading"], json!(["archive", "model-card"]));

    let files = FileServer::start().await;
    let id = app
        .register(&model(&files, "job-ready", &adapter_files()))
        .await;
    let deployments = format!("/v1/models/{id}/deployments");
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (Method::POST, &deployments, Some(json!({ "deployer": "model-card" })), StatusCode::SERVICE_UNAVAILABLE, "deployer model-card is still loading (the server compiles its plugins after it starts); try again in a few seconds"),
        (Method::POST, &deployments, Some(json!({ "deployer": "nobody" })), StatusCode::BAD_REQUEST, "no deployers are loaded"),
    ];
    app.check(&rules).await;
    let (_, listed) = app.get(&deployments).await;
    assert_eq!(listed["deployments"], json!([]), "nothing was recorded");
}

#[tokio::test]
async fn a_loaded_server_is_ready() {
    let app = App::start(Backend::Sqlite).await;
    let (status, _) = app.get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    let (_, listed) = app.get("/v1/deployers").await;
    assert_eq!(listed["loading"], json!([]));
}

/// A cold start: the Python example compiles for seconds, with no code
/// cache. The server answers meanwhile; the Rust example, first by name,
/// serves before the Python one is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_serves_each_deployer_as_soon_as_it_is_compiled() {
    let berth = Berth::bare(Backend::Sqlite)
        .plugin("archive", plugins::example("archive"))
        .plugin("model-card", plugins::example("model-card"))
        .private_cache()
        .start_listening()
        .await;
    let (status, body) = berth.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("model-card"),
        "{body}"
    );
    let files = FileServer::start().await;
    let id = berth
        .register(&model(&files, "job-cold", &adapter_files()))
        .await;
    let (status, refused) = berth.deploy(id, "model-card", json!({})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert_error(
        &(status, refused),
        StatusCode::SERVICE_UNAVAILABLE,
        "deployer model-card is still loading",
    );

    // archive is served while model-card still compiles, or the load is
    // over: both prove the server never waited for all of them.
    eventually(
        || "archive to be served".into(),
        async || {
            let (_, listed) = berth.get("/v1/deployers").await;
            let names: Vec<&str> = listed["deployers"]
                .as_array()?
                .iter()
                .filter_map(|d| d["name"].as_str())
                .collect();
            names.contains(&"archive").then_some(())
        },
    )
    .await;
    let (status, deployed) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployed}");

    // A cold compile of a Python component takes tens of seconds here.
    let ready = async {
        while berth.get("/readyz").await.0 != StatusCode::OK {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(300), ready)
        .await
        .expect("the server was not ready within 5 minutes");
    let (status, deployed) = berth.deploy(id, "model-card", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployed}");
    assert!(berth.log().contains("plugins folder loaded: ready"));
}
