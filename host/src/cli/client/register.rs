//! `berth models register DIR`: a finished training run's folder as a
//! registration (`run_folder`) whose files the server fetches from a
//! source — `--source`, or the folder itself for a server on this machine —
//! sent to the server, or printed with `--dry-run`.

use std::path::Path;

use clap::Args;

use super::api::{Api, Error};
use super::run_folder::{self, FolderArgs};
use super::{Common, print_json};
use crate::cli::folder::Listed;
use crate::http::json;

#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// Where the server fetches the files from: a URL template with
    /// {path} (and optionally {job_id}), like
    /// http://files.internal/{job_id}/{path} or file:///srv/runs/{job_id}/{path}.
    /// Default, for a server on this machine (--server on loopback): the
    /// folder itself, file://DIR/{path}.
    #[arg(long, value_name = "TEMPLATE")]
    source: Option<String>,
    /// Stores the model without the server first finding each file at the
    /// source with its size (for files not copied there yet).
    #[arg(long)]
    no_check_source: bool,
    #[command(flatten)]
    folder: FolderArgs,
    #[command(flatten)]
    pub common: Common,
}

pub async fn run(args: RegisterArgs) -> Result<(), Error> {
    // A bad --server is said before the files are hashed.
    let api = (!args.folder.dry_run)
        .then(|| Api::new(&args.common.server, args.common.token.as_deref()))
        .transpose()?;
    let source = |dir: &Path, files: &[Listed]| source_of(&args, dir, files);
    let digests = async |dir: &Path, files: &[Listed], _| run_folder::hashed(dir, files).await;
    let mut read = run_folder::complete(&args.folder, api.as_ref(), &source, &digests).await?;
    read.body.check_source = args.no_check_source.then_some(false);
    let Some(api) = api else {
        print_json(&serde_json::to_value(&read.body).unwrap_or_default());
        return Ok(());
    };
    let answer = api.post::<json::Model>("/v1/models", &read.body).await?;
    run_folder::report(answer, read.registered, args.common.json);
    Ok(())
}

/// `--source`, or for a server on this machine the folder's own
/// `file://` template; for a `file://` source, a warning about files other
/// users cannot read.
fn source_of(args: &RegisterArgs, dir: &Path, files: &[Listed]) -> Result<String, Error> {
    let source = match &args.source {
        Some(source) => source.clone(),
        None => folder_source(args, dir)?,
    };
    if source.starts_with("file:") {
        let closed = unreadable_by_others(dir, files);
        if !closed.is_empty() {
            eprintln!(
                "warning: {} cannot be read by other users (e.g. mode 0600, as safetensors \
                 writes): a server running as another user will fail to fetch {}; \
                 chmod o+r them",
                closed.join(", "),
                if closed.len() == 1 { "it" } else { "them" }
            );
        }
    }
    Ok(source)
}

/// The folder's own `file://` template, for a server on this machine.
fn folder_source(args: &RegisterArgs, dir: &Path) -> Result<String, Error> {
    let local = url::Url::parse(&args.common.server)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .is_some_and(|host| matches!(host.as_str(), "127.0.0.1" | "localhost" | "[::1]"));
    if !local {
        return Err(Error::Invalid(format!(
            "--source is needed: the server {} is not on this machine, so it cannot read {} \
             (give where it fetches the files from, e.g. --source \
             'https://files.internal/{{job_id}}/{{path}}')",
            args.common.server,
            dir.display()
        )));
    }
    let absolute =
        std::path::absolute(dir).map_err(|e| Error::Invalid(format!("{}: {e}", dir.display())))?;
    let folder = url::Url::from_directory_path(&absolute).map_err(|()| {
        Error::Invalid(format!(
            "{} cannot be written as a file:// URL",
            absolute.display()
        ))
    })?;
    Ok(format!("{folder}{{path}}"))
}

/// Files a server running as another user could not read: `file://`
/// sources only, where the server opens the files themselves.
fn unreadable_by_others(dir: &Path, files: &[Listed]) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    files
        .iter()
        .filter(|f| {
            std::fs::metadata(dir.join(&f.path)).is_ok_and(|m| m.permissions().mode() & 0o004 == 0)
        })
        .map(|f| f.path.clone())
        .collect()
}
