//! What a verification says: who signed, and each way it can fail, in
//! sentences for the person who must act on them.

use std::fmt;

/// How a `model.sig` was signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A bare ECDSA key (`model_signing sign key`).
    Key,
    /// A key whose certificate chains to a CA (`model_signing sign certificate`).
    Certificate,
    /// Sigstore keyless: a short-lived Fulcio certificate for an OIDC
    /// identity, the signature in the Rekor transparency log
    /// (`model_signing sign sigstore`).
    Sigstore,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Key => "bare public key",
            Method::Certificate => "certificate chain",
            Method::Sigstore => "Sigstore keyless identity",
        })
    }
}

/// Who signed, as far as a verified signature proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signer {
    /// `key_id`: the lowercase hex sha256 of the public key's PEM text
    /// (SubjectPublicKeyInfo, LF line ends, 64 columns), which is exactly the
    /// hint `model_signing` writes into the bundle; `sha256sum key.pub.pem`
    /// gives it for a key written by openssl or Python's `cryptography`.
    Key { key_id: String },
    /// The leaf certificate's subject, its subject alternative names
    /// (`email:…`, `uri:…`, `dns:…`) and its issuer, as the chain proved them.
    Certificate {
        subject: String,
        names: Vec<String>,
        issuer: String,
    },
    /// The OIDC identity (an email or a URI) and issuer the Fulcio
    /// certificate names, and the entry's index in the transparency log.
    Sigstore {
        identity: String,
        issuer: String,
        log_index: i64,
    },
}

impl fmt::Display for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Signer::Key { key_id } => write!(f, "key sha256:{key_id}"),
            Signer::Sigstore {
                identity,
                issuer,
                log_index,
            } => write!(
                f,
                "Sigstore identity {identity} (issuer {issuer}, log entry {log_index})"
            ),
            Signer::Certificate {
                subject,
                names,
                issuer,
            } => {
                write!(f, "certificate \"{subject}\"")?;
                if !names.is_empty() {
                    write!(f, " ({})", names.join(", "))?;
                }
                write!(f, " issued by \"{issuer}\"")
            }
        }
    }
}

/// One difference between what a signature lists and the model's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileProblem {
    /// Signed, but not one of the model's files.
    Missing { path: String },
    /// One of the model's files, but not signed (nor left out by the signer).
    Unsigned { path: String },
    /// Signed with another sha256 than the one recorded.
    Differs {
        path: String,
        signed: String,
        recorded: String,
    },
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::Missing { path } => {
                write!(f, "{path} is signed but not a file of the model")
            }
            FileProblem::Unsigned { path } => {
                write!(
                    f,
                    "{path} is a file of the model but the signature does not cover it"
                )
            }
            FileProblem::Differs {
                path,
                signed,
                recorded,
            } => write!(
                f,
                "{path} was signed with sha256 {signed} but is recorded with {recorded}"
            ),
        }
    }
}

/// Why a `model.sig` does not vouch for a model. Each message starts with
/// its subject; the caller adds which model once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configured trust itself is unusable (found when it is read, not
    /// when a signature is checked).
    #[error("signing trust: {0}")]
    Trust(String),
    /// Not a bundle the reference tool writes (JSON, media type, envelope).
    #[error("model.sig is not an OpenSSF model signature: {0}")]
    Malformed(String),
    /// The transparency-log entry of a keyless bundle does not vouch for
    /// its signature.
    #[error("model.sig: its transparency-log entry {0}")]
    Log(String),
    /// A genuine keyless signature, by someone the policy does not name.
    #[error(
        "model.sig was signed by {found}, not by the configured identity {identity} of issuer \
         {issuer}"
    )]
    OtherIdentity {
        found: String,
        identity: String,
        issuer: String,
    },
    /// The bundle's method is not the one berth was configured to trust.
    #[error(
        "model.sig is signed with a {found}, but berth is configured to trust a {configured}: {}",
        method_advice(*found)
    )]
    MethodMismatch { configured: Method, found: Method },
    /// The bundle names its key (the sha256 of its PEM) and it is not ours.
    #[error("model.sig was signed by key sha256:{hint}, not by the configured key sha256:{key_id}")]
    WrongKey { hint: String, key_id: String },
    /// The ECDSA signature over the envelope does not verify.
    #[error(
        "model.sig: the signature does not verify with {signer}: it was signed by another key, \
         or the signed statement was changed after signing"
    )]
    BadSignature { signer: Signer },
    /// A key of a curve or kind berth cannot check.
    #[error("model.sig: {0}")]
    UnsupportedKey(String),
    /// The signing certificate does not lead to a configured CA.
    #[error(
        "model.sig: the signing certificate \"{subject}\" does not chain to a configured CA: \
         {reason} (the chain is checked at {at})"
    )]
    Untrusted {
        subject: String,
        at: String,
        reason: String,
    },
    /// The leaf may not sign: the reference tool's rule.
    #[error(
        "model.sig: the signing certificate \"{subject}\" may not sign: it has neither the \
         digitalSignature key usage nor the codeSigning extended key usage"
    )]
    NotForSigning { subject: String },
    /// The signed statement is not an OMS v1.0 statement, or is inconsistent.
    #[error("model.sig: the signed statement {0}")]
    Statement(String),
    /// The signature is genuine, and the model is not what it signed.
    #[error(
        "model.sig ({signer}) verifies, but the model differs from what it signed: {}",
        list(problems)
    )]
    Files {
        signer: Signer,
        problems: Vec<FileProblem>,
    },
    /// berth was asked to sign what it cannot vouch for.
    #[error("cannot sign: {0}")]
    CannotSign(String),
    /// The signature is genuine, and these files cannot be compared from
    /// their records alone.
    #[error(
        "model.sig ({signer}) verifies, but {} cannot be verified without re-reading: {why}: {}",
        files_noun(paths.len()),
        paths.join(", ")
    )]
    Unverifiable {
        signer: Signer,
        why: String,
        paths: Vec<String>,
    },
}

fn method_advice(found: Method) -> &'static str {
    match found {
        Method::Key => {
            "configure the signer's public key, or have the model signed with a certificate \
             that chains to the configured CA"
        }
        Method::Certificate => {
            "configure the CA certificates its chain leads to, or have the model signed with \
             the configured key"
        }
        Method::Sigstore => {
            "configure a Sigstore signer (a trusted root and the identity), or have the model \
             signed with the configured key or certificate"
        }
    }
}

fn list(problems: &[FileProblem]) -> String {
    let items: Vec<String> = problems.iter().map(ToString::to_string).collect();
    items.join("; ")
}

fn files_noun(n: usize) -> String {
    if n == 1 {
        "1 file".to_owned()
    } else {
        format!("{n} files")
    }
}
