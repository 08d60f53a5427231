//! The model `berth plugin run` hands a deployer: a registration body
//! (`--model`, checked by the server's own rules) whose files are taken
//! from `--dir` and checked as a deployment checks what it fetches, or,
//! without one, every regular file under `--dir` with its size and sha256.
//! What a deployment's directory would not hold is said on stderr.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::fetch;
use crate::model::{ModelFile, TrainedModel};

/// The model of the registration body in `file`, its files to be found in
/// `dir` (`check_files`).
pub fn registered(file: &Path, dir: &Path) -> anyhow::Result<TrainedModel> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--model {}: cannot be read", file.display()))?;
    let mut model = crate::http::registration(&text)
        .map_err(|e| anyhow::anyhow!("--model {}: {e}", file.display()))?;
    // What the server's records would give it; the guest sees it.
    model.id = 1;
    let listed: BTreeSet<&str> = model.files.iter().map(|f| f.path.as_str()).collect();
    for found in regular_files(dir)? {
        if !listed.contains(found.as_str()) {
            eprintln!(
                "--dir: {found} is not among --model's files: the deployer sees it here, but a deployment's directory would not hold it"
            );
        }
    }
    Ok(model)
}

/// Checks the registered files in `dir` as a deployment's fetch would; a
/// file recorded without sha256 passes on its size, and its sha256 is said.
pub async fn check_files(model: &TrainedModel, dir: &Path) -> Result<(), fetch::Error> {
    let hashes = fetch::check_local(dir, &model.files).await?;
    for (file, sha256) in model.files.iter().zip(hashes) {
        if file.sha256.is_none() {
            eprintln!(
                "file {}: no sha256 recorded, so only its size is checked, as in a deployment (its sha256 is {sha256})",
                file.path
            );
        }
    }
    Ok(())
}

/// Every regular file under `dir`, described the way a registration would.
pub fn of_dir(dir: &Path) -> anyhow::Result<TrainedModel> {
    let mut files = Vec::new();
    for relative in regular_files(dir)? {
        let mut hasher = digest_io::IoWrapper(Sha256::new());
        let path = dir.join(&relative);
        let mut file = std::fs::File::open(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let size = std::io::copy(&mut file, &mut hasher)
            .with_context(|| format!("cannot read {}", path.display()))?;
        files.push(ModelFile {
            path: relative,
            size_bytes: size,
            sha256: Some(hex::encode(hasher.0.finalize())),
            format: None,
        });
    }
    let name = dir
        .canonicalize()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let source = format!("file://{}/{{path}}", dir.display());
    Ok(TrainedModel::from_files(&name, source, files))
}

/// The `/`-separated paths of the regular files under `dir`, sorted; every
/// other entry is reported on stderr, one line each, saying why it is left
/// out.
fn regular_files(dir: &Path) -> anyhow::Result<Vec<String>> {
    let listing = crate::cli::folder::list(
        dir,
        crate::cli::folder::Reach {
            dotfiles: true,
            follow_links: false,
        },
    )
    .with_context(|| "--dir")?;
    for skipped in &listing.skipped {
        eprintln!("--dir: skipped {}: {}", skipped.path, skipped.why);
    }
    for link in &listing.links_out {
        eprintln!(
            "--dir: skipped {}: a link to {}, outside the folder, which the deployer cannot read",
            link.path,
            link.target.display()
        );
    }
    Ok(listing.files.into_iter().map(|f| f.path).collect())
}
