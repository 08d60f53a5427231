//! Signed plugins: keys and signatures made by the real `berth plugin
//! keygen` and `berth plugin sign`, a real `berth serve` with a plugins
//! folder of signed, unsigned, untrusted, tampered and pinned plugins, with
//! `--require-signed` off and on, judged by `GET /v1/deployers`; a signature
//! added to a served plugin; the start refused for bad settings.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{expect_success, lossy, path};
use crate::support::server::{Backend, Berth};
use crate::support::{eventually, plugins, sha256_hex};

/// A key pair made by `berth plugin keygen` in a folder of its own (the
/// tests of pulled deployers sign with it too).
pub struct Key {
    _dir: TempDir,
    secret: PathBuf,
    /// The public key's line, as `--trusted-key` takes it.
    pub public: String,
    pub id: String,
}

impl Key {
    pub fn new() -> Self {
        let dir = TempDir::new().unwrap();
        let secret = dir.path().join("author.key");
        let printed = expect_success(&berth(&["plugin", "keygen", "--out", path(&secret)]));
        let pub_file = std::fs::read_to_string(dir.path().join("author.key.pub")).unwrap();
        let public = pub_file.lines().nth(1).unwrap().to_string();
        let id = printed
            .lines()
            .find_map(|l| l.strip_prefix("key id:"))
            .unwrap_or_else(|| panic!("keygen prints the key id: {printed}"))
            .trim()
            .to_string();
        assert!(
            printed.contains(&format!("berth serve --trusted-key {public}")),
            "{printed}"
        );
        assert!(
            pub_file.starts_with(&format!("untrusted comment: minisign public key: {id}\n")),
            "{pub_file}"
        );
        Self {
            _dir: dir,
            secret,
            public,
            id,
        }
    }

    /// Signs `bytes` with `berth plugin sign`: the signature's text.
    pub fn sign(&self, bytes: &[u8]) -> String {
        let dir = TempDir::new().unwrap();
        let file = dir.path().join("p.wasm");
        std::fs::write(&file, bytes).unwrap();
        let printed = expect_success(&berth(&[
            "plugin",
            "sign",
            path(&file),
            "--key",
            path(&self.secret),
        ]));
        assert!(
            printed.contains(&format!("with key {}", self.id)),
            "{printed}"
        );
        std::fs::read_to_string(dir.path().join("p.wasm.sig")).unwrap()
    }
}

fn berth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .output()
        .expect("running berth")
}

/// The served deployers' `signed_by`, and the rejections' reasons, by file.
fn outcome(deployers: &Value) -> (BTreeMap<String, Value>, BTreeMap<String, String>) {
    let served = deployers["deployers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["signed_by"].clone(),
            )
        })
        .collect();
    let rejected = deployers["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let reason = r["reason"].as_str().unwrap().to_string();
            (r["file"].as_str().unwrap().to_string(), reason)
        })
        .collect();
    (served, rejected)
}

