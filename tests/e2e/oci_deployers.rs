//! Deployers pulled from a registry: an example plugin pushed by hand into
//! the CNCF registry (`tests/registry`) in the wasm OCI artifact layout,
//! then `berth deployers push oci://…` — the real CLI against a real
//! server — which pulls it, serves it and keeps the manifest's digest as
//! the version's source. Refused with nothing stored: a damaged layer, a
//! manifest of another layout, a missing tag, an unreachable registry, an
//! unsigned component under `--require-signed`, a login the registry
//! refuses (the sources file's prefix named, never the password).

use std::process::Stdio;
use std::time::Duration;

use axum::http::Method;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::signatures::Key;
use crate::support::catalog::served;
use crate::support::files::FileServer;
use crate::support::plugins::{example, test_plugin};
use crate::support::registry::{self, Registry};
use crate::support::router::{App, MAX_PLUGIN_BYTES};
use crate::support::server::{Backend, Berth};
use crate::support::{
    adapter_files, answer_body, assert_error, model, on_both_backends, sha256_hex,
};

on_both_backends!(a_pulled_deployer_serves_pinned_to_its_manifest_and_bad_pulls_store_nothing);

const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
const WASM_LAYER: &str = "application/wasm";
/// Guards against a hang only; every command here ends in seconds.
const HANG: Duration = Duration::from_secs(120);

/// Pushes `wasm` under `repo:tag` as `wkg oci push` lays a component out:
/// a wasm config and one `application/wasm` layer. Answers the manifest's
/// and the layer's sha256.
async fn push_component(
    registry: &Registry,
    repo: &str,
    tag: &str,
    wasm: &[u8],
) -> (String, String) {
    let config = br#"{"architecture":"wasm","os":"wasip2","layerDigests":[]}"#.to_vec();
    let config_size = config.len();
    let config = registry.push_blob(repo, config).await;
    let layer = registry.push_blob(repo, wasm.to_vec()).await;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": WASM_CONFIG, "digest": format!("sha256:{config}"), "size": config_size},
        "layers": [{"mediaType": WASM_LAYER, "digest": format!("sha256:{layer}"), "size": wasm.len()}],
    });
    (registry.push_manifest(repo, tag, &manifest).await, layer)
}

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `berth ARGS… --server URL`, run to its end.
async fn berth_cli(server: &Berth, args: &[&str]) -> Run {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .args(["--server", &server.url])
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let output = tokio::time::timeout(HANG, child.wait_with_output())
        .await
        .expect("berth hung")
        .unwrap();
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `PUT /v1/deployers/{name}` with a pull's JSON body.
async fn pull(berth: &Berth, name: &str, body: &Value) -> (StatusCode, Value) {
    let response = berth
        .client()
        .put(format!("{}/v1/deployers/{name}", berth.url))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, answer_body(response.text().await.unwrap()))
}

/// Asserts a CLI run failed with `fragment` in its error.
#[track_caller]
fn assert_refused(run: &Run, fragment: &str) {
    assert!(
        run.code == Some(1) && run.stderr.contains(fragment),
        "expected exit 1 with {fragment:?}; got {run:?}"
    );
}

