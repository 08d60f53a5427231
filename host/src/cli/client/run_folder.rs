//! A training run's folder read as a registration, for `berth models
//! register` and `berth models push`: the flags that choose its files and
//! fill its fields (`FolderArgs`), the folder listed, its files chosen
//! (`choose`), hashed (by the caller's `digests`: `hashed` here, or on
//! the way to the server) and its PEFT and Trainer files read (`training`),
//! looked at again while it is still being written (`--wait`). What it
//! leaves out of the folder is named on stderr. Where the files come from
//! is the caller's (`Source`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::{Map, Value};

use super::api::{Api, Error};
use super::progress::Meter;
use super::training;
use crate::cli::choose::{self, Why};
use crate::cli::folder::{self, Listed, Listing};
use crate::http::json::{self, FileBody, RegisterBody};

/// The source a registration names, from the folder it reads and the files
/// it chose.
pub(super) type Source<'a> = dyn Fn(&Path, &[Listed]) -> Result<String, Error> + Sync + 'a;

/// A folder read as a registration.
pub(super) struct Registration {
    pub body: RegisterBody,
    /// The model the job id names on the server already, with these files.
    pub registered: Option<i64>,
    /// The folder the files are in (a checkpoint's, with `--checkpoint`).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct FolderArgs {
    /// The training run's output folder.
    pub dir: PathBuf,
    /// The model's name (default: the folder's name).
    #[arg(long)]
    name: Option<String>,
    /// The training job's id, which names the model's directory on the
    /// server (default: the folder's name).
    #[arg(long)]
    job_id: Option<String>,
    /// Wins over adapter_config.json's base_model_name_or_path.
    #[arg(long)]
    base_model: Option<String>,
    #[arg(long)]
    model_size: Option<String>,
    #[arg(long)]
    dataset: Option<String>,
    #[arg(long, value_name = "N")]
    num_examples: Option<u64>,
    /// Wins over trainer_state.json's global_step.
    #[arg(long, value_name = "N")]
    num_train_steps: Option<u64>,
    /// Wins over the last loss trainer_state.json logged.
    #[arg(long, value_name = "LOSS")]
    final_loss: Option<f64>,
    /// One training parameter: VALUE is JSON if it parses, otherwise a
    /// string. Repeat for more; wins over what adapter_config.json says.
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = super::parse_option)]
    params: Vec<(String, Value)>,
    /// Registers files and folders whose names start with a dot too
    /// (`.git/` never).
    #[arg(long)]
    all: bool,
    /// Follows links to files anywhere. Without it, a link is followed
    /// only when it leads inside DIR or into the `blobs/` of the Hugging
    /// Face cache DIR is a snapshot of; any other is refused.
    #[arg(long)]
    follow_links: bool,
    /// Leaves out the files PATTERN matches (gitignore-style; repeat for
    /// more). A `.berthignore` in DIR adds its lines.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Takes back files an exclude or the training-run default left out,
    /// e.g. --include 'checkpoint-*/**'.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Registers one checkpoint of a Trainer run, DIR/checkpoint-N (`last`:
    /// the highest N), as the model; its default name and job id are the
    /// run's folder name and `-checkpoint-N`.
    #[arg(long, value_name = "N|last")]
    checkpoint: Option<String>,
    /// Waits (up to an hour, looking again every 2 s) while the folder is
    /// still being written, instead of refusing it: a file changing while
    /// it is hashed, a checkpoint without its trainer_state.json.
    #[arg(long)]
    wait: bool,
    /// The model's OpenSSF signature (what `model_signing sign` wrote),
    /// sent for the server to verify. Default: DIR/model.sig, if there is
    /// one; it is never registered as one of the model's files.
    #[arg(long, value_name = "FILE")]
    signature: Option<PathBuf>,
    /// Prints the registration body instead of sending it (what is left
    /// out is said on stderr, as always).
    #[arg(long)]
    pub dry_run: bool,
}

