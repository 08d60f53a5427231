//! The `oci-publish` deployer: pushes every file of a model to an OCI
//! registry through a publishing target, as one artifact `{repo}:{tag}`
//! under the target's namespace (each file a layer titled with its path),
//! and answers the manifest's reference by digest as the deployment's
//! `ref`.
//!
//! It holds no login: the host pushes each file as a blob (none the
//! registry already has), with the target's credentials, and writes the
//! manifest when the plugin calls `finish`.

use serde_json::{Map, Value, json};

use berth::deployer::host::{self, Level};
use berth::deployer::publish::Target;
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};

wit_bindgen::generate!({
    world: "deployer",
    path: "../../wit",
    // The world imports wasi:filesystem explicitly for languages without a file
    // API; this plugin reads no file itself, so those bindings go unused.
    generate_all,
});

const OPTIONS_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "target": {
      "type": "string",
      "minLength": 1,
      "description": "the oci:// publishing target to push the model to, by name; it may be left out when the deployer is granted exactly one"
    },
    "repo": {
      "type": "string",
      "minLength": 1,
      "description": "the repository under the target's namespace (a/b: lowercase letters, digits, . _ -); by default the model's name, lowercased, other characters as -"
    },
    "tag": {
      "type": "string",
      "minLength": 1,
      "maxLength": 128,
      "description": "the artifact's tag (letters, digits, _ . -); by default the model's job id, other characters as -"
    }
  },
  "required": ["target"],
  "additionalProperties": false
}"#;

struct OciPublish;

impl Guest for OciPublish {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description: "Pushes the model's files to an OCI registry as one artifact, \
                          {repo}:{tag} under a publishing target, a layer per file"
                .to_string(),
            options_schema: Some(OPTIONS_SCHEMA.to_string()),
        }
    }

    fn check_options(options_json: String) -> Result<(), String> {
        Options::parse(&options_json).map(|_| ())
    }

    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        let options = Options::parse(&request.options_json)?;
        let model = &request.model;
        let repo = match options.repo {
            Some(repo) => repo,
            None => repository_of(&model.name),
        };
        let tag = match options.tag {
            Some(tag) => tag,
            None => tag_of(&model.job_id),
        };
        let artifact = format!("{repo}:{tag}");
        let target = Target::open(&options.target)?;

        // One call: the host pushes a few files at once, and keeps their
        // layers in this order.
        let puts: Vec<(String, String)> = model
            .files
            .iter()
            .map(|file| (file.path.clone(), format!("{artifact}/{}", file.path)))
            .collect();
        let receipts = target.put_model_files(&puts);
        let mut files = Vec::with_capacity(puts.len());
        let mut failed = Vec::new();
        let mut bytes = 0;
        for ((path, _), put) in puts.into_iter().zip(receipts) {
            match put {
                Ok(receipt) => {
                    bytes += receipt.bytes;
                    files.push(json!({
                        "path": path, "bytes": receipt.bytes, "sha256": receipt.sha256,
                        "digest": receipt.etag,
                    }));
                }
                Err(e) => failed.push(e),
            }
        }
        if !failed.is_empty() {
            // Nothing is finished: no manifest names a partial model.
            return Err(failed.join("; "));
        }

        let written = target.finish()?;
        // On an OCI target `finish` writes the artifact's manifest; on any
        // other (a folder, a bucket) every put is whole already and the
        // files sit under the folder `REPO:TAG/`.
        let (reference, manifest_sha256) = match written
            .iter()
            .find(|receipt| receipt.url.contains(&format!("/{artifact}@sha256:")))
        {
            Some(manifest) => (manifest.url.clone(), Some(manifest.sha256.clone())),
            None if written.is_empty() && !files.is_empty() => {
                (target.url(&format!("{artifact}/"))?, None)
            }
            None => {
                return Err(format!(
                    "the host wrote no manifest for {artifact} (a model with no files?)"
                ));
            }
        };
        host::log(
            Level::Info,
            &format!("{reference}: {} files, {bytes} bytes", files.len()),
        );
        Ok(DeployResult {
            ref_: reference.clone(),
            details_json: json!({
                "target": options.target,
                "reference": reference,
                "repo": repo,
                "tag": tag,
                "manifest_sha256": manifest_sha256,
                "files": files,
                "bytes": bytes,
            })
            .to_string(),
        })
    }
}

