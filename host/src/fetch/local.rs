//! A model's files already in a local directory, checked against their
//! record the way a fetch from a `file://` source checks what it reads —
//! the same refusals, the same sentences — but used where they are:
//! nothing is copied, written or deleted. For `berth plugin run --model`.

use std::path::Path;

use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::Error;
use super::file::{sha256_mismatch, size_contradicts, wrong_length};
use super::source::{self, Location, Span};
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::fetch::{Fetcher, Quiet};
    use crate::model::TrainedModel;

    const BYTES: &[u8] = b"weights of a small model";

    fn sha256_of(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    fn record(size_bytes: u64, sha256: Option<String>) -> ModelFile {
        ModelFile {
            path: "sub/w.bin".into(),
            size_bytes,
            sha256,
            format: None,
        }
    }

    /// What a deployment's fetch says of the same file, read from a
    /// `file://` source: the sentence the local check must repeat.
    async fn fetched(dir: &Path, file: &ModelFile) -> Result<(), Error> {
        let models = tempfile::tempdir().unwrap();
        let fetcher = Fetcher::new(models.path().into(), Duration::from_secs(30)).unwrap();
        let source = format!("file://{}/{{path}}", dir.display());
        let model = TrainedModel::from_files("job", source, vec![file.clone()]);
        let cancel = CancellationToken::new();
        fetcher
            .fetch(&model, Arc::new(Quiet), &cancel)
            .await
            .map(drop)
    }

    #[tokio::test]
    async fn a_file_in_place_is_judged_as_a_fetch_of_it_would_be() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/w.bin"), BYTES).unwrap();
        let size = BYTES.len() as u64;
        let wrong = "0".repeat(64);
        // (record, what both say: None for accepted)
        let cases = [
            (record(size, Some(sha256_of(BYTES))), None),
            (record(size, None), None),
            (
                record(size + 1, None),
                Some(format!(
                    "file sub/w.bin: the source has {size} bytes for this file, but the record says {}",
                    size + 1
                )),
            ),
            (
                record(size, Some(wrong.clone())),
                Some(format!(
                    "file sub/w.bin: sha256 mismatch: expected {wrong}, got {}",
                    sha256_of(BYTES)
                )),
            ),
        ];
        for (file, expected) in cases {
            let local = check_local(dir.path(), std::slice::from_ref(&file)).await;
            let fetch = fetched(dir.path(), &file).await;
            assert_eq!(
                local.as_ref().err(),
                fetch.as_ref().err(),
                "{file:?}: the same verdict as a fetch"
            );
            match expected {
                None => assert_eq!(local.unwrap(), [sha256_of(BYTES)], "{file:?}"),
                Some(sentence) => {
                    let said = local.unwrap_err().to_string();
                    assert!(said.starts_with(&sentence), "{file:?}: {said}");
                }
            }
        }
        assert!(
            std::fs::read_dir(dir.path().join("sub")).unwrap().count() == 1,
            "the check wrote nothing beside the file"
        );
    }

    #[tokio::test]
    async fn a_missing_file_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let missing = check_local(dir.path(), &[record(1, None)]).await;
        let said = missing.unwrap_err().to_string();
        assert!(
            said.starts_with("file sub/w.bin: cannot open the source file"),
            "{said}"
        );

        let target = dir.path().join("elsewhere.bin");
        std::fs::write(&target, BYTES).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("sub/w.bin")).unwrap();
        let linked = check_local(dir.path(), &[record(BYTES.len() as u64, None)]).await;
        let said = linked.unwrap_err().to_string();
        assert!(said.contains("is a symbolic link"), "{said}");
    }
}
