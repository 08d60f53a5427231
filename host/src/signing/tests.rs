//! Verification against signatures the reference tool wrote
//! (`tests/data/signing/`, made by `scripts/make-signing-fixtures`), and
//! their tampered variants derived here.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use super::*;
use crate::model::ModelFile;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/signing")
}

#[track_caller]
fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The model folder as berth would record it: every regular file with its
/// size and sha256.
pub(super) fn record(dir: &Path) -> Vec<ModelFile> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<ModelFile>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.push(ModelFile {
                    path: path
                        .strip_prefix(root)
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .replace('\\', "/"),
                    size_bytes: bytes.len() as u64,
                    sha256: Some(hex::encode(Sha256::digest(&bytes))),
                    format: None,
                });
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn model() -> Vec<ModelFile> {
    record(&fixtures().join("model"))
}

#[track_caller]
fn file<'a>(files: &'a mut [ModelFile], path: &str) -> &'a mut ModelFile {
    files
        .iter_mut()
        .find(|f| f.path == path)
        .expect("a file of the fixture model")
}

fn key(name: &str) -> Trust {
    Trust::public_key_pem(&read(name)).unwrap()
}

fn root_ca() -> Trust {
    Trust::ca_certificates_pem(&read("ca/root.pem")).unwrap()
}

const SIGNED: [&str; 3] = [
    "config.json",
    "generation_config.json",
    "tokenizer/tokenizer_config.json",
];