/// `body_of`, looked at again while the folder is still being written and
/// `--wait` says to wait for it (at most `MAX_WAIT`).
///
/// `digests` gives the chosen files' sizes and digests, from the folder,
/// the files, and the model the job id names already with these files, if
/// any.
pub(super) async fn complete(
    args: &FolderArgs,
    api: Option<&Api>,
    source: &Source<'_>,
    digests: &impl AsyncFn(&Path, &[Listed], Option<i64>) -> Result<Vec<FileBody>, Error>,
) -> Result<Registration, Error> {
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        match body_of(args, api, source, digests).await {
            Err(Error::Unfinished(why)) if args.wait && started.elapsed() < MAX_WAIT => {
                if !said {
                    eprintln!("waiting: {why}");
                    said = true;
                }
                tokio::time::sleep(LOOK_AGAIN).await;
            }
            Err(Error::Unfinished(why)) if args.wait => {
                return Err(Error::Unfinished(format!(
                    "{why} (still, after waiting {})",
                    crate::human::duration(MAX_WAIT)
                )));
            }
            done => return done,
        }
    }
}

/// How long `--wait` waits for a run to finish writing its folder.
const MAX_WAIT: Duration = Duration::from_secs(3600);
/// How often it looks again.
const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// The registration of `args.dir`: listed, chosen, hashed, read, flags on
/// top, its source from `source` (asked before any hashing); and the model
/// its job id names on `api` already, if any, whose files the listing
/// matches (one that does not is refused before any hashing).
async fn body_of(
    args: &FolderArgs,
    api: Option<&Api>,
    source: &Source<'_>,
    digests: &impl AsyncFn(&Path, &[Listed], Option<i64>) -> Result<Vec<FileBody>, Error>,
) -> Result<Registration, Error> {
    let (dir, folder_name) = match &args.checkpoint {
        Some(wanted) => {
            let (n, dir) = checkpoint(&args.dir, wanted)?;
            let run = folder_name(&args.dir).unwrap_or_default();
            (dir, Some(format!("{run}-checkpoint-{n}")))
        }
        None => (args.dir.clone(), folder_name(&args.dir)),
    };
    let listing_dir = dir.clone();
    let reach = folder::Reach {
        dotfiles: args.all,
        follow_links: args.follow_links,
    };
    let invalid = |e: anyhow::Error| Error::Invalid(format!("{e:#}"));
    let mut listing = tokio::task::spawn_blocking(move || folder::list(&listing_dir, reach))
        .await
        .map_err(|e| Error::Invalid(e.to_string()))?
        .map_err(invalid)?;
    for skipped in &listing.skipped {
        eprintln!("skipped {}: {}", skipped.path, skipped.why);
    }
    if !listing.links_out.is_empty() {
        let lines: Vec<String> = listing
            .links_out
            .iter()
            .map(|link| {
                format!(
                    "{}: a link to {}, outside {}: berth follows links inside the folder or \
                     into a Hugging Face cache's blobs/; copy the file in, or pass \
                     --follow-links to register what it points at",
                    link.path,
                    link.target.display(),
                    dir.display()
                )
            })
            .collect();
        return Err(Error::Invalid(lines.join("\n")));
    }
    let signature = signature_of(args, &dir, &mut listing)?;
    let every_file = listing.files.clone();
    listing.files = chosen(args, &dir, std::mem::take(&mut listing.files))?;
    if listing.files.is_empty() {
        return Err(Error::Invalid(format!(
            "{} holds no file to register{}",
            dir.display(),
            if listing.skipped.is_empty() {
                ""
            } else {
                " (see what was skipped above)"
            }
        )));
    }
    let job_id = args.job_id.clone().or(folder_name.clone());
    // Said before any hashing, with the way out.
    if let Some(Err(e)) = job_id.as_deref().map(crate::validate::job_id_rule) {
        return Err(Error::Invalid(match args.job_id {
            Some(_) => e,
            None => format!("{e}; the folder's name is the default job id: give one with --job-id"),
        }));
    }
    let registered = match (api, &job_id) {
        (Some(api), Some(job_id)) => registered_as(api, job_id, &listing.files).await?,
        _ => None,
    };
    let source = source(&dir, &listing.files)?;
    let files = digests(&dir, &listing.files, registered).await?;
    let found = training::of_folder(&dir, &every_file, &listing.files);
    for note in &found.notes {
        eprintln!("note: {note}");
    }
    let mut params: Map<String, Value> = found.params;
    params.extend(args.params.iter().cloned());
    let body = RegisterBody {
        name: args.name.clone().or(folder_name),
        job_id,
        base_model: args.base_model.clone().or(found.base_model),
        model_size: args.model_size.clone(),
        dataset: args.dataset.clone(),
        num_examples: args.num_examples,
        num_train_steps: args.num_train_steps.or(found.num_train_steps),
        final_loss: args.final_loss.or(found.final_loss),
        params: (!params.is_empty()).then_some(Value::Object(params)),
        source: Some(source),
        files: Some(files),
        check_source: None,
        signature,
    };
    Ok(Registration {
        body,
        registered,
        dir,
    })
}

