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
    let base_model = text("base_model", draft.base_model, false);
    let model_size = text("model_size", draft.model_size, false);
    let dataset = text("dataset", draft.dataset, false);

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
            Err(p) => {
                assert!(
                    !expected.is_empty() && p.to_string().contains(expected),
                    "{p}"
                );
                for problem in &p.0 {
                    assert!(
                        problem.message.starts_with(&problem.field),
                        "a problem's sentence starts with its field: {problem:?}"
                    );
                }
            }
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
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["name", "job_id", "source"], "{problems}");
    }

    /// Found by `props::a_valid_draft_keeps_every_field`: serde_json's
    /// default float parser read this back one unit in the last place off.
    #[test]
    fn params_keep_every_number_exactly() {
        let params = serde_json::json!({ "x": 2.9070374620697757e-214 });
        let mut d = draft();
        d.params = Some(params.clone());
        let stored = model(d).unwrap().params_json;
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&stored).unwrap(),
            params
        );
    }

    #[test]
    fn hashes_are_stored_lowercase_and_defaults_filled() {
        let m = model(draft()).unwrap();
        assert_eq!(m.files[0].sha256.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!(m.params_json, "{}");
        assert_eq!(m.num_examples, 0);
    }
}

/// The rules over generated drafts: what validates keeps every field as
/// given, what is refused says why field by field, and no path that could
/// leave the model directory ever validates.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;
    use crate::strategies::{self, json, segment};

    /// Files with valid, distinct paths, none the directory of another (the
    /// first segment holds the file's index).
    fn files() -> impl Strategy<Value = Vec<FileDraft>> {
        let file = (
            prop::collection::vec(segment(), 0..4),
            0..=MAX_COUNT,
            prop::option::of("[0-9a-fA-F]{64}"),
        );
        prop::collection::vec(file, 0..6).prop_map(|files| {
            files
                .into_iter()
                .enumerate()
                .map(|(i, (segments, size, sha256))| {
                    let mut path = format!("{i}-file");
                    for segment in segments {
                        path = format!("{path}/{segment}");
                    }
                    FileDraft {
                        path: Some(path),
                        size_bytes: Some(size),
                        sha256,
                    }
                })
                .collect()
        })
    }

    fn text() -> impl Strategy<Value = Option<String>> {
        prop::option::of(r"\PC{0,40}")
    }

    /// A draft every rule accepts.
    fn valid() -> impl Strategy<Value = ModelDraft> {
        let counts = (
            prop::option::of(0..=MAX_COUNT),
            prop::option::of(0..=MAX_COUNT),
            prop::option::of(prop::num::f64::NORMAL | prop::num::f64::ZERO),
        );
        let params = prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            prop::collection::vec((strategies::text(), json(3)), 0..5)
                .prop_map(|pairs| Some(Value::Object(pairs.into_iter().collect()))),
        ];
        let source = prop_oneof![
            Just("http://files.local/{job_id}/{path}"),
            Just("https://files.local:8443/m/{path}?job={job_id}"),
            Just("s3://team-models/{job_id}/{path}"),
            Just("file:///srv/models/{job_id}/{path}"),
        ];
        (
            (r"\PC{0,20}[^\pC\s]\PC{0,20}", strategies::job_id(), source),
            (text(), text(), text()),
            counts,
            params,
            files(),
        )
            .prop_map(
                |(
                    (name, job_id, source),
                    (base_model, model_size, dataset),
                    (num_examples, num_train_steps, final_loss),
                    params,
                    files,
                )| ModelDraft {
                    name: Some(name),
                    job_id: Some(job_id),
                    base_model,
                    model_size,
                    dataset,
                    num_examples,
                    num_train_steps,
                    final_loss,
                    params,
                    source: Some(source.to_string()),
                    files,
                },
            )
    }

    /// Paths the rules must refuse, each with the words of its refusal.
    fn unsafe_path() -> impl Strategy<Value = (String, &'static str)> {
        let around = || (segment(), segment());
        prop_oneof![
            around().prop_map(|(a, b)| (format!("{a}/../{b}"), "..")),
            around().prop_map(|(a, _)| (format!("{a}/.."), "..")),
            around().prop_map(|(a, b)| (format!("/{a}/{b}"), "absolute")),
            around().prop_map(|(a, b)| (format!("{a}/.fetch-{b}"), ".fetch-")),
            around().prop_map(|(a, b)| (format!("{a}\0{b}"), "NUL")),
            around().prop_map(|(a, b)| (format!("{a}//{b}"), "empty")),
            around().prop_map(|(a, b)| (format!("{a}/./{b}"), "'.'")),
        ]
    }

    /// Anything at all in every field, often close enough to valid that
    /// the rules after the first are reached too.
    fn arbitrary() -> impl Strategy<Value = ModelDraft> {
        let text = || {
            prop::option::of(prop_oneof![
                "[a-zA-Z0-9][a-zA-Z0-9_.-]{0,8}",
                strategies::text()
            ])
        };
        let source = prop::option::of(prop_oneof![
            Just("http://files.local/{job_id}/{path}".to_string()),
            (strategies::text(), strategies::text()).prop_map(|(a, b)| format!("{a}{{path}}{b}")),
            "(http|https|s3|file|ftp)://[a-z.{}_]{0,8}(:[0-9]{1,6})?/[a-z{}_]{0,12}[?#]?[a-z{}_=]{0,12}"
                .prop_map(|t| t.replace("_", "{path}")),
            strategies::text(),
        ]);
        let path = prop::option::of(prop_oneof![
            prop::collection::vec(
                prop_oneof![
                    4 => segment(),
                    1 => prop_oneof![Just(".."), Just("."), Just("")].prop_map(String::from),
                    1 => ".fetch-[a-z]{0,3}",
                    1 => strategies::text(),
                ],
                1..5
            )
            .prop_map(|segments| segments.join("/")),
            strategies::text(),
        ]);
        let file =
            (path, any::<Option<u64>>(), text()).prop_map(|(path, size_bytes, sha256)| FileDraft {
                path,
                size_bytes,
                sha256,
            });
        (
            (text(), text(), text(), text(), text(), source),
            (
                any::<Option<u64>>(),
                any::<Option<u64>>(),
                any::<Option<f64>>(),
            ),
            prop::option::of(json(3)),
            prop::collection::vec(file, 0..6),
        )
            .prop_map(
                |(
                    (name, job_id, base_model, model_size, dataset, source),
                    (num_examples, num_train_steps, final_loss),
                    params,
                    files,
                )| ModelDraft {
                    name,
                    job_id,
                    base_model,
                    model_size,
                    dataset,
                    num_examples,
                    num_train_steps,
                    final_loss,
                    params,
                    source,
                    files,
                },
            )
    }

    proptest! {
        #![proptest_config(strategies::cases(256))]

        #[test]
        fn a_valid_draft_keeps_every_field(draft in valid()) {
            let model = model(draft.clone()).map_err(|p| TestCaseError::fail(p.to_string()))?;
            prop_assert_eq!(Some(&model.name), draft.name.as_ref());
            prop_assert_eq!(Some(&model.job_id), draft.job_id.as_ref());
            prop_assert_eq!(&model.base_model, &draft.base_model.unwrap_or_default());
            prop_assert_eq!(&model.model_size, &draft.model_size.unwrap_or_default());
            prop_assert_eq!(&model.dataset, &draft.dataset.unwrap_or_default());
            prop_assert_eq!(model.num_examples, draft.num_examples.unwrap_or(0));
            prop_assert_eq!(model.num_train_steps, draft.num_train_steps.unwrap_or(0));
            prop_assert_eq!(model.final_loss, draft.final_loss);
            prop_assert_eq!(Some(&model.source), draft.source.as_ref());
            let params: Value = serde_json::from_str(&model.params_json).unwrap();
            match draft.params {
                None | Some(Value::Null) => prop_assert_eq!(params, serde_json::json!({})),
                Some(given) => prop_assert_eq!(params, given),
            }
            prop_assert_eq!(model.files.len(), draft.files.len());
            for (kept, given) in model.files.iter().zip(&draft.files) {
                prop_assert_eq!(Some(&kept.path), given.path.as_ref());
                prop_assert_eq!(Some(kept.size_bytes), given.size_bytes);
                let lowercase = given.sha256.as_ref().map(|h| h.to_ascii_lowercase());
                prop_assert_eq!(&kept.sha256, &lowercase);
            }
        }

        #[test]
        fn an_unsafe_path_is_refused_naming_its_field(
            draft in valid(),
            (path, words) in unsafe_path(),
            at in any::<prop::sample::Index>(),
        ) {
            let mut draft = draft;
            let at = at.index(draft.files.len() + 1);
            draft.files.insert(at, FileDraft { path: Some(path.clone()), size_bytes: Some(1), sha256: None });
            let problems = model(draft).expect_err("an unsafe path validated").0;
            let field = format!("files[{at}].path");
            let start = format!("{field} {path:?}: ");
            prop_assert!(
                problems.iter().any(|p| p.field == field && p.message.starts_with(&start) && p.message.contains(words)),
                "{start}… {words}: {problems:?}"
            );
        }

        #[test]
        fn a_path_listed_twice_is_refused_naming_the_second(
            draft in valid().prop_filter("has a file", |d| !d.files.is_empty()),
            which in any::<prop::sample::Index>(),
        ) {
            let mut draft = draft;
            let twin = draft.files[which.index(draft.files.len())].clone();
            draft.files.push(twin.clone());
            let at = draft.files.len() - 1;
            let problems = model(draft).expect_err("a duplicate validated").0;
            let expected = format!("files[{at}].path {:?}: listed twice", twin.path.unwrap());
            let expected = Problem::new(format!("files[{at}].path"), expected);
            prop_assert!(problems.contains(&expected), "{expected:?}: {problems:?}");
        }

        /// Whatever arrives, validation answers without panicking; a refusal
        /// has at least one problem, and what it accepts is safe to store
        /// and to use as directory and file names.
        #[test]
        fn any_draft_is_answered_and_only_safe_ones_accepted(draft in arbitrary()) {
            match model(draft) {
                Err(Problems(problems)) => prop_assert!(!problems.is_empty()),
                Ok(model) => {
                    for text in [&model.name, &model.base_model, &model.model_size, &model.dataset, &model.source] {
                        prop_assert!(!text.chars().any(char::is_control), "{text:?}");
                    }
                    prop_assert!(!model.name.trim().is_empty());
                    prop_assert!(model.job_id.starts_with(|c: char| c.is_ascii_alphanumeric()));
                    prop_assert!(!model.job_id.contains(['/', '\\', '\0']));
                    prop_assert!(model.final_loss.is_none_or(f64::is_finite));
                    prop_assert!(model.params_json.starts_with('{'), "{}", model.params_json);
                    let mut paths = HashSet::new();
                    for file in &model.files {
                        let path = &file.path;
                        prop_assert!(!path.starts_with('/') && !path.contains(['\0', '\\']), "{path:?}");
                        prop_assert!(
                            path.split('/').all(|s| !matches!(s, "" | "." | "..") && !s.starts_with(".fetch-")),
                            "{path:?}"
                        );
                        prop_assert!(paths.insert(path.as_str()), "{path:?} twice");
                        prop_assert!(i64::try_from(file.size_bytes).is_ok());
                    }
                }
            }
        }
    }
}
