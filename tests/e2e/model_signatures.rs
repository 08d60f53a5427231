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

on_both_backends!(
    under_require_only_a_model_its_trusted_signer_signed_deploys,
    a_keyless_signature_is_verified_offline_for_its_identity_as_the_reference_tool_does,
);

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
    crate::support::cli::client(
        server,
        &["models", "register", path(dir), "--job-id", job_id],
    )
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
        .arg(&format!(
            "--model-signer={}",
            path(&signing("key-p256.pub.pem"))
        ))
        .arg(&format!("--model-signer={}", path(&signing("ca/root.pem"))))
        .start()
        .await;
    let mut events = server.events().await;

    // Signed with the key: verified, named by the key's id.
    let (_keep, dir) = signed_copy(Some("key-p256.sig"));
    let output = register(&server.url, &dir, "signed-key");
    expect_success(&output);
    assert!(
        lossy(&output.stderr).contains("signature: ")
            && lossy(&output.stderr).contains("model.sig"),
        "{}",
        lossy(&output.stderr)
    );
    let signed = model(&server, "signed-key").await;
    let key_id = sha256_hex(&std::fs::read(signing("key-p256.pub.pem")).unwrap());
    assert_eq!(signed["signature"]["verified"], true, "{signed}");
    assert_eq!(signed["signature"]["method"], "bare public key");
    assert_eq!(
        signed["signature"]["signer"],
        format!("key sha256:{key_id}")
    );
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
            .args([
                "serve",
                "--data-dir",
                path(data.path()),
                "--listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .env_remove("BERTH_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let none = serve(&["--model-signatures", "require"]);
    assert!(!none.status.success());
    let said = lossy(&none.stderr);
    assert!(
        said.contains("--model-signatures require needs a --model-signer"),
        "{said}"
    );
    let notes = signing("model/NOTES.md");
    let bad = serve(&["--model-signer", path(&notes)]);
    assert!(!bad.status.success());
    let said = lossy(&bad.stderr);
    assert!(
        said.contains(&format!(
            "--model-signer {}: holds neither a PEM PUBLIC KEY, CERTIFICATEs nor a Sigstore signer",
            path(&notes)
        )),
        "{said}"
    );
}

/// `model_signing` as `scripts/setup test` installs it; `None` (the test
/// says why and passes) only outside CI.
fn reference_tool() -> Option<PathBuf> {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/model_signing");
    if tool.exists() {
        return Some(tool);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing: scripts/setup test installs it",
        tool.display()
    );
    eprintln!(
        "skipped: {} is missing (scripts/setup test)",
        tool.display()
    );
    None
}

/// With --publish-signing-key, what a deployment put into a file target
/// gets a model.sig the reference tool verifies, over exactly those files;
/// recorded as one more put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_deployment_publishes_is_signed_and_the_reference_tool_verifies_it() {
    let Some(tool) = reference_tool() else {
        return;
    };
    let temp = TempDir::new().unwrap();
    let shelf = temp.path().join("shelf");
    std::fs::create_dir(&shelf).unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"shelf\"\nurl = \"file://{}/\"\n",
            path(&shelf)
        ),
    )
    .unwrap();
    let files = crate::support::files::FileServer::start().await;
    let server = Berth::options(Backend::Sqlite)
        .plugin("s3-publish", plugins::example("s3-publish"))
        .plugins_file("s3-publish.toml", "targets = [\"shelf\"]\n")
        .arg(&format!("--sources-file={}", path(&sources)))
        .arg(&format!(
            "--publish-signing-key={}",
            path(&signing("key-p256.pem"))
        ))
        .start()
        .await;
    let contents = crate::support::adapter_files();
    let id = server
        .register(&crate::support::model(&files, "job-signed-out", &contents))
        .await;
    let (status, deployment) = server
        .deploy(
            id,
            "s3-publish",
            json!({ "target": "shelf", "prefix": "team/" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed", "{deployment}");
    let folder = shelf.join(format!("team/job-signed-out/deploy-{}", deployment["id"]));
    let signature = folder.join("model.sig");
    assert!(signature.is_file(), "no {}", signature.display());
    let last = deployment["published"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["key"],
        format!("team/job-signed-out/deploy-{}/model.sig", deployment["id"])
    );
    assert!(
        server
            .deployment_log(&deployment["id"])
            .await
            .contains("signed the 4 file(s) published to target \"shelf\""),
        "the manifest and the three files"
    );

    let verify = || {
        Command::new(&tool)
            .args(["verify", "key", "--public_key"])
            .arg(signing("key-p256.pub.pem"))
            .arg("--signature")
            .arg(&signature)
            .arg(&folder)
            .output()
            .unwrap()
    };
    let verified = verify();
    assert!(
        verified.status.success(),
        "model_signing refused berth's signature: {}{}",
        lossy(&verified.stdout),
        lossy(&verified.stderr)
    );
    // It covers the bytes: one changed, and the tool refuses it.
    let published = folder.join("adapter_config.json");
    let mut bytes = std::fs::read(&published).unwrap();
    bytes[0] ^= 1;
    std::fs::set_permissions(
        &published,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    std::fs::write(&published, bytes).unwrap();
    assert!(!verify().status.success(), "a changed file still verified");
}

/// With --publish-signing-key, an artifact a deployment pushed to an oci
/// target gets its signature attached as an OCI referrer: listed under the
/// referrers tag `sha256-HEX` of its manifest (the CNCF registry 2.x has no
/// referrers API), its layer the `model.sig` that the reference tool
/// verifies over the artifact's files as a consumer pulls them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oci_artifact_gets_its_signature_as_a_referrer_the_reference_tool_verifies() {
    let Some(tool) = reference_tool() else {
        return;
    };
    let registry = crate::support::registry::Registry::with_login();
    let temp = TempDir::new().unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"registry\"\nurl = \"oci://{}/models/\"\n\
             options = {{ username = \"{}\", password = \"${{REGISTRY_PASSWORD}}\" }}\n",
            registry.host,
            crate::support::registry::USER
        ),
    )
    .unwrap();
    let files = crate::support::files::FileServer::start().await;
    let server = Berth::options(Backend::Sqlite)
        .plugin("oci-publish", plugins::example("oci-publish"))
        .plugins_file("oci-publish.toml", "targets = [\"registry\"]\n")
        .arg(&format!("--sources-file={}", path(&sources)))
        .arg(&format!(
            "--publish-signing-key={}",
            path(&signing("key-p256.pem"))
        ))
        .env("REGISTRY_PASSWORD", crate::support::registry::PASSWORD)
        .start()
        .await;
    let contents = crate::support::adapter_files();
    let id = server
        .register(&crate::support::model(&files, "job-oci-signed", &contents))
        .await;
    let (status, deployment) = server.deploy(id, "oci-publish", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed", "{deployment}");
    let reference = deployment["ref"].as_str().unwrap();
    let subject = reference.rsplit_once("@sha256:").unwrap().1.to_string();
    let last = deployment["published"].as_array().unwrap().last().unwrap();
    assert_eq!(
        last["key"],
        "job-oci-signed-adapter:job-oci-signed/model.sig"
    );
    assert!(
        server
            .deployment_log(&deployment["id"])
            .await
            .contains("signed the 3 file(s) of oci://"),
        "the artifact's three layers"
    );

    // What a consumer does: the referrers of the manifest, the signature
    // among them, the files by their titles.
    let repo = format!("{}models/job-oci-signed-adapter", registry.api());
    let http = reqwest::Client::new();
    let get = |url: String, accept: &'static str| {
        http.get(url)
            .basic_auth(
                crate::support::registry::USER,
                Some(crate::support::registry::PASSWORD),
            )
            .header("accept", accept)
            .send()
    };
    let index: Value = get(
        format!("{repo}/manifests/sha256-{subject}"),
        "application/vnd.oci.image.index.v1+json",
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let referrers = index["manifests"].as_array().unwrap();
    assert_eq!(referrers.len(), 1, "{index}");
    assert_eq!(
        referrers[0]["artifactType"],
        "application/vnd.dev.sigstore.bundle.v0.3+json"
    );
    let manifest = "application/vnd.oci.image.manifest.v1+json";
    let signature: Value = get(
        format!(
            "{repo}/manifests/{}",
            referrers[0]["digest"].as_str().unwrap()
        ),
        manifest,
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(signature["subject"]["digest"], format!("sha256:{subject}"));
    let artifact: Value = get(format!("{repo}/manifests/sha256:{subject}"), manifest)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pulled = temp.path().join("pulled");
    std::fs::create_dir(&pulled).unwrap();
    let layers = artifact["layers"].as_array().unwrap();
    for layer in layers.iter().chain(signature["layers"].as_array().unwrap()) {
        let title = layer["annotations"]["org.opencontainers.image.title"]
            .as_str()
            .unwrap();
        let url = format!("{repo}/blobs/{}", layer["digest"].as_str().unwrap());
        let bytes = get(url, "*/*").await.unwrap().bytes().await.unwrap();
        let to = pulled.join(title);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, bytes).unwrap();
    }
    let verify = || {
        Command::new(&tool)
            .args(["verify", "key", "--public_key"])
            .arg(signing("key-p256.pub.pem"))
            .arg("--signature")
            .arg(pulled.join("model.sig"))
            .arg(&pulled)
            .output()
            .unwrap()
    };
    let verified = verify();
    assert!(
        verified.status.success(),
        "model_signing refused the attached signature: {}{}",
        lossy(&verified.stdout),
        lossy(&verified.stderr)
    );
    // It covers the artifact's files: one more, and the tool refuses it.
    std::fs::write(pulled.join("extra.bin"), b"not in the artifact").unwrap();
    assert!(!verify().status.success(), "an extra file still verified");
}

/// Sigstore keyless, offline: a real bundle from the public-good instance
/// (`tests/data/signing/sigstore/`), registered with its folder to a server
/// whose signer is a Sigstore identity over the trusted root; it deploys
/// under `require`; a changed file does not. The reference tool verifies
/// the same folder offline with the same trusted root.
async fn a_keyless_signature_is_verified_offline_for_its_identity_as_the_reference_tool_does(
    backend: Backend,
) {
    let (identity, issuer) = (
        "stefanb@us.ibm.com",
        "https://sigstore.verify.ibm.com/oauth2",
    );
    let temp = TempDir::new().unwrap();
    let signer = temp.path().join("sigstore-signer.toml");
    std::fs::write(
        &signer,
        format!(
            "trusted_root = \"{}\"\nidentity = \"*@us.ibm.com\"\nissuer = \"{issuer}\"\n",
            path(&signing("sigstore/trusted_root.json"))
        ),
    )
    .unwrap();
    let server = Berth::options(backend)
        .arg("--model-signatures=require")
        .arg(&format!("--model-signer={}", path(&signer)))
        .start()
        .await;
    let copy = |name: &str| {
        let dir = temp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for file in ["signme-1", "signme-2", "ignore-me"] {
            std::fs::copy(signing(&format!("sigstore/model/{file}")), dir.join(file)).unwrap();
        }
        std::fs::copy(signing("sigstore/model.sig"), dir.join("model.sig")).unwrap();
        dir
    };
    let dir = copy("keyless");
    expect_success(&register(&server.url, &dir, "keyless"));
    let signed = model(&server, "keyless").await;
    assert_eq!(signed["signature"]["verified"], true, "{signed}");
    assert_eq!(signed["signature"]["method"], "Sigstore keyless identity");
    assert_eq!(
        signed["signature"]["signer"],
        format!("Sigstore identity {identity} (issuer {issuer}, log entry 598151086)")
    );
    let id = signed["id"].as_i64().unwrap();
    let (status, deployment) = server.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed", "{deployment}");

    let changed = copy("changed");
    std::fs::write(changed.join("signme-2"), b"changed\n").unwrap();
    expect_success(&register(&server.url, &changed, "keyless-changed"));
    let refused = model(&server, "keyless-changed").await;
    assert_eq!(refused["signature"]["verified"], false, "{refused}");
    assert!(
        refused["signature"]["error"]
            .as_str()
            .unwrap()
            .contains("signme-2 was signed with sha256"),
        "{refused}"
    );
    let id = refused["id"].as_i64().unwrap();
    let (status, refusal) = server.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refusal}");

    let Some(tool) = reference_tool() else {
        return;
    };
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(signing(name)).unwrap()).unwrap()
    };
    let trust_config = temp.path().join("trust_config.json");
    let config = json!({
        "mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
        "trustedRoot": read("sigstore/trusted_root.json"),
        "signingConfig": read("sigstore/signing_config.json"),
    });
    std::fs::write(&trust_config, config.to_string()).unwrap();
    let verified = Command::new(&tool)
        .args(["verify", "sigstore", "--trust_config"])
        .arg(&trust_config)
        .args(["--identity", identity, "--identity_provider", issuer])
        .arg("--ignore-paths")
        .arg(dir.join("ignore-me"))
        .arg("--signature")
        .arg(dir.join("model.sig"))
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "model_signing refused the keyless fixture offline: {}{}",
        lossy(&verified.stdout),
        lossy(&verified.stderr)
    );
}
