//! The certificates berth trusts beyond the public roots: `--ca-file`, an
//! operator's internal CA, read and checked once at start and handed to
//! every HTTPS client berth makes (sources over reqwest and object_store,
//! guests' outgoing requests in `runtime`, the webhook). It only ever adds
//! to the public roots, never replaces them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The certificates of `--ca-file`; none by default.
#[derive(Clone, Default)]
pub struct Trust {
    certificates: Arc<[CertificateDer<'static>]>,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Trust({} extra certificates)", self.certificates.len())
    }
}

/// Why the `--ca-file` cannot be used; names the file.
#[derive(Debug, thiserror::Error)]
#[error("--ca-file {}: {problem}", path.display())]
pub struct CaFileError {
    path: PathBuf,
    problem: String,
}

impl Trust {
    /// Reads the PEM certificates of `path`: at least one, each a
    /// certificate rustls accepts as a root.
    pub fn load(path: &Path) -> Result<Self, CaFileError> {
        let error = |problem: String| CaFileError {
            path: path.to_path_buf(),
            problem,
        };
        let bytes = std::fs::read(path).map_err(|e| error(format!("cannot read it: {e}")))?;
        let certificates = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| error(format!("is not valid PEM: {e}")))?;
        if certificates.is_empty() {
            return Err(error(
                "holds no certificate (expected PEM: -----BEGIN CERTIFICATE----- blocks)"
                    .to_string(),
            ));
        }
        for (n, certificate) in certificates.iter().enumerate() {
            RootCertStore::empty()
                .add(certificate.clone())
                .map_err(|e| {
                    let why = match e {
                        rustls::Error::InvalidCertificate(problem) => problem.to_string(),
                        other => other.to_string(),
                    };
                    error(format!(
                        "certificate {} is not a usable X.509 certificate: {why}",
                        n + 1
                    ))
                })?;
        }
        Ok(Self {
            certificates: certificates.into(),
        })
    }

    /// How many certificates are trusted beyond the public roots.
    pub fn len(&self) -> usize {
        self.certificates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty()
    }

    /// A reqwest client that also trusts these certificates (reqwest keeps
    /// its bundled public roots).
    pub(crate) fn reqwest(
        &self,
        mut builder: reqwest::ClientBuilder,
    ) -> reqwest::Result<reqwest::ClientBuilder> {
        for certificate in self.certificates.iter() {
            builder = builder.add_root_certificate(reqwest::Certificate::from_der(certificate)?);
        }
        Ok(builder)
    }

    /// Object-store client options that also trust these certificates.
    pub(crate) fn object_store(
        &self,
        mut options: object_store::ClientOptions,
    ) -> object_store::Result<object_store::ClientOptions> {
        for certificate in self.certificates.iter() {
            options =
                options.with_root_certificate(object_store::Certificate::from_der(certificate)?);
        }
        Ok(options)
    }

    /// The public roots wasmtime-wasi-http's own sender trusts, and these.
    pub(crate) fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        // Each was added to a store once already, at load.
        roots.add_parsable_certificates(self.certificates.iter().cloned());
        roots
    }
}

/// Said after an HTTPS failure caused by a certificate no trusted CA
/// signed (`hint`).
const UNKNOWN_ISSUER: &str = " (the certificate is signed by a CA berth does not trust: give the server that CA with --ca-file)";

/// What to add to the message of an HTTPS failure: how to trust the CA
/// when the cause is a certificate signed by an unknown one, else nothing.
pub(crate) fn hint(error: &(dyn std::error::Error + 'static)) -> &'static str {
    let unknown_issuer = |e: &(dyn std::error::Error + 'static)| {
        matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))
        )
    };
    if crate::causes::causes(error).any(unknown_issuer) {
        UNKNOWN_ISSUER
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tls as tls;

    #[track_caller]
    fn refused(contents: &[u8], expected: &str) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, contents).unwrap();
        let error = Trust::load(&path).unwrap_err().to_string();
        assert_eq!(error, format!("--ca-file {}: {expected}", path.display()));
    }

    #[test]
    fn a_ca_file_that_cannot_be_used_is_refused_naming_the_file_and_the_problem() {
        refused(
            b"",
            "holds no certificate (expected PEM: -----BEGIN CERTIFICATE----- blocks)",
        );
        refused(
            b"\x30\x82\x01\x0a binary DER",
            "holds no certificate (expected PEM: -----BEGIN CERTIFICATE----- blocks)",
        );
        let key_only = rcgen::KeyPair::generate().unwrap().serialize_pem();
        refused(
            key_only.as_bytes(),
            "holds no certificate (expected PEM: -----BEGIN CERTIFICATE----- blocks)",
        );
        refused(
            b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
            "is not valid PEM: base64 decode error: InvalidCharacter(33)",
        );
        refused(
            b"-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
            "certificate 1 is not a usable X.509 certificate: BadEncoding",
        );

        let missing = tempfile::tempdir().unwrap().path().join("absent.pem");
        let error = Trust::load(&missing).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "--ca-file {}: cannot read it: ",
                missing.display()
            )),
            "{error}"
        );
    }

    #[test]
    fn every_certificate_of_a_bundle_is_trusted() {
        let (one, two) = (tls::TestCa::new("one"), tls::TestCa::new("two"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bundle.pem");
        std::fs::write(&path, one.pem() + &two.pem()).unwrap();
        let trust = Trust::load(&path).unwrap();
        assert_eq!(trust.len(), 2);
        assert_eq!(
            trust.roots().len(),
            webpki_roots::TLS_SERVER_ROOTS.len() + 2
        );
    }
}