async fn a_pulled_deployer_serves_pinned_to_its_manifest_and_bad_pulls_store_nothing(
    backend: Backend,
) {
    let registry = Registry::start();
    let host = registry.host.clone();
    let archive = std::fs::read(example("archive")).unwrap();
    let (manifest, _) = push_component(&registry, "team/packer", "v1", &archive).await;
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;

    // Pulled by the server, named after the repository's last component.
    let run = berth_cli(
        &berth,
        &["deployers", "push", &format!("oci://{host}/team/packer:v1")],
    )
    .await;
    let pinned = format!("oci://{host}/team/packer@sha256:{manifest}");
    assert_eq!(run.code, Some(0), "{run:?}\nserver log:\n{}", berth.log());
    assert!(
        run.stdout
            .starts_with("deployer packer now serves version 1 (sha256 ")
            && run.stdout.ends_with(&format!(", pulled from {pinned}\n")),
        "{run:?}"
    );
    let (_, listing) = berth.get("/v1/deployers").await;
    let packer = served(&listing, "packer").unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(
        (&packer["origin"], &packer["sha256"], &packer["source"]),
        (&json!("api"), &json!(sha256_hex(&archive)), &json!(pinned)),
        "{packer}"
    );
    let (_, versions) = berth.get("/v1/deployers/packer/versions").await;
    assert_eq!(versions["versions"][0]["source"], pinned, "{versions}");
    let run = berth_cli(&berth, &["deployers", "versions", "packer"]).await;
    assert!(run.stdout.contains(&pinned), "{run:?}");

    // It deploys.
    let id = berth
        .register(&model(&files, "job-pulled", &adapter_files()))
        .await;
    let (status, deployment) = berth.deploy(id, "packer", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(
        (&deployment["status"], &deployment["plugin_sha256"]),
        (&json!("completed"), &json!(sha256_hex(&archive))),
        "{deployment}"
    );

    // The same again by its digest, with a name given: nothing new.
    let (status, again) = pull(&berth, "packer", &json!({ "oci": pinned })).await;
    assert_eq!(
        (status, &again["version"]),
        (StatusCode::OK, &json!(1)),
        "{again}"
    );

    // A damaged layer: the registry serves bytes that are not the digest's.
    let misbehave = std::fs::read(test_plugin("misbehave")).unwrap();
    let (_, layer) = push_component(&registry, "team/packer", "v2", &misbehave).await;
    let mut damaged = misbehave.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0xff;
    std::fs::write(registry.blob_file(&layer), &damaged).unwrap();
    let run = berth_cli(
        &berth,
        &["deployers", "push", &format!("oci://{host}/team/packer:v2")],
    )
    .await;
    assert_refused(
        &run,
        &format!(
            "deployer packer was not pulled from oci://{host}/team/packer:v2: the registry {host} sent {} bytes whose sha256 is {} for the blob sha256:{layer}",
            damaged.len(),
            sha256_hex(&damaged)
        ),
    );

    // Another layout: ORAS's files (an empty config), a wasm config
    // without a wasm layer.
    registry
        .push_model("team/files", "v1", &[("packer.wasm", archive.clone())])
        .await;
    let run = berth_cli(
        &berth,
        &["deployers", "push", &format!("oci://{host}/team/files:v1")],
    )
    .await;
    assert_refused(
        &run,
        &format!(
            "deployer files was not pulled from oci://{host}/team/files:v1: the manifest's config type is application/vnd.oci.empty.v1+json, not a wasm component's"
        ),
    );
    let config = registry.push_blob("team/empty", b"{}".to_vec()).await;
    let notes = registry.push_blob("team/empty", b"notes".to_vec()).await;
    registry
        .push_manifest(
            "team/empty",
            "v1",
            &json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": WASM_CONFIG, "digest": format!("sha256:{config}"), "size": 2},
                "layers": [{"mediaType": "text/plain", "digest": format!("sha256:{notes}"), "size": 5}],
            }),
        )
        .await;
    let run = berth_cli(
        &berth,
        &["deployers", "push", &format!("oci://{host}/team/empty:v1")],
    )
    .await;
    assert_refused(
        &run,
        "the manifest has no application/wasm layer (its 1 layers are text/plain)",
    );

    // The API's statuses: a bad reference is the request's fault (400); a
    // registry that does not give the component is a bad gateway (502).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_host = closed.local_addr().unwrap().to_string();
    drop(closed);
    #[rustfmt::skip]
    let cases = [
        ("bad", format!("https://{host}/team/packer:v1"), StatusCode::BAD_REQUEST,
         format!("deployer bad was not pulled: \"https://{host}/team/packer:v1\" is not an oci:// reference")),
        ("bad", format!("oci://{host}/Team/packer"), StatusCode::BAD_REQUEST,
         "must be lowercase letters".to_string()),
        ("missing", format!("oci://{host}/team/packer:v9"), StatusCode::BAD_GATEWAY,
         format!("deployer missing was not pulled from oci://{host}/team/packer:v9: the registry {host} has no manifest oci://{host}/team/packer:v9")),
        ("gone", format!("oci://{closed_host}/team/packer:v1"), StatusCode::BAD_GATEWAY,
         format!("deployer gone was not pulled from oci://{closed_host}/team/packer:v1: cannot reach the registry {closed_host}")),
        ("empty", format!("oci://{host}/team/empty:v1"), StatusCode::BAD_REQUEST,
         "the manifest has no application/wasm layer".to_string()),
    ];
    for (name, reference, status, fragment) in &cases {
        let answer = pull(&berth, name, &json!({ "oci": reference })).await;
        assert_error(&answer, *status, fragment);
    }
    let answer = pull(
        &berth,
        "bad",
        &json!({ "oci": "oci://r.io/a:b", "wasm": "x" }),
    )
    .await;
    assert_error(&answer, StatusCode::BAD_REQUEST, "unknown field `wasm`");

    // Nothing of any refusal was stored: packer has its one version, no
    // other name has any.
    let (_, versions) = berth.get("/v1/deployers/packer/versions").await;
    assert_eq!(
        versions["versions"].as_array().unwrap().len(),
        1,
        "{versions}"
    );
    for name in ["files", "empty", "bad", "missing", "gone"] {
        let answer = berth.get(&format!("/v1/deployers/{name}/versions")).await;
        assert_error(&answer, StatusCode::NOT_FOUND, "there is no deployer");
    }
}

