//! Against the reference tool at test time: `model_signing` (installed into
//! `.venv` by `scripts/setup test`) signs a fresh folder and berth verifies
//! it; berth signs one and `model_signing verify` accepts it. Without the
//! tool a local run skips with a sentence; CI (`CI` set) fails instead, so
//! the interop is never silently untested there.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::tests::record;
use super::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/signing")
}

/// The tool, or `None` (with the sentence printed) where a local run may skip.
fn tool() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/model_signing");
    if path.exists() {
        return Some(path);
    }
    let why = format!(
        "{} not found; `scripts/setup test` installs it",
        path.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipped: {why}");
    None
}

#[track_caller]
fn run(command: &mut Command) -> Result<(), String> {
    let out = command.output().expect("model_signing runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A small model folder of its own, with a subfolder.
fn fresh_model() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("fresh");
    std::fs::create_dir_all(model.join("weights")).unwrap();
    std::fs::write(model.join("config.json"), br#"{"hidden_size": 8}"#).unwrap();
    let weights: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(
        model.join("weights/model-00001-of-00002.safetensors"),
        &weights,
    )
    .unwrap();
    std::fs::write(
        model.join("weights/model-00002-of-00002.safetensors"),
        &weights[..777],
    )
    .unwrap();
    (dir, model)
}

#[test]
fn fresh_signatures_of_the_tool_verify() {
    let Some(tool) = tool() else { return };
    let (_dir, model) = fresh_model();
    let sig = model.join("model.sig");
    let f = fixtures();
    run(Command::new(&tool)
        .args(["sign", "key", "--private_key"])
        .arg(f.join("key-p384.pem"))
        .arg("--signature")
        .arg(&sig)
        .arg(&model))
    .unwrap();
    let trust = Trust::public_key_pem(&std::fs::read(f.join("key-p384.pub.pem")).unwrap()).unwrap();
    let files = record(&model);
    let verified = verify(&std::fs::read(&sig).unwrap(), &trust, &files).unwrap();
    assert_eq!(verified.files_checked.len(), 3);
    assert_eq!(verified.files_ignored, ["model.sig"]);

    run(Command::new(&tool)
        .args(["sign", "certificate", "--private_key"])
        .arg(f.join("ca/leaf-key.pem"))
        .arg("--signing_certificate")
        .arg(f.join("ca/leaf.pem"))
        .arg("--certificate_chain")
        .arg(f.join("ca/intermediate.pem"))
        .arg("--signature")
        .arg(&sig)
        .arg(&model))
    .unwrap();
    let root = Trust::ca_certificates_pem(&std::fs::read(f.join("ca/root.pem")).unwrap()).unwrap();
    let verified = verify(&std::fs::read(&sig).unwrap(), &root, &files).unwrap();
    assert_eq!(verified.method, Method::Certificate);
    assert_eq!(verified.files_checked.len(), 3);
}

#[test]
fn what_berth_signs_passes_the_tools_verify() {
    let Some(tool) = tool() else { return };
    let f = fixtures();
    for name in ["key-p256", "key-p384"] {
        let (_dir, model) = fresh_model();
        let key =
            SigningKey::from_pkcs8_pem(&std::fs::read(f.join(format!("{name}.pem"))).unwrap())
                .unwrap();
        let sig = model.join("model.sig");
        std::fs::write(&sig, sign(&key, "fresh", &record(&model)).unwrap()).unwrap();
        let verify_key = |model: &Path| {
            run(Command::new(&tool)
                .args(["verify", "key", "--public_key"])
                .arg(f.join(format!("{name}.pub.pem")))
                .arg("--signature")
                .arg(&sig)
                .arg(model))
        };
        verify_key(&model)
            .unwrap_or_else(|e| panic!("{name}: model_signing refused berth's model.sig: {e}"));
        // And the tool does check it: a changed byte fails.
        std::fs::write(model.join("config.json"), br#"{"hidden_size": 9}"#).unwrap();
        let refused = verify_key(&model).expect_err("a changed file must fail");
        assert!(refused.contains("config.json"), "{name}: {refused}");
    }
}
