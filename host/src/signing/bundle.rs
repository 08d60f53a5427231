//! The `model.sig` file: a Sigstore bundle v0.3 (JSON) as model_signing
//! writes it for the key, certificate and Sigstore (keyless) methods.
//! Parsing only: nothing here is trusted until `verify` has checked the
//! signature.

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
    /// Sigstore keyless: `verificationMaterial.certificate.rawBytes` (DER,
    /// the short-lived Fulcio certificate) and the first transparency-log
    /// entry.
    Keyless {
        certificate: Vec<u8>,
        entry: LogEntry,
    },
}

/// A transparency-log (Rekor) entry of a bundle, decoded, unchecked.
#[derive(Debug)]
pub(super) struct LogEntry {
    pub(super) log_index: i64,
    /// `logId.keyId`: the sha256 of the log's public key (DER).
    pub(super) log_id: Vec<u8>,
    /// `kindVersion`: `dsse` `0.0.1` for model_signing.
    pub(super) kind: String,
    pub(super) version: String,
    /// Seconds since 1970, as the log recorded the entry.
    pub(super) integrated_time: i64,
    /// `canonicalizedBody` as the bundle writes it (base64), which is what
    /// the log signed, and decoded.
    pub(super) body_base64: String,
    pub(super) body: Vec<u8>,
    /// `inclusionPromise.signedEntryTimestamp`, if any: the log's signature.
    pub(super) promise: Option<Vec<u8>>,
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
    certificate: Option<RawCertificate>,
    #[serde(default)]
    tlog_entries: Vec<RawLogEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLogEntry {
    log_index: String,
    log_id: RawLogId,
    kind_version: RawKindVersion,
    integrated_time: String,
    inclusion_promise: Option<RawPromise>,
    canonicalized_body: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLogId {
    key_id: String,
}

#[derive(Deserialize)]
struct RawKindVersion {
    kind: String,
    version: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPromise {
    signed_entry_timestamp: String,
}

#[derive(Deserialize)]
struct RawPublicKey {
    hint: Option<String>,
}

#[derive(Deserialize)]
struct RawChain {
    certificates: Vec<RawCertificate>,
}

/// A DER certificate as Sigstore's JSON writes it (base64), here and in a
/// trusted root's CA chains.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawCertificate {
    pub(super) raw_bytes: String,
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
    let mut material = raw.verification_material;
    if raw.media_type != MEDIA_TYPE {
        return Err(malformed(format!(
            "media type {:?}, expected {MEDIA_TYPE:?} (as model_signing 1.x writes)",
            raw.media_type
        )));
    }
    let keyless = material.certificate.take();
    let material = match (material.public_key, material.x509_certificate_chain) {
        (None, None) if keyless.is_some() => {
            let certificate = keyless.expect("matched Some");
            let certificate = decode(&certificate.raw_bytes)
                .map_err(|e| malformed(format!("its certificate is not base64 ({e})")))?;
            let entry = material.tlog_entries.into_iter().next().ok_or_else(|| {
                malformed("its certificate comes with no transparency-log entry".to_owned())
            })?;
            Material::Keyless {
                certificate,
                entry: log_entry(entry)?,
            }
        }
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
                "it carries neither a public key hint, a certificate chain nor a certificate"
                    .to_owned(),
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
/// A log entry's fields, decoded; the signed ones checked later.
fn log_entry(raw: RawLogEntry) -> Result<LogEntry, Error> {
    let malformed = |what: &str, e: &dyn std::fmt::Display| {
        Error::Malformed(format!(
            "its transparency-log entry's {what} is unreadable ({e})"
        ))
    };
    Ok(LogEntry {
        log_index: raw
            .log_index
            .parse()
            .map_err(|e| malformed("logIndex", &e))?,
        log_id: decode(&raw.log_id.key_id).map_err(|e| malformed("logId", &e))?,
        kind: raw.kind_version.kind,
        version: raw.kind_version.version,
        integrated_time: raw
            .integrated_time
            .parse()
            .map_err(|e| malformed("integratedTime", &e))?,
        body: decode(&raw.canonicalized_body).map_err(|e| malformed("canonicalizedBody", &e))?,
        body_base64: raw.canonicalized_body,
        promise: match raw.inclusion_promise {
            Some(promise) => Some(
                decode(&promise.signed_entry_timestamp)
                    .map_err(|e| malformed("signedEntryTimestamp", &e))?,
            ),
            None => None,
        },
    })
}

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
