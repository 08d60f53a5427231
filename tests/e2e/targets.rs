//! Publishing targets as far as the 0.1.0 contract sees them: the sources
//! file's `[[target]]`s, granted by a manifest's `targets`, shown by
//! `GET /v1/deployers` and `berth deployers` with their names and URLs,
//! never their credentials. The rules run in-process; the real server
//! where the sources file and the command line matter.

use reqwest::StatusCode;
use serde_json::json;

use berth::targets::Targets;

use crate::support::catalog::{push_in_process, served};
use crate::support::plugins::example;
use crate::support::router::App;
use crate::support::server::{Backend, Berth};

const HEADER_SECRET: &str = "mirror-token-5d1e";
const KEY_SECRET: &str = "bucket-secret-93ac";

/// Two targets, their credentials from the environment.
const SOURCES: &str = r#"
[[target]]
name = "releases"
url = "s3://team-releases/models/"
options = { region = "us-east-1", secret_access_key = "${TEST_KEY_SECRET}" }

[[target]]
name = "mirror"
url = "https://mirror.internal/base/"
headers = { Authorization = "Bearer ${TEST_HEADER_SECRET}" }
"#;

fn lookup(name: &str) -> Option<String> {
    match name {
        "TEST_KEY_SECRET" => Some(KEY_SECRET.to_string()),
        "TEST_HEADER_SECRET" => Some(HEADER_SECRET.to_string()),
        _ => None,
    }
}

#[track_caller]
fn assert_no_secret(text: &str) {
    for secret in [HEADER_SECRET, KEY_SECRET] {
        assert!(!text.contains(secret), "{secret} shown in {text}");
    }
}

#[tokio::test]
async fn a_deployer_shows_the_targets_it_is_granted_without_their_credentials() {
    let targets = Targets::parse(SOURCES, "sources.toml", lookup).unwrap();
    let app = App::start_with_targets(Backend::Sqlite, targets).await;
    let archive = std::fs::read(example("archive")).unwrap();
    let manifest = b"targets = [\"mirror\", \"elsewhere\"]\n";
    let (status, pushed) = push_in_process(
        &app,
        "publisher",
        &[("wasm", &archive), ("manifest", manifest)],
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    let granted = json!([
        { "name": "mirror", "url": "https://mirror.internal/base/" },
        // Granted, but not a target of this server: shown, and unusable.
        { "name": "elsewhere", "url": null },
    ]);
    assert_eq!(pushed["targets"], granted, "{pushed}");
    assert_no_secret(&pushed.to_string());

    let (status, deployers) = app.get("/v1/deployers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served(&deployers, "publisher").unwrap()["targets"], granted);
    // Deny by default: a deployer without the grant has none.
    assert_eq!(served(&deployers, "archive").unwrap()["targets"], json!([]));
    assert_no_secret(&deployers.to_string());

    // The document describes them.
    let (_, document) = app.get("/openapi.json").await;
    let schemas = &document["components"]["schemas"];
    assert_eq!(
        schemas["Deployer"]["properties"]["targets"]["items"]["$ref"],
        "#/components/schemas/GrantedTarget",
        "{}",
        schemas["Deployer"]
    );
    assert_eq!(
        schemas["GrantedTarget"]["required"],
        json!(["name", "url"]),
        "{}",
        schemas["GrantedTarget"]
    );

    // A grant that is not a plain name is refused with the manifest.
    let (status, refused) = push_in_process(
        &app,
        "bad-grant",
        &[("wasm", &archive), ("manifest", b"targets = [\"a/b\"]")],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("targets: target name \"a/b\" is not a plain name"),
        "{refused}"
    );
}

#[tokio::test]
async fn berth_deployers_lists_the_granted_targets_of_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources.toml");
    std::fs::write(&sources, SOURCES).unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(sources.to_str().unwrap())
        .env("TEST_KEY_SECRET", KEY_SECRET)
        .env("TEST_HEADER_SECRET", HEADER_SECRET)
        .plugins_file("archive.toml", "targets = [\"releases\"]\n")
        .start()
        .await;
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["deployers", "--server", &berth.url])
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    let header = out.lines().next().unwrap_or_default();
    assert!(header.trim_end().ends_with("TARGETS"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("archive "))
        .unwrap_or_else(|| panic!("no archive row in:\n{out}"));
    assert!(
        row.trim_end()
            .ends_with("releases s3://team-releases/models/"),
        "{out}"
    );
    assert_no_secret(&out);
    let (_, deployers) = berth.get("/v1/deployers").await;
    assert_no_secret(&deployers.to_string());
    let log = berth.log();
    assert!(
        log.contains("releases=s3://team-releases/models/ mirror=https://mirror.internal/base/"),
        "{log}"
    );
    assert_no_secret(&log);
}
