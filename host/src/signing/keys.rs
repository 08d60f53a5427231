//! ECDSA public keys as OMS uses them: read from PEM or a certificate's
//! SubjectPublicKeyInfo, checked with ring, and named by the sha256 of their
//! PEM text (the reference tool's hint, berth's key id).

use base64::Engine as _;
use ring::signature::{ECDSA_P256_SHA256_ASN1, ECDSA_P384_SHA384_ASN1, UnparsedPublicKey};
use sha2::{Digest as _, Sha256};
use x509_parser::prelude::FromDer as _;
use x509_parser::x509::SubjectPublicKeyInfo;

const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const P256: &str = "1.2.840.10045.3.1.7";
const P384: &str = "1.3.132.0.34";
const P521: &str = "1.3.132.0.35";

/// The SubjectPublicKeyInfo DER before the uncompressed point, per curve:
/// SEQUENCE { SEQUENCE { id-ecPublicKey, namedCurve }, BIT STRING }.
const P256_SPKI_PREFIX: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
const P384_SPKI_PREFIX: &[u8] = &[
    0x30, 0x76, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b,
    0x81, 0x04, 0x00, 0x22, 0x03, 0x62, 0x00,
];

/// The curves berth checks; the hash goes with the curve, as model_signing
/// pairs them (P-256 with SHA-256, P-384 with SHA-384).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Curve {
    P256,
    P384,
}

impl Curve {
    fn spki_prefix(self) -> &'static [u8] {
        match self {
            Curve::P256 => P256_SPKI_PREFIX,
            Curve::P384 => P384_SPKI_PREFIX,
        }
    }

    fn point_len(self) -> usize {
        match self {
            Curve::P256 => 65,
            Curve::P384 => 97,
        }
    }
}

/// An ECDSA public key, P-256 or P-384.
#[derive(Debug, Clone)]
pub(super) struct PublicKey {
    curve: Curve,
    /// SEC1 uncompressed: 0x04 ‖ x ‖ y.
    point: Vec<u8>,
}

impl PublicKey {
    /// The first `PUBLIC KEY` block of a PEM text.
    pub(super) fn from_pem(pem: &[u8]) -> Result<PublicKey, String> {
        let mut labels = Vec::new();
        for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
            let block = block.map_err(|e| format!("not PEM text ({e})"))?;
            if block.label == "PUBLIC KEY" {
                return PublicKey::from_spki_der(&block.contents);
            }
            labels.push(block.label);
        }
        if labels.is_empty() {
            Err("no PEM block found; expected a PUBLIC KEY (openssl pkey -pubout)".to_owned())
        } else {
            Err(format!(
                "expected a PEM PUBLIC KEY block, found {} (for a certificate chain, configure \
                 the CA certificates instead; from a private key: openssl pkey -pubout)",
                labels.join(", ")
            ))
        }
    }

    /// A DER SubjectPublicKeyInfo, as a certificate or a PEM block holds it.
    pub(super) fn from_spki_der(der: &[u8]) -> Result<PublicKey, String> {
        let (rest, spki) = SubjectPublicKeyInfo::from_der(der)
            .map_err(|e| format!("not a DER SubjectPublicKeyInfo ({e})"))?;
        if !rest.is_empty() {
            return Err("trailing bytes after the SubjectPublicKeyInfo".to_owned());
        }
        let algorithm = spki.algorithm.algorithm.to_id_string();
        if algorithm != EC_PUBLIC_KEY {
            return Err(format!(
                "a key of algorithm {algorithm}, not ECDSA: model signing uses ECDSA P-256 or P-384 keys"
            ));
        }
        let curve_oid = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|oid| oid.to_id_string())
            .ok_or("an ECDSA key without a named curve")?;
        let curve = match curve_oid.as_str() {
            P256 => Curve::P256,
            P384 => Curve::P384,
            P521 => {
                return Err(
                    "a P-521 key: berth checks P-256 and P-384 keys only (ring has no \
                            P-521); sign with one of those"
                        .to_owned(),
                );
            }
            other => return Err(format!("an ECDSA key on curve {other}, not P-256 or P-384")),
        };
        PublicKey::from_point(curve, &spki.subject_public_key.data)
    }

    pub(super) fn from_point(curve: Curve, point: &[u8]) -> Result<PublicKey, String> {
        if point.len() != curve.point_len() || point.first() != Some(&0x04) {
            return Err("an ECDSA key whose point is not in uncompressed form".to_owned());
        }
        Ok(PublicKey {
            curve,
            point: point.to_vec(),
        })
    }

    /// Whether `signature` (ASN.1 DER) is this key's over `message`.
    pub(super) fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        let algorithm = match self.curve {
            Curve::P256 => &ECDSA_P256_SHA256_ASN1,
            Curve::P384 => &ECDSA_P384_SHA384_ASN1,
        };
        UnparsedPublicKey::new(algorithm, &self.point)
            .verify(message, signature)
            .is_ok()
    }

    /// The PEM text Python's `cryptography` writes for this key (and openssl
    /// does): the form whose sha256 model_signing puts in the bundle.
    pub(super) fn pem(&self) -> String {
        let mut der = self.curve.spki_prefix().to_vec();
        der.extend_from_slice(&self.point);
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
        for line in b64.as_bytes().chunks(64) {
            // base64 output is ASCII, so any chunk is UTF-8.
            pem.push_str(std::str::from_utf8(line).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str("-----END PUBLIC KEY-----\n");
        pem
    }

    /// berth's key id: lowercase hex sha256 of [`PublicKey::pem`], the same
    /// value as the reference tool's `publicKey.hint`.
    pub(super) fn key_id(&self) -> String {
        hex::encode(Sha256::digest(self.pem().as_bytes()))
    }
}
