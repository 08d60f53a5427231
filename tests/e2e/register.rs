//! `berth models register | show | rm` as a person runs them: the real
//! binary on a real training run's folder, `--server` pointing at a real
//! server (SQLite), which then fetches and deploys what was registered.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{expect_success, lossy, path};
use crate::support::server::{Backend, Berth};
use crate::support::{bytes, sha256_hex};

use crate::support::cli::client as berth;

/// A finished PEFT run as Trainer leaves it, with the things a folder
/// picks up besides: a git checkout, a dotfile, a link to a folder, a FIFO.
fn peft_run(parent: &Path) -> std::path::PathBuf {
    let dir = parent.join("support-bot-run");
    for sub in ["checkpoint-500", "checkpoint-1000", ".git/objects"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let write = |p: &str, b: &[u8]| std::fs::write(dir.join(p), b).unwrap();
    write(
        "adapter_config.json",
        br#"{"base_model_name_or_path": "meta-llama/Llama-3.2-1B", "peft_type": "LORA",
            "r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
            "target_modules": ["q_proj", "v_proj"], "bias": "none"}"#,
    );
    write("adapter_model.safetensors", &bytes(7, 3 * 1024 * 1024 + 5));
    write(
        "checkpoint-500/trainer_state.json",
        br#"{"global_step": 500, "log_history": [{"loss": 1.5, "step": 500}]}"#,
    );
    write(
        "checkpoint-1000/trainer_state.json",
        br#"{"global_step": 1000, "log_history": [{"loss": 1.5, "step": 500},
            {"loss": 0.625, "step": 1000}, {"train_loss": 1.1, "step": 1000}]}"#,
    );
    write(".git/HEAD", b"ref: refs/heads/main\n");
    write(".env", b"HF_TOKEN=secret\n");
    std::os::unix::fs::symlink("checkpoint-1000", dir.join("latest")).unwrap();
    let made = Command::new("mkfifo")
        .arg(dir.join("pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_training_folder_is_registered_shown_deployed_and_removed() {
    let parent = TempDir::new().unwrap();
    let dir = peft_run(parent.path());
    let server = Berth::start(Backend::Sqlite).await;
    let source = format!("file://{}/{{path}}", path(&dir));
    let register = |extra: &[&str]| {
        let mut args = vec!["models", "register", path(&dir), "--source", &source];
        args.extend_from_slice(extra);
        berth(&server.url, &args)
    };

    let dry = register(&[
        "--job-id",
        "run-1",
        "--dataset",
        "tickets",
        "--param",
        "lr=0.0002",
        "--param",
        "r=4",
        "--dry-run",
    ]);
    let body: Value = serde_json::from_str(&expect_success(&dry)).unwrap();
    let said = lossy(&dry.stderr);
    for skipped in [
        "skipped .env: its name starts with a dot (--all registers it)",
        "skipped .git/: a git repository's own files",
        "skipped latest: a link to a folder; berth follows links to files only (name the folder itself)",
        "skipped pipe: a FIFO; a model's files are regular files",
    ] {
        assert!(said.lines().any(|l| l == skipped), "{skipped}: {said}");
    }
    // A Trainer run keeps its final model; its checkpoints are left out,
    // and said so, but their trainer_state.json still fills the fields.
    assert!(
        said.lines().any(|l| l.starts_with(
            "left out a training run's state, 2 file(s), 209 bytes: checkpoint-1000/, checkpoint-500/; "
        )),
        "{said}"
    );
    let files_of = |paths: &[&str]| -> Vec<Value> {
        paths
            .iter()
            .map(|p| {
                let bytes = std::fs::read(dir.join(p)).unwrap();
                json!({"path": p, "size_bytes": bytes.len(), "sha256": sha256_hex(&bytes)})
            })
            .collect()
    };
    let expected_files = files_of(&["adapter_config.json", "adapter_model.safetensors"]);
    assert_eq!(
        body,
        json!({
            "name": "support-bot-run",
            "job_id": "run-1",
            "base_model": "meta-llama/Llama-3.2-1B",
            "dataset": "tickets",
            "num_train_steps": 1000,
            "final_loss": 0.625,
            // The flags win over adapter_config.json.
            "params": {"peft_type": "LORA", "r": 4, "lora_alpha": 16, "lora_dropout": 0.1,
                       "target_modules": ["q_proj", "v_proj"], "lr": 0.0002},
            "source": source,
            "files": expected_files,
        })
    );
    let (_, listed) = server.get("/v1/models").await;
    assert_eq!(listed["models"], json!([]), "a dry run registers nothing");

    // --include takes the checkpoints back; --exclude leaves a file out.
    let chosen = register(&[
        "--include",
        "checkpoint-*/**",
        "--exclude",
        "adapter_model.safetensors",
        "--dry-run",
    ]);
    let body: Value = serde_json::from_str(&expect_success(&chosen)).unwrap();
    assert_eq!(
        body["files"],
        json!(files_of(&[
            "adapter_config.json",
            "checkpoint-1000/trainer_state.json",
            "checkpoint-500/trainer_state.json",
        ]))
    );
    // --checkpoint registers one checkpoint as the model, named after it.
    let last = register(&["--checkpoint", "last", "--dry-run"]);
    let body: Value = serde_json::from_str(&expect_success(&last)).unwrap();
    assert_eq!(body["job_id"], "support-bot-run-checkpoint-1000");
    assert_eq!(body["files"][0]["path"], "trainer_state.json");
    let missing = register(&["--checkpoint", "750", "--dry-run"]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(
        lossy(&missing.stderr)
            .contains("has no checkpoint 750: it has checkpoint-500, checkpoint-1000"),
        "{missing:?}"
    );
    // A checkpoint Trainer is still writing has no trainer_state.json yet.
    let writing = dir.join("checkpoint-1500");
    std::fs::create_dir(&writing).unwrap();
    std::fs::write(writing.join("adapter_model.safetensors"), b"half").unwrap();
    let early = register(&["--checkpoint", "last", "--dry-run"]);
    assert_eq!(early.status.code(), Some(1), "{early:?}");
    assert!(
        lossy(&early.stderr).contains(&format!(
            "{} has no trainer_state.json, which Trainer writes last: it is still being written",
            writing.display()
        )),
        "{early:?}"
    );
    // With --wait it looks again until Trainer has written the state: the
    // state is written once it has said it waits.
    let mut waiting = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["models", "register", path(&dir), "--source", &source])
        .args(["--checkpoint", "last", "--wait", "--dry-run"])
        .args(["--server", &server.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(waiting.stderr.take().unwrap());
    let mut lines = std::io::BufRead::lines(stderr).map(Result::unwrap);
    let said = lines
        .find(|line| line.starts_with("waiting: "))
        .expect("register --wait says it waits");
    assert!(
        said.contains("checkpoint-1500 has no trainer_state.json"),
        "{said}"
    );
    std::fs::write(
        writing.join("trainer_state.json"),
        br#"{"global_step": 1500, "log_history": []}"#,
    )
    .unwrap();
    // Read to its end, so the command never writes into a closed pipe.
    let rest: Vec<String> = lines.collect();
    let waited = waiting.wait_with_output().unwrap();
    assert!(waited.status.success(), "{waited:?} {rest:?}");
    let body: Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert_eq!(body["job_id"], "support-bot-run-checkpoint-1500");
    std::fs::remove_dir_all(&writing).unwrap();

    let registered = register(&["--job-id", "run-1", "--json"]);
    let model: Value = serde_json::from_str(&expect_success(&registered)).unwrap();
    // As sent, and each file's format unknown until a fetch tells it.
    let mut stored_files = json!(expected_files);
    for file in stored_files.as_array_mut().unwrap() {
        file["format"] = Value::Null;
    }
    assert_eq!(model["files"], stored_files);
    assert_eq!(model["final_loss"], 0.625);
    let id = model["id"].as_i64().unwrap();

    // The server fetches the same bytes and deploys them.
    let (status, deployment) = server.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed", "{deployment}");

    // The same folder again: the model there.
    let again = register(&["--job-id", "run-1"]);
    assert_eq!(
        expect_success(&again).trim(),
        format!(
            "already registered as model {id} (job run-1): the same files from the same source"
        )
    );
    // Other files under the job id: refused before hashing, naming both.
    let other = register(&["--job-id", "run-1", "--include", "checkpoint-*/**"]);
    assert_eq!(other.status.code(), Some(1), "{other:?}");
    let refusal = lossy(&other.stderr);
    assert!(
        refusal.contains(&format!(
            "job id \"run-1\" is registered already as model {id} and it has no \
             checkpoint-1000/trainer_state.json of "
        )) && refusal.contains("(--job-id)"),
        "{refusal}"
    );

    let shown = expect_success(&berth(&server.url, &["models", "show", "run-1"]));
    for fragment in [
        "meta-llama/Llama-3.2-1B",
        "0.625",
        &sha256_hex(&std::fs::read(dir.join("adapter_model.safetensors")).unwrap()),
        "2 files",
    ] {
        assert!(shown.contains(fragment), "{fragment}: {shown}");
    }
    // Deployed: each file's format as the fetch told it from its bytes
    // (this run's weights are random bytes, whatever their name).
    for (path, format) in [
        ("adapter_config.json", " json "),
        ("adapter_model.safetensors", " other "),
    ] {
        assert!(
            shown
                .lines()
                .any(|l| l.trim_start().starts_with(path) && l.contains(format)),
            "{path}: {shown}"
        );
    }

    let dropped = expect_success(&berth(&server.url, &["models", "rm", "--files", "run-1"]));
    assert!(
        dropped.contains(&format!(
            "dropped the copy of model {id} (job run-1)'s files"
        )),
        "{dropped}"
    );
    assert_eq!(
        server.get(&format!("/v1/models/{id}")).await.0,
        StatusCode::OK
    );
    let removed = expect_success(&berth(&server.url, &["models", "rm", "run-1"]));
    assert!(
        removed.contains(&format!("deleted model {id} (job run-1)")),
        "{removed}"
    );
    let (status, _) = server.get(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let gone = berth(&server.url, &["models", "show", "run-1"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        lossy(&gone.stderr).contains("no model has the id or job id"),
        "{gone:?}"
    );
}

#[test]
fn dotfiles_come_with_all_and_an_empty_folder_is_refused() {
    let parent = TempDir::new().unwrap();
    let dir = peft_run(parent.path());
    let source = "http://files.local/{job_id}/{path}";
    let dry = berth(
        "http://127.0.0.1:9",
        &[
            "models",
            "register",
            path(&dir),
            "--source",
            source,
            "--all",
            "--dry-run",
        ],
    );
    let body: Value = serde_json::from_str(&expect_success(&dry)).unwrap();
    let paths: Vec<&str> = body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&".env"), "{paths:?}");
    assert!(!paths.iter().any(|p| p.starts_with(".git/")), "{paths:?}");
    assert_eq!(body["job_id"], "support-bot-run");

    let empty = parent.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join(".hidden"), b"x").unwrap();
    let refused = berth(
        "http://127.0.0.1:9",
        &[
            "models",
            "register",
            path(&empty),
            "--source",
            source,
            "--dry-run",
        ],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        lossy(&refused.stderr).contains("holds no file to register"),
        "{refused:?}"
    );
}

/// A link out of the folder is refused, naming it, unless --follow-links.
#[test]
fn a_link_out_of_the_folder_is_refused_unless_followed() {
    let parent = TempDir::new().unwrap();
    let dir = peft_run(parent.path());
    std::fs::write(parent.path().join("tokenizer.json"), b"{}").unwrap();
    std::os::unix::fs::symlink("../tokenizer.json", dir.join("tokenizer.json")).unwrap();
    let dry = |extra: &[&str]| {
        let mut args = vec!["models", "register", path(&dir), "--dry-run"];
        args.extend_from_slice(&["--source", "http://files.local/{path}"]);
        args.extend_from_slice(extra);
        berth("http://127.0.0.1:9", &args)
    };
    let refused = dry(&[]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let said = lossy(&refused.stderr);
    assert!(said.contains("tokenizer.json: a link to "), "{said}");
    assert!(said.contains("--follow-links"), "{said}");

    let followed = dry(&["--follow-links"]);
    let body: Value = serde_json::from_str(&expect_success(&followed)).unwrap();
    assert!(
        body["files"].as_array().unwrap().contains(
            &json!({"path": "tokenizer.json", "size_bytes": 2, "sha256": sha256_hex(b"{}")})
        ),
        "{body}"
    );
}

/// The longest name the filesystem allows registers and is fetched and
/// deployed; a name that is not UTF-8 is refused, named, before anything
/// is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_name_the_filesystem_allows_registers_and_fetches() {
    use std::os::unix::ffi::OsStrExt;
    let parent = TempDir::new().unwrap();
    let dir = parent.path().join("long-names");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let longest = format!("sub/{}.safetensors", "w".repeat(255 - ".safetensors".len()));
    std::fs::write(dir.join(&longest), bytes(3, 70_000)).unwrap();
    let server = Berth::start(Backend::Sqlite).await;
    let source = format!("file://{}/{{path}}", path(&dir));
    let register = || {
        berth(
            &server.url,
            &[
                "models",
                "register",
                path(&dir),
                "--source",
                &source,
                "--json",
            ],
        )
    };

    let model: Value = serde_json::from_str(&expect_success(&register())).unwrap();
    assert_eq!(model["files"][0]["path"], longest.as_str());
    let (status, deployment) = server
        .deploy(model["id"].as_i64().unwrap(), "archive", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed", "{deployment}");

    std::fs::write(
        dir.join("sub")
            .join(std::ffi::OsStr::from_bytes(b"r\xe9sum\xe9.txt")),
        b"x",
    )
    .unwrap();
    let refused = register();
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let said = lossy(&refused.stderr);
    assert!(
        said.contains("sub/r\u{fffd}sum\u{fffd}.txt: the name is not UTF-8"),
        "{said}"
    );
    assert!(!said.contains("No such file"), "{said}");
}

/// A 2 GiB file (sparse, so the disk does not fill) is hashed through
/// fixed buffers: the process's peak memory grows far less than the file
/// over the same command on a 1 MiB file. (The baseline matters: a
/// debug binary's own pages are a few hundred MiB of the peak, and how
/// many are resident depends on what else ran.)
#[test]
fn a_large_file_is_hashed_without_holding_it() {
    const SIZE: u64 = 2 << 30;
    let parent = TempDir::new().unwrap();
    let register = |name: &str, size: u64| {
        let dir = parent.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::File::create(dir.join("weights.bin"))
            .unwrap()
            .set_len(size)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["models", "register", path(&dir), "--dry-run"])
            .args(["--source", "http://files.local/{job_id}/{path}"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (max_rss_kib, output) = waited(child);
        let body: Value = serde_json::from_str(&expect_success(&output)).unwrap();
        assert_eq!(body["files"][0]["size_bytes"], size);
        assert_eq!(body["files"][0]["sha256"], zeros_sha256(size));
        max_rss_kib
    };
    let baseline = register("small-run", 1 << 20);
    let big = register("big-run", SIZE);
    assert!(
        big - baseline < 64 * 1024,
        "peak memory {big} KiB hashing 2 GiB, {baseline} KiB hashing 1 MiB"
    );
}

/// The sha256 of `len` zero bytes, computed here in pieces.
fn zeros_sha256(len: u64) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let block = vec![0u8; 1 << 20];
    for _ in 0..len / block.len() as u64 {
        hasher.update(&block);
    }
    hex::encode(hasher.finalize())
}

/// Waits for `child`, reading its output: its peak resident memory (KiB,
/// the kernel's own count for exactly this process) and what it wrote.
fn waited(mut child: std::process::Child) -> (i64, Output) {
    use std::io::Read;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        err.read_to_end(&mut text).unwrap();
        text
    });
    let mut stdout = Vec::new();
    out.read_to_end(&mut stdout).unwrap();
    let stderr = reader.join().unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, which nothing else waits for;
    // `status` and `usage` are valid for writes.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4 failed");
    use std::os::unix::process::ExitStatusExt;
    (
        usage.ru_maxrss,
        Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout,
            stderr,
        },
    )
}