/// Says what the server answered a registration with: the model, or that
/// it was registered already (`registered`).
pub(super) fn report(
    answer: super::api::Answer<json::Model>,
    registered: Option<i64>,
    as_json: bool,
) {
    if as_json {
        super::print_json(&answer.raw);
        return;
    }
    let model = answer.body;
    if registered == Some(model.id) {
        println!(
            "already registered as model {} (job {}): the same files from the same source",
            model.id, model.job_id
        );
        return;
    }
    let size: u64 = model.files.iter().map(|f| f.size_bytes).sum();
    println!(
        "registered model {} (job {}): {} files, {}",
        model.id,
        model.job_id,
        model.files.len(),
        crate::human::size(size)
    );
}

/// The id of the model registered under `job_id` on `api`, if any, when
/// `files` are its files by path and size; a 409's sentence, before any
/// hashing, when they are not.
async fn registered_as(api: &Api, job_id: &str, files: &[Listed]) -> Result<Option<i64>, Error> {
    let models = api.get::<super::Models>("/v1/models").await?.body.models;
    let Some(model) = models.into_iter().find(|m| m.job_id == job_id) else {
        return Ok(None);
    };
    let theirs: Vec<(&str, u64)> = model
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.size_bytes))
        .collect();
    let ours: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
    if theirs == ours {
        return Ok(Some(model.id));
    }
    let differs = ours
        .iter()
        .find(|file| !theirs.contains(file))
        .map(|(path, size)| format!("it has no {path} of {size} bytes"))
        .or_else(|| {
            theirs
                .iter()
                .find(|file| !ours.contains(file))
                .map(|(path, _)| format!("it has {path}, which this folder does not"))
        })
        .unwrap_or_default();
    Err(Error::Invalid(format!(
        "job id {job_id:?} is registered already as model {} and {differs}; register this \
         folder under another job id (--job-id), or delete model {} first",
        model.id, model.id
    )))
}

/// The checkpoint `wanted` (`N` or `last`) of the run in `dir`: its number
/// and folder.
fn checkpoint(dir: &Path, wanted: &str) -> Result<(u64, PathBuf), Error> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", dir.display())))?;
    let mut numbers: Vec<u64> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| choose::checkpoint_number(e.file_name().to_str()?))
        .collect();
    numbers.sort_unstable();
    let n = match wanted {
        "last" => numbers.last().copied(),
        n => n.parse().ok().filter(|n| numbers.contains(n)),
    };
    let listed = || {
        if numbers.is_empty() {
            "it has no checkpoint-N folder".to_string()
        } else {
            let names: Vec<String> = numbers.iter().map(|n| format!("checkpoint-{n}")).collect();
            format!("it has {}", names.join(", "))
        }
    };
    match n {
        Some(n) => Ok((n, dir.join(format!("checkpoint-{n}")))),
        None if wanted != "last" && wanted.parse::<u64>().is_err() => Err(Error::Invalid(format!(
            "--checkpoint {wanted:?} is neither a number nor last"
        ))),
        None => Err(Error::Invalid(format!(
            "{} has no checkpoint {wanted}: {}",
            dir.display(),
            listed()
        ))),
    }
}

