//! The Sigstore method (keyless), verified offline: a short-lived Fulcio
//! certificate for an OIDC identity, and the signature's entry in the
//! Rekor transparency log, checked against a configured trusted root (the
//! `trusted_root.json` Sigstore's clients keep: Fulcio's CA chains and the
//! logs' keys, each with the time it is valid) and an identity policy.
//!
//! In order: the entry was signed by a log of the trusted root, valid at
//! the time it recorded (its signed entry timestamp, the "inclusion
//! promise", over the canonical JSON of body, time, log id and index); the
//! entry's body is this signature (a `dsse` entry: the payload's sha256,
//! the envelope's signature and the certificate as its verifier); the
//! certificate chains to a Fulcio CA of the trusted root at that time; it
//! names the configured identity and issuer. The caller then checks the
//! envelope's signature with the certificate's key, as for the other
//! methods.
//!
//! Not checked, and said so in the book: the log's inclusion proof and
//! checkpoint (the promise is the log's own signature on the entry, which
//! needs no proof to be checked offline), the certificate's SCTs (the CT
//! log's promise that Fulcio's issuance was logged), and RFC 3161
//! timestamps. Entries of logs with Ed25519 keys (Rekor v2, which gives no
//! promise) are refused by name.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer as _;

use super::bundle::{LogEntry, RawCertificate};
use super::chain::{self, Cas};
use super::keys::PublicKey;
use super::{Error, Signer};

/// Fulcio's extension naming the OIDC issuer (DER UTF8String), and its
/// older form (the raw text).
const ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
const ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";

/// A trusted root and whom it is trusted for.
#[derive(Debug, Clone)]
pub(super) struct Sigstore {
    authorities: Vec<Authority>,
    logs: Vec<Log>,
    /// The certificate's identity (an email or URI); `*` matches any run
    /// of characters.
    identity: String,
    /// The OIDC issuer, exactly.
    issuer: String,
}

/// One Fulcio CA chain: its root as the anchor, the rest as intermediates.
#[derive(Debug, Clone)]
struct Authority {
    root: Cas,
    intermediates: Vec<Vec<u8>>,
    valid: Validity,
}

/// One transparency log's key.
#[derive(Debug, Clone)]
struct Log {
    /// sha256 of the key's DER, as entries name their log.
    id: Vec<u8>,
    key: PublicKey,
    valid: Validity,
}

/// Seconds since 1970: from, and until if the key or CA was retired.
#[derive(Debug, Clone, Copy)]
struct Validity {
    start: i64,
    end: Option<i64>,
}