/// Against a server on this machine the folder is its own source, and a
/// file only its owner can read is warned about (a server running as
/// another user could not fetch it); a server elsewhere needs --source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_server_fetches_from_the_folder_itself_and_closed_files_are_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    let parent = TempDir::new().unwrap();
    let dir = parent.path().join("merged");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("config.json"), b"{\"model_type\": \"llama\"}").unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes(3, 4096)).unwrap();
    std::fs::set_permissions(
        dir.join("model.safetensors"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let server = Berth::start(Backend::Sqlite).await;

    let registered = berth(&server.url, &["models", "register", path(&dir), "--json"]);
    let model: Value = serde_json::from_str(&expect_success(&registered)).unwrap();
    let folder = url::Url::from_directory_path(&dir).unwrap();
    assert_eq!(model["source"], format!("{folder}{{path}}"));
    assert!(
        lossy(&registered.stderr).contains(
            "warning: model.safetensors cannot be read by other users (e.g. mode 0600, as \
             safetensors writes): a server running as another user will fail to fetch it"
        ),
        "{registered:?}"
    );
    let (status, deployment) = server
        .deploy(model["id"].as_i64().unwrap(), "archive", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");

    let elsewhere = berth(
        "http://berth.internal:7878",
        &["models", "register", path(&dir), "--dry-run"],
    );
    assert_eq!(elsewhere.status.code(), Some(1), "{elsewhere:?}");
    assert!(
        lossy(&elsewhere.stderr).contains(
            "--source is needed: the server http://berth.internal:7878 is not on this machine"
        ),
        "{elsewhere:?}"
    );
}
