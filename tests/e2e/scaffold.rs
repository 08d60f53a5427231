//! `berth plugin new`: a project scaffolded in each language into a temp
//! dir outside the repository, built with its own Makefile and the
//! project's toolchains, then checked and run by the real binary, and
//! deployed by a server with a `file://` publishing target, into which it
//! puts the model and its summary.
//!
//! The toolchains are the ones `scripts/setup` installs, passed to each
//! project's Makefile instead of its own first-use install: the Rust target
//! with a shared target dir (`target/scaffold`, so dependencies are compiled
//! once), componentize-py from `.venv/`, componentize-js from the
//! safetensors-check example's `node_modules/` (the same pinned version: the
//! scaffold carries that example's lock file).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{expect_success, lossy, path};
use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, model, tree};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_project_builds_checks_runs_and_publishes() {
    let wasm = scaffold_build_check_and_run("rust", "size-report");
    publishes_into_a_file_target("rust", "size-report", &wasm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_project_builds_checks_runs_and_publishes() {
    let wasm = scaffold_build_check_and_run("python", "card.v2");
    publishes_into_a_file_target("python", "card.v2", &wasm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_js_project_builds_checks_runs_and_publishes() {
    let wasm = scaffold_build_check_and_run("js", "Check_JS");
    publishes_into_a_file_target("js", "Check_JS", &wasm).await;
}

/// The same source built in two folders, in Python and JavaScript.
/// componentize-py 0.25.1 and componentize-js 0.25.0 snapshot the
/// interpreter's memory after loading the app (pre-initialization) with
/// the build's own random seeds and clocks (componentize-py's issue #247),
/// and componentize-js writes the project's absolute path into it, so two
/// builds differ in that snapshot, and so in their sha256, even in one
/// folder; everything else — the code, types, imports and exports — is the
/// same, as docs/src/writing/testing.md says.
#[test]
fn python_and_js_builds_differ_only_in_the_preinitialized_memory() {
    for lang in ["python", "js"] {
        let scratch = TempDir::new().unwrap();
        let built: Vec<Vec<u8>> = ["a/report", "b/deeper/report"]
            .iter()
            .map(|dir| {
                let project = scratch.path().join(dir);
                std::fs::create_dir_all(project.parent().unwrap()).unwrap();
                let args = [
                    "plugin",
                    "new",
                    "report",
                    "--lang",
                    lang,
                    "--dir",
                    path(&project),
                ];
                expect_success(&berth_in(scratch.path(), &args));
                build(lang, &project);
                std::fs::read(project.join("report.wasm")).unwrap()
            })
            .collect();
        let (first, second) = (sections(&built[0]), sections(&built[1]));
        assert_eq!(
            first.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
            second.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
            "{lang}: the two builds have other sections"
        );
        let differing: Vec<(bool, u8)> = first
            .iter()
            .zip(&second)
            .filter(|(a, b)| a.2 != b.2)
            .map(|(a, _)| (a.0, a.1))
            .collect();
        // A core module's data (11: the memory image) and globals (6:
        // where its stack and heap ended), nothing else.
        assert!(
            differing
                .iter()
                .all(|&(module, id)| module && (id == 11 || id == 6)),
            "{lang}: sections other than the memory snapshot differ (in a module?, section id): \
             {differing:?}; update what docs/src/writing/testing.md says varies"
        );
    }
}

/// Every leaf section of a component, in order: whether it is in a core
/// module, its id, its bytes. Nested modules and components are left out:
/// their own sections are listed.
fn sections(wasm: &[u8]) -> Vec<(bool, u8, &[u8])> {
    use wasmparser::{Encoding, Parser, Payload};
    let mut within = Vec::new();
    let mut listed = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.expect("a valid component");
        match &payload {
            Payload::Version { encoding, .. } => within.push(*encoding == Encoding::Module),
            Payload::End(_) => {
                within.pop();
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => {}
            _ => {
                if let Some((id, range)) = payload.as_section() {
                    listed.push((*within.last().unwrap(), id, &wasm[range]));
                }
            }
        }
    }
    listed
}

#[test]
fn new_refuses_a_used_dir_a_bad_name_and_an_unknown_language() {
    let scratch = TempDir::new().unwrap();
    let used = scratch.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("notes.txt"), "mine").unwrap();
    let file = scratch.path().join("a-file");
    std::fs::write(&file, "").unwrap();

    // (arguments, exit code, what stderr says)
    let cases: [(&[&str], i32, String); 5] = [
        (
            &["ok", "--lang", "rust", "--dir", path(&used)],
            1,
            format!("{}: already exists and is not empty", used.display()),
        ),
        (
            &["ok", "--lang", "rust", "--dir", path(&file)],
            1,
            format!("{}: exists and is not a directory", file.display()),
        ),
        (
            &["two words", "--lang", "python"],
            1,
            "the deployer name \"two words\" contains ' '".into(),
        ),
        (
            &[".hidden", "--lang", "js"],
            1,
            "the deployer name \".hidden\" must start with a letter or digit".into(),
        ),
        (
            &["ok", "--lang", "go"],
            2,
            "invalid value 'go' for '--lang <LANG>'".into(),
        ),
    ];
    for (args, code, says) in cases {
        let output = berth_in(scratch.path(), &[&["plugin", "new"], args].concat());
        let stderr = lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&says),
            "{args:?}: expected {says:?} in {stderr}"
        );
    }
    assert_eq!(
        tree(&used).keys().collect::<Vec<_>>(),
        ["notes.txt"],
        "a refused scaffold wrote into the used dir"
    );
    let made: Vec<_> = std::fs::read_dir(scratch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(made.len(), 2, "a refused scaffold made a dir: {made:?}");
}

/// Scaffolds, builds, checks and runs the project without a server or a
/// target; returns its `.wasm`, copied out of the project's temp dir.
fn scaffold_build_check_and_run(lang: &str, name: &str) -> tempfile::TempPath {
    let scratch = TempDir::new().unwrap();
    let project = scratch.path().join("project");
    let output = berth_in(
        scratch.path(),
        &[
            "plugin",
            "new",
            name,
            "--lang",
            lang,
            "--dir",
            path(&project),
        ],
    );
    expect_success(&output);
    assert!(
        !project.starts_with(repo()),
        "the project must build outside the repository"
    );
    for copied in [
        "wit/deployer.wit",
        "wit/deps/filesystem.wit",
        "README.md",
        "Makefile",
    ] {
        assert!(project.join(copied).is_file(), "{lang}: no {copied}");
    }

    build(lang, &project);
    let wasm = project.join(format!("{name}.wasm"));
    assert!(
        wasm.is_file(),
        "{lang}: make did not write {}",
        wasm.display()
    );

    let checked = expect_success(&berth_in(&project, &["plugin", "check", path(&wasm)]));
    let field = |key: &str| {
        checked
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{key}:")))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{lang}: no {key} in {checked}"))
    };
    assert_eq!(field("name"), name);
    let schema: Value = serde_json::from_str(field("options")).unwrap();
    assert_eq!(schema, expected_schema(), "{lang}");

    let model = project.join("example-model");
    let bytes: usize = tree(&model).values().map(Vec::len).sum();
    let out = scratch.path().join("out");
    let ran = expect_success(&berth_in(
        &project,
        &[
            "plugin",
            "run",
            path(&wasm),
            "--dir",
            path(&model),
            "--out",
            path(&out),
            "--options",
            r#"{"note": "first", "max_files": 5}"#,
        ],
    ));
    let result: Value = serde_json::from_str(&ran).unwrap_or_else(|e| panic!("{lang}: {e}: {ran}"));
    assert_eq!(result["ref"], "/out/summary.json", "{lang}: {result}");
    assert_eq!(
        result["details"],
        json!({"files": 2, "bytes": bytes, "written": true}),
        "{lang}"
    );
    let summary: Value = serde_json::from_slice(&tree(&out)["summary.json"]).unwrap();
    assert_eq!(summary["note"], "first", "{lang}: {summary}");
    let listed: Vec<_> = summary["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].clone())
        .collect();
    assert_eq!(
        listed,
        [json!("README.txt"), json!("config.json")],
        "{lang}"
    );

    // (options, what the deployer answers): a refusal from check_options,
    // then an error returned from deploy, each in the language's own way.
    let refusals = [
        (
            r#"{"nte": "x"}"#,
            format!(
                "deployer {name} refused the options: unknown option \"nte\": \
                 the {name} deployer accepts only \"note\", \"max_files\", \"dry_run\", \"target\""
            ),
        ),
        (
            r#"{"max_files": 1}"#,
            format!("deployer {name} failed: the model has 2 files, more than max_files (1)"),
        ),
    ];
    for (options, says) in refusals {
        let output = berth_in(
            &project,
            &[
                "plugin",
                "run",
                path(&wasm),
                "--dir",
                path(&model),
                "--options",
                options,
            ],
        );
        let stdout = lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(1), "{lang} {options}: {stdout}");
        assert_eq!(stdout.trim(), says, "{lang} {options}");
    }

    let kept = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    std::fs::copy(&wasm, &kept).unwrap();
    kept
}

