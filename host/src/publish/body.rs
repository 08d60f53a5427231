//! What a put sends: a file streamed from disk or bytes held, and, for
//! destinations told the digest before the bytes, the body with its sha256
//! learned first.

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use super::{Error, Key, Subject, read};

/// What to put. A file is streamed from disk (never whole in memory);
/// `sha256` is its verified digest when known (a model file's recorded
/// one), else the host computes it while reading; `vouched` is the file's
/// stamp in the verification record, by which an unchanged file is not
/// hashed again.
pub enum Body {
    File {
        path: PathBuf,
        bytes: u64,
        sha256: Option<String>,
        vouched: Option<crate::fetch::Stamp>,
    },
    Bytes {
        bytes: bytes::Bytes,
        content_type: String,
    },
}

/// What a put sends, once per try: bytes held, or a file read from disk
/// (with its stamp in the verification record, if any).
pub(super) enum Content {
    Bytes(bytes::Bytes),
    File(PathBuf, Option<crate::fetch::Stamp>),
}

/// A body whose sha256 is known before anything is sent, for destinations
/// told the digest first (a mirror's `Content-Digest`, a registry's blob
/// name).
pub(super) struct Digested {
    pub(super) bytes: u64,
    /// Lowercase hex, 64 digits.
    pub(super) sha256: String,
    /// A `Body::Bytes`'s content type; `None` for a file.
    pub(super) content_type: Option<String>,
    pub(super) content: Content,
}

impl Body {
    /// The body with its digest: a file's recorded one, or the file read
    /// once to learn it (the sending read checks that the file did not
    /// change in between).
    pub(super) async fn digested(
        self,
        subject: &Subject,
        key: &Key,
        cancel: &CancellationToken,
    ) -> Result<Digested, Error> {
        let digested = match self {
            Body::Bytes {
                bytes,
                content_type,
            } => Digested {
                bytes: bytes.len() as u64,
                sha256: sha256_hex(&bytes),
                content_type: Some(content_type),
                content: Content::Bytes(bytes),
            },
            Body::File {
                path,
                bytes,
                sha256,
                vouched,
            } => {
                let sha256 = match sha256 {
                    Some(sha256) => sha256.to_ascii_lowercase(),
                    None => match read::digest_of(path.clone(), bytes, cancel.clone()).await {
                        Ok(Some(sha256)) => sha256,
                        Ok(None) => return Err(Error::Cancelled),
                        Err(e) => return Err(subject.source(key, e)),
                    },
                };
                Digested {
                    bytes,
                    sha256,
                    content_type: None,
                    content: Content::File(path, vouched),
                }
            }
        };
        if crate::oci::reference::checked_hex(&digested.sha256).is_err() {
            return Err(subject.source(
                key,
                format!(
                    "the expected sha256 {:?} is not 64 hex digits",
                    digested.sha256
                ),
            ));
        }
        Ok(digested)
    }
}

/// The lowercase hex sha256 of `bytes`.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