impl Validity {
    fn covers(&self, t: i64) -> bool {
        t >= self.start && self.end.is_none_or(|end| t <= end)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRoot {
    #[serde(default)]
    tlogs: Vec<RawLog>,
    #[serde(default)]
    certificate_authorities: Vec<RawAuthority>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawTrustConfig {
    trusted_root: RawRoot,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLog {
    public_key: RawKey,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawKey {
    raw_bytes: String,
    key_details: String,
    valid_for: RawValidity,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAuthority {
    cert_chain: RawChain,
    valid_for: RawValidity,
}

#[derive(Deserialize)]
struct RawChain {
    certificates: Vec<RawCertificate>,
}

#[derive(Deserialize)]
struct RawValidity {
    start: String,
    end: Option<String>,
}

impl Sigstore {
    /// `trusted_root` (a Sigstore trusted root, or a client trust config
    /// holding one, as JSON), trusted for `identity` of `issuer`.
    pub(super) fn from_json(
        trusted_root: &[u8],
        identity: &str,
        issuer: &str,
    ) -> Result<Sigstore, String> {
        let root: RawRoot = match serde_json::from_slice::<RawTrustConfig>(trusted_root) {
            Ok(config) => config.trusted_root,
            Err(_) => serde_json::from_slice(trusted_root)
                .map_err(|e| format!("not a Sigstore trusted root as JSON ({e})"))?,
        };
        let mut logs = Vec::new();
        for log in root.tlogs {
            // Ed25519 logs (Rekor v2) give entries no promise to check.
            if !log.public_key.key_details.starts_with("PKIX_ECDSA_") {
                continue;
            }
            let der = decode(&log.public_key.raw_bytes)?;
            logs.push(Log {
                id: Sha256::digest(&der).to_vec(),
                key: PublicKey::from_spki_der(&der)
                    .map_err(|e| format!("a transparency log's key: {e}"))?,
                valid: validity(&log.public_key.valid_for)?,
            });
        }
        let mut authorities = Vec::new();
        for authority in root.certificate_authorities {
            let mut chain = authority
                .cert_chain
                .certificates
                .iter()
                .map(|c| decode(&c.raw_bytes))
                .collect::<Result<Vec<_>, _>>()?;
            let Some(root) = chain.pop() else {
                continue;
            };
            authorities.push(Authority {
                root: Cas::from_ders(vec![root]).map_err(|e| format!("a Fulcio CA: {e}"))?,
                intermediates: chain,
                valid: validity(&authority.valid_for)?,
            });
        }
        if logs.is_empty() || authorities.is_empty() {
            return Err(
                "the trusted root names no ECDSA transparency-log key or no certificate \
                 authority: expected Sigstore's trusted_root.json"
                    .to_owned(),
            );
        }
        if identity.is_empty() || issuer.is_empty() {
            return Err("a Sigstore signer needs an identity and an issuer".to_owned());
        }
        Ok(Sigstore {
            authorities,
            logs,
            identity: identity.to_owned(),
            issuer: issuer.to_owned(),
        })
    }
}

/// The certificate's key and identity, once the log entry vouches for the
/// envelope's `payload` and `signature` and the certificate chains to
/// Fulcio at the entry's time, for the configured identity.
pub(super) fn verify(
    certificate: &[u8],
    entry: &LogEntry,
    (payload, signature): (&[u8], &[u8]),
    sigstore: &Sigstore,
) -> Result<(PublicKey, Signer), Error> {
    let log = sigstore
        .logs
        .iter()
        .find(|l| l.id == entry.log_id)
        .ok_or_else(|| {
            Error::Log(format!(
                "is in a log the trusted root does not name (log id {})",
                hex::encode(&entry.log_id)
            ))
        })?;
    let t = entry.integrated_time;
    if !log.valid.covers(t) {
        return Err(Error::Log(format!(
            "is dated {}, when the trusted root does not trust its log's key",
            date(t)
        )));
    }
    let promise = entry.promise.as_deref().ok_or_else(|| {
        Error::Log(
            "carries no signed entry timestamp (inclusion promise), which berth checks it by"
                .to_owned(),
        )
    })?;
    let signed = format!(
        r#"{{"body":"{}","integratedTime":{t},"logID":"{}","logIndex":{}}}"#,
        entry.body_base64,
        hex::encode(&entry.log_id),
        entry.log_index
    );
    if !log.key.verifies(signed.as_bytes(), promise) {
        return Err(Error::Log(
            "is not signed by its log: the signed entry timestamp does not verify".to_owned(),
        ));
    }
    entry_is_this_signature(entry, certificate, payload, signature)?;

    let mut first = None;
    for authority in sigstore.authorities.iter().filter(|a| a.valid.covers(t)) {
        let mut chain = vec![certificate.to_vec()];
        chain.extend(authority.intermediates.iter().cloned());
        match chain::verify(&chain, &authority.root, Some(t)) {
            Ok((key, _)) => return identified(certificate, key, entry.log_index, sigstore),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(|| {
        Error::Log(format!(
            "is dated {}, when no certificate authority of the trusted root was valid",
            date(t)
        ))
    }))
}

/// That the log's entry records this envelope: a `dsse` 0.0.1 entry whose
/// payload hash is the payload's, with this signature by this certificate.
fn entry_is_this_signature(
    entry: &LogEntry,
    certificate: &[u8],
    payload: &[u8],
    signature: &[u8],
) -> Result<(), Error> {
    if (entry.kind.as_str(), entry.version.as_str()) != ("dsse", "0.0.1") {
        return Err(Error::Log(format!(
            "is of kind {} {}; berth checks dsse 0.0.1 entries, which model_signing writes",
            entry.kind, entry.version
        )));
    }
    #[derive(Deserialize)]
    struct Body {
        kind: String,
        spec: Spec,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        payload_hash: Hash,
        signatures: Vec<Signed>,
    }
    #[derive(Deserialize)]
    struct Hash {
        algorithm: String,
        value: String,
    }
    #[derive(Deserialize)]
    struct Signed {
        signature: String,
        verifier: String,
    }
    let body: Body = serde_json::from_slice(&entry.body)
        .map_err(|e| Error::Log(format!("has a body berth cannot read ({e})")))?;
    let hash = &body.spec.payload_hash;
    let payload_sha256 = hex::encode(Sha256::digest(payload));
    if body.kind != "dsse" || hash.algorithm != "sha256" || hash.value != payload_sha256 {
        return Err(Error::Log(
            "records another statement than the one model.sig carries".to_owned(),
        ));
    }
    let by_this = |signed: &Signed| {
        let pem = decode(&signed.verifier).unwrap_or_default();
        let der = x509_parser::pem::parse_x509_pem(&pem)
            .map(|(_, pem)| pem.contents)
            .unwrap_or_default();
        decode(&signed.signature).is_ok_and(|s| s == signature) && der == certificate
    };
    if !body.spec.signatures.iter().any(by_this) {
        return Err(Error::Log(
            "records another signature or certificate than the ones model.sig carries".to_owned(),
        ));
    }
    Ok(())
}

/// The signer a chained certificate names, if the policy trusts it.
fn identified(
    certificate: &[u8],
    key: PublicKey,
    log_index: i64,
    sigstore: &Sigstore,
) -> Result<(PublicKey, Signer), Error> {
    let (_, leaf) = X509Certificate::from_der(certificate)
        .map_err(|e| Error::Malformed(format!("its certificate is not DER X.509 ({e})")))?;
    let identities: Vec<String> = match leaf.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::RFC822Name(v) | GeneralName::URI(v) => Some(v.to_string()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let issuer = leaf
        .extensions()
        .iter()
        .find_map(|ext| match ext.oid.to_id_string().as_str() {
            ISSUER_V2 => utf8_string(ext.value),
            ISSUER_V1 => String::from_utf8(ext.value.to_vec()).ok(),
            _ => None,
        })
        .unwrap_or_default();
    let trusted = identities
        .iter()
        .find(|identity| matches(&sigstore.identity, identity) && issuer == sigstore.issuer);
    match trusted {
        Some(identity) => Ok((
            key,
            Signer::Sigstore {
                identity: identity.clone(),
                issuer,
                log_index,
            },
        )),
        None => Err(Error::OtherIdentity {
            found: format!("{} (issuer {issuer})", identities.join(", ")),
            identity: sigstore.identity.clone(),
            issuer: sigstore.issuer.clone(),
        }),
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of
/// characters (none included) and everything else for itself.
fn matches(pattern: &str, text: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == text;
    };
    let Some(mut left) = text.strip_prefix(head) else {
        return false;
    };
    let mut parts: Vec<&str> = rest.split('*').collect();
    let tail = parts.pop().unwrap_or_default();
    for part in parts {
        match left.find(part) {
            Some(i) => left = &left[i + part.len()..],
            None => return false,
        }
    }
    left.len() >= tail.len() && left.ends_with(tail)
}

/// The text of a DER UTF8String.
fn utf8_string(der: &[u8]) -> Option<String> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        n if n < 0x80 => (usize::from(n), rest),
        0x81 => (usize::from(*rest.first()?), &rest[1..]),
        0x82 => (
            usize::from(*rest.first()?) << 8 | usize::from(*rest.get(1)?),
            &rest[2..],
        ),
        _ => return None,
    };
    (tag == 0x0c && rest.len() == len)
        .then(|| String::from_utf8(rest.to_vec()).ok())
        .flatten()
}

fn validity(raw: &RawValidity) -> Result<Validity, String> {
    let seconds = |text: &str| {
        humantime::parse_rfc3339_weak(text)
            .map_err(|e| format!("the time {text:?} is not RFC 3339 ({e})"))
            .map(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64)
            })
    };
    Ok(Validity {
        start: seconds(&raw.start)?,
        end: raw.end.as_deref().map(seconds).transpose()?,
    })
}

fn date(t: i64) -> String {
    u64::try_from(t)
        .map(|s| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(s),
            )
            .to_string()
        })
        .unwrap_or_else(|_| t.to_string())
}

fn decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64 ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_pattern_matches_with_stars_and_else_exactly() {
        let uri = "https://github.com/acme/train/.github/workflows/sign.yml@refs/heads/main";
        for (pattern, text, ok) in [
            ("a@b.c", "a@b.c", true),
            ("a@b.c", "a@b.cd", false),
            ("https://github.com/acme/*", uri, true),
            ("https://github.com/acme/*@refs/heads/main", uri, true),
            ("https://github.com/acme/*@refs/tags/*", uri, false),
            ("*", "", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
        ] {
            assert_eq!(matches(pattern, text), ok, "{pattern} {text}");
        }
    }

    #[test]
    fn a_der_utf8_string_is_read_and_anything_else_is_not() {
        assert_eq!(utf8_string(b"\x0c\x03abc").as_deref(), Some("abc"));
        assert_eq!(utf8_string(b"\x0c\x04abc"), None);
        assert_eq!(utf8_string(b"\x13\x03abc"), None);
    }
}
