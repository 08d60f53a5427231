//! `berth plugin new`: a project scaffolded in each language into a temp
//! dir outside the repository, built with its own Makefile and the
//! project's toolchains, then checked and run by the real binary.
//!
//! The toolchains are the ones `scripts/setup` installs, passed to each
//! project's Makefile instead of its own first-use install: the Rust target
//! with a shared target dir (`target/scaffold`, so dependencies are compiled
//! once), componentize-py from `.venv/`, componentize-js from the
//! safetensors-check example's `node_modules/` (the same pinned version: the
//! scaffold carries that example's lock file).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{expect_success, lossy, path};
use crate::support::tree;

#[test]
fn a_rust_project_builds_checks_and_runs() {
    scaffold_build_check_and_run("rust", "size-report");
}

#[test]
fn a_python_project_builds_checks_and_runs() {
    scaffold_build_check_and_run("python", "card.v2");
}

#[test]
fn a_js_project_builds_checks_and_runs() {
    scaffold_build_check_and_run("js", "Check_JS");
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

fn scaffold_build_check_and_run(lang: &str, name: &str) {
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
                 the {name} deployer accepts only \"note\", \"max_files\", \"dry_run\""
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
