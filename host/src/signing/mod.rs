//! OpenSSF model signing (OMS): verifying a `model.sig` against a model's
//! recorded files, offline, and writing one. Owns the format (a Sigstore
//! bundle v0.3 whose DSSE envelope carries an in-toto statement listing each
//! file's digest) and its three methods: a bare ECDSA key, a certificate
//! chain to a configured CA, and Sigstore keyless against a trusted root. It never reads a model's bytes, never
//! touches the database or the network, and knows nothing of registration:
//! the caller hands in the signature's bytes, the trust it configured and the
//! files it recorded, and gets back who signed and what was checked.
//!
//! Why offline, without re-reading: berth already holds every file's sha256,
//! and an OMS statement lists the same digests, so a signature covers a model
//! once its statement equals the record. Where it cannot (blake2b or sharded
//! digests, a file recorded without a sha256) the answer is
//! [`Error::Unverifiable`], never "verified" over bytes nobody checked.
//!
//! What was measured against: `model-signing` 1.1.1 from PyPI, OpenSSF's
//! reference signer (fixtures in `tests/data/signing/` made by
//! `scripts/make-signing-fixtures`; the interop tests run it). Its facts, in
//! the book's `operating/security/model-signatures.md`.
//!
//! Crates, and why:
//! - `ring` (0.17) for ECDSA P-256/SHA-256 and P-384/SHA-384 over the DSSE
//!   pre-authentication encoding, and for signing: the crypto provider rustls
//!   already builds here, constant-time, widely audited. No second provider
//!   (the RustCrypto `p256`/`p384` crates would be one more to keep patched).
//!   It has no P-521, so neither has berth: such a key is refused by name.
//! - `rustls-webpki` (0.103, `webpki`) for the certificate chain: the path
//!   builder rustls trusts for every TLS connection (signatures, validity,
//!   basic constraints, path length, name constraints, critical extensions),
//!   already built. Its extended-key-usage check is replaced by the reference
//!   tool's own rule (see `chain.rs`).
//! - `x509-parser` (0.18, the version already in Cargo.lock) only to read
//!   what webpki does not expose: a leaf's notBefore, names and key usage, a
//!   public key's curve, PEM blocks.
//! - `serde_json`, `base64`, `hex`, `sha2`: already dependencies.
//!
//! The sigstore crates are not used: they refuse key and certificate bundles,
//! which carry no transparency-log entry, and the keyless checks
//! (`sigstore.rs`: a log's signed promise, a Fulcio chain, an identity) are
//! made of the pieces above, with the trusted root Sigstore's clients keep.

mod bundle;
mod chain;
mod compare;
mod dsse;
mod error;
mod keys;
mod sign;
mod sigstore;
mod statement;
mod verify;

pub use error::{Error, FileProblem, Method, Signer};
pub use sign::{SigningKey, sign};
pub use verify::{Trust, Verified, verify};

/// The file name the reference tool writes and looks for, at the model's root.
/// Never one of the model's files: it is left out of every comparison.
pub const SIGNATURE_FILE: &str = "model.sig";

#[cfg(test)]
mod tests;

#[cfg(test)]
mod chain_tests;

#[cfg(test)]
mod interop_tests;