/// The deployment's options, checked.
struct Options {
    target: String,
    repo: Option<String>,
    tag: Option<String>,
}

impl Options {
    fn parse(options_json: &str) -> Result<Self, String> {
        let options: Map<String, Value> = serde_json::from_str(options_json)
            .map_err(|e| format!("options must be a JSON object: {e}"))?;
        if let Some(key) = options
            .keys()
            .find(|k| !matches!(k.as_str(), "target" | "repo" | "tag"))
        {
            return Err(format!(
                "unknown option {key:?}: the oci-publish deployer accepts only \"target\", \"repo\" and \"tag\""
            ));
        }
        let target = match options.get("target") {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            None => {
                return Err(
                    "option \"target\" is missing: name the oci:// publishing target to push the \
                     model to (it may be left out only when the deployer is granted exactly one)"
                        .to_string(),
                );
            }
            Some(other) => {
                return Err(format!(
                    "option \"target\" must be a target's name, not {other}"
                ));
            }
        };
        let text = |name: &str| match options.get(name) {
            None => Ok(None),
            Some(Value::String(value)) => Ok(Some(value.clone())),
            Some(other) => Err(format!("option {name:?} must be a string, not {other}")),
        };
        let repo = text("repo")?;
        if let Some(repo) = &repo
            && !is_repository(repo)
        {
            return Err(format!(
                "option \"repo\" {repo:?} is not a repository name: lowercase letters and digits, \
                 . _ or - between them, components joined by / (e.g. \"team/llama-ft\")"
            ));
        }
        let tag = text("tag")?;
        if let Some(tag) = &tag
            && !is_tag(tag)
        {
            return Err(format!(
                "option \"tag\" {tag:?} is not a tag: 1 to 128 letters, digits, _ . -, not \
                 starting with . or -"
            ));
        }
        Ok(Self { target, repo, tag })
    }
}

/// Path components of lowercase letters and digits, with `.`, `_` or `-`
/// only between them, as the distribution spec names repositories.
fn is_repository(text: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    text.len() <= 255
        && text.split('/').all(|c| {
            let bytes = c.as_bytes();
            !bytes.is_empty()
                && alnum(bytes[0])
                && alnum(bytes[bytes.len() - 1])
                && bytes
                    .iter()
                    .all(|&b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
        })
}

fn is_tag(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=128).contains(&bytes.len())
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A model's name as a repository: lowercased, each run of other
/// characters one `-`, none at either end (`Support Bot (LoRA)` →
/// `support-bot-lora`); `model` when nothing is left.
fn repository_of(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(128);
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "model".to_string()
    } else {
        out.to_string()
    }
}

/// A job id as a tag: other characters as `-`, at most 128, starting with
/// a letter, digit or `_` (`job 7/a` → `job-7-a`, `.x` → `_.x`).
fn tag_of(job_id: &str) -> String {
    let mut out: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
        out.insert(0, '_');
    }
    out.truncate(128);
    out
}

export!(OciPublish);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_repositories_and_job_ids_tags() {
        for (name, repo) in [
            ("Support Bot (LoRA)", "support-bot-lora"),
            ("llama-3.1-ft", "llama-3-1-ft"),
            ("--", "model"),
            ("ünï", "n"),
            ("ü", "model"),
        ] {
            assert_eq!(repository_of(name), repo, "{name}");
            assert!(is_repository(&repository_of(name)));
        }
        for (job, tag) in [("job-7", "job-7"), ("job 7/a", "job-7-a"), (".x", "_.x")] {
            assert_eq!(tag_of(job), tag, "{job}");
            assert!(is_tag(&tag_of(job)));
        }
        assert!(!is_repository("Team/x") && !is_repository("a//b") && !is_repository("a-"));
        assert!(!is_tag("-t") && !is_tag("") && !is_tag("a:b"));
    }
}
