//! A model's files already in a local directory, checked against their
//! record the way a fetch from a `file://` source checks what it reads —
//! the same refusals, the same sentences — but used where they are:
//! nothing is copied, written or deleted. For `berth plugin run --model`.

use std::path::Path;

use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::source::{self, Location, Span};
use super::{Error, sha256_mismatch, size_contradicts, wrong_length};
use crate::model::ModelFile;

/// Checks each recorded file at `dir/<path>` against its size and, when
/// recorded, its sha256; stops at the first that contradicts its record.
/// Returns each file's sha256 as read, in the order of `files`.
pub async fn check_local(dir: &Path, files: &[ModelFile]) -> Result<Vec<String>, Error> {
    if files.is_empty() {
        return Err(Error::NoFiles);
    }
    let mut hashes = Vec::with_capacity(files.len());
    for file in files {
        let sha256 = check_file(dir, file).await.map_err(|reason| Error::File {
            path: file.path.clone(),
            reason,
        })?;
        hashes.push(sha256);
    }
    Ok(hashes)
}

async fn check_file(dir: &Path, file: &ModelFile) -> Result<String, String> {
    let path = dir.join(&file.path);
    // A fetch would follow a link at its source and put a regular file in
    // the model directory; here the directory is the one the deployer sees,
    // where a link could lead out of its mount.
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!(
            "{} is a symbolic link; a deployment's model directory holds only regular files: copy the file there instead",
            path.display()
        ));
    }
    let location = Location::File(path.clone());
    let mut body = source::open_file(&path, Span::from(0)).await?;
    let size = file.size_bytes;
    if let Some(total) = body.total.filter(|total| *total != size) {
        return Err(size_contradicts(total, size, &location));
    }
    let mut hasher = Sha256::new();
    let mut received = 0u64;
    while let Some(chunk) = body.stream.next().await {
        let chunk = chunk?;
        received += chunk.len() as u64;
        hasher.update(&chunk);
    }
    if received != size {
        return Err(wrong_length(size, received, &location));
    }
    let sha256 = hex::encode(hasher.finalize());
    match &file.sha256 {
        Some(expected) if *expected != sha256 => Err(sha256_mismatch(expected, &sha256, &location)),
        _ => Ok(sha256),
    }
}