#[track_caller]
fn assert_reason(rejected: &BTreeMap<String, String>, file: &str, expected: &str) {
    let reason = rejected
        .get(file)
        .unwrap_or_else(|| panic!("{file} is not rejected: {rejected:#?}"));
    assert!(reason.starts_with(expected), "{file}: {reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_load_by_their_signatures_with_signatures_optional_and_required() {
    let (trusted, stranger) = (Key::new(), Key::new());
    let archive = std::fs::read(plugins::example("archive")).unwrap();
    let other = std::fs::read(plugins::test_plugin("misbehave")).unwrap();
    let wrong_pin = sha256_hex(&other);
    // One folder for both servers: every case a name.
    let folder: Vec<(String, Vec<u8>)> = vec![
        ("unsigned.wasm".into(), archive.clone()),
        ("untrusted.wasm".into(), archive.clone()),
        ("untrusted.wasm.sig".into(), stranger.sign(&archive).into()),
        // Signed, then rebuilt: the trusted signature is over other bytes.
        ("tampered.wasm".into(), other.clone()),
        ("tampered.wasm.sig".into(), trusted.sign(&archive).into()),
        ("valid.wasm".into(), archive.clone()),
        ("valid.wasm.sig".into(), trusted.sign(&archive).into()),
        ("garbled.wasm".into(), archive.clone()),
        ("garbled.wasm.sig".into(), b"not a signature".to_vec()),
        ("pinned.wasm".into(), archive.clone()),
        (
            "pinned.toml".into(),
            format!("sha256 = \"{}\"\n", sha256_hex(&archive)).into(),
        ),
        ("mispinned.wasm".into(), archive.clone()),
        (
            "mispinned.toml".into(),
            format!("sha256 = \"{wrong_pin}\"\n").into(),
        ),
        ("orphan.wasm.sig".into(), trusted.sign(&archive).into()),
    ];
    let start = |required: bool| {
        let mut options = Berth::bare(Backend::Sqlite)
            .arg("--trusted-key")
            .arg(&trusted.public);
        if required {
            options = options.arg("--require-signed");
        }
        for (file, bytes) in &folder {
            options = options.plugins_file(file, bytes.clone());
        }
        options.start()
    };
    let archive_sha = sha256_hex(&archive);
    let wrong_pin_reason =
        format!("its sha256 is {archive_sha} but its manifest mispinned.toml pins {wrong_pin}");
    let tampered_reason = format!(
        "its signature by trusted key {} does not match its bytes (Signature verification failed): was it changed or rebuilt after signing? Sign this build again",
        trusted.id
    );

    // Optional: all but the refused signatures and the wrong pin load.
    let optional = start(false).await;
    let (_, body) = optional.get("/v1/deployers").await;
    let (served, rejected) = outcome(&body);
    assert_eq!(
        served,
        BTreeMap::from([
            ("pinned".to_string(), Value::Null),
            ("unsigned".to_string(), Value::Null),
            ("untrusted".to_string(), Value::Null),
            ("valid".to_string(), json!(trusted.id)),
        ]),
        "{body:#}"
    );
    assert_eq!(rejected.len(), 4, "{rejected:#?}");
    assert_reason(&rejected, "tampered.wasm", &tampered_reason);
    assert_reason(&rejected, "mispinned.wasm", &wrong_pin_reason);
    assert_reason(
        &rejected,
        "garbled.wasm",
        "its signature cannot be read (Missing signature): give the text `berth plugin sign` (or `minisign -S`) wrote",
    );
    assert_reason(
        &rejected,
        "orphan.wasm.sig",
        "a signature without a plugin: there is no orphan.wasm beside it",
    );
    assert!(
        optional.log().contains(&format!(
            "plugin untrusted is signed by key {}, which this server does not trust",
            stranger.id
        )),
        "{}",
        optional.log()
    );
    drop(optional);

    // Required: only the validly signed plugin loads.
    let required = start(true).await;
    let (_, body) = required.get("/v1/deployers").await;
    let (served, rejected) = outcome(&body);
    assert_eq!(
        served,
        BTreeMap::from([("valid".to_string(), json!(trusted.id))]),
        "{body:#}"
    );
    assert_eq!(rejected.len(), 7, "{rejected:#?}");
    let unsigned = "is not signed, and this server loads only signed plugins (--require-signed): sign it with `berth plugin sign unsigned.wasm` and give its signature with it (unsigned.wasm.sig beside it in the plugins folder, or with its upload)";
    assert_reason(&rejected, "unsigned.wasm", unsigned);
    assert_reason(
        &rejected,
        "pinned.wasm",
        "is not signed, and this server loads only signed plugins (--require-signed)",
    );
    assert_reason(
        &rejected,
        "untrusted.wasm",
        &format!(
            "is signed by key {}, which this server does not trust (it trusts {}; --trusted-key): sign it with a trusted key, or trust this one",
            stranger.id, trusted.id
        ),
    );
    assert_reason(&rejected, "tampered.wasm", &tampered_reason);
    assert_reason(&rejected, "mispinned.wasm", &wrong_pin_reason);
    assert_reason(&rejected, "garbled.wasm", "its signature cannot be read");
    assert_reason(&rejected, "orphan.wasm.sig", "a signature without a plugin");
    assert!(
        required
            .log()
            .contains("plugin signatures: required: only plugins signed by a trusted key load"),
        "{}",
        required.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signature_put_beside_a_served_plugin_reloads_it() {
    let (trusted, stranger) = (Key::new(), Key::new());
    let berth = Berth::bare(Backend::Sqlite)
        .plugin("archive", plugins::example("archive"))
        .arg("--trusted-key")
        .arg(&trusted.public)
        .arg("--plugins-poll-ms")
        .arg("200")
        .start()
        .await;
    let dir = berth.plugins_dir().to_path_buf();
    let wasm = dir.join("archive.wasm");
    let signed_by = async |expected: Value| {
        eventually(
            || format!("archive signed by {expected}; log:\n{}", berth.log()),
            async || {
                let (_, body) = berth.get("/v1/deployers").await;
                let (served, _) = outcome(&body);
                (served.get("archive") == Some(&expected)).then_some(body)
            },
        )
        .await
    };
    signed_by(Value::Null).await;

    // Signed in place by the real CLI: the watcher reloads it, verified.
    expect_success(&berth_sign(&wasm, &trusted.secret));
    signed_by(json!(trusted.id)).await;

    // A stranger's signature instead: it loads again, unverified.
    expect_success(&berth_sign(&wasm, &stranger.secret));
    signed_by(Value::Null).await;

    // Trusted again, then rebuilt without signing: refused, and the
    // signed version stays serving.
    expect_success(&berth_sign(&wasm, &trusted.secret));
    let body = signed_by(json!(trusted.id)).await;
    let serving = body["deployers"][0]["sha256"].clone();
    let rebuilt = dir.join(".archive.tmp");
    std::fs::copy(plugins::test_plugin("misbehave"), &rebuilt).unwrap();
    std::fs::rename(&rebuilt, &wasm).unwrap();
    let body = eventually(
        || format!("the rebuilt archive refused; log:\n{}", berth.log()),
        async || {
            let (_, body) = berth.get("/v1/deployers").await;
            (!body["rejected"].as_array().unwrap().is_empty()).then_some(body)
        },
    )
    .await;
    let reason = body["rejected"][0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "its signature by trusted key {} does not match its bytes",
            trusted.id
        )),
        "{reason}"
    );
    assert!(
        reason.ends_with(&format!(
            "(still serving the previous version, sha256 {})",
            serving.as_str().unwrap()
        )),
        "{reason}"
    );
    assert_eq!(body["deployers"][0]["signed_by"], json!(trusted.id));
}

fn berth_sign(file: &Path, key: &Path) -> Output {
    berth(&["plugin", "sign", path(file), "--key", path(key)])
}

#[test]
fn the_start_is_refused_for_unusable_signature_settings() {
    let temp = TempDir::new().unwrap();
    let serve = |args: &[&str]| {
        let mut all = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            path(temp.path()),
            "--plugins-dir",
            path(temp.path()),
        ];
        all.extend(args);
        berth(&all)
    };

    let run = serve(&["--require-signed"]);
    assert!(!run.status.success());
    let stderr = lossy(&run.stderr);
    assert!(
        stderr.contains(
            "error: --require-signed needs at least one --trusted-key (BERTH_TRUSTED_KEYS): without a trusted key no plugin could load"
        ),
        "{stderr}"
    );

    let run = serve(&["--trusted-key", "RWQnotakey"]);
    assert_eq!(run.status.code(), Some(2));
    let stderr = lossy(&run.stderr);
    assert!(
        stderr.contains("invalid value 'RWQnotakey' for '--trusted-key <KEY>': \"RWQnotakey\" is not a minisign public key"),
        "{stderr}"
    );
    // Nothing was opened before the refusals.
    assert!(!temp.path().join("berth.db").exists());
}

