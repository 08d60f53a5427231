//! Writing a `model.sig` for the key method, as model_signing would for the
//! same files: what berth publishes can be checked with `model_signing verify
//! key`. Signs records (path, sha256), never reads a file.

use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P384_SHA384_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _,
};

use super::keys::{Curve, PublicKey};
use super::{Error, bundle, dsse, statement};
use crate::model::ModelFile;

/// An ECDSA P-256 or P-384 private key, from PKCS#8 PEM (`BEGIN PRIVATE
/// KEY`, as `openssl genpkey` writes).
pub struct SigningKey {
    pair: EcdsaKeyPair,
    public: PublicKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private half.
        f.debug_struct("SigningKey")
            .field("key_id", &self.key_id())
            .finish()
    }
}

impl SigningKey {
    pub fn from_pkcs8_pem(pem: &[u8]) -> Result<SigningKey, Error> {
        let trust = |s: &str| Error::Trust(format!("signing key: {s}"));
        let mut der = None;
        for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
            let block = block.map_err(|_| trust("not PEM text"))?;
            match block.label.as_str() {
                "PRIVATE KEY" => {
                    der = Some(block.contents);
                    break;
                }
                "EC PRIVATE KEY" => {
                    return Err(trust(
                        "a SEC1 EC PRIVATE KEY; convert it to PKCS#8 with \
                         openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8.pem",
                    ));
                }
                "ENCRYPTED PRIVATE KEY" => {
                    return Err(trust("encrypted; berth reads an unencrypted PKCS#8 key"));
                }
                _ => {}
            }
        }
        let der = der.ok_or_else(|| trust("no PEM PRIVATE KEY block found"))?;
        let rng = SystemRandom::new();
        for (curve, algorithm) in [
            (Curve::P256, &ECDSA_P256_SHA256_ASN1_SIGNING),
            (Curve::P384, &ECDSA_P384_SHA384_ASN1_SIGNING),
        ] {
            if let Ok(pair) = EcdsaKeyPair::from_pkcs8(algorithm, &der, &rng) {
                let public = PublicKey::from_point(curve, pair.public_key().as_ref())
                    .map_err(|e| trust(&e))?;
                return Ok(SigningKey { pair, public });
            }
        }
        Err(trust("not an ECDSA P-256 or P-384 PKCS#8 key"))
    }

    /// The DSSE signature (ASN.1 DER) over an in-toto payload.
    pub(super) fn sign_payload(&self, payload: &[u8]) -> Result<Vec<u8>, Error> {
        self.pair
            .sign(&SystemRandom::new(), &dsse::pae(payload))
            .map(|s| s.as_ref().to_vec())
            .map_err(|_| Error::CannotSign("the signing key did not sign (ring)".to_owned()))
    }

    /// The key id verifiers will see: sha256 of the public key's PEM.
    pub fn key_id(&self) -> String {
        self.public.key_id()
    }

    /// The public key, as PEM: what a consumer passes to `model_signing
    /// verify key --public_key`.
    pub fn public_key_pem(&self) -> String {
        self.public.pem()
    }
}

/// A `model.sig` (Sigstore bundle v0.3, DSSE, in-toto statement with
/// predicate `https://model_signing/signature/v1.0`) over exactly `files`,
/// whose sha256 must all be recorded. `model_name` is the subject's name,
/// the folder's last component as the reference tool uses it (informative
/// only). A file named `model.sig` at the root is never signed.
pub fn sign(key: &SigningKey, model_name: &str, files: &[ModelFile]) -> Result<Vec<u8>, Error> {
    let mut entries = Vec::with_capacity(files.len());
    let mut unrecorded = Vec::new();
    for f in files.iter().filter(|f| f.path != super::SIGNATURE_FILE) {
        match &f.sha256 {
            Some(sha) if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) => {
                entries.push((f.path.as_str(), sha.as_str()))
            }
            _ => unrecorded.push(f.path.clone()),
        }
    }
    if !unrecorded.is_empty() {
        return Err(Error::CannotSign(format!(
            "no sha256 is recorded for {}",
            unrecorded.join(", ")
        )));
    }
    let lower: Vec<(String, String)> = entries
        .iter()
        .map(|(p, s)| ((*p).to_owned(), s.to_ascii_lowercase()))
        .collect();
    let pairs: Vec<(&str, &str)> = lower
        .iter()
        .map(|(p, s)| (p.as_str(), s.as_str()))
        .collect();
    let payload = statement::write(model_name, &pairs);
    let signature = key.sign_payload(&payload)?;
    let material = serde_json::json!({ "publicKey": { "hint": key.key_id() } });
    Ok(bundle::write(material, &payload, &signature))
}
