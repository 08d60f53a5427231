//! `/v1/blobs`' shape: a blob stored by upload.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A blob the store holds whole, verified and pinned: a model registered
/// with the source `upload:` may name it.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Blob {
    /// Lowercase hex.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub sha256: String,
    pub size_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::*;

    #[test]
    fn a_blob_keeps_its_bytes() {
        check(
            Blob {
                sha256: "ab".repeat(32),
                size_bytes: 4096,
            },
            &format!(r#"{{"sha256":"{}","size_bytes":4096}}"#, "ab".repeat(32)),
        );
    }
}
