//! The rules over generated drafts: what validates keeps every field as
//! given, what is refused says why field by field, and no path that could
//! leave the model directory ever validates.

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
        let blank_is_unknown = |text: Option<String>| text.filter(|t| !t.trim().is_empty());
        prop_assert_eq!(&model.base_model, &blank_is_unknown(draft.base_model));
        prop_assert_eq!(&model.model_size, &blank_is_unknown(draft.model_size));
        prop_assert_eq!(&model.dataset, &blank_is_unknown(draft.dataset));
        prop_assert_eq!(model.num_examples, draft.num_examples);
        prop_assert_eq!(model.num_train_steps, draft.num_train_steps);
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
                let optional = [&model.base_model, &model.model_size, &model.dataset];
                for text in [&model.name, &model.source].into_iter().chain(optional.into_iter().flatten()) {
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
