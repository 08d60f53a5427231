//! `/v1/deployments/{id}/files`' shape: the listing of a deployment's
//! artifacts (the files themselves go out as bytes).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::artifacts::Listing;

/// `GET /v1/deployments/{id}/files`: what the deployer left in its
/// output directory, as far as it may be served.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Artifacts {
    /// Regular files only, sorted by path.
    pub files: Vec<Artifact>,
    /// More files than are listed.
    pub truncated: bool,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    /// Relative to the output directory, `/`-separated.
    pub path: String,
    pub size_bytes: u64,
    /// RFC 3339 UTC with milliseconds.
    pub modified: String,
}

impl From<&Listing> for Artifacts {
    fn from(listing: &Listing) -> Self {
        Artifacts {
            files: listing
                .files
                .iter()
                .map(|a| Artifact {
                    path: a.path.clone(),
                    size_bytes: a.size_bytes,
                    modified: humantime::format_rfc3339_millis(a.modified).to_string(),
                })
                .collect(),
            truncated: listing.truncated,
        }
    }
}