/// The project on a server whose sources file has a `file://` target that
/// the project's manifest grants: with the option `target` it puts the
/// model's files and its summary there, under `{job_id}/deploy-{id}/`; a
/// target it is not granted fails the deployment with the host's sentence,
/// passed on the way the language returns errors.
async fn publishes_into_a_file_target(lang: &str, name: &str, wasm: &Path) {
    let temp = TempDir::new().unwrap();
    let published = temp.path().join("published");
    std::fs::create_dir(&published).unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"scratch\"\nurl = \"file://{}/\"\n",
            published.display()
        ),
    )
    .unwrap();
    let files = FileServer::start().await;
    let berth = Berth::bare(Backend::Sqlite)
        .plugin(name, wasm.to_path_buf())
        .plugins_file(&format!("{name}.toml"), "targets = [\"scratch\"]\n")
        .arg("--sources-file")
        .arg(path(&sources))
        .start()
        .await;
    let contents = adapter_files();
    let id = berth
        .register(&model(&files, "job-scaffold", &contents))
        .await;

    let (status, deployment) = berth
        .deploy(
            id,
            name,
            json!({ "note": "published", "target": "scratch" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{lang}: {deployment}");
    let folder = format!("job-scaffold/deploy-{}", deployment["id"]);
    let landed = tree(&published);
    let mut expected: Vec<String> = contents
        .iter()
        .map(|(file, _)| format!("{folder}/{file}"))
        .collect();
    expected.push(format!("{folder}/summary.json"));
    expected.sort();
    assert_eq!(
        landed.keys().cloned().collect::<Vec<_>>(),
        expected,
        "{lang}"
    );
    for (file, bytes) in &contents {
        assert!(
            landed[&format!("{folder}/{file}")] == *bytes,
            "{lang}: {file} landed with other bytes"
        );
    }
    let summary: Value =
        serde_json::from_slice(&landed[&format!("{folder}/summary.json")]).unwrap();
    assert_eq!(summary["note"], "published", "{lang}: {summary}");
    let urls = deployment["details"]["published"]
        .as_array()
        .unwrap_or_else(|| panic!("{lang}: no published URLs in {deployment}"));
    assert_eq!(urls.len(), contents.len() + 1, "{lang}: {deployment}");
    assert_eq!(Some(&deployment["ref"]), urls.last(), "{lang}");
    assert_eq!(
        deployment["details"]["folder"],
        format!("file://{}/{folder}/", published.display()),
        "{lang}: the url of a folder key"
    );
    assert!(
        deployment["ref"]
            .as_str()
            .unwrap()
            .ends_with(&format!("{folder}/summary.json")),
        "{lang}: {deployment}"
    );

    let refused = berth
        .deploy(id, name, json!({ "target": "elsewhere" }))
        .await;
    assert_error(
        &refused,
        StatusCode::BAD_GATEWAY,
        &format!("deployer {name}: plugin {name}: target \"elsewhere\" is not granted"),
    );
}

/// Runs the project's own `make`, with the toolchains this repository
/// already has.
fn build(lang: &str, project: &Path) {
    let mut make = Command::new("make");
    make.current_dir(project);
    match lang {
        "rust" => make.env("CARGO_TARGET_DIR", repo().join("target/scaffold")),
        "python" => make.env("COMPONENTIZE_PY", tool(".venv/bin/componentize-py")),
        "js" => make.env(
            "COMPONENTIZE_JS",
            tool("examples/safetensors-check/node_modules/.bin/componentize-js"),
        ),
        _ => unreachable!("{lang}"),
    };
    let output = make.output().expect("make runs");
    assert!(
        output.status.success(),
        "{lang}: make failed\nstdout:\n{}\nstderr:\n{}",
        lossy(&output.stdout),
        lossy(&output.stderr)
    );
}

fn expected_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "note": {"type": "string", "description": "a line of text written into the summary"},
            "max_files": {"type": "integer", "minimum": 1, "description": "fail when the model has more files than this"},
            "dry_run": {"type": "boolean", "description": "check and report, but write nothing"},
            "target": {"type": "string", "description": "a publishing target to put the model's files and the summary into"},
        },
        "additionalProperties": false,
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

#[track_caller]
fn tool(relative: &str) -> PathBuf {
    let path = repo().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup",
        path.display()
    );
    path
}

fn berth_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .current_dir(dir)
        .args(args)
        .env("BERTH_LOG", "warn")
        .output()
        .expect("the berth binary runs")
}