#[test]
fn keys_are_kept_secret_and_never_overwritten() {
    let key = Key::new();
    let mode = std::fs::metadata(&key.secret).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let before = std::fs::read(&key.secret).unwrap();
    let again = berth(&["plugin", "keygen", "--out", path(&key.secret)]);
    assert!(!again.status.success());
    assert!(
        lossy(&again.stderr).contains("already exists: not overwriting a key"),
        "{}",
        lossy(&again.stderr)
    );
    assert_eq!(std::fs::read(&key.secret).unwrap(), before);
}

#[test]
fn check_tells_whether_the_signature_beside_a_plugin_is_verified() {
    let (trusted, stranger) = (Key::new(), Key::new());
    let temp = TempDir::new().unwrap();
    let wasm = temp.path().join("archive.wasm");
    std::fs::copy(plugins::example("archive"), &wasm).unwrap();
    let cache = plugins::shared_cache();
    let check = |keys: &[&str]| {
        let mut args = vec!["plugin", "check", path(&wasm), "--cache-dir", path(&cache)];
        for key in keys {
            args.extend(["--trusted-key", key]);
        }
        berth(&args)
    };
    let signature = |out: &Output| {
        let printed = expect_success(out);
        printed
            .lines()
            .find_map(|l| l.strip_prefix("signature:"))
            .unwrap_or_else(|| panic!("check prints the signature: {printed}"))
            .trim()
            .to_string()
    };

    assert_eq!(signature(&check(&[])), "none (no .sig beside it)");
    expect_success(&berth_sign(&wasm, &trusted.secret));
    assert_eq!(
        signature(&check(&[])),
        "present, not verified: give --trusted-key KEY to check it"
    );
    assert_eq!(
        signature(&check(&[&trusted.public])),
        format!("verified: signed by trusted key {}", trusted.id)
    );
    assert_eq!(
        signature(&check(&[&stranger.public])),
        "present, by a key not given with --trusted-key"
    );

    std::fs::write(
        &wasm,
        std::fs::read(plugins::test_plugin("misbehave")).unwrap(),
    )
    .unwrap();
    let run = check(&[&trusted.public]);
    assert!(!run.status.success());
    assert!(
        lossy(&run.stdout).contains(&format!(
            "archive.wasm: its signature by trusted key {} does not match its bytes",
            trusted.id
        )),
        "{}",
        lossy(&run.stdout)
    );
}

