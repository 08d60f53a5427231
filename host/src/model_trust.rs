//! Whom this server trusts to have signed models, and what it does with a
//! model's signature: the policy (`--model-signatures off|record|require`)
//! and the signers (`--model-signer FILE`: a PEM public key, PEM CA
//! certificates, or a Sigstore signer: a TOML file naming a trusted root,
//! an identity and an issuer). A registration's `model.sig` is verified here against
//! the files it records (`signing::verify`, no byte read again) and the
//! outcome kept as the model's `Signature`; the admission gate asks
//! `allows` before any deployment is recorded. Knows nothing of HTTP or
//! of the records' storage.

use std::path::{Path, PathBuf};

use crate::model::{ModelFile, Signature, TrainedModel};
use crate::signing::{self, Trust};

/// The most bytes of a `model.sig` looked at: the reference tool's for a
/// model of thousands of files is some hundreds of KiB.
pub const MAX_SIGNATURE_BYTES: usize = 4 << 20;

/// A Sigstore (keyless) signer, as a `--model-signer` TOML file names it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SigstoreSigner {
    /// Sigstore's `trusted_root.json` (or a client trust config), relative
    /// to the signer's file.
    trusted_root: PathBuf,
    /// The certificate's identity: an email or URI; `*` matches any run of
    /// characters.
    identity: String,
    /// The OIDC issuer, exactly.
    issuer: String,
}

impl SigstoreSigner {
    /// The trust it names; `path` is its own file.
    fn trust(&self, path: &Path) -> Result<Trust, signing::Error> {
        let root = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(&self.trusted_root);
        let json = std::fs::read(&root).map_err(|e| {
            signing::Error::Trust(format!(
                "cannot read its trusted_root {}: {e}",
                root.display()
            ))
        })?;
        Trust::sigstore(&json, &self.identity, &self.issuer)
    }
}

/// What the server does with models' signatures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Policy {
    /// Signatures are neither verified nor recorded.
    Off,
    /// A given signature is verified and its outcome recorded; every
    /// model may be deployed.
    #[default]
    Record,
    /// Only a model whose signature a trusted signer made, over exactly
    /// its files, may be deployed.
    Require,
}

/// The policy and the signers, read once at start.
#[derive(Debug, Clone, Default)]
pub struct ModelTrust {
    policy: Policy,
    /// Each with the file it came from, for messages.
    signers: Vec<(PathBuf, Trust)>,
}

impl ModelTrust {
    /// Reads each file of `signers`: a PEM `PUBLIC KEY` (the key method),
    /// PEM `CERTIFICATE`s (the certificate method, each a trust anchor), or
    /// a Sigstore signer (TOML, `SigstoreSigner`).
    pub fn load(policy: Policy, signers: &[PathBuf]) -> Result<Self, String> {
        let mut read = Vec::new();
        for path in signers {
            let pem = std::fs::read(path)
                .map_err(|e| format!("--model-signer {}: cannot read it: {e}", path.display()))?;
            let text = String::from_utf8_lossy(&pem);
            let trust = if text.contains("-----BEGIN PUBLIC KEY-----") {
                Trust::public_key_pem(&pem)
            } else if text.contains("-----BEGIN CERTIFICATE-----") {
                Trust::ca_certificates_pem(&pem)
            } else if let Ok(signer) = toml::from_str::<SigstoreSigner>(&text) {
                signer.trust(path)
            } else {
                return Err(format!(
                    "--model-signer {}: holds neither a PEM PUBLIC KEY, CERTIFICATEs nor a \
                     Sigstore signer (TOML: trusted_root, identity, issuer)",
                    path.display()
                ));
            };
            let trust = trust.map_err(|e| format!("--model-signer {}: {e}", path.display()))?;
            read.push((path.clone(), trust));
        }
        if policy == Policy::Require && read.is_empty() {
            return Err(
                "--model-signatures require needs a --model-signer (a PEM public key, CA \
                 certificates or a Sigstore signer) to trust: without one no model could be \
                 deployed"
                    .into(),
            );
        }
        Ok(Self {
            policy,
            signers: read,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The record of `model_sig` for a model of `files`, verified at
    /// `now`: who signed it, or why it does not vouch for the model.
    /// `None` when the policy is off.
    pub fn examine(&self, model_sig: &[u8], files: &[ModelFile], now: &str) -> Option<Signature> {
        if self.policy == Policy::Off {
            return None;
        }
        let bundle = String::from_utf8_lossy(model_sig).into_owned();
        let outcome = if model_sig.len() > MAX_SIGNATURE_BYTES {
            Err(format!(
                "the signature is {} bytes, more than the {} MiB berth reads",
                model_sig.len(),
                MAX_SIGNATURE_BYTES >> 20
            ))
        } else {
            self.verified(model_sig, files)
        };
        Some(match outcome {
            Ok(verified) => Signature {
                method: Some(verified.method.to_string()),
                signer: Some(verified.signer.to_string()),
                verified_at: Some(now.to_string()),
                error: None,
                bundle,
            },
            Err(error) => Signature {
                method: None,
                signer: None,
                verified_at: None,
                error: Some(error),
                bundle,
            },
        })
    }

    /// Verified by the first signer that vouches for it; else the sentence
    /// of the first signer of the signature's method (or the first one).
    fn verified(&self, model_sig: &[u8], files: &[ModelFile]) -> Result<signing::Verified, String> {
        if self.signers.is_empty() {
            return Err(
                "no signer is trusted on this server (--model-signer), so the signature \
                 cannot be verified"
                    .into(),
            );
        }
        let mut first: Option<(bool, String)> = None;
        for (path, trust) in &self.signers {
            match signing::verify(model_sig, trust, files) {
                Ok(verified) => return Ok(verified),
                Err(e) => {
                    let other_method = matches!(e, signing::Error::MethodMismatch { .. });
                    let sentence = format!("{e} (checked with --model-signer {})", path.display());
                    if first
                        .as_ref()
                        .is_none_or(|(was_other, _)| *was_other && !other_method)
                    {
                        first = Some((other_method, sentence));
                    }
                }
            }
        }
        Err(first.map(|(_, s)| s).unwrap_or_default())
    }

    /// Whether `model` may be deployed here: under `require`, only with a
    /// verified signature; the sentence says what is missing and the way
    /// out.
    pub fn allows(&self, model: &TrainedModel) -> Result<(), String> {
        if self.policy != Policy::Require {
            return Ok(());
        }
        let why = match &model.signature {
            Some(Signature {
                verified_at: Some(_),
                ..
            }) => return Ok(()),
            Some(Signature { error, .. }) => format!(
                "its signature does not vouch for it: {}",
                error.as_deref().unwrap_or("it was not verified")
            ),
            None => "it has no signature".to_string(),
        };
        Err(format!(
            "model {} cannot be deployed: this server requires models signed by a trusted \
             signer (--model-signatures require), and {why}; register it again with a \
             model.sig a --model-signer made over exactly its files",
            model.id
        ))
    }
}
