//! `berth plugin run` and `berth plugin check`: the real binary on real
//! plugins, judged only by its exit code, its output and the files it leaves.
//! Unless a test is about the cache, runs share the test servers' cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::bytes as noise;
use crate::support::cli::{berth_command, expect_success, lossy, path};
use crate::support::{plugins, sha256_hex, tree, unpack};

#[test]
fn run_packs_every_file_of_the_directory_into_the_archive() {
    let model = model_dir();
    let out = TempDir::new().unwrap();

    // The archive is named after the deployment the plugin is told of.
    let output = berth(
        &["plugin", "run"],
        &plugins::example("archive"),
        &[
            "--dir",
            path(&model.dir),
            "--out",
            path(out.path()),
            "--deploy-id",
            "7",
        ],
    );

    let result = expect_success(&output);
    let printed: Value = serde_json::from_str(&result)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {result}"));
    assert_eq!(
        printed["ref"], "/out/support-bot-lora-7.tar.gz",
        "{printed:#}"
    );
    assert_eq!(printed["out_dir"], path(out.path()), "{printed:#}");
    let written = tree(out.path());
    assert_eq!(
        written.keys().collect::<Vec<_>>(),
        ["support-bot-lora-7.tar.gz"]
    );
    let archive = &written["support-bot-lora-7.tar.gz"];
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
            "exports no berth:deployer/plugin interface (this server speaks berth:deployer@0.1.0 and 0.2.0",
        ),
        (
            plugins::test_plugin("future-version"),
            "built for berth:deployer@0.3.0 but this server speaks 0.1.0 and 0.2.0",
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

#[test]
fn a_second_run_loads_the_plugin_from_the_users_cache() {
    let model = model_dir();
    let archive = plugins::example("archive");
    let sha256 = sha256_hex(&std::fs::read(&archive).unwrap());
    let scratch = TempDir::new().unwrap();
    let (xdg, home, flag) = (
        scratch.path().join("xdg"),
        scratch.path().join("home"),
        scratch.path().join("flag"),
    );
    let runs = |args: &[&str]| {
        let out = TempDir::new().unwrap();
        let mut all = vec!["--dir", path(&model.dir), "--out", path(out.path())];
        all.extend(args);
        let mut berth = berth_command(&["plugin", "run"], &archive, &all);
        berth
            .env_remove("BERTH_CACHE_DIR")
            .env("XDG_CACHE_HOME", &xdg)
            .env("HOME", &home);
        let output = run(berth);
        expect_success(&output);
        lossy(&output.stderr)
    };
    // (flags, the cache dir they mean)
    let cases = [
        (vec![], xdg.join("berth")),
        (vec!["--cache-dir", path(&flag)], flag.clone()),
    ];
    for (args, dir) in cases {
        let first = runs(&args);
        assert!(
            first.contains("plugin archive: compiled and loaded in "),
            "{args:?}: {first}"
        );
        assert!(
            first.contains(&format!(
                "kept in the compiled-code cache ({}) for the next run",
                dir.display()
            )),
            "{args:?}: {first}"
        );
        let entries = names_in(&dir);
        assert_eq!(
            entries.len(),
            2,
            "{args:?}: an entry and its seal: {entries:?}"
        );
        assert!(
            entries[0].starts_with(&format!("{sha256}-")) && entries[0].ends_with(".cwasm"),
            "{args:?}: keyed by the wasm's sha256: {entries:?}"
        );
        assert_eq!(entries[1], format!("{}.sha256", entries[0]), "{args:?}");

        let second = runs(&args);
        assert!(
            second.contains("plugin archive: loaded from the compiled-code cache in ")
                && second.contains(&format!("({})", dir.display())),
            "{args:?}: {second}"
        );
    }

    // Optimized code (Cranelift) is compiled and cached beside the
    // baseline code a run starts on.
    let optimized = ["--cache-dir", path(&flag), "--compiler", "optimized"];
    let first = runs(&optimized);
    assert!(
        first.contains("plugin archive: compiled and loaded in "),
        "{first}"
    );
    let entries = names_in(&flag);
    assert_eq!(entries.len(), 4, "{entries:?}");
    assert!(
        entries
            .iter()
            .any(|e| e.starts_with(&format!("{sha256}-baseline-")) && e.ends_with(".cwasm")),
        "{entries:?}"
    );
    let second = runs(&optimized);
    assert!(
        second.contains("plugin archive: loaded from the compiled-code cache in "),
        "{second}"
    );

    let uncached = runs(&["--no-cache"]);
    assert!(
        uncached.contains("plugin archive: compiled and loaded in ")
            && uncached.contains("(no cache)"),
        "{uncached}"
    );

    // `check` shares the cache; without XDG_CACHE_HOME it is under HOME.
    for expected in ["compiled and loaded", "loaded from the compiled-code cache"] {
        let mut again = berth_command(&["plugin", "check"], &archive, &[]);
        again
            .env_remove("BERTH_CACHE_DIR")
            .env_remove("XDG_CACHE_HOME")
            .env("HOME", &home);
        let output = run(again);
        expect_success(&output);
        let said = lossy(&output.stderr);
        assert!(said.contains(expected), "{expected}: {said}");
    }
    assert_eq!(names_in(&home.join(".cache/berth")).len(), 2);
}

#[test]
fn run_with_a_registration_body_hands_its_metadata_to_the_deployer() {
    let model = model_dir();
    std::fs::write(model.dir.join("notes.txt"), "not registered").unwrap();
    let weights = "adapter/adapter_model.safetensors";
    let config = "adapter_config.json";
    let body = json!({
        "name": "support-bot",
        "job_id": "ft-2026-12-01-a",
        "base_model": "meta-llama/Llama-3.1-8B",
        "dataset": "support-tickets-v3",
        "num_examples": 1200,
        "params": {"learning_rate": 0.0002},
        "source": "https://files.example/{job_id}/{path}",
        "files": [
            {"path": config, "size_bytes": model.files[config].len(), "sha256": sha256_hex(&model.files[config])},
            {"path": weights, "size_bytes": model.files[weights].len()},
        ],
    });
    let scratch = TempDir::new().unwrap();
    let body_file = scratch.path().join("model.json");
    std::fs::write(&body_file, body.to_string()).unwrap();
    let out = TempDir::new().unwrap();

    let output = berth(
        &["plugin", "run"],
        &plugins::example("model-card"),
        &[
            "--dir",
            path(&model.dir),
            "--model",
            path(&body_file),
            "--out",
            path(out.path()),
        ],
    );

    let result: Value = serde_json::from_str(&expect_success(&output)).unwrap();
    assert_eq!(result["details"]["files"], 2, "{result:#}");
    assert_eq!(
        result["details"]["hashed"], 1,
        "the file without sha256 reached the deployer without one: {result:#}"
    );
    let card = String::from_utf8(tree(out.path()).remove("README.md").unwrap()).unwrap();
    for recorded in [
        "support-bot",
        "meta-llama/Llama-3.1-8B",
        "support-tickets-v3",
        "learning_rate",
    ] {
        assert!(
            card.contains(recorded),
            "{recorded} is on the card:\n{card}"
        );
    }
    let said = lossy(&output.stderr);
    assert!(
        said.contains(&format!(
            "file {weights}: no sha256 recorded, so only its size is checked, as in a deployment (its sha256 is {})",
            sha256_hex(&model.files[weights])
        )),
        "{said}"
    );
    let unlisted: Vec<&str> = said
        .lines()
        .filter_map(|line| line.strip_prefix("--dir: "))
        .filter_map(|line| line.split_once(" is not among --model's files"))
        .map(|(file, _)| file)
        .collect();
    assert_eq!(
        unlisted,
        [
            "notes.txt",
            "tokenizer/empty.txt",
            "tokenizer/nested/deeper/tokenizer.json"
        ],
        "{said}"
    );
}

#[test]
fn run_with_a_registration_body_fails_as_a_deployment_would() {
    let model = model_dir();
    let config = "adapter_config.json";
    let size = model.files[config].len() as u64;
    let real = sha256_hex(&model.files[config]);
    let wrong = "ab".repeat(32);
    let at = model.dir.join(config);
    let body = |files: Value| json!({"name": "m", "job_id": "job-1", "source": "file:///models/{path}", "files": files});
    // (body, where the reason is printed, what it says)
    let cases = [
        (
            body(json!([{"path": config, "size_bytes": size + 5}])),
            Stream::Stdout,
            format!(
                "fetching model 1: file {config}: the source has {size} bytes for this file, but the record says {} ({})",
                size + 5,
                at.display()
            ),
        ),
        (
            body(json!([{"path": config, "size_bytes": size, "sha256": wrong}])),
            Stream::Stdout,
            format!(
                "fetching model 1: file {config}: sha256 mismatch: expected {wrong}, got {real} ({})",
                at.display()
            ),
        ),
        (
            body(json!([{"path": "missing.bin", "size_bytes": 1}])),
            Stream::Stdout,
            "fetching model 1: file missing.bin: cannot open the source file".to_string(),
        ),
        (
            json!({"name": "m", "source": "file:///models/{path}", "files": [{"path": "../x", "size_bytes": 1}]}),
            Stream::Stderr,
            r#"invalid model: job_id is required; files[0].path "../x": must not contain .."#
                .to_string(),
        ),
        (
            body(json!([{"path": config, "size": size}])),
            Stream::Stderr,
            "not a registration body as POST /v1/models takes it: unknown field `size`".to_string(),
        ),
    ];
    let scratch = TempDir::new().unwrap();
    let body_file = scratch.path().join("model.json");
    for (body, stream, reason) in cases {
        std::fs::write(&body_file, body.to_string()).unwrap();
        let out = TempDir::new().unwrap();
        let output = berth(
            &["plugin", "run"],
            &plugins::example("archive"),
            &[
                "--dir",
                path(&model.dir),
                "--model",
                path(&body_file),
                "--out",
                path(out.path()),
            ],
        );
        let text = expect_failure(&output, stream);
        assert!(
            text.contains(&reason),
            "{body}: expected {reason:?} in {text:?}"
        );
        assert!(tree(out.path()).is_empty(), "{body}: the deployer ran");
    }
}

#[test]
fn run_says_which_entries_of_the_directory_it_skips() {
    let model = model_dir();
    let outside = TempDir::new().unwrap();
    std::fs::write(outside.path().join("secret"), "outside the model").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret"),
        model.dir.join("tokenizer/linked.json"),
    )
    .unwrap();
    let made = Command::new("mkfifo")
        .arg(model.dir.join("pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    let out = TempDir::new().unwrap();

    let output = berth(
        &["plugin", "run"],
        &plugins::example("archive"),
        &["--dir", path(&model.dir), "--out", path(out.path())],
    );

    let result: Value = serde_json::from_str(&expect_success(&output)).unwrap();
    assert_eq!(result["details"]["files"], model.files.len(), "{result:#}");
    let said = lossy(&output.stderr);
    let skipped: Vec<&str> = said.lines().filter(|l| l.starts_with("--dir: ")).collect();
    for expected in [
        "--dir: skipped pipe: a FIFO; a model's files are regular files",
        &format!(
            "--dir: skipped tokenizer/linked.json: a link to {}, outside the folder, which the deployer cannot read",
            std::fs::canonicalize(outside.path().join("secret"))
                .unwrap()
                .display()
        ),
    ] {
        assert!(skipped.contains(&expected), "{expected}: {said}");
    }
    assert_eq!(skipped.len(), 2, "one line each: {said}");
}

#[test]
fn verbose_shows_the_deployers_log_and_progress_lines() {
    let model = model_dir();
    let guest_lines = |flags: &[&str]| {
        let out = TempDir::new().unwrap();
        let mut args = vec!["--dir", path(&model.dir), "--out", path(out.path())];
        // Chosen, so that berth says no id of its own among the lines.
        args.extend(["--deploy-id", "1"]);
        args.extend(flags);
        let output = berth(&["plugin", "run"], &plugins::example("archive"), &args);
        expect_success(&output);
        lossy(&output.stderr)
            .lines()
            .filter(|line| line.starts_with("plugin archive: ") && !line.contains("loaded"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };

    let shown = guest_lines(&["-v"]);
    let first_file = model.files.keys().next().unwrap();
    assert_eq!(
        shown.first().map(String::as_str),
        Some(
            format!(
                "plugin archive: deploying 1/{} (25%), {first_file}",
                model.files.len()
            )
            .as_str()
        ),
        "{shown:#?}"
    );
    assert!(
        shown
            .iter()
            .any(|line| line
                .starts_with("plugin archive: info: wrote /out/support-bot-lora-1.tar.gz")),
        "{shown:#?}"
    );
    // Off a terminal the lines are off by default; --quiet keeps them off.
    assert_eq!(guest_lines(&[]), Vec::<String>::new());
    assert_eq!(guest_lines(&["--quiet"]), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

fn berth(command: &[&str], plugin: &Path, args: &[&str]) -> Output {
    run(berth_command(command, plugin, args))
}

fn run(mut command: Command) -> Output {
    command.output().expect("the berth binary runs")
}

#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
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

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
