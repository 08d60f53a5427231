//! The certificate method: the bundle's chain (leaf first) must lead to one
//! of the configured CA certificates, checked at the leaf's notBefore, and the
//! leaf must be allowed to sign. Path building is webpki's; the time and the
//! leaf's usage rule are the reference tool's.
//!
//! What model_signing 1.1.1 does (`_signing/sign_certificate.py`): an OpenSSL
//! store of the configured certificates, its time set to the leaf's
//! `not_valid_before` ("max_signing_time": a model.sig has no trusted
//! timestamp), the bundle's other certificates as untrusted intermediates;
//! then the leaf must have the digitalSignature key usage, or else the
//! codeSigning extended key usage. The same here, with two differences, both
//! documented in the book: any configured certificate is a trust anchor
//! (OpenSSL's default wants the chain to end at a self-signed one), and an
//! intermediate's extended key usage is not checked (nor is it by OpenSSL's
//! default purpose).

use std::cell::Cell;

use rustls::pki_types::{CertificateDer, TrustAnchor, UnixTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer as _;

use super::keys::PublicKey;
use super::{Error, Signer};

/// Configured CA certificates, kept as DER and checked once when read.
#[derive(Debug, Clone)]
pub(super) struct Cas {
    certificates: Vec<Vec<u8>>,
}

impl Cas {
    /// Every `CERTIFICATE` block of a PEM text (one file may hold several).
    pub(super) fn from_pem(pem: &[u8]) -> Result<Cas, String> {
        let mut certificates = Vec::new();
        for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
            let block = block.map_err(|e| format!("not PEM text ({e})"))?;
            if block.label != "CERTIFICATE" {
                continue;
            }
            certificates.push(block.contents);
        }
        if certificates.is_empty() {
            return Err("no PEM CERTIFICATE block found; expected the CA certificates".to_owned());
        }
        Cas::from_ders(certificates)
    }

    /// DER certificates, each one a trust anchor.
    pub(super) fn from_ders(certificates: Vec<Vec<u8>>) -> Result<Cas, String> {
        for (i, der) in certificates.iter().enumerate() {
            webpki::anchor_from_trusted_cert(&CertificateDer::from(der.as_slice()))
                .map_err(|e| format!("certificate {}: not usable as a CA ({e:?})", i + 1))?;
        }
        Ok(Cas { certificates })
    }
}

/// Accepts any extended key usage: webpki would apply one purpose to every
/// certificate of the path; the reference tool's rule is for the leaf only
/// and is applied after the path is built.
struct AnyUsage;

impl webpki::ExtendedKeyUsageValidator for AnyUsage {
    fn validate(&self, iter: webpki::KeyPurposeIdIter<'_, '_>) -> Result<(), webpki::Error> {
        for purpose in iter {
            purpose?;
        }
        Ok(())
    }
}

