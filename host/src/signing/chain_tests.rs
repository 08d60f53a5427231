//! The certificate method's rules where the reference tool's fixtures cannot
//! reach: dates and usages of chains made here with rcgen, signed here the
//! way model_signing signs (the fixtures prove the two agree).

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};

use super::statement;
use super::*;
use crate::model::ModelFile;

fn files() -> Vec<ModelFile> {
    vec![ModelFile {
        path: "weights.bin".into(),
        size_bytes: 3,
        sha256: Some("ab".repeat(32)),
        format: None,
    }]
}

fn root(from: i32, until: i32) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "chain test root");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    params.not_before = date_time_ymd(from, 1, 1);
    params.not_after = date_time_ymd(until, 1, 1);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf of `root` valid over [from, until), with these usages, and a
/// `model.sig` it signed over `files()` (the certificate method's bundle).
fn signed(
    root: &CertifiedIssuer<'static, KeyPair>,
    (from, until): (i32, i32),
    edit: impl FnOnce(&mut CertificateParams),
) -> Vec<u8> {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "chain test signer");
    params.not_before = date_time_ymd(from, 1, 1);
    params.not_after = date_time_ymd(until, 1, 1);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    edit(&mut params);
    let leaf = params.signed_by(&key, root).unwrap();
    let signing = SigningKey::from_pkcs8_pem(key.serialize_pem().as_bytes()).unwrap();
    let payload = statement::write("m", &[("weights.bin", &"ab".repeat(32))]);
    let signature = signing.sign_payload(&payload).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let material = serde_json::json!({
        "x509CertificateChain": { "certificates": [{ "rawBytes": b64.encode(leaf.der()) }] }
    });
    bundle::write(material, &payload, &signature)
}

fn trust(root: &CertifiedIssuer<'static, KeyPair>) -> Trust {
    Trust::ca_certificates_pem(root.pem().as_bytes()).unwrap()
}

#[test]
fn a_certificate_expired_since_signing_still_verifies() {
    let ca = root(2000, 2100);
    let sig = signed(&ca, (2001, 2002), |_| {});
    let verified = verify(&sig, &trust(&ca), &files()).unwrap();
    assert_eq!(verified.files_checked, ["weights.bin"]);
}

#[test]
fn a_certificate_issued_outside_its_cas_validity_is_refused() {
    let ca = root(2010, 2100);
    let e = verify(&signed(&ca, (2005, 2030), |_| {}), &trust(&ca), &files()).unwrap_err();
    assert!(matches!(e, Error::Untrusted { .. }), "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains("the configured CA \"CN=chain test root\" is not valid at that time"),
        "{message}"
    );
    assert!(message.contains("notBefore, Sat, 01 Jan 2005"), "{message}");
}

#[test]
fn the_leaf_must_be_allowed_to_sign() {
    let ca = root(2000, 2100);
    let server = signed(&ca, (2001, 2030), |p| {
        p.key_usages = vec![KeyUsagePurpose::KeyEncipherment];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    });
    let e = verify(&server, &trust(&ca), &files()).unwrap_err();
    assert!(matches!(e, Error::NotForSigning { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("neither the digitalSignature key usage nor the codeSigning"),
        "{e}"
    );

    let code_signing = signed(&ca, (2001, 2030), |p| {
        p.key_usages = vec![];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    });
    verify(&code_signing, &trust(&ca), &files()).expect("codeSigning alone is enough");

    let ca_leaf = signed(&ca, (2001, 2030), |p| {
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained)
    });
    let e = verify(&ca_leaf, &trust(&ca), &files()).unwrap_err();
    assert!(
        e.to_string()
            .contains("the signing certificate is a CA certificate"),
        "{e}"
    );
}
