//! `berth plugin run` and `berth plugin check`: the real binary on real
//! plugins, judged only by its exit code, its output and the files it leaves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::bytes as noise;
use crate::support::{plugins, sha256_hex, tree, unpack};

#[test]
fn run_packs_every_file_of_the_directory_into_the_archive() {
    let model = model_dir();
    let out = TempDir::new().unwrap();

    let output = berth(
        &["plugin", "run"],
        &plugins::example("archive"),
        &["--dir", path(&model.dir), "--out", path(out.path())],
    );

    let result = expect_success(&output);
    let printed: Value = serde_json::from_str(&result)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {result}"));
    assert_eq!(
        printed["ref"], "/out/support-bot-lora-1.tar.gz",
        "{printed:#}"
    );
    assert_eq!(printed["out_dir"], path(out.path()), "{printed:#}");
    let written = tree(out.path());
    assert_eq!(
        written.keys().collect::<Vec<_>>(),
        ["support-bot-lora-1.tar.gz"]
    );
    let archive = &written["support-bot-lora-1.tar.gz"];
    assert_eq!(
        printed["details"],
        json!({"files": model.files.len(), "bytes": archive.len(), "sha256": sha256_hex(archive)})
    );
    assert_eq!(unpack(archive), model.files, "the archive's contents");
}

#[test]
fn run_refuses_options_the_deployer_or_the_cli_rejects() {
    let model = model_dir();
    // (options, where the reason is printed, what it says)
    let cases = [
        (
            r#"{"levle": 3}"#,
            Stream::Stdout,
            "unknown option \"levle\"",
        ),
        (
            r#"{"level": 10}"#,
            Stream::Stdout,
            "option \"level\" must be an integer from 0 to 9, not 10",
        ),
        ("[1]", Stream::Stderr, "--options must be a JSON object"),
        ("{level", Stream::Stderr, "--options is not valid JSON"),
    ];
    for (options, stream, reason) in cases {
        let out = TempDir::new().unwrap();
        let output = berth(
            &["plugin", "run"],
            &plugins::example("archive"),
            &[
                "--dir",
                path(&model.dir),
                "--out",
                path(out.path()),
                "--options",
                options,
            ],
        );
        let text = expect_failure(&output, stream);
        assert!(
            text.contains(reason),
            "{options}: expected {reason:?} in {text:?}"
        );
        assert!(
            tree(out.path()).is_empty(),
            "{options}: refused options still wrote to the out-dir"
        );
    }
}

#[test]
fn check_describes_a_good_plugin() {
    let output = berth(&["plugin", "check"], &plugins::example("archive"), &[]);

    let text = expect_success(&output);
    let fields: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key, value.trim()))
        .collect();
    assert_eq!(fields.get("name"), Some(&"archive"), "{text}");
    assert_eq!(
        fields.get("description"),
        Some(&"Packs the model's files into a .tar.gz in the deployment's output directory"),
        "{text}"
    );
    assert_eq!(fields.get("wit"), Some(&"berth:deployer@0.1.0"), "{text}");
    let sha256 = sha256_hex(&std::fs::read(plugins::example("archive")).unwrap());
    assert_eq!(fields.get("sha256"), Some(&sha256.as_str()), "{text}");
    assert_eq!(fields.get("network"), Some(&"none"), "{text}");
    assert_eq!(text.lines().last(), Some("ok"), "{text}");
}

#[test]
fn check_explains_why_a_file_is_not_a_deployer() {
    let scratch = TempDir::new().unwrap();
    let corrupt = scratch.path().join("corrupt.wasm");
    std::fs::write(&corrupt, b"PK\x03\x04 this is a zip, not a component").unwrap();
    let archive = std::fs::read(plugins::example("archive")).unwrap();
    let truncated = scratch.path().join("truncated.wasm");
    std::fs::write(&truncated, &archive[..archive.len() / 2]).unwrap();

    let cases = [
        (
            plugins::test_plugin("other-world"),
            "exports no berth:deployer/plugin@0.1.0 interface",
        ),
        (
            plugins::test_plugin("future-version"),
            "built for berth:deployer@0.2.0 but this server speaks 0.1.0",
        ),
        (corrupt, "is not a WebAssembly file"),
        (truncated, "is not a valid component"),
    ];
    for (file, reason) in cases {
        let output = berth(&["plugin", "check"], &file, &[]);
        let text = expect_failure(&output, Stream::Stdout);
        assert!(
            text.starts_with(&format!("{}: ", file.display())),
            "names the file: {text}"
        );
        assert!(
            text.contains(reason),
            "{}: expected {reason:?} in {text:?}",
            file.display()
        );
    }
}

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

fn berth(command: &[&str], plugin: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(command)
        .arg(plugin)
        .args(args)
        .env("BERTH_LOG", "warn")
        .output()
        .expect("the berth binary runs")
}

#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Stdout of a run that exited 0.
#[track_caller]
fn expect_success(output: &Output) -> String {
    let (stdout, stderr) = (lossy(&output.stdout), lossy(&output.stderr));
    assert!(
        output.status.success(),
        "exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout
}

/// The stream that should explain a run that exited 1.
#[track_caller]
fn expect_failure(output: &Output, stream: Stream) -> String {
    let (stdout, stderr) = (lossy(&output.stdout), lossy(&output.stderr));
    assert_eq!(
        output.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    match stream {
        Stream::Stdout => stdout,
        Stream::Stderr => stderr,
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// A model directory named like a training job, with nested files, an
/// empty one and 1 MiB of incompressible bytes.
struct ModelDir {
    _root: TempDir,
    dir: PathBuf,
    files: BTreeMap<String, Vec<u8>>,
}

fn model_dir() -> ModelDir {
    let root = TempDir::new().unwrap();
    let dir = root.path().join("support-bot-lora");
    let files = BTreeMap::from([
        (
            "adapter_config.json".to_string(),
            br#"{"r": 16, "alpha": 32}"#.to_vec(),
        ),
        (
            "adapter/adapter_model.safetensors".to_string(),
            noise(7, 1 << 20),
        ),
        (
            "tokenizer/nested/deeper/tokenizer.json".to_string(),
            b"{\"vocab\": {}}".to_vec(),
        ),
        ("tokenizer/empty.txt".to_string(), Vec::new()),
    ]);
    for (relative, bytes) in &files {
        let file = dir.join(relative);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }
    ModelDir {
        _root: root,
        dir,
        files,
    }
}