/// The leaf's public key and who it names, once the chain is trusted: at
/// the time a transparency log recorded the signature (`logged`, seconds
/// since 1970), else at the leaf's notBefore.
pub(super) fn verify(
    chain: &[Vec<u8>],
    cas: &Cas,
    logged: Option<i64>,
) -> Result<(PublicKey, Signer), Error> {
    let leaf_der = chain
        .first()
        .ok_or_else(|| Error::Malformed("its certificate chain is empty".to_owned()))?;
    let (_, leaf) = X509Certificate::from_der(leaf_der)
        .map_err(|e| Error::Malformed(format!("its signing certificate is not DER X.509 ({e})")))?;
    let subject = leaf.subject().to_string();
    let not_before = leaf.validity().not_before;
    let checked_at = logged.unwrap_or(not_before.timestamp());
    let date = x509_parser::time::ASN1Time::from_timestamp(checked_at)
        .ok()
        .and_then(|t| t.to_rfc2822().ok())
        .unwrap_or_else(|| checked_at.to_string());
    let at = match logged {
        Some(_) => format!("{date}, when the transparency log recorded the signature"),
        None => format!(
            "the certificate's notBefore, {date}, as model_signing does: a model.sig carries \
             no trusted time, so a certificate that has expired since signing still verifies"
        ),
    };
    let untrusted = |reason: String| Error::Untrusted {
        subject: subject.clone(),
        at: at.clone(),
        reason,
    };
    let seconds =
        u64::try_from(checked_at).map_err(|_| untrusted("the time is before 1970".to_owned()))?;
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(seconds));

    let ca_ders: Vec<CertificateDer<'_>> = cas
        .certificates
        .iter()
        .map(|c| CertificateDer::from(c.as_slice()))
        .collect();
    let anchors: Vec<TrustAnchor<'_>> = ca_ders
        .iter()
        .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
        .collect();
    let intermediates: Vec<CertificateDer<'_>> = chain[1..]
        .iter()
        .map(|c| CertificateDer::from(c.as_slice()))
        .collect();
    let leaf_cert = CertificateDer::from(leaf_der.as_slice());
    let end_entity = webpki::EndEntityCert::try_from(&leaf_cert)
        .map_err(|e| untrusted(format!("the certificate cannot be read ({e:?})")))?;

    // webpki takes an anchor as a name and a key, without its dates; OpenSSL
    // checks the root's validity too, so the anchor reached must be valid at
    // the same time. Which one it was is found by identity in `anchors`.
    let expired_anchor: Cell<Option<String>> = Cell::new(None);
    let anchor_valid = |path: &webpki::VerifiedPath<'_>| -> Result<(), webpki::Error> {
        let Some(i) = anchors.iter().position(|a| std::ptr::eq(a, path.anchor())) else {
            return Ok(());
        };
        let Ok((_, ca)) = X509Certificate::from_der(&cas.certificates[i]) else {
            return Err(webpki::Error::BadDer);
        };
        let (from, until) = (
            ca.validity().not_before.timestamp(),
            ca.validity().not_after.timestamp(),
        );
        if checked_at < from || checked_at > until {
            expired_anchor.set(Some(ca.subject().to_string()));
            return Err(webpki::Error::InvalidCertValidity);
        }
        Ok(())
    };
    let algorithms = webpki::ALL_VERIFICATION_ALGS;
    end_entity
        .verify_for_usage(
            algorithms,
            &anchors,
            &intermediates,
            time,
            AnyUsage,
            None,
            Some(&anchor_valid),
        )
        .map_err(|e| match expired_anchor.take() {
            Some(ca) => untrusted(format!(
                "the configured CA \"{ca}\" is not valid at that time"
            )),
            None => untrusted(reason(&e)),
        })?;

    let digital_signature =
        matches!(leaf.key_usage(), Ok(Some(ku)) if ku.value.digital_signature());
    let code_signing = matches!(leaf.extended_key_usage(), Ok(Some(eku)) if eku.value.code_signing);
    if !digital_signature && !code_signing {
        return Err(Error::NotForSigning { subject });
    }

    let key = PublicKey::from_spki_der(leaf.public_key().raw).map_err(|e| {
        Error::UnsupportedKey(format!("the signing certificate \"{subject}\" holds {e}"))
    })?;
    let names = match leaf.subject_alternative_name() {
        Ok(Some(san)) => san.value.general_names.iter().filter_map(name).collect(),
        _ => Vec::new(),
    };
    let signer = Signer::Certificate {
        subject,
        names,
        issuer: leaf.issuer().to_string(),
    };
    Ok((key, signer))
}

fn name(general: &GeneralName<'_>) -> Option<String> {
    match general {
        GeneralName::RFC822Name(v) => Some(format!("email:{v}")),
        GeneralName::URI(v) => Some(format!("uri:{v}")),
        GeneralName::DNSName(v) => Some(format!("dns:{v}")),
        _ => None,
    }
}

/// webpki's errors, said for the person who configured the CA.
fn reason(e: &webpki::Error) -> String {
    use webpki::Error as E;
    match e {
        E::UnknownIssuer => "neither a configured CA nor an intermediate the signature carries issued it".to_owned(),
        E::CertExpired { .. } | E::CertNotValidYet { .. } | E::InvalidCertValidity => {
            "a certificate of the chain is not valid at that time".to_owned()
        }
        E::InvalidSignatureForPublicKey => "a certificate's signature does not verify with its issuer's key".to_owned(),
        E::CaUsedAsEndEntity => "the signing certificate is a CA certificate".to_owned(),
        E::EndEntityUsedAsCa => "a certificate that is not a CA issued another".to_owned(),
        E::PathLenConstraintViolated => "the chain is longer than a CA's path length allows".to_owned(),
        E::UnsupportedCriticalExtension => "a certificate has a critical extension berth does not know".to_owned(),
        E::UnsupportedSignatureAlgorithmContext(_)
        | E::UnsupportedSignatureAlgorithmForPublicKeyContext(_) => {
            "a certificate is signed with an algorithm berth does not check (ECDSA P-256/P-384, RSA, Ed25519 are)".to_owned()
        }
        other => format!("{other:?}"),
    }
}