/// The files of `dir` the registration takes (`choose`), with what it
/// left out said on stderr.
fn chosen(args: &FolderArgs, dir: &Path, files: Vec<Listed>) -> Result<Vec<Listed>, Error> {
    let mut rules = choose::Rules {
        include: args.include.clone(),
        exclude: args.exclude.clone(),
    };
    rules.exclude.push(IGNORE_FILE.to_string());
    match std::fs::read_to_string(dir.join(IGNORE_FILE)) {
        Ok(text) => rules = rules.with_ignore_file(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::Invalid(format!(
                "cannot read {}: {e}",
                dir.join(IGNORE_FILE).display()
            )));
        }
    }
    let choice = choose::choose(files, &rules).map_err(Error::Invalid)?;
    let unfinished = choose::half_written(&choice.kept, args.checkpoint.is_some());
    if !unfinished.is_empty() {
        let named: Vec<String> = unfinished
            .iter()
            .map(|folder| match folder.as_str() {
                "" => dir.display().to_string(),
                folder => folder.to_string(),
            })
            .collect();
        return Err(Error::Unfinished(format!(
            "{} has no {}, which Trainer writes last: it is still being written, or was cut \
             short; register it once it has one (--wait waits for it), or leave it out \
             (--exclude)",
            named.join(", "),
            choose::WRITTEN_LAST
        )));
    }
    let count = |why| choice.left_out.iter().filter(|(_, w)| *w == why).count();
    let excluded = count(Why::Excluded);
    if excluded > 0 {
        eprintln!("left out {excluded} file(s) that --exclude or {IGNORE_FILE} matched");
    }
    let state: Vec<&Listed> = choice
        .left_out
        .iter()
        .filter(|(_, w)| *w == Why::TrainingState)
        .map(|(f, _)| f)
        .collect();
    if !state.is_empty() {
        // A checkpoint's files are said as its folder, once.
        let mut named: Vec<String> = Vec::new();
        for file in &state {
            let name = match file.path.split_once('/') {
                Some((top, _)) if choose::checkpoint_number(top).is_some() => format!("{top}/"),
                _ => file.path.clone(),
            };
            if !named.contains(&name) {
                named.push(name);
            }
        }
        let bytes: u64 = state.iter().map(|f| f.size).sum();
        eprintln!(
            "left out a training run's state, {} file(s), {}: {}; serving needs none of it. \
             --include PATTERN takes some back (e.g. --include 'checkpoint-*/**'); \
             --checkpoint N|last registers one checkpoint as the model",
            state.len(),
            crate::human::size(bytes),
            named.join(", ")
        );
    }
    Ok(choice.kept)
}

/// Patterns of files a registration leaves out, read from the folder.
const IGNORE_FILE: &str = ".berthignore";

/// The folder's own name, the default name and job id.
fn folder_name(dir: &Path) -> Option<String> {
    std::path::absolute(dir)
        .ok()?
        .components()
        .rfind(|c| matches!(c, std::path::Component::Normal(_)))
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
}

/// The signature to send: `--signature`, or the folder's `model.sig`,
/// which is taken out of the listing either way (it signs the files; it
/// is not one of them).
fn signature_of(
    args: &FolderArgs,
    dir: &Path,
    listing: &mut Listing,
) -> Result<Option<Value>, Error> {
    use crate::signing::SIGNATURE_FILE;
    let beside = listing.files.iter().position(|f| f.path == SIGNATURE_FILE);
    let beside = beside.map(|i| listing.files.remove(i));
    let path = match (&args.signature, beside) {
        (Some(path), _) => path.clone(),
        (None, Some(_)) => dir.join(SIGNATURE_FILE),
        (None, None) => return Ok(None),
    };
    let bytes = std::fs::read(&path).map_err(|e| {
        Error::Invalid(format!("cannot read the signature {}: {e}", path.display()))
    })?;
    if bytes.len() > crate::model_trust::MAX_SIGNATURE_BYTES {
        return Err(Error::Invalid(format!(
            "{} is {} bytes: too large for a model.sig",
            path.display(),
            bytes.len()
        )));
    }
    let bundle = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Invalid(format!(
            "{} is not a model.sig (a Sigstore bundle, JSON): {e}",
            path.display()
        ))
    })?;
    eprintln!("signature: {} (the server verifies it)", path.display());
    Ok(Some(bundle))
}

/// Every listed file with its size and sha256, hashed off the async
/// threads; a line on a terminal shows how far it is.
pub(super) async fn hashed(dir: &Path, files: &[Listed]) -> Result<Vec<FileBody>, Error> {
    let total: u64 = files.iter().map(|f| f.size).sum();
    let meter = Meter::start(format!("hashing {} files", files.len()), total, false);
    let done = meter.done();
    let (dir, files) = (dir.to_path_buf(), files.to_vec());
    let counter = done.clone();
    let result = tokio::task::spawn_blocking(move || {
        folder::hash(&dir, &files, &counter).map(|hashed| (files, hashed))
    })
    .await;
    meter.finish().await;
    let (files, hashed) = result
        .map_err(|e| Error::Invalid(e.to_string()))?
        .map_err(|e| match e.downcast::<folder::Changed>() {
            Ok(changed) => Error::Unfinished(changed.to_string()),
            Err(e) => Error::Invalid(format!("{e:#}")),
        })?;
    Ok(files
        .into_iter()
        .zip(hashed)
        .map(|(file, hashed)| FileBody {
            path: Some(file.path),
            size_bytes: Some(hashed.size),
            sha256: Some(hashed.sha256),
        })
        .collect())
}