/// A registry behind a login, given by the sources file for one prefix
/// (and a wrong one for another), under `--require-signed`: an unsigned
/// pull is refused, a signed one serves signed by the trusted key; the
/// wrong login is refused naming its prefix, never its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_uses_the_sources_files_login_and_the_signature_rules() {
    let registry = Registry::with_login();
    let host = registry.host.clone();
    let archive = std::fs::read(example("archive")).unwrap();
    push_component(&registry, "team/packer", "v1", &archive).await;
    push_component(&registry, "other/packer", "v1", &archive).await;
    let key = Key::new();
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[source]]\nprefix = \"oci://{host}/team/\"\n\
             options = {{ username = \"{}\", password = \"${{REGISTRY_PASSWORD}}\" }}\n\n\
             [[source]]\nprefix = \"oci://{host}/other/\"\n\
             options = {{ username = \"{}\", password = \"not-the-password\" }}\n",
            registry::USER,
            registry::USER,
        ),
    )
    .unwrap();
    let berth = Berth::bare(Backend::Sqlite)
        .arg("--sources-file")
        .arg(sources.to_str().unwrap())
        .arg("--trusted-key")
        .arg(&key.public)
        .arg("--require-signed")
        .env("REGISTRY_PASSWORD", registry::PASSWORD)
        .start()
        .await;
    let reference = format!("oci://{host}/team/packer:v1");

    let run = berth_cli(&berth, &["deployers", "push", &reference]).await;
    assert_refused(
        &run,
        "deployer packer was not stored: is not signed, and this server loads only signed plugins (--require-signed)",
    );
    let signature = dir.path().join("packer.wasm.sig");
    std::fs::write(&signature, key.sign(&archive)).unwrap();
    let run = berth_cli(
        &berth,
        &[
            "deployers",
            "push",
            &reference,
            "--signature",
            signature.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}\nserver log:\n{}", berth.log());
    let (_, listing) = berth.get("/v1/deployers").await;
    let packer = served(&listing, "packer").unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(packer["signed_by"], json!(key.id), "{packer}");
    assert!(
        packer["source"]
            .as_str()
            .unwrap()
            .starts_with(&format!("oci://{host}/team/packer@sha256:")),
        "{packer}"
    );
    let (_, versions) = berth.get("/v1/deployers/packer/versions").await;
    assert_eq!(versions["versions"][0]["signed"], true, "{versions}");

    // The wrong login of the other prefix: refused, the prefix named.
    let run = berth_cli(
        &berth,
        &[
            "deployers",
            "push",
            &format!("oci://{host}/other/packer:v1"),
            "--name",
            "other",
            "--signature",
            signature.to_str().unwrap(),
        ],
    )
    .await;
    assert_refused(
        &run,
        &format!(
            "deployer other was not pulled from oci://{host}/other/packer:v1: the registry {host} refused the login of the sources file's prefix oci://{host}/other/ for other/packer: check them"
        ),
    );
    assert!(!run.stderr.contains("not-the-password"), "{run:?}");
    assert!(!berth.log().contains("not-the-password"));
    assert!(!berth.log().contains(registry::PASSWORD));
    let answer = berth.get("/v1/deployers/other/versions").await;
    assert_error(&answer, StatusCode::NOT_FOUND, "there is no deployer");
}

/// A layer whose manifest gives more bytes than `--max-plugin-mib` is a
/// 413 without a byte of it read: the registry's copy is damaged, which a
/// read would have reported instead (in-process, the API's 4 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_over_the_plugin_limit_is_refused_unread() {
    let registry = Registry::start();
    let host = registry.host.clone();
    let big = vec![7u8; MAX_PLUGIN_BYTES + 1];
    let (_, layer) = push_component(&registry, "team/big", "v1", &big).await;
    std::fs::write(registry.blob_file(&layer), b"damaged").unwrap();
    let app = App::start(Backend::Sqlite).await;
    let reference = format!("oci://{host}/team/big:v1");
    let answer = app
        .request(
            Method::PUT,
            "/v1/deployers/big",
            Some(&json!({ "oci": reference })),
        )
        .await;
    assert_error(
        &answer,
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!(
            "deployer big was not pulled from {reference}: the component is {} bytes, larger than this server takes (4 MiB, --max-plugin-mib)",
            MAX_PLUGIN_BYTES + 1
        ),
    );
    let answer = app.get("/v1/deployers/big/versions").await;
    assert_error(&answer, StatusCode::NOT_FOUND, "there is no deployer");
}
