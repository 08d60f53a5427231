//! The in-toto statement a `model.sig` signs (predicate
//! `https://model_signing/signature/v1.0`): the model's name, one digest over
//! all the file digests, the serialization the signer used (method, hash,
//! ignored paths) and each resource (name, algorithm, digest). Read only
//! after its signature verified.

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::Error;

pub(super) const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub(super) const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
/// model_signing 0.2's statement, which the 1.x tool still reads.
const PREDICATE_TYPE_V0_2: &str = "https://model_signing/Digests/v0.1";

/// A statement whose root digest matched its resources.
#[derive(Debug)]
pub(super) struct Statement {
    /// `files` or `shards`.
    pub(super) method: String,
    /// Relative paths the signer left out; a folder covers what is under it.
    pub(super) ignore_paths: Vec<String>,
    pub(super) resources: Vec<Resource>,
}

/// One signed item: a file (`files`) or `path:start:end` (`shards`).
#[derive(Debug)]
pub(super) struct Resource {
    pub(super) name: String,
    /// `sha256`, `blake2b`, `sha256-sharded-<size>`, …
    pub(super) algorithm: String,
    pub(super) digest: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStatement {
    #[serde(rename = "_type")]
    type_: String,
    subject: Vec<RawSubject>,
    predicate_type: String,
    predicate: Option<RawPredicate>,
}

#[derive(Deserialize)]
struct RawSubject {
    digest: std::collections::BTreeMap<String, String>,
}

/// Fields beyond these are ignored, as the v1.0 predicate tells verifiers.
#[derive(Deserialize)]
struct RawPredicate {
    serialization: RawSerialization,
    resources: Vec<RawResource>,
}

#[derive(Deserialize)]
struct RawSerialization {
    method: String,
    #[serde(default)]
    ignore_paths: Vec<String>,
}

#[derive(Deserialize)]
struct RawResource {
    name: String,
    algorithm: String,
    digest: String,
}

pub(super) fn parse(payload: &[u8]) -> Result<Statement, Error> {
    let bad = |s: String| Error::Statement(s);
    let raw: RawStatement = serde_json::from_slice(payload)
        .map_err(|e| bad(format!("is not an in-toto statement as JSON ({e})")))?;
    if raw.type_ != STATEMENT_TYPE {
        return Err(bad(format!(
            "has _type {:?}, expected {STATEMENT_TYPE:?}",
            raw.type_
        )));
    }
    if raw.predicate_type == PREDICATE_TYPE_V0_2 {
        return Err(bad(format!(
            "is model_signing 0.2's ({PREDICATE_TYPE_V0_2}), which berth does not read: \
             re-sign the model with model_signing 1.x"
        )));
    }
    if raw.predicate_type != PREDICATE_TYPE {
        return Err(bad(format!(
            "has predicate type {:?}, expected {PREDICATE_TYPE:?}",
            raw.predicate_type
        )));
    }
    let [subject] = raw.subject.as_slice() else {
        return Err(bad(format!(
            "has {} subjects, expected one (the model)",
            raw.subject.len()
        )));
    };
    let predicate = raw
        .predicate
        .ok_or_else(|| bad("has no predicate".to_owned()))?;
    let method = predicate.serialization.method;
    if method != "files" && method != "shards" {
        return Err(bad(format!(
            "uses serialization method {method:?}, not files or shards"
        )));
    }
    let mut root = Sha256::new();
    let mut resources = Vec::with_capacity(predicate.resources.len());
    let mut names = std::collections::HashSet::new();
    for r in predicate.resources {
        let digest = hex::decode(&r.digest)
            .map_err(|_| bad(format!("gives {} a digest that is not hex", r.name)))?;
        if !names.insert(r.name.clone()) {
            return Err(bad(format!("lists {} twice", r.name)));
        }
        // The subject's digest is sha256 over every resource's digest bytes,
        // in the order listed: checked, so the list is the one signed for.
        root.update(&digest);
        resources.push(Resource {
            name: r.name,
            algorithm: r.algorithm,
            digest,
        });
    }
    let root = hex::encode(root.finalize());
    match subject.digest.get("sha256") {
        Some(expected) if expected.eq_ignore_ascii_case(&root) => {}
        Some(expected) => {
            return Err(bad(format!(
                "is inconsistent: its subject's digest is {expected} but its resources hash to {root}"
            )));
        }
        None => return Err(bad("has a subject without a sha256 digest".to_owned())),
    }
    Ok(Statement {
        method,
        ignore_paths: predicate.serialization.ignore_paths,
        resources,
    })
}

/// The statement berth signs: the same shape model_signing writes for
/// `files` with sha256, resources in name order, and `model.sig` ignored.
pub(super) fn write(model_name: &str, files: &[(&str, &str)]) -> Vec<u8> {
    let mut files = files.to_vec();
    files.sort();
    let mut root = Sha256::new();
    let resources: Vec<serde_json::Value> = files
        .iter()
        .map(|(name, sha256)| {
            // Callers pass checked lowercase hex; a bad one would fail verification.
            root.update(hex::decode(sha256).unwrap_or_default());
            serde_json::json!({ "name": name, "algorithm": "sha256", "digest": sha256 })
        })
        .collect();
    let statement = serde_json::json!({
        "_type": STATEMENT_TYPE,
        "subject": [{ "name": model_name, "digest": { "sha256": hex::encode(root.finalize()) } }],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {
                "method": "files",
                "hash_type": "sha256",
                "allow_symlinks": false,
                "ignore_paths": [super::SIGNATURE_FILE],
            },
            "resources": resources,
        },
    });
    serde_json::to_vec_pretty(&statement).unwrap_or_default()
}
