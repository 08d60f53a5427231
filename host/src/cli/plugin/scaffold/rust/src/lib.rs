//! The `{{name}}` deployer: writes a summary of the model's files to
//! `summary.json` in the deployment's output directory and, when the option
//! `target` names a publishing target, puts the model's files and the
//! summary there.
//!
//! Replace `deploy` with what your deployer does; keep the rest.

mod options;

use std::path::Path;

use serde_json::json;

// The bindings are generated from wit/ at compile time: `Guest` is the trait
// to implement, `host` the functions berth offers, `publish` its publishing
// targets. WIT names become Rust names: `check-options` is `check_options`,
// the field `ref` is `ref_`.
use berth::deployer::host::{self, Level};
use berth::deployer::publish::Target;
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};
use options::{Kind, Spec};

wit_bindgen::generate!({
    world: "deployer",
    path: "wit",
    // The world imports wasi:filesystem for languages without a file API;
    // Rust reaches it through std, so those bindings go unused.
    generate_all,
});

const NAME: &str = "{{name}}";

/// Every option this deployer takes: `describe` publishes them as a JSON
/// Schema and `options::parse` refuses anything else.
const OPTIONS: &[Spec] = &[
    Spec {
        name: "note",
        kind: Kind::String,
        description: "a line of text written into the summary",
    },
    Spec {
        name: "max_files",
        kind: Kind::Integer {
            minimum: Some(1),
            maximum: None,
        },
        description: "fail when the model has more files than this",
    },
    Spec {
        name: "dry_run",
        kind: Kind::Boolean,
        description: "check and report, but write nothing",
    },
    Spec {
        name: "target",
        kind: Kind::String,
        description: "a publishing target to put the model's files and the summary into",
    },
];

const SUMMARY: &str = "summary.json";

struct Deployer;

impl Guest for Deployer {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description: "Writes a summary of the model's files to summary.json, and puts both into a publishing target when given one".to_string(),
            options_schema: Some(options::schema(OPTIONS)),
        }
    }

    // Called before anything is fetched: refuse bad options early.
    fn check_options(options_json: String) -> Result<(), String> {
        options::parse(NAME, OPTIONS, &options_json).map(|_| ())
    }

    // An `Err(sentence)` fails the deployment with that sentence.
    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        let options = options::parse(NAME, OPTIONS, &request.options_json)?;
        let note = options.get("note").and_then(|v| v.as_str()).unwrap_or("");
        let dry_run = options.get("dry_run").and_then(|v| v.as_bool()).unwrap_or(false);
        let files = &request.model.files;
        let max_files = options.get("max_files").and_then(|v| v.as_u64());
        if let Some(max) = max_files.filter(|max| files.len() as u64 > *max) {
            return Err(format!(
                "the model has {} files, more than max_files ({max})",
                files.len()
            ));
        }

        let mut listed = Vec::with_capacity(files.len());
        let mut bytes = 0;
        for (done, file) in (1..).zip(files) {
            // The model's files are under request.dir (/model), read-only.
            listed.push(json!({ "path": file.path, "size_bytes": file.size_bytes, "sha256": file.sha256 }));
            bytes += file.size_bytes;
            host::progress(done, files.len() as u64, &file.path);
        }

        let path = Path::new(&request.out_dir).join(SUMMARY);
        let mut ref_ = path.display().to_string();
        let mut published = Vec::new();
        let mut folder_url = None;
        if !dry_run {
            let summary = json!({ "model": request.model.name, "job_id": request.model.job_id, "note": note, "files": listed });
            std::fs::write(&path, summary.to_string())
                .map_err(|e| format!("{}: cannot write the summary: {e}", path.display()))?;
            if let Some(name) = options.get("target").and_then(|v| v.as_str()) {
                // The host streams each file, checks its sha256 at the
                // destination and records the put; this code never sees the
                // target's credentials. Its errors are sentences: pass them on.
                let target = Target::open(name)?;
                let folder = format!("{}/deploy-{}", request.model.job_id, request.deploy_id);
                // One call puts every file, a few at once; each result is
                // Ok(receipt) or Err(sentence), in the order given, and a
                // file that fails does not stop the others.
                let puts: Vec<(String, String)> =
                    files.iter().map(|f| (f.path.clone(), format!("{folder}/{}", f.path))).collect();
                let mut failed = Vec::new();
                for ((path, _), put) in puts.iter().zip(target.put_model_files(&puts)) {
                    match put {
                        Ok(receipt) => published.push(receipt.url),
                        Err(e) => failed.push(format!("{path}: {e}")),
                    }
                }
                if !failed.is_empty() {
                    return Err(failed.join("; "));
                }
                // A file this deployment wrote under /out; `put_bytes` puts
                // bytes made in memory instead.
                ref_ = target.put_out_file(SUMMARY, &format!("{folder}/{SUMMARY}"))?.url;
                published.push(ref_.clone());
                // A folder key (ending in /): where the keys under it
                // landed, ending in / too.
                folder_url = Some(target.url(&format!("{folder}/"))?);
            }
        }
        host::log(Level::Info, &format!("{ref_}: {} files, {bytes} bytes", files.len()));
        let mut details = json!({ "files": files.len(), "bytes": bytes, "written": !dry_run });
        if !published.is_empty() {
            details["published"] = published.into();
            details["folder"] = folder_url.into();
        }
        Ok(DeployResult { ref_, details_json: details.to_string() })
    }
}

export!(Deployer);
