//! Models signed with OpenSSF model signing, as the reference tool
//! (`model-signing` from PyPI, `scripts/make-signing-fixtures`) signed the
//! folder of `tests/data/signing/`: registered with their `model.sig`
//! through the CLI, verified by the server against what it records, the
//! outcome in the API, the event and `berth models show`; under
//! `--model-signatures require` only a verified model deploys.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{expect_success, lossy, path};
use crate::support::server::{Backend, Berth};
use crate::support::{assert_error, on_both_backends, plugins, sha256_hex};

on_both_backends!(under_require_only_a_model_its_trusted_signer_signed_deploys);

fn signing(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/signing")
        .join(file)
}

/// The signed folder copied into a temp dir, with `sig` as its model.sig.
fn signed_copy(sig: Option<&str>) -> (TempDir, PathBuf) {
    let parent = TempDir::new().unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(signing("model"))
        .arg(parent.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let dir = parent.path().join("model");
    if let Some(sig) = sig {
        std::fs::copy(signing(sig), dir.join("model.sig")).unwrap();
    }
    (parent, dir)
}

fn register(server: &str, dir: &Path, job_id: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["models", "register", path(dir), "--job-id", job_id, "--server", server])
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

async fn model(server: &Berth, job_id: &str) -> Value {
    let (_, listed) = server.get("/v1/models").await;
    listed["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["job_id"] == job_id)
        .unwrap_or_else(|| panic!("no model {job_id}: {listed}"))
        .clone()
}

async fn under_require_only_a_model_its_trusted_signer_signed_deploys(backend: Backend) {
    let server = Berth::options(backend)
        .plugin("model-card", plugins::example("model-card"))
        .arg("--model-signatures=require")
        .arg(&format!("--model-signer={}", path(&signing("key-p256.pub.pem"))))
        .arg(&format!("--model-signer={}", path(&signing("ca/root.pem"))))
        .start()
        .await;
    let mut events = server.events().await;

    // Signed with the key: verified, named by the key's id.
    let (_keep, dir) = signed_copy(Some("key-p256.sig"));
    let output = register(&server.url, &dir, "signed-key");
    expect_success(&output);
    assert!(
        lossy(&output.stderr).contains("signature: ") && lossy(&output.stderr).contains("model.sig"),
        "{}",
        lossy(&output.stderr)
    );
    let signed = model(&server, "signed-key").await;
    let key_id = sha256_hex(&std::fs::read(signing("key-p256.pub.pem")).unwrap());
    assert_eq!(signed["signature"]["verified"], true, "{signed}");
    assert_eq!(signed["signature"]["method"], "bare public key");
    assert_eq!(signed["signature"]["signer"], format!("key sha256:{key_id}"));
    assert_eq!(signed["signature"]["error"], Value::Null);
    assert!(
        signed["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["path"] != "model.sig"),
        "the signature is not one of the files: {signed}"
    );
    let received = events
        .until(|e| e.iter().any(|e| e.kind == "model.registered"))
        .await;
    let registered = received
        .iter()
        .find(|e| e.kind == "model.registered")
        .unwrap();
    assert_eq!(registered.data["signed_by"], format!("key sha256:{key_id}"));
    let id = signed["id"].as_i64().unwrap();
    let shown = expect_success(
        &Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["models", "show", &id.to_string(), "--server", &server.url])
            .output()
            .unwrap(),
    );
    assert!(
        shown.contains(&format!("verified: key sha256:{key_id}")),
        "{shown}"
    );
    let (status, deployment) = server.deploy(id, "model-card", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed");

    // Signed by the CA's leaf: verified, named by the certificate.
    let (_keep, dir) = signed_copy(Some("certificate.sig"));
    expect_success(&register(&server.url, &dir, "signed-cert"));
    let by_cert = model(&server, "signed-cert").await;
    assert_eq!(by_cert["signature"]["verified"], true, "{by_cert}");
    assert_eq!(by_cert["signature"]["method"], "certificate chain");
    assert!(
        by_cert["signature"]["signer"]
            .as_str()
            .unwrap()
            .starts_with("certificate "),
        "{by_cert}"
    );

    // A byte changed after signing: recorded, not verified, not deployed.
    let (_keep, dir) = signed_copy(Some("key-p256.sig"));
    let config = dir.join("config.json");
    let mut bytes = std::fs::read(&config).unwrap();
    bytes[0] ^= 0x20;
    std::fs::write(&config, bytes).unwrap();
    expect_success(&register(&server.url, &dir, "tampered"));
    let tampered = model(&server, "tampered").await;
    assert_eq!(tampered["signature"]["verified"], false, "{tampered}");
    let error = tampered["signature"]["error"].as_str().unwrap();
    assert!(error.contains("config.json"), "{error}");
    let answer = server
        .deploy(tampered["id"].as_i64().unwrap(), "model-card", json!({}))
        .await;
    assert_error(
        &answer,
        StatusCode::FORBIDDEN,
        "requires models signed by a trusted signer (--model-signatures require), and its signature does not vouch for it",
    );

    // No signature at all: refused, saying so; nothing recorded.
    let (_keep, dir) = signed_copy(None);
    expect_success(&register(&server.url, &dir, "unsigned"));
    let unsigned = model(&server, "unsigned").await;
    assert_eq!(unsigned["signature"], Value::Null);
    let unsigned_id = unsigned["id"].as_i64().unwrap();
    assert_error(
        &server.deploy(unsigned_id, "model-card", json!({})).await,
        StatusCode::FORBIDDEN,
        "and it has no signature; register it again with a model.sig a --model-signer made",
    );
    let (_, rows) = server
        .get(&format!("/v1/models/{unsigned_id}/deployments"))
        .await;
    assert_eq!(rows["deployments"], json!([]));
}

#[test]
fn require_without_a_signer_or_with_a_bad_one_is_refused_at_start() {
    let data = TempDir::new().unwrap();
    let serve = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--data-dir", path(data.path()), "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("BERTH_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let none = serve(&["--model-signatures", "require"]);
    assert!(!none.status.success());
    let said = lossy(&none.stderr);
    assert!(said.contains("--model-signatures require needs a --model-signer"), "{said}");
    let notes = signing("model/NOTES.md");
    let bad = serve(&["--model-signer", path(&notes)]);
    assert!(!bad.status.success());
    let said = lossy(&bad.stderr);
    assert!(
        said.contains(&format!(
            "--model-signer {}: holds neither a PEM PUBLIC KEY nor CERTIFICATEs",
            path(&notes)
        )),
        "{said}"
    );
}