/// An upload is judged by the same rules as a folder plugin, its signature
/// sent as a form part or in the header; a refused one leaves nothing
/// stored. And a stored deployer is judged again by every server that
/// loads it: one requiring signatures refuses a version another server,
/// which does not, accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_plugins_are_judged_by_the_same_signature_rules_on_every_server() {
    use base64::Engine;
    use reqwest::StatusCode;

    use crate::support::assert_error;
    use crate::support::catalog::{push, refused, served, wait_for_deployers};
    use crate::support::server::Shared;

    let (trusted, stranger) = (Key::new(), Key::new());
    let archive = std::fs::read(plugins::example("archive")).unwrap();
    let other = std::fs::read(plugins::test_plugin("misbehave")).unwrap();
    let shared = Shared::new().await;
    let start = |required: bool| {
        let mut options = Berth::bare(Backend::Postgres)
            .shared(&shared)
            .arg("--trusted-key")
            .arg(&trusted.public);
        if required {
            options = options.arg("--require-signed");
        }
        options.start()
    };
    let open = start(false).await;
    let strict = start(true).await;
    let (valid, untrusted, tampered) = (
        trusted.sign(&archive),
        stranger.sign(&archive),
        trusted.sign(&other),
    );
    let sig = |text: &String| text.clone().into_bytes();

    // Without --require-signed: unsigned and untrusted load unverified; a
    // trusted key's signature over other bytes never loads.
    let (status, body) = push(&open, "unsigned", &[("wasm", &archive)]).await;
    assert_eq!(
        (status, &body["signed_by"]),
        (StatusCode::CREATED, &json!(null)),
        "{body}"
    );
    let parts = [("wasm", &archive[..]), ("signature", &sig(&untrusted)[..])];
    let (status, body) = push(&open, "untrusted", &parts).await;
    assert_eq!(
        (status, &body["signed_by"]),
        (StatusCode::CREATED, &json!(null)),
        "{body}"
    );
    let parts = [("wasm", &archive[..]), ("signature", &sig(&tampered)[..])];
    let answer = push(&open, "tampered", &parts).await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        &format!(
            "deployer tampered was not stored: its signature by trusted key {} does not match its bytes",
            trusted.id
        ),
    );
    let parts = [("wasm", &archive[..]), ("signature", &sig(&valid)[..])];
    let (status, body) = push(&open, "valid", &parts).await;
    assert_eq!(
        (status, &body["signed_by"]),
        (StatusCode::CREATED, &json!(trusted.id)),
        "{body}"
    );

    // With it: only the valid one, here sent in the header.
    let answer = push(&strict, "unsigned-too", &[("wasm", &archive)]).await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "deployer unsigned-too was not stored: is not signed, and this server loads only signed plugins (--require-signed)",
    );
    let parts = [("wasm", &archive[..]), ("signature", &sig(&untrusted)[..])];
    let answer = push(&strict, "untrusted-too", &parts).await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        &format!(
            "is signed by key {}, which this server does not trust",
            stranger.id
        ),
    );
    let header = base64::engine::general_purpose::STANDARD.encode(&valid);
    let response = strict
        .client()
        .put(format!("{}/v1/deployers/valid-too", strict.url))
        .header("content-type", "application/wasm")
        .header("x-berth-plugin-signature", header)
        .body(archive.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["signed_by"], json!(trusted.id), "{body}");
    for name in ["tampered", "unsigned-too", "untrusted-too"] {
        let (status, _) = open.get(&format!("/v1/deployers/{name}/versions")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{name} was stored");
    }

    // What the open server stored unsigned, the strict one refuses to load
    // (listed as refused, from the API); the signed ones it serves.
    let listing = wait_for_deployers(&strict, |l| refused(l, "untrusted.wasm").is_some()).await;
    for (file, reason) in [
        (
            "unsigned.wasm",
            "is not signed, and this server loads only signed plugins".to_string(),
        ),
        (
            "untrusted.wasm",
            format!(
                "is signed by key {}, which this server does not trust",
                stranger.id
            ),
        ),
    ] {
        let refusal = refused(&listing, file).unwrap_or_else(|| panic!("{listing}"));
        assert_eq!(refusal["origin"], "api", "{refusal}");
        assert!(
            refusal["reason"].as_str().unwrap().starts_with(&reason),
            "{refusal}"
        );
    }
    assert_eq!(
        served(&listing, "valid").unwrap()["signed_by"],
        json!(trusted.id)
    );
    assert!(served(&listing, "unsigned").is_none(), "{listing}");
    let listing = wait_for_deployers(&open, |l| served(l, "valid-too").is_some()).await;
    assert_eq!(served(&listing, "unsigned").unwrap()["origin"], "api");
}
