//! A verified statement against a model's recorded files: the same set of
//! paths, the same sha256 each, with the signer's ignored paths and
//! `model.sig` left out. Compares records only; never reads a file.

use std::collections::{BTreeMap, BTreeSet};

use super::statement::Statement;
use super::{Error, FileProblem, SIGNATURE_FILE, Signer};
use crate::model::ModelFile;

/// The model's files the statement covers, and those the signer left out.
#[derive(Debug)]
pub(super) struct Covered {
    pub(super) checked: Vec<String>,
    pub(super) ignored: Vec<String>,
}

pub(super) fn compare(
    statement: &Statement,
    files: &[ModelFile],
    signer: &Signer,
) -> Result<Covered, Error> {
    let ignore: Vec<&str> = statement
        .ignore_paths
        .iter()
        .map(|p| p.trim_start_matches("./").trim_end_matches('/'))
        .filter(|p| !p.is_empty())
        .collect();
    let left_out = |path: &str| {
        path == SIGNATURE_FILE
            || ignore
                .iter()
                .any(|i| path == *i || path.strip_prefix(i).is_some_and(|r| r.starts_with('/')))
    };
    let (ignored, model): (Vec<&ModelFile>, Vec<&ModelFile>) =
        files.iter().partition(|f| left_out(&f.path));
    let model: BTreeMap<&str, &ModelFile> = model.iter().map(|f| (f.path.as_str(), *f)).collect();

    // Shards name `path:start:end`; the file set is what they cover.
    let sharded = statement.method == "shards";
    let signed_path = |name: &str| -> String {
        if sharded {
            name.rsplitn(3, ':').last().unwrap_or(name).to_owned()
        } else {
            name.to_owned()
        }
    };
    let signed: BTreeSet<String> = statement
        .resources
        .iter()
        .map(|r| signed_path(&r.name))
        .collect();

    let mut problems = Vec::new();
    for path in &signed {
        if !model.contains_key(path.as_str()) {
            problems.push(FileProblem::Missing { path: path.clone() });
        }
    }
    for path in model.keys() {
        if !signed.contains(*path) {
            problems.push(FileProblem::Unsigned {
                path: (*path).to_owned(),
            });
        }
    }

    // Whole-file sha256 is what berth records; anything else would need the
    // bytes. A differing sha256 is a definite answer and comes first.
    let mut unverifiable: BTreeMap<String, String> = BTreeMap::new();
    for r in &statement.resources {
        let path = signed_path(&r.name);
        let Some(file) = model.get(path.as_str()) else {
            continue;
        };
        if sharded || r.algorithm != "sha256" {
            let why = if sharded {
                format!(
                    "they were signed in shards ({}), and berth records whole-file sha256 only",
                    r.algorithm
                )
            } else {
                format!(
                    "they were signed with {} digests, and berth records sha256 only",
                    r.algorithm
                )
            };
            unverifiable.entry(path).or_insert(why);
            continue;
        }
        let signed = hex::encode(&r.digest);
        match &file.sha256 {
            Some(recorded) if recorded.eq_ignore_ascii_case(&signed) => {}
            Some(recorded) => problems.push(FileProblem::Differs {
                path,
                signed,
                recorded: recorded.to_ascii_lowercase(),
            }),
            None => {
                unverifiable
                    .entry(path)
                    .or_insert_with(|| "berth recorded no sha256 for them".to_owned());
            }
        }
    }
    if !problems.is_empty() {
        return Err(Error::Files {
            signer: signer.clone(),
            problems,
        });
    }
    if let Some(why) = unverifiable.values().next().cloned() {
        return Err(Error::Unverifiable {
            signer: signer.clone(),
            why,
            paths: unverifiable.into_keys().collect(),
        });
    }
    let mut ignored: Vec<String> = ignored.iter().map(|f| f.path.clone()).collect();
    ignored.sort();
    Ok(Covered {
        checked: model.keys().map(|p| (*p).to_owned()).collect(),
        ignored,
    })
}
