//! Registration rules: turns what a client sent into a `TrainedModel`, or
//! into every problem at once. Pure: no I/O, no database.

use std::collections::HashSet;

use crate::model::{ModelFile, TrainedModel};

/// A registration as received, before any rule was applied.
#[derive(Debug, Default, Clone)]
pub struct ModelDraft {
    pub name: Option<String>,
    pub job_id: Option<String>,
    pub base_model: Option<String>,
    pub model_size: Option<String>,
    pub dataset: Option<String>,
    pub num_examples: Option<u64>,
    pub num_train_steps: Option<u64>,
    pub final_loss: Option<f64>,
    pub params: Option<serde_json::Value>,
    pub source: Option<String>,
    pub files: Vec<FileDraft>,
}

#[derive(Debug, Default, Clone)]
pub struct FileDraft {
    pub path: Option<String>,
    pub size_bytes: Option<u64>,
    pub sha256: Option<String>,
}

/// Every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

/// One problem: the field it is about, as the registration names it
/// (`name`, `files[2].path`; `files` for a conflict between two files),
/// and a sentence that starts with that field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl Problem {
    fn new(field: impl Into<String>, message: String) -> Self {
        Problem {
            field: field.into(),
            message,
        }
    }
}

/// The messages, `; `-separated.
impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str(&problem.message)?;
        }
        Ok(())
    }
}

const MAX_TEXT: usize = 1024;
const MAX_JOB_ID: usize = 128;
const MAX_PATH: usize = 1024;
/// One name of a path: the limit of Linux's filesystems (`NAME_MAX`).
const MAX_NAME: usize = 255;
/// Sizes and counts are stored as BIGINT.
const MAX_COUNT: u64 = i64::MAX as u64;

pub fn model(draft: ModelDraft) -> Result<TrainedModel, Problems> {
    let mut problems = Vec::new();
    let mut text = |field: &str, value: Option<String>, required: bool| -> String {
        let value = value.unwrap_or_default();
        let message = if required && value.trim().is_empty() {
            format!("{field} is required")
        } else if value.len() > MAX_TEXT {
            format!("{field} is longer than {MAX_TEXT} bytes")
        } else if value.chars().any(char::is_control) {
            format!("{field} contains control characters")
        } else {
            return value;
        };
        problems.push(Problem::new(field, message));
        value
    };
    let name = text("name", draft.name, true);
    // An optional text left blank is not known: `None`, as if left out.
    let mut optional = |field: &str, value: Option<String>| {
        Some(text(field, value, false)).filter(|v| !v.trim().is_empty())
    };
    let base_model = optional("base_model", draft.base_model);
    let model_size = optional("model_size", draft.model_size);
    let dataset = optional("dataset", draft.dataset);

    let job_id = draft.job_id.unwrap_or_default();
    if let Err(e) = job_id_rule(&job_id) {
        problems.push(Problem::new("job_id", e));
    }
    let source = draft.source.unwrap_or_default();
    if let Err(e) = source_rule(&source) {
        problems.push(Problem::new("source", e));
    }

    for (field, value) in [
        ("num_examples", draft.num_examples),
        ("num_train_steps", draft.num_train_steps),
    ] {
        if value.is_some_and(|v| v > MAX_COUNT) {
            problems.push(Problem::new(field, format!("{field} is too large")));
        }
    }
    if draft.final_loss.is_some_and(|loss| !loss.is_finite()) {
        problems.push(Problem::new(
            "final_loss",
            "final_loss must be a finite number".into(),
        ));
    }
    let params_json = match draft.params {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(value @ serde_json::Value::Object(_)) => value.to_string(),
        Some(_) => {
            problems.push(Problem::new(
                "params",
                "params must be a JSON object".into(),
            ));
            String::new()
        }
    };

    let mut files = Vec::with_capacity(draft.files.len());
    let mut seen = HashSet::new();
    for (i, file) in draft.files.into_iter().enumerate() {
        let path = file.path.unwrap_or_default();
        let field = |name: &str| format!("files[{i}].{name}");
        if let Err(e) = path_rule(&path) {
            problems.push(Problem::new(
                field("path"),
                format!("files[{i}].path {path:?}: {e}"),
            ));
        } else if !seen.insert(path.clone()) {
            problems.push(Problem::new(
                field("path"),
                format!("files[{i}].path {path:?}: listed twice"),
            ));
        }
        let Some(size_bytes) = file.size_bytes else {
            problems.push(Problem::new(
                field("size_bytes"),
                format!("files[{i}].size_bytes is required"),
            ));
            continue;
        };
        if size_bytes > MAX_COUNT {
            problems.push(Problem::new(
                field("size_bytes"),
                format!("files[{i}].size_bytes is too large"),
            ));
        }
        let sha256 = file.sha256.map(|h| h.to_ascii_lowercase());
        if let Some(hash) = &sha256
            && (hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            problems.push(Problem::new(
                field("sha256"),
                format!("files[{i}].sha256 must be 64 hexadecimal characters, got {hash:?}"),
            ));
        }
        if sha256.is_none() && source == crate::model::UPLOADED {
            problems.push(Problem::new(
                field("sha256"),
                format!("files[{i}].sha256 is required with the source upload:: an uploaded file is kept by its digest"),
            ));
        }
        if sha256.is_none() && source.starts_with("oci://") {
            problems.push(Problem::new(
                field("sha256"),
                format!("files[{i}].sha256 is required with an oci:// source: a registry serves files by digest"),
            ));
        }
        files.push(ModelFile {
            path,
            size_bytes,
            sha256,
            format: None,
        });
    }
    // A file cannot also be the directory of another file.
    for file in &files {
        let mut prefix = file.path.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if seen.contains(parent) {
                problems.push(Problem::new(
                    "files",
                    format!(
                        "files: {parent:?} is listed as a file but is also the directory of {:?}",
                        file.path
                    ),
                ));
            }
            prefix = parent;
        }
    }

    if !problems.is_empty() {
        return Err(Problems(problems));
    }
    Ok(TrainedModel {
        id: 0,
        name,
        job_id,
        base_model,
        model_size,
        dataset,
        num_examples: draft.num_examples,
        num_train_steps: draft.num_train_steps,
        final_loss: draft.final_loss,
        params_json,
        source,
        files,
        created_at: String::new(),
        created_by: None,
        signature: None,
    })
}

