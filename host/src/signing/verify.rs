//! One verification, in the reference tool's order: read the bundle, check
//! its signature with the configured trust, only then read the statement,
//! and compare it with the model's record.

use super::bundle::{self, Material};
use super::chain::{self, Cas};
use super::compare;
use super::dsse;
use super::keys::PublicKey;
use super::sigstore::{self, Sigstore};
use super::statement;
use super::{Error, Method, Signer};
use crate::model::ModelFile;

/// What berth trusts to have signed models: read once, from the operator's
/// PEM files, so a bad setting is found before any signature is.
#[derive(Debug, Clone)]
pub struct Trust(TrustKind);

#[derive(Debug, Clone)]
enum TrustKind {
    Key(PublicKey),
    Cas(Cas),
    Sigstore(Box<Sigstore>),
}

impl Trust {
    /// A PEM `PUBLIC KEY` (ECDSA P-256 or P-384): the key method.
    pub fn public_key_pem(pem: &[u8]) -> Result<Trust, Error> {
        PublicKey::from_pem(pem)
            .map(|k| Trust(TrustKind::Key(k)))
            .map_err(Error::Trust)
    }

    /// PEM `CERTIFICATE`s, each one a trust anchor: the certificate method.
    pub fn ca_certificates_pem(pem: &[u8]) -> Result<Trust, Error> {
        Cas::from_pem(pem)
            .map(|c| Trust(TrustKind::Cas(c)))
            .map_err(Error::Trust)
    }

    /// Sigstore keyless: `trusted_root` (JSON: Sigstore's
    /// `trusted_root.json`, or a client trust config holding one) for the
    /// certificate identity `identity` (an email or URI; `*` matches any
    /// run of characters) of the OIDC issuer `issuer`.
    pub fn sigstore(trusted_root: &[u8], identity: &str, issuer: &str) -> Result<Trust, Error> {
        Sigstore::from_json(trusted_root, identity, issuer)
            .map(|s| Trust(TrustKind::Sigstore(Box::new(s))))
            .map_err(Error::Trust)
    }

    /// The method this trust verifies.
    pub fn method(&self) -> Method {
        match self.0 {
            TrustKind::Key(_) => Method::Key,
            TrustKind::Cas(_) => Method::Certificate,
            TrustKind::Sigstore(_) => Method::Sigstore,
        }
    }

    /// For a key: its key id, as [`Signer::Key`] will name it.
    pub fn key_id(&self) -> Option<String> {
        match &self.0 {
            TrustKind::Key(k) => Some(k.key_id()),
            TrustKind::Cas(_) | TrustKind::Sigstore(_) => None,
        }
    }
}

/// A `model.sig` that vouches for every one of the model's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub method: Method,
    pub signer: Signer,
    /// The model's files whose recorded sha256 is the signed one, sorted.
    pub files_checked: Vec<String>,
    /// The model's files the signer left out (its `ignore_paths`, and
    /// `model.sig` itself), sorted: the signature says nothing about them.
    pub files_ignored: Vec<String>,
}

/// Verifies `model_sig` (the bytes of a `model.sig`, bounded by the caller)
/// for the model recorded as `files`, signed as `trust` says. `Ok` only when
/// the signature is the trusted signer's and every file not ignored has the
/// signed sha256 on record; every other outcome is an [`Error`] saying which.
pub fn verify(model_sig: &[u8], trust: &Trust, files: &[ModelFile]) -> Result<Verified, Error> {
    let bundle = bundle::parse(model_sig)?;
    let found = match bundle.material {
        Material::PublicKey { .. } => Method::Key,
        Material::Chain(_) => Method::Certificate,
        Material::Keyless { .. } => Method::Sigstore,
    };
    let (key, signer) = match (&trust.0, &bundle.material) {
        (TrustKind::Key(key), Material::PublicKey { hint }) => {
            let key_id = key.key_id();
            // The hint is unsigned: a mismatch is only the clearer sentence
            // for a wrong key; a match proves nothing until the signature does.
            if let Some(hint) = hint
                && !hint.eq_ignore_ascii_case(&key_id)
            {
                return Err(Error::WrongKey {
                    hint: hint.clone(),
                    key_id,
                });
            }
            (key.clone(), Signer::Key { key_id })
        }
        (TrustKind::Cas(cas), Material::Chain(certificates)) => {
            chain::verify(certificates, cas, None)?
        }
        (TrustKind::Sigstore(trusted), Material::Keyless { certificate, entry }) => {
            let envelope = (bundle.payload.as_slice(), bundle.signature.as_slice());
            sigstore::verify(certificate, entry, envelope, trusted)?
        }
        (_, _) => {
            return Err(Error::MethodMismatch {
                configured: trust.method(),
                found,
            });
        }
    };
    if bundle.payload_type != dsse::IN_TOTO_PAYLOAD_TYPE {
        return Err(Error::Malformed(format!(
            "its DSSE payload type is {:?}, expected {:?}",
            bundle.payload_type,
            dsse::IN_TOTO_PAYLOAD_TYPE
        )));
    }
    if !dsse::verifies(&key, &bundle.payload, &bundle.signature) {
        return Err(Error::BadSignature { signer });
    }
    let statement = statement::parse(&bundle.payload)?;
    let covered = compare::compare(&statement, files, &signer)?;
    Ok(Verified {
        method: found,
        signer,
        files_checked: covered.checked,
        files_ignored: covered.ignored,
    })
}
