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

/// Every problem found, each a sentence naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<String>);

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

const MAX_TEXT: usize = 1024;
const MAX_JOB_ID: usize = 128;
const MAX_PATH: usize = 1024;
/// Sizes and counts are stored as BIGINT.
const MAX_COUNT: u64 = i64::MAX as u64;

pub fn model(draft: ModelDraft) -> Result<TrainedModel, Problems> {
    let mut problems = Vec::new();
    let mut text = |field: &str, value: Option<String>, required: bool| -> String {
        let value = value.unwrap_or_default();
        if required && value.trim().is_empty() {
            problems.push(format!("{field} is required"));
        } else if value.len() > MAX_TEXT {
            problems.push(format!("{field} is longer than {MAX_TEXT} bytes"));
        } else if value.chars().any(char::is_control) {
            problems.push(format!("{field} contains control characters"));
        }
        value
    };
    let name = text("name", draft.name, true);
    let base_model = text("base_model", draft.base_model, false);
    let model_size = text("model_size", draft.model_size, false);
    let dataset = text("dataset", draft.dataset, false);

    let job_id = draft.job_id.unwrap_or_default();
    if let Err(e) = job_id_rule(&job_id) {
        problems.push(e);
    }
    let source = draft.source.unwrap_or_default();
    if let Err(e) = source_rule(&source) {
        problems.push(e);
    }

    for (field, value) in [
        ("num_examples", draft.num_examples),
        ("num_train_steps", draft.num_train_steps),
    ] {
        if value.is_some_and(|v| v > MAX_COUNT) {
            problems.push(format!("{field} is too large"));
        }
    }
    if draft.final_loss.is_some_and(|loss| !loss.is_finite()) {
        problems.push("final_loss must be a finite number".into());
    }
    let params_json = match draft.params {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(value @ serde_json::Value::Object(_)) => value.to_string(),
        Some(_) => {
            problems.push("params must be a JSON object".into());
            String::new()
        }
    };

    let mut files = Vec::with_capacity(draft.files.len());
    let mut seen = HashSet::new();
    for (i, file) in draft.files.into_iter().enumerate() {
        let path = file.path.unwrap_or_default();
        if let Err(e) = path_rule(&path) {
            problems.push(format!("files[{i}].path {path:?}: {e}"));
        } else if !seen.insert(path.clone()) {
            problems.push(format!("files[{i}].path {path:?}: listed twice"));
        }
        let Some(size_bytes) = file.size_bytes else {
            problems.push(format!("files[{i}].size_bytes is required"));
            continue;
        };
        if size_bytes > MAX_COUNT {
            problems.push(format!("files[{i}].size_bytes is too large"));
        }
        let sha256 = file.sha256.map(|h| h.to_ascii_lowercase());
        if let Some(hash) = &sha256
            && (hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            problems.push(format!(
                "files[{i}].sha256 must be 64 hexadecimal characters, got {hash:?}"
            ));
        }
        files.push(ModelFile {
            path,
            size_bytes,
            sha256,
        });
    }
    // A file cannot also be the directory of another file.
    for file in &files {
        let mut prefix = file.path.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if seen.contains(parent) {
                problems.push(format!(
                    "files: {parent:?} is listed as a file but is also the directory of {:?}",
                    file.path
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
        num_examples: draft.num_examples.unwrap_or(0),
        num_train_steps: draft.num_train_steps.unwrap_or(0),
        final_loss: draft.final_loss,
        params_json,
        source,
        files,
        created_at: String::new(),
        created_by: None,
    })
}

/// The job id names the model's directory on disk.
fn job_id_rule(job_id: &str) -> Result<(), String> {
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

/// A relative path that stays inside the model directory.
fn path_rule(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("is required");
    }
    if path.len() > MAX_PATH {
        return Err("is too long");
    }
    if path.contains('\0') {
        return Err("must not contain a NUL byte");
    }
    if path.contains('\\') {
        return Err("must not contain a backslash (use /)");
    }
    if path.starts_with('/') {
        return Err("must be relative, not absolute");
    }
    for segment in path.split('/') {
        match segment {
            ".." => return Err("must not contain .."),
            "" | "." => return Err("must not contain empty or '.' segments"),
            s if s.starts_with(".fetch-") => {
                return Err("must not start with .fetch- (berth's temporary files)");
            }
            s if s.chars().any(char::is_control) => {
                return Err("must not contain control characters");
            }
            _ => {}
        }
    }
    Ok(())
}

/// `http`, `https`, `s3` or `file` URL template with `{path}`.
fn source_rule(source: &str) -> Result<(), String> {
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
    if !source.contains("{path}") {
        return Err(format!(
            "source {source:?} must contain {{path}}, where each file's path goes"
        ));
    }
    let sample = source.replace("{job_id}", "job").replace("{path}", "file");
    let url = url::Url::parse(&sample)
        .map_err(|e| format!("source {source:?} is not a valid URL template: {e}"))?;
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
            "source {source:?}: scheme {other} is not supported (use http, https, s3 or file)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft() -> ModelDraft {
        ModelDraft {
            name: Some("support-bot".into()),
            job_id: Some("job-1".into()),
            source: Some("http://files.local/{job_id}/{path}".into()),
            files: vec![FileDraft {
                path: Some("adapter/model.safetensors".into()),
                size_bytes: Some(10),
                sha256: Some("AB".repeat(32)),
            }],
            ..ModelDraft::default()
        }
    }

    #[track_caller]
    fn check(change: impl FnOnce(&mut ModelDraft), expected: &str) {
        let mut d = draft();
        change(&mut d);
        match model(d) {
            Ok(_) if expected.is_empty() => {}
            Ok(m) => panic!("accepted {m:?}, expected {expected:?}"),
            Err(p) => assert!(
                !expected.is_empty() && p.to_string().contains(expected),
                "{p}"
            ),
        }
    }

    fn file(path: &str) -> FileDraft {
        FileDraft {
            path: Some(path.into()),
            size_bytes: Some(1),
            sha256: None,
        }
    }

    #[test]
    fn registrations_are_checked_field_by_field() {
        check(|_| {}, "");
        check(|d| d.name = None, "name is required");
        check(
            |d| d.name = Some("a\u{7}b".into()),
            "name contains control characters",
        );
        check(|d| d.job_id = None, "job_id is required");
        check(
            |d| d.job_id = Some("../etc".into()),
            "cannot be used as a directory name",
        );
        check(
            |d| d.job_id = Some(".hidden".into()),
            "cannot be used as a directory name",
        );
        check(
            |d| d.job_id = Some("a/b".into()),
            "cannot be used as a directory name",
        );
        check(
            |d| d.job_id = Some("x".repeat(129)),
            "cannot be used as a directory name",
        );
        check(|d| d.source = None, "source is required");
        check(
            |d| d.source = Some("http://files.local/{job_id}".into()),
            "must contain {path}",
        );
        check(
            |d| d.source = Some("ftp://files.local/{path}".into()),
            "scheme ftp is not supported",
        );
        check(
            |d| d.source = Some("not a url {path}".into()),
            "not a valid URL template",
        );
        check(
            |d| d.source = Some("file:///srv/{job_id}/{path}".into()),
            "",
        );
        let sources = [
            ("s3://team-models/{job_id}/{path}", ""),
            ("s3://team-models/{path}", ""),
            ("s3://{job_id}/{path}", ""),
            ("s3:///{job_id}/{path}", "names no bucket"),
            ("s3:{path}", "names no bucket"),
            ("s3://b/{path}?versionId=1", "no query or fragment"),
            ("gs://b/{path}", "scheme gs is not supported"),
        ];
        for (source, expected) in sources {
            check(|d| d.source = Some(source.into()), expected);
        }
        check(
            |d| d.source = Some("http://files.local/{path}\0".into()),
            "source contains control characters",
        );
        check(
            |d| d.final_loss = Some(f64::NAN),
            "final_loss must be a finite number",
        );
        check(
            |d| d.params = Some(serde_json::json!([1])),
            "params must be a JSON object",
        );
        check(
            |d| d.num_examples = Some(u64::MAX),
            "num_examples is too large",
        );
        check(
            |d| d.files[0].sha256 = Some("abc".into()),
            "files[0].sha256 must be 64 hexadecimal",
        );
        check(
            |d| d.files[0].sha256 = Some("g".repeat(64)),
            "files[0].sha256 must be 64 hexadecimal",
        );
        check(
            |d| d.files[0].size_bytes = None,
            "files[0].size_bytes is required",
        );
        check(|d| d.files = vec![], "");
    }

    #[test]
    fn file_paths_stay_inside_the_model_directory() {
        let cases = [
            ("/etc/passwd", "must be relative"),
            ("a/../../etc", "must not contain .."),
            ("..", "must not contain .."),
            ("a\\b", "backslash"),
            ("a\0b", "NUL"),
            ("a//b", "empty or '.' segments"),
            ("./a", "empty or '.' segments"),
            ("a/", "empty or '.' segments"),
            ("", "is required"),
            ("dir/.fetch-x", "must not start with .fetch-"),
        ];
        for (path, expected) in cases {
            check(|d| d.files = vec![file(path)], expected);
        }
        check(
            |d| d.files = vec![file("a.bin"), file("a.bin")],
            "listed twice",
        );
        check(
            |d| d.files = vec![file("a"), file("a/b")],
            "is listed as a file but is also the directory",
        );
        check(|d| d.files = vec![file("a/b c.bin"), file("a/.hidden")], "");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let problems = model(ModelDraft::default()).unwrap_err();
        assert_eq!(problems.0.len(), 3, "{problems}");
    }

    #[test]
    fn hashes_are_stored_lowercase_and_defaults_filled() {
        let m = model(draft()).unwrap();
        assert_eq!(m.files[0].sha256.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!(m.params_json, "{}");
        assert_eq!(m.num_examples, 0);
    }
}