/// The job id names the model's directory on disk.
pub(crate) fn job_id_rule(job_id: &str) -> Result<(), String> {
    if job_id.is_empty() {
        return Err("job_id is required".into());
    }
    let mut chars = job_id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = job_id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !first_ok || !rest_ok || job_id.len() > MAX_JOB_ID {
        return Err(format!(
            "job_id {job_id:?} cannot be used as a directory name: use letters, digits, '_', '-' and '.', \
             starting with a letter or digit, at most {MAX_JOB_ID} characters"
        ));
    }
    Ok(())
}

/// A relative path that stays inside the model directory, each name of it
/// one the filesystem allows. Also what `berth models register` checks
/// before it hashes anything.
pub fn path_rule(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("is required".into());
    }
    if path.len() > MAX_PATH {
        return Err(format!(
            "is {} bytes long; a file's path may be at most {MAX_PATH} bytes",
            path.len()
        ));
    }
    if let Some(long) = path.split('/').find(|s| s.len() > MAX_NAME) {
        return Err(format!(
            "has a name of {} bytes ({long:.40}…); a file or folder name may be at most \
             {MAX_NAME} bytes, the filesystems' limit",
            long.len()
        ));
    }
    if path.contains('\0') {
        return Err("must not contain a NUL byte".into());
    }
    if path.contains('\\') {
        return Err("must not contain a backslash (use /)".into());
    }
    if path.starts_with('/') {
        return Err("must be relative, not absolute".into());
    }
    for segment in path.split('/') {
        match segment {
            ".." => return Err("must not contain ..".into()),
            "" | "." => return Err("must not contain empty or '.' segments".into()),
            s if s.starts_with(".fetch-") => {
                return Err("must not start with .fetch- (berth's temporary files)".into());
            }
            s if s.chars().any(char::is_control) => {
                return Err("must not contain control characters".into());
            }
            _ => {}
        }
    }
    Ok(())
}

/// `http`, `https`, `s3` or `file` URL template with `{path}`, a
/// registry's manifest pinned by digest (`oci://REG/REPO@sha256:…`, whose
/// files are its blobs), or `upload:` (files uploaded into the blob store).
fn source_rule(source: &str) -> Result<(), String> {
    if source == crate::model::UPLOADED {
        return Ok(());
    }
    if source.is_empty() {
        return Err(
            "source is required: a URL template such as http://files.local/{job_id}/{path}".into(),
        );
    }
    // PostgreSQL cannot store a NUL, and the URL parser would quietly drop
    // tabs and newlines from what was registered.
    if source.chars().any(char::is_control) {
        return Err("source contains control characters".into());
    }
    if source.starts_with("oci://") {
        let reference = crate::oci::Reference::parse(source).map_err(|e| format!("source {e}"))?;
        if reference.digest.is_none() {
            return Err(format!(
                "source {source:?}: a model keeps its manifest pinned; name it by digest \
                 (oci://REGISTRY/REPOSITORY@sha256:…), or leave files out and the server \
                 reads the tag and pins it"
            ));
        }
        return Ok(());
    }
    if !source.contains("{path}") {
        return Err(format!(
            "source {source:?} must contain {{path}}, where each file's path goes"
        ));
    }
    let sample = source.replace("{job_id}", "job").replace("{path}", "file");
    let url = url::Url::parse(&sample)
        .map_err(|e| format!("source {source:?} is not a valid URL template: {e}"))?;
    if url.scheme() != "s3"
        && let Some(located) = crate::cloud::Bucket::locate(&url)
    {
        return match located {
            Err(e) => Err(format!("source {source:?}: {e}")),
            Ok(_) if url.query().is_some() || url.fragment().is_some() => Err(format!(
                "source {source:?}: a bucket's URL is a bucket and a key, with no query or \
                 fragment"
            )),
            Ok(_) => Ok(()),
        };
    }
    match url.scheme() {
        "http" | "https" if url.host().is_some() => Ok(()),
        "http" | "https" => Err(format!("source {source:?} has no host")),
        "s3" if url.host_str().is_none_or(str::is_empty) => Err(format!(
            "source {source:?} names no bucket: write s3://BUCKET/…/{{path}}"
        )),
        "s3" if url.query().is_some() || url.fragment().is_some() => Err(format!(
            "source {source:?}: an s3 URL is a bucket and a key, with no query or fragment"
        )),
        "s3" => Ok(()),
        "file" => Ok(()),
        other => Err(format!(
            "source {source:?}: scheme {other} is not supported (use http, https, s3, gs, az, file or oci; upload: alone for uploaded files)"
        )),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod props;
