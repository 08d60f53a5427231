//! The `model.sig` file: a Sigstore bundle v0.3 (JSON) as model_signing
//! writes it for the key and certificate methods. Parsing only: nothing here
//! is trusted until `verify` has checked the signature.

use base64::Engine as _;
use serde::Deserialize;

use super::Error;

/// The only media type the reference tool writes, and accepts for the key
/// and certificate methods.
pub(super) const MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// What a bundle carries to check its signature with.
#[derive(Debug)]
pub(super) enum Material {
    /// `verificationMaterial.publicKey.hint`: the sha256 of the signer's
    /// public key PEM; absent in bundles of model_signing before 1.0.
    PublicKey { hint: Option<String> },
    /// `verificationMaterial.x509CertificateChain.certificates[].rawBytes`,
    /// DER, the signing (leaf) certificate first, then what the signer passed
    /// as `--certificate_chain`.
    Chain(Vec<Vec<u8>>),
}

/// A parsed bundle: the DSSE envelope's payload and first signature, decoded.
#[derive(Debug)]
pub(super) struct Bundle {
    pub(super) material: Material,
    pub(super) payload_type: String,
    pub(super) payload: Vec<u8>,
    pub(super) signature: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBundle {
    media_type: String,
    verification_material: RawMaterial,
    dsse_envelope: Option<RawEnvelope>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMaterial {
    public_key: Option<RawPublicKey>,
    x509_certificate_chain: Option<RawChain>,
    /// A single certificate: what Sigstore keyless bundles v0.3 carry.
    certificate: Option<serde_json::Value>,
    #[serde(default)]
    tlog_entries: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawPublicKey {
    hint: Option<String>,
}

#[derive(Deserialize)]
struct RawChain {
    certificates: Vec<RawCertificate>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCertificate {
    raw_bytes: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEnvelope {
    payload: String,
    payload_type: String,
    signatures: Vec<RawSignature>,
}

#[derive(Deserialize)]
struct RawSignature {
    sig: String,
}

pub(super) fn parse(bytes: &[u8]) -> Result<Bundle, Error> {
    let malformed = |s: String| Error::Malformed(s);
    let raw: RawBundle = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("not a Sigstore bundle as JSON ({e})")))?;
    let material = raw.verification_material;
    if material.certificate.is_some() || !material.tlog_entries.is_empty() {
        return Err(Error::Keyless);
    }
    if raw.media_type != MEDIA_TYPE {
        return Err(malformed(format!(
            "media type {:?}, expected {MEDIA_TYPE:?} (as model_signing 1.x writes)",
            raw.media_type
        )));
    }
    let material = match (material.public_key, material.x509_certificate_chain) {
        (Some(key), None) => Material::PublicKey {
            hint: key.hint.filter(|h| !h.is_empty()),
        },
        (None, Some(chain)) => {
            if chain.certificates.is_empty() {
                return Err(malformed("its certificate chain is empty".to_owned()));
            }
            let certificates = chain
                .certificates
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    decode(&c.raw_bytes)
                        .map_err(|e| malformed(format!("certificate {i} is not base64 ({e})")))
                })
                .collect::<Result<_, _>>()?;
            Material::Chain(certificates)
        }
        (Some(_), Some(_)) => {
            return Err(malformed(
                "it carries both a public key and a certificate chain".to_owned(),
            ));
        }
        (None, None) => {
            return Err(malformed(
                "it carries neither a public key hint nor a certificate chain".to_owned(),
            ));
        }
    };
    let envelope = raw
        .dsse_envelope
        .ok_or_else(|| malformed("it has no DSSE envelope (dsseEnvelope)".to_owned()))?;
    // The reference tool checks the first signature only, and writes one.
    let first = envelope
        .signatures
        .first()
        .ok_or_else(|| malformed("its DSSE envelope has no signature".to_owned()))?;
    Ok(Bundle {
        material,
        payload_type: envelope.payload_type,
        payload: decode(&envelope.payload)
            .map_err(|e| malformed(format!("its DSSE payload is not base64 ({e})")))?,
        signature: decode(&first.sig)
            .map_err(|e| malformed(format!("its DSSE signature is not base64 ({e})")))?,
    })
}

/// Protobuf JSON writes standard base64 with padding; accepting the
/// URL-safe alphabet too costs nothing and the envelope spec allows either.
fn decode(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    STANDARD
        .decode(text)
        .or_else(|e| URL_SAFE.decode(text).map_err(|_| e))
}

/// A bundle as model_signing writes it, `material` being its
/// `verificationMaterial` less the (empty) transparency-log entries.
pub(super) fn write(mut material: serde_json::Value, payload: &[u8], signature: &[u8]) -> Vec<u8> {
    use base64::engine::general_purpose::STANDARD;
    material["tlogEntries"] = serde_json::json!([]);
    let bundle = serde_json::json!({
        "mediaType": MEDIA_TYPE,
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": STANDARD.encode(payload),
            "payloadType": super::dsse::IN_TOTO_PAYLOAD_TYPE,
            "signatures": [{ "sig": STANDARD.encode(signature), "keyid": "" }],
        },
    });
    // A Value always serializes.
    serde_json::to_vec_pretty(&bundle).unwrap_or_default()
}