/// The bundle with its statement changed by `edit` and re-encoded, the
/// signature left as the tool wrote it.
fn with_payload(sig: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut bundle: serde_json::Value = serde_json::from_slice(sig).unwrap();
    let mut payload = b64
        .decode(bundle["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    edit(&mut payload);
    bundle["dsseEnvelope"]["payload"] = b64.encode(&payload).into();
    serde_json::to_vec(&bundle).unwrap()
}

#[test]
fn key_signatures_of_the_tool_verify_p256_and_p384() {
    for name in ["key-p256", "key-p384"] {
        let trust = key(&format!("{name}.pub.pem"));
        let verified = verify(&read(&format!("{name}.sig")), &trust, &model())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(verified.method, Method::Key);
        assert_eq!(verified.files_checked, SIGNED);
        assert_eq!(
            verified.files_ignored,
            ["NOTES.md"],
            "the signer's --ignore-paths"
        );
        assert_eq!(
            verified.signer,
            Signer::Key {
                key_id: trust.key_id().unwrap()
            }
        );
    }
}

#[test]
fn key_id_is_the_sha256_of_the_pem_the_tool_hints() {
    for name in ["key-p256", "key-p384"] {
        let pem = read(&format!("{name}.pub.pem"));
        let id = key(&format!("{name}.pub.pem")).key_id().unwrap();
        assert_eq!(
            id,
            hex::encode(Sha256::digest(&pem)),
            "{name}: openssl's PEM text"
        );
        let bundle: serde_json::Value =
            serde_json::from_slice(&read(&format!("{name}.sig"))).unwrap();
        assert_eq!(
            bundle["verificationMaterial"]["publicKey"]["hint"],
            id.as_str(),
            "{name}"
        );
    }
}

#[test]
fn certificate_signature_of_the_tool_verifies_to_the_root() {
    let verified = verify(&read("certificate.sig"), &root_ca(), &model()).unwrap();
    assert_eq!(verified.method, Method::Certificate);
    assert_eq!(verified.files_checked, SIGNED);
    assert_eq!(
        verified.signer,
        Signer::Certificate {
            subject: "O=berth tests, CN=model signer".to_owned(),
            names: vec!["email:signer@example.com".to_owned()],
            issuer: "O=berth tests, CN=berth test intermediate".to_owned(),
        }
    );
}

#[test]
fn an_intermediate_configured_as_the_ca_is_a_trust_anchor() {
    let trust = Trust::ca_certificates_pem(&read("ca/intermediate.pem")).unwrap();
    verify(&read("certificate.sig"), &trust, &model()).unwrap();
}

#[track_caller]
fn refused(sig: &[u8], trust: &Trust, files: &[ModelFile]) -> (Error, String) {
    let e = verify(sig, trust, files).expect_err("must be refused");
    let message = e.to_string();
    (e, message)
}

#[test]
fn another_root_is_not_trusted_and_says_the_time_policy() {
    let other = Trust::ca_certificates_pem(&read("ca/other-root.pem")).unwrap();
    let (e, message) = refused(&read("certificate.sig"), &other, &model());
    assert!(matches!(e, Error::Untrusted { .. }), "{e:?}");
    assert!(
        message.contains("\"O=berth tests, CN=model signer\" does not chain to a configured CA"),
        "{message}"
    );
    assert!(
        message.contains("checked at the certificate's notBefore"),
        "{message}"
    );
}

#[test]
fn a_wrong_key_is_named_by_the_hint() {
    let (e, message) = refused(&read("key-p256.sig"), &key("other-p256.pub.pem"), &model());
    assert!(matches!(e, Error::WrongKey { .. }), "{e:?}");
    assert!(
        message.starts_with("model.sig was signed by key sha256:0a3d"),
        "{message}"
    );
}

#[test]
fn a_wrong_key_without_a_hint_fails_the_signature() {
    let mut bundle: serde_json::Value = serde_json::from_slice(&read("key-p256.sig")).unwrap();
    bundle["verificationMaterial"]["publicKey"] = serde_json::json!({});
    let sig = serde_json::to_vec(&bundle).unwrap();
    verify(&sig, &key("key-p256.pub.pem"), &model()).expect("no hint: the tool only warns");
    let (e, message) = refused(&sig, &key("other-p256.pub.pem"), &model());
    assert!(matches!(e, Error::BadSignature { .. }), "{e:?}");
    assert!(
        message.contains("does not verify with key sha256:"),
        "{message}"
    );
}

#[test]
fn a_byte_changed_in_the_signed_digests_fails_the_signature() {
    let sig = with_payload(&read("key-p256.sig"), |p| {
        let at = String::from_utf8_lossy(p).find("e9f6ab4b").unwrap();
        p[at] = b'f';
    });
    let (e, _) = refused(&sig, &key("key-p256.pub.pem"), &model());
    assert!(matches!(e, Error::BadSignature { .. }), "{e:?}");
    let sig = with_payload(&read("certificate.sig"), |p| p.push(b'\n'));
    let (e, _) = refused(&sig, &root_ca(), &model());
    assert!(matches!(e, Error::BadSignature { .. }), "{e:?}");
}

#[test]
fn a_byte_changed_in_the_signature_fails_it() {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut bundle: serde_json::Value = serde_json::from_slice(&read("key-p384.sig")).unwrap();
    let mut sig = b64
        .decode(
            bundle["dsseEnvelope"]["signatures"][0]["sig"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    let last = sig.len() - 1;
    sig[last] ^= 1;
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = b64.encode(&sig).into();
    let (e, _) = refused(
        &serde_json::to_vec(&bundle).unwrap(),
        &key("key-p384.pub.pem"),
        &model(),
    );
    assert!(matches!(e, Error::BadSignature { .. }), "{e:?}");
}

#[test]
fn a_dropped_an_added_and_a_changed_file_are_each_named() {
    let sig = read("key-p256.sig");
    let trust = key("key-p256.pub.pem");
    let mut dropped = model();
    dropped.retain(|f| f.path != "generation_config.json");
    let (e, message) = refused(&sig, &trust, &dropped);
    assert!(
        matches!(&e, Error::Files { problems, .. }
        if problems == &[FileProblem::Missing { path: "generation_config.json".into() }]),
        "{e:?}"
    );
    assert!(
        message.contains("generation_config.json is signed but not a file of the model"),
        "{message}"
    );

    let mut added = model();
    added.push(ModelFile {
        path: "extra.bin".into(),
        size_bytes: 1,
        sha256: Some("00".repeat(32)),
        format: None,
    });
    let (_, message) = refused(&sig, &trust, &added);
    assert!(
        message.contains("extra.bin is a file of the model but the signature does not cover it"),
        "{message}"
    );

    let mut changed = model();
    file(&mut changed, "config.json").sha256 = Some("ab".repeat(32));
    let (e, message) = refused(&sig, &trust, &changed);
    assert!(
        matches!(&e, Error::Files { problems, .. } if matches!(&problems[0],
        FileProblem::Differs { path, .. } if path == "config.json")),
        "{e:?}"
    );
    assert!(
        message.contains("config.json was signed with sha256 e9f6ab4b"),
        "{message}"
    );
    assert!(
        message.contains(&format!("recorded with {}", "ab".repeat(32))),
        "{message}"
    );
}

#[test]
fn model_sig_itself_and_ignored_paths_are_left_out() {
    let mut files = model();
    files.push(ModelFile {
        path: "model.sig".into(),
        size_bytes: 10,
        sha256: Some("cd".repeat(32)),
        format: None,
    });
    files.push(ModelFile {
        path: ".git/HEAD".into(),
        size_bytes: 10,
        sha256: None,
        format: None,
    });
    let verified = verify(&read("key-p256.sig"), &key("key-p256.pub.pem"), &files).unwrap();
    assert_eq!(verified.files_checked, SIGNED);
    assert_eq!(
        verified.files_ignored,
        [".git/HEAD", "NOTES.md", "model.sig"]
    );
    // A folder ignores what is under it, not a longer name beside it.
    files.push(ModelFile {
        path: ".gitx".into(),
        size_bytes: 1,
        sha256: Some("00".repeat(32)),
        format: None,
    });
    let (_, message) = refused(&read("key-p256.sig"), &key("key-p256.pub.pem"), &files);
    assert!(
        message.contains(".gitx is a file of the model"),
        "{message}"
    );
}

#[test]
fn what_berth_cannot_compare_is_unverifiable_never_verified() {
    let trust = key("key-p256.pub.pem");
    for (sig, why) in [
        ("key-p256-blake2.sig", "signed with blake2b digests"),
        (
            "key-p256-shards.sig",
            "signed in shards (sha256-sharded-64)",
        ),
    ] {
        let (e, message) = refused(&read(sig), &trust, &model());
        assert!(
            matches!(&e, Error::Unverifiable { paths, .. } if paths == &SIGNED),
            "{sig}: {e:?}"
        );
        assert!(
            message.contains("3 files cannot be verified without re-reading"),
            "{message}"
        );
        assert!(message.contains(why), "{sig}: {message}");
    }
    let mut unhashed = model();
    file(&mut unhashed, "generation_config.json").sha256 = None;
    let (e, message) = refused(&read("key-p256.sig"), &trust, &unhashed);
    assert!(
        matches!(&e, Error::Unverifiable { paths, .. } if paths == &["generation_config.json"]),
        "{e:?}"
    );
    assert!(
        message.contains("1 file cannot be verified without re-reading: berth recorded no sha256"),
        "{message}"
    );
    // A definite difference wins over what cannot be compared.
    let mut dropped = model();
    dropped.pop();
    let (e, _) = refused(&read("key-p256-shards.sig"), &trust, &dropped);
    assert!(matches!(e, Error::Files { .. }), "{e:?}");
}

#[test]
fn a_method_other_than_the_configured_one_is_named() {
    let (e, message) = refused(&read("certificate.sig"), &key("key-p256.pub.pem"), &model());
    assert!(
        matches!(
            e,
            Error::MethodMismatch {
                configured: Method::Key,
                found: Method::Certificate
            }
        ),
        "{e:?}"
    );
    assert!(
        message.contains(
            "signed with a certificate chain, but berth is configured to trust a bare public key"
        ),
        "{message}"
    );
    let (e, _) = refused(&read("key-p256.sig"), &root_ca(), &model());
    assert!(matches!(e, Error::MethodMismatch { .. }), "{e:?}");
}

#[test]
fn not_a_signature_says_so() {
    for (bytes, says) in [
        (&b"{"[..], "not a Sigstore bundle as JSON"),
        (br#"{"mediaType":"x","verificationMaterial":{"publicKey":{}}}"#, "media type \"x\""),
        (br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{"publicKey":{}}}"#, "no DSSE envelope"),
    ] {
        let (e, message) = refused(bytes, &key("key-p256.pub.pem"), &model());
        assert!(matches!(e, Error::Malformed(_)), "{e:?}");
        assert!(message.contains(says), "{message}");
    }
    let keyless = br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{"certificate":{"rawBytes":""}},"dsseEnvelope":{"payload":"","payloadType":"x","signatures":[{"sig":""}]}}"#;
    let (e, message) = refused(keyless, &root_ca(), &model());
    assert!(matches!(e, Error::Malformed(_)), "{e:?}");
    assert!(message.contains("no transparency-log entry"), "{message}");
}

#[test]
fn unusable_trust_is_refused_when_read() {
    let e = Trust::public_key_pem(&read("ca/root.pem"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("expected a PEM PUBLIC KEY block, found CERTIFICATE"),
        "{e}"
    );
    let e = Trust::ca_certificates_pem(&read("key-p256.pub.pem"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no PEM CERTIFICATE block"), "{e}");
    let e = Trust::public_key_pem(b"junk").unwrap_err().to_string();
    assert!(e.starts_with("signing trust: "), "{e}");
}

#[test]
fn what_berth_signs_verifies_and_covers_exactly_the_files() {
    for name in ["key-p256", "key-p384"] {
        let signing = SigningKey::from_pkcs8_pem(&read(&format!("{name}.pem"))).unwrap();
        let trust = key(&format!("{name}.pub.pem"));
        assert_eq!(signing.key_id(), trust.key_id().unwrap(), "{name}");
        assert_eq!(
            signing.public_key_pem().as_bytes(),
            read(&format!("{name}.pub.pem")),
            "{name}"
        );
        let files: Vec<ModelFile> = model()
            .into_iter()
            .filter(|f| f.path != "NOTES.md")
            .collect();
        let sig = sign(&signing, "model", &files).unwrap();
        let verified = verify(&sig, &trust, &files).unwrap();
        assert_eq!(verified.files_checked, SIGNED);
        let (e, _) = refused(&sig, &trust, &model());
        assert!(
            matches!(e, Error::Files { .. }),
            "NOTES.md was not signed: {e:?}"
        );
    }
    let signing = SigningKey::from_pkcs8_pem(&read("key-p256.pem")).unwrap();
    let mut files = model();
    files[0].sha256 = None;
    let e = sign(&signing, "model", &files).unwrap_err().to_string();
    assert_eq!(e, "cannot sign: no sha256 is recorded for NOTES.md");
}

/// The keyless fixture: a real bundle from Sigstore's public-good
/// instance, with the trusted root it chains to (`sigstore/README.md`).
mod keyless {
    use super::*;

    const IDENTITY: &str = "stefanb@us.ibm.com";
    const ISSUER: &str = "https://sigstore.verify.ibm.com/oauth2";

    fn trust(root: &[u8], identity: &str, issuer: &str) -> Trust {
        Trust::sigstore(root, identity, issuer).unwrap()
    }

    fn signed() -> Vec<ModelFile> {
        record(&fixtures().join("sigstore/model"))
    }

    #[test]
    fn a_keyless_signature_verifies_offline_for_its_identity() {
        let root = read("sigstore/trusted_root.json");
        let verified = verify(
            &read("sigstore/model.sig"),
            &trust(&root, IDENTITY, ISSUER),
            &signed(),
        )
        .unwrap();
        assert_eq!(verified.method, Method::Sigstore);
        assert_eq!(
            verified.signer,
            Signer::Sigstore {
                identity: IDENTITY.into(),
                issuer: ISSUER.into(),
                log_index: 598151086,
            }
        );
        assert_eq!(verified.files_checked, ["signme-1", "signme-2"]);
        assert_eq!(verified.files_ignored, ["ignore-me"]);
        // A pattern for the identity.
        let pattern = trust(&root, "*@us.ibm.com", ISSUER);
        assert!(verify(&read("sigstore/model.sig"), &pattern, &signed()).is_ok());
    }

    #[test]
    fn another_identity_or_issuer_is_refused_naming_the_signer() {
        let root = read("sigstore/trusted_root.json");
        for (identity, issuer) in [
            ("someone@us.ibm.com", ISSUER),
            (IDENTITY, "https://accounts.google.com"),
        ] {
            let (e, message) = refused(
                &read("sigstore/model.sig"),
                &trust(&root, identity, issuer),
                &signed(),
            );
            assert!(matches!(e, Error::OtherIdentity { .. }), "{e:?}");
            assert!(
                message.contains(&format!(
                    "signed by {IDENTITY} (issuer {ISSUER}), not by the configured identity"
                )),
                "{message}"
            );
        }
    }

    #[test]
    fn a_changed_log_entry_statement_or_file_is_refused() {
        let root = read("sigstore/trusted_root.json");
        let trusted = trust(&root, IDENTITY, ISSUER);
        let bundle: serde_json::Value =
            serde_json::from_slice(&read("sigstore/model.sig")).unwrap();
        let changed = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut bundle = bundle.clone();
            edit(&mut bundle);
            serde_json::to_vec(&bundle).unwrap()
        };
        let entry = "/verificationMaterial/tlogEntries/0";
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                changed(&|b| {
                    let index = b.pointer_mut(&format!("{entry}/logIndex")).unwrap();
                    *index = serde_json::json!("598151087");
                }),
                "is not signed by its log",
            ),
            (
                changed(&|b| {
                    let e = b.pointer_mut(entry).unwrap().as_object_mut().unwrap();
                    e.remove("inclusionPromise");
                }),
                "carries no signed entry timestamp",
            ),
            (
                changed(&|b| {
                    let payload = b.pointer_mut("/dsseEnvelope/payload").unwrap();
                    *payload = serde_json::json!("e30=");
                }),
                "records another statement than the one model.sig carries",
            ),
        ];
        for (sig, says) in cases {
            let (e, message) = refused(&sig, &trusted, &signed());
            assert!(matches!(e, Error::Log(_)), "{e:?}");
            assert!(message.contains(says), "{message}");
        }
        let mut files = signed();
        file(&mut files, "signme-2").sha256 = Some("00".repeat(32));
        let (e, _) = refused(&read("sigstore/model.sig"), &trusted, &files);
        assert!(matches!(e, Error::Files { .. }), "{e:?}");
    }

    #[test]
    fn a_root_without_the_log_or_the_ca_does_not_vouch() {
        let mut root: serde_json::Value =
            serde_json::from_slice(&read("sigstore/trusted_root.json")).unwrap();
        // Only the Ed25519 log left: the entry's log is unknown.
        let logs = root["tlogs"].as_array_mut().unwrap();
        let mut other = logs.clone();
        logs.retain(|l| l["publicKey"]["keyDetails"] != "PKIX_ECDSA_P256_SHA_256");
        let without_log = serde_json::to_vec(&root).unwrap();
        assert!(
            Trust::sigstore(&without_log, IDENTITY, ISSUER)
                .unwrap_err()
                .to_string()
                .contains("names no ECDSA transparency-log key")
        );
        // The log kept, a CA of berth's own tests instead of Fulcio's.
        other.truncate(2);
        root["tlogs"] = serde_json::Value::Array(other);
        let der = x509_parser::pem::parse_x509_pem(&read("ca/root.pem"))
            .unwrap()
            .1
            .contents;
        use base64::Engine as _;
        root["certificateAuthorities"][1]["certChain"]["certificates"] = serde_json::json!([{ "rawBytes": base64::engine::general_purpose::STANDARD.encode(der) }]);
        let foreign =
            Trust::sigstore(&serde_json::to_vec(&root).unwrap(), IDENTITY, ISSUER).unwrap();
        let (e, message) = refused(&read("sigstore/model.sig"), &foreign, &signed());
        assert!(matches!(e, Error::Untrusted { .. }), "{e:?}");
        assert!(
            message.contains("when the transparency log recorded the signature"),
            "{message}"
        );
    }

    #[test]
    fn a_keyless_signature_under_a_key_says_which_signer_to_configure() {
        let (e, message) = refused(
            &read("sigstore/model.sig"),
            &key("key-p256.pub.pem"),
            &signed(),
        );
        assert!(matches!(e, Error::MethodMismatch { .. }), "{e:?}");
        assert!(message.contains("configure a Sigstore signer"), "{message}");
    }
}
