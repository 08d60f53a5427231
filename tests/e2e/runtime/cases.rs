// The cases of `runtime.rs`, included once per tier of compiled code: each
// runs with the `COMPILER` of the module including it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth::model::{ModelFile, TrainedModel};
use berth::runtime::{
    CallError, CodeCache, Compiler, DeployCall, Deployed, Engines, GuestLevel, Limits, LogReporter,
    Manifest, Origin, Plugin, Reporter, Runtime, Tier, caps,
};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::bytes as noise;
use crate::support::{plugins, sha256_hex, tree, unpack};
use tokio_util::sync::CancellationToken;

/// No call in these tests should come near this: it turns a hang into a
/// failure, it does not measure speed.
const HANG_GUARD: Duration = Duration::from_secs(10);
/// The same for a whole test body, which also compiles its plugin.
const TEST_HANG_GUARD: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Sandbox denials (the misbehave plugin)
// ---------------------------------------------------------------------------

#[tokio::test]
async fn writing_into_the_model_directory_is_refused() {
    let (runtime, plugin, model) = misbehave().await;
    let before = tree(model.dir());

    let (result, out) = deploy(&runtime, &plugin, &model, 7, json!({"mode": "write-model"})).await;

    // The plugin succeeds only when both writes failed inside the guest.
    let deployed = result.expect("write-model reports a breach by failing");
    for key in ["create_error", "append_error"] {
        let error = deployed.details[key].as_str().unwrap_or_default();
        assert!(
            error.contains("not permitted"),
            "{key} should be a permission error: {:?}",
            deployed.details
        );
    }
    assert!(
        !model.dir().join("intruder.txt").exists(),
        "a file appeared in the model directory"
    );
    assert_eq!(tree(model.dir()), before, "the model directory changed");
    assert!(
        tree(out.path()).is_empty(),
        "write-model writes nothing to the out-dir"
    );

    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn nothing_outside_the_preopens_can_be_read() {
    let (runtime, plugin, model) = misbehave().await;

    let (result, _out) = deploy(
        &runtime,
        &plugin,
        &model,
        7,
        json!({"mode": "read-outside"}),
    )
    .await;

    let deployed = result.expect("read-outside reports what it saw");
    let results = deployed.details["results"]
        .as_object()
        .expect("results is an object");
    assert_eq!(results.len(), 4, "{results:?}");
    for (path, outcome) in results {
        let outcome = outcome.as_str().unwrap_or_default();
        assert!(
            !outcome.is_empty() && !outcome.starts_with("OK:"),
            "{path} was readable: {outcome}"
        );
    }
    // Listing the guest's "/" shows at most the two mounts, never the host's root.
    for entry in deployed.details["root_entries"]
        .as_array()
        .expect("root_entries is a list")
    {
        let entry = entry.as_str().unwrap_or_default();
        assert!(
            entry.starts_with("error:") || ["model", "out"].contains(&entry),
            "the guest's / lists {entry:?}: {}",
            deployed.details["root_entries"]
        );
    }
    let seen = Value::Object(deployed.details).to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").expect("the host has an /etc/passwd");
    for line in passwd.lines().filter(|line| !line.is_empty()) {
        assert!(
            !seen.contains(line),
            "/etc/passwd leaked into the details: {line}"
        );
    }

    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[test]
fn an_endless_loop_is_stopped_at_its_deadline() {
    on_guarded_thread(|| async {
        let (runtime, mut plugin, model) = misbehave().await;
        plugin.limits.timeout = Duration::from_secs(1);

        let started = Instant::now();
        let (result, _out) = deploy(&runtime, &plugin, &model, 7, json!({"mode": "loop"})).await;

        let limit = Duration::from_secs(1);
        assert_eq!(expect_failure(result), CallError::TimedOut { limit });
        let elapsed = started.elapsed();
        assert!(elapsed >= limit, "stopped before its deadline: {elapsed:?}");
        // A loaded machine must not make the good deployment miss a 1s limit.
        plugin.limits = runtime.defaults();
        assert_still_deploys(&runtime, &plugin, &model).await;
    });
}

#[tokio::test]
async fn a_guest_blocked_in_a_host_call_is_stopped_at_its_deadline() {
    let (runtime, mut plugin, model) = misbehave().await;
    plugin.limits.timeout = Duration::from_secs(1);

    // Asleep inside wasi's poll: the epoch deadline cannot reach it there.
    let started = Instant::now();
    let (result, _out) = deploy(
        &runtime,
        &plugin,
        &model,
        7,
        json!({"mode": "sleep", "ms": 60_000}),
    )
    .await;

    let limit = Duration::from_secs(1);
    assert_eq!(expect_failure(result), CallError::TimedOut { limit });
    assert!(
        started.elapsed() >= limit,
        "stopped before its deadline: {:?}",
        started.elapsed()
    );
    // A loaded machine must not make the good deployment miss a 1s limit.
    plugin.limits = runtime.defaults();
    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn a_memory_bomb_is_stopped_at_its_limit() {
    let (runtime, mut plugin, model) = misbehave().await;
    plugin.limits.memory_mib = 64;

    let (result, _out) = deploy(&runtime, &plugin, &model, 7, json!({"mode": "memory-bomb"})).await;

    let error = expect_failure(result);
    assert_eq!(error, CallError::OutOfMemory { limit_mib: 64 });
    assert!(error.to_string().contains("64 MiB"), "{error}");
    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn a_panic_is_a_crash_that_quotes_the_guests_stderr() {
    let (runtime, plugin, model) = misbehave().await;

    let (result, _out) = deploy(&runtime, &plugin, &model, 7, json!({"mode": "panic"})).await;

    match expect_failure(result) {
        error @ CallError::Crashed { .. } => {
            let CallError::Crashed { output, .. } = &error else {
                unreachable!()
            };
            assert!(
                output.contains("deliberate panic from the misbehave plugin"),
                "{output}"
            );
            assert!(
                error.to_string().contains("deliberate panic"),
                "the message people read: {error}"
            );
        }
        other => panic!("expected a crash, got {other:?}"),
    }
    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn details_that_are_not_a_json_object_fail_the_deployment() {
    let (runtime, plugin, model) = misbehave().await;
    let cases = [
        (
            "bad-details",
            "returned details-json that is not a JSON object: [1,2,3]",
        ),
        (
            "invalid-json-details",
            "returned details-json that is not valid JSON",
        ),
    ];
    for (mode, expected) in cases {
        let (result, _out) = deploy(&runtime, &plugin, &model, 7, json!({"mode": mode})).await;
        match expect_failure(result) {
            CallError::BadResult(message) => {
                assert!(message.starts_with(expected), "{mode}: {message}")
            }
            other => panic!("{mode}: expected BadResult, got {other:?}"),
        }
    }
    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn the_deployers_own_error_is_passed_on_verbatim() {
    let (runtime, plugin, model) = misbehave().await;

    let (result, _out) = deploy(&runtime, &plugin, &model, 7, json!({"mode": "error"})).await;

    assert_eq!(
        expect_failure(result),
        CallError::Refused("the deployer said no".into())
    );
    assert_still_deploys(&runtime, &plugin, &model).await;
}

/// What a deployer hands back is held to `caps`: cut with a note where a
/// deployment can still mean something, refused naming the output and its
/// cap where not, and wasmtime's own copy budget (16 MiB) named too.
#[tokio::test]
async fn outputs_past_their_caps_are_cut_or_refused_naming_the_cap() {
    let (runtime, plugin, model) = misbehave().await;
    let over_budget = caps::COPY_BYTES + (1 << 20);
    #[rustfmt::skip]
    let refused = [
        ("huge-ref", 10 << 20, "returned a ref of 10 MiB; a ref may be at most 4 KiB (put the rest into details)"),
        ("huge-details", 2 << 20, "returned details-json of 2.0 MiB; details may be at most 1 MiB"),
        ("deep-details", 10_000, "returned details-json nested more than 64 levels deep; details may nest arrays and objects at most 64 levels"),
        ("huge-ref", over_budget, "returned a result larger than 16 MiB, the most berth copies out of a deployer in one piece (a ref may be at most 4 KiB, details 1 MiB, an error 32 KiB)"),
        ("huge-error", over_budget, "returned a result larger than 16 MiB"),
        ("long-log-line", over_budget, "passed more than 16 MiB to one host call (a log line, a progress note or a single write), the most berth copies out of a deployer in one piece"),
    ];
    for (mode, bytes, expected) in refused {
        let options = json!({"mode": mode, "bytes": bytes, "depth": bytes});
        let (result, _out) = deploy(&runtime, &plugin, &model, 7, options).await;
        let error = expect_failure(result).to_string();
        assert!(error.starts_with(expected), "{mode} ({bytes}): {error}");
    }

    let (result, _out) = deploy(&runtime, &plugin, &model, 7, json!({"mode": "huge-error"})).await;
    let CallError::Refused(error) = expect_failure(result) else {
        panic!("huge-error is the deployer's own error")
    };
    assert!(
        error.starts_with(&"e".repeat(caps::ERROR_BYTES)),
        "{}",
        &error[..40]
    );
    assert!(
        error.ends_with("e… [truncated: the error was 10 MiB, berth keeps 32 KiB]"),
        "{}",
        &error[caps::ERROR_BYTES - 10..]
    );
    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn a_long_log_line_or_note_is_cut_and_the_deployment_goes_on() {
    let (runtime, plugin, model) = misbehave().await;
    let transcript = Arc::new(Transcript::default());
    for mode in ["long-log-line", "long-note"] {
        let out = TempDir::new().unwrap();
        let options = json!({"mode": mode}).to_string();
        let call = deploy_call(&model, out.path(), 7, &options);
        let result = tokio::time::timeout(
            HANG_GUARD,
            runtime.deploy(&plugin, call, transcript.clone(), &CancellationToken::new()),
        )
        .await
        .expect("deployment hangs");
        result.unwrap_or_else(|e| panic!("{mode} fails: {e}"));
    }
    let lines = transcript.lines.lock().unwrap().clone();
    let note = "… [truncated: the line was 10 MiB, berth keeps 16 KiB]";
    assert_eq!(lines.len(), 2, "the log call and the stdout line");
    for ((_, line), letter) in lines.iter().zip(["l", "o"]) {
        assert_eq!(
            *line,
            format!("{}{note}", letter.repeat(caps::LOG_LINE_BYTES))
        );
    }
    let progress = transcript.progress.lock().unwrap().clone();
    assert_eq!(progress, [(1, 2, "n".repeat(caps::NOTE_BYTES))]);
}

#[tokio::test]
async fn stack_exhaustion_exit_and_a_lone_surrogate_say_what_happened() {
    let (runtime, plugin, model) = misbehave().await;
    #[rustfmt::skip]
    let cases = [
        // The shadow stack in linear memory, as Rust and C guests keep it.
        (json!({"mode": "stack-overflow"}), "ran out of stack (an endless or too deep recursion?)"),
        // wasmtime's own call stack.
        (json!({"mode": "call-stack-overflow"}), "ran out of stack (an endless or too deep recursion?)"),
        // Rust's libc turns exit(3) into WASI 0.2's bare failure.
        (json!({"mode": "exit", "status": 3}), "exited with an error status (a process exit with a non-zero code; WASI 0.2 passes on only that it failed, not the number)"),
        (json!({"mode": "exit", "status": 0}), "exited (status 0) without returning a result"),
        (json!({"mode": "lone-surrogate"}), r"returned details-json that is not valid JSON: \ud83d at byte 15 is a lone UTF-16 surrogate, which encodes no character (a string cut inside a surrogate pair?)"),
    ];
    for (options, expected) in cases {
        let (result, _out) = deploy(&runtime, &plugin, &model, 7, options.clone()).await;
        let error = expect_failure(result).to_string();
        assert!(error.starts_with(expected), "{options}: {error}");
    }
    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn check_options_passes_the_plugins_verdict_on() {
    let (runtime, plugin, model) = misbehave().await;

    runtime
        .check_options(&plugin, r#"{"mode": "loop"}"#)
        .await
        .expect("a known mode is accepted");
    match runtime.check_options(&plugin, r#"{"mode": "fly"}"#).await {
        Err(CallError::Refused(reason)) => {
            assert!(reason.contains("unknown mode \"fly\""), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_still_deploys(&runtime, &plugin, &model).await;
}

#[tokio::test]
async fn the_environment_is_empty_unless_the_manifest_grants_variables() {
    let runtime = runtime();
    let model = small_model();
    let wasm = std::fs::read(plugins::test_plugin("misbehave")).unwrap();

    let bare = load_bytes(&runtime, "misbehave", wasm.clone(), Manifest::default()).await;
    let (result, _out) = deploy(&runtime, &bare, &model, 7, json!({"mode": "env"})).await;
    assert_eq!(result.expect("env mode succeeds").details["env"], json!({}));

    let manifest = Manifest {
        env: vec![
            ("MIRROR_TOKEN".into(), "s3cret".into()),
            ("REGION".into(), "eu-west".into()),
        ],
        ..Manifest::default()
    };
    let granted = load_bytes(&runtime, "misbehave", wasm, manifest).await;
    let (result, _out) = deploy(&runtime, &granted, &model, 8, json!({"mode": "env"})).await;
    assert_eq!(
        result.expect("env mode succeeds").details["env"],
        json!({"MIRROR_TOKEN": "s3cret", "REGION": "eu-west"})
    );

    assert_still_deploys(&runtime, &bare, &model).await;
}

#[test]
fn cancelling_stops_a_running_deployment_promptly() {
    on_guarded_thread(|| async {
        let (runtime, plugin, model) = misbehave().await;
        assert!(
            plugin.limits.timeout >= Duration::from_secs(60),
            "the deadline must not be what stops it"
        );
        let out = TempDir::new().unwrap();
        let cancel = CancellationToken::new();
        // Cancelled from another thread, as a server's request handler would.
        let started = Instant::now();
        let trigger = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            trigger.cancel();
        });

        let call = deploy_call(&model, out.path(), 7, r#"{"mode": "loop"}"#);
        let result = tokio::time::timeout(
            HANG_GUARD,
            runtime.deploy(&plugin, call, log_reporter(7), &cancel),
        )
        .await
        .expect("a cancelled deployment hangs");

        assert_eq!(expect_failure(result), CallError::Cancelled);
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(200),
            "ended before the cancel: {elapsed:?}"
        );
        assert_still_deploys(&runtime, &plugin, &model).await;
    });
}

#[tokio::test]
async fn stdout_stderr_logs_and_progress_reach_the_reporter() {
    let (runtime, plugin, model) = misbehave().await;
    let out = TempDir::new().unwrap();
    let transcript = Arc::new(Transcript::default());

    let call = deploy_call(&model, out.path(), 7, r#"{"mode": "stdio"}"#);
    let result = tokio::time::timeout(
        HANG_GUARD,
        runtime.deploy(&plugin, call, transcript.clone(), &CancellationToken::new()),
    )
    .await
    .expect("deployment hangs");

    result.expect("stdio mode succeeds");
    let lines = transcript.lines.lock().unwrap().clone();
    let expected = [
        (GuestLevel::Info, "hello from stdout"),
        (GuestLevel::Warn, "hello from stderr"),
        (GuestLevel::Debug, "hello from host::log at Level::Debug"),
        (GuestLevel::Info, "hello from host::log at Level::Info"),
        (GuestLevel::Warn, "hello from host::log at Level::Warn"),
        (GuestLevel::Error, "hello from host::log at Level::Error"),
    ]
    .map(|(level, line)| (level, line.to_string()));
    assert_eq!(lines, expected);
    assert_eq!(
        *transcript.progress.lock().unwrap(),
        [(1, 2, "half".to_string())]
    );
}

// ---------------------------------------------------------------------------
// The plugins folder
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_plugins_folder_loads_the_good_file_and_says_why_not_for_each_other() {
    let folder = TempDir::new().unwrap();
    let archive = std::fs::read(plugins::example("archive")).unwrap();
    let put = |name: &str, bytes: &[u8]| std::fs::write(folder.path().join(name), bytes).unwrap();
    put("archive.wasm", &archive);
    put("corrupt.wasm", &noise(1, 4096));
    put("truncated.wasm", &archive[..archive.len() / 2]);
    put("core.wasm", b"\0asm\x01\0\0\0");
    put(
        "other.wasm",
        &std::fs::read(plugins::test_plugin("other-world")).unwrap(),
    );
    put(
        "future.wasm",
        &std::fs::read(plugins::test_plugin("future-version")).unwrap(),
    );
    put("bad name.wasm", &archive);
    put("-dash.wasm", &archive);
    put("orphan.toml", b"description = \"no plugin beside me\"\n");
    put("withbadmanifest.wasm", &archive);
    put("withbadmanifest.toml", b"colour = \"blue\"\n");

    let set = runtime().load_dir(folder.path(), 100).await;

    assert_eq!(
        set.deployers.keys().collect::<Vec<_>>(),
        ["archive"],
        "rejected: {:#?}",
        set.rejected
    );
    assert_eq!(set.deployers["archive"].name, "archive");
    let expected = [
        (
            "-dash.wasm",
            "name \"-dash\" must start with a letter or digit",
        ),
        ("bad name.wasm", "name \"bad name\" contains ' '"),
        ("core.wasm", "is a core WebAssembly module, not a component"),
        ("corrupt.wasm", "is not a WebAssembly file"),
        (
            "future.wasm",
            "built for berth:deployer@0.3.0 but this server speaks 0.1.0 and 0.2.0",
        ),
        (
            "orphan.toml",
            "a manifest without a plugin: there is no orphan.wasm beside it",
        ),
        (
            "other.wasm",
            "exports no berth:deployer/plugin interface (this server speaks berth:deployer@0.1.0 and 0.2.0",
        ),
        ("truncated.wasm", "is not a valid component"),
        (
            "withbadmanifest.wasm",
            "manifest withbadmanifest.toml: unknown field `colour`",
        ),
    ];
    let rejected: BTreeMap<&str, &str> = set
        .rejected
        .iter()
        .map(|r| (r.file.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(
        rejected.len(),
        set.rejected.len(),
        "a file was rejected twice: {:#?}",
        set.rejected
    );
    assert_eq!(
        rejected.keys().copied().collect::<Vec<_>>(),
        expected.map(|(file, _)| file),
        "{:#?}",
        set.rejected
    );
    for (file, reason) in expected {
        assert!(
            rejected[file].contains(reason),
            "{file}: expected {reason:?} in {:?}",
            rejected[file]
        );
    }
}

#[tokio::test]
async fn a_plugins_folder_loads_at_most_max_deployers() {
    let folder = TempDir::new().unwrap();
    let archive = std::fs::read(plugins::example("archive")).unwrap();
    for name in ["first", "second", "third"] {
        std::fs::write(folder.path().join(format!("{name}.wasm")), &archive).unwrap();
    }

    let set = runtime().load_dir(folder.path(), 2).await;

    assert_eq!(
        set.deployers.keys().collect::<Vec<_>>(),
        ["first", "second"]
    );
    assert_eq!(set.rejected.len(), 1, "{:#?}", set.rejected);
    assert_eq!(set.rejected[0].file, "third.wasm");
    assert!(
        set.rejected[0].reason.contains("too many deployers"),
        "{}",
        set.rejected[0].reason
    );
    assert!(
        set.rejected[0].reason.contains("at most 2"),
        "{}",
        set.rejected[0].reason
    );
}

// ---------------------------------------------------------------------------
// The compiled-code cache
// ---------------------------------------------------------------------------

#[tokio::test]
async fn compiled_code_is_cached_and_a_damaged_entry_is_rebuilt() {
    let cache_dir = TempDir::new().unwrap();
    let cached_runtime = || {
        Runtime::new(
            Limits::default(),
            Some(CodeCache::new(cache_dir.path())),
            engines(),
        )
        .unwrap()
    };
    let model = small_model();

    let first = load(&cached_runtime(), &plugins::example("archive")).await;
    assert_eq!(first.origin, Origin::Compiled);
    assert_eq!(first.tier(), tier());
    let entry = only_entry(cache_dir.path(), "cwasm");

    let runtime = cached_runtime();
    let second = load(&runtime, &plugins::example("archive")).await;
    assert_eq!(second.origin, Origin::Cached);
    assert_eq!(second.tier(), tier());
    assert_eq!(second.sha256, first.sha256);
    assert_archive_deploys(&runtime, &second, &model).await;

    // Flip bytes in the middle of the compiled code: it must never be loaded.
    let mut bytes = std::fs::read(&entry).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 64] {
        *byte = !*byte;
    }
    std::fs::write(&entry, &bytes).unwrap();

    let runtime = cached_runtime();
    let rebuilt = load(&runtime, &plugins::example("archive")).await;
    assert_eq!(
        rebuilt.origin,
        Origin::Compiled,
        "a damaged cache entry was used"
    );
    assert_archive_deploys(&runtime, &rebuilt, &model).await;

    let runtime = cached_runtime();
    assert_eq!(
        load(&runtime, &plugins::example("archive")).await.origin,
        Origin::Cached,
        "the rebuilt entry was not stored"
    );
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_simultaneous_deployments_each_produce_a_correct_archive() {
    let runtime = Arc::new(runtime());
    let plugin = Arc::new(load(&runtime, &plugins::example("archive")).await);
    let model = Arc::new(archive_model());

    let tasks: Vec<_> = (1..=20)
        .map(|deploy_id| {
            let (runtime, plugin, model) = (runtime.clone(), plugin.clone(), model.clone());
            tokio::spawn(async move {
                let (result, out) =
                    deploy(&runtime, &plugin, &model, deploy_id, json!({"level": 1})).await;
                (deploy_id, result, out)
            })
        })
        .collect();

    for task in tasks {
        let (deploy_id, result, out) = task.await.expect("deployment task panicked");
        let deployed = result.unwrap_or_else(|e| panic!("deployment {deploy_id} failed: {e}"));
        assert_archive(&deployed, out.path(), &model, deploy_id);
    }
}

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

/// Runs an async test body on a thread of its own. A guest that never hands
/// control back to the executor (an endless loop the epoch deadline failed to
/// interrupt) would hang the whole test run; here it fails the test after
/// [`TEST_HANG_GUARD`] instead. A panic in the body is re-raised as it was.
#[track_caller]
fn on_guarded_thread<F>(body: impl FnOnce() -> F + Send + 'static)
where
    F: Future<Output = ()>,
{
    let (done, finished) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let executor = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        executor.block_on(body());
        let _ = done.send(());
    });
    match finished.recv_timeout(TEST_HANG_GUARD) {
        Ok(()) => {}
        Err(RecvTimeoutError::Timeout) => {
            panic!(
                "the test did not finish within {TEST_HANG_GUARD:?}: a guest was never interrupted"
            )
        }
        Err(RecvTimeoutError::Disconnected) => {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

/// The server's engines, compiling with this module's `COMPILER`.
fn engines() -> Engines {
    Engines {
        compiler: COMPILER,
        ..Engines::default()
    }
}

/// The tier this module's runtime compiles with.
fn tier() -> Tier {
    match COMPILER {
        Compiler::Baseline => Tier::Baseline,
        _ => Tier::Optimized,
    }
}

fn runtime() -> Runtime {
    Runtime::new(Limits::default(), None, engines()).expect("the runtime starts")
}

pub(super) async fn load(runtime: &Runtime, path: &Path) -> Plugin {
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a UTF-8 file name");
    runtime
        .load_file(path, name)
        .await
        .unwrap_or_else(|reason| panic!("{} does not load: {reason}", path.display()))
}

async fn load_bytes(runtime: &Runtime, name: &str, wasm: Vec<u8>, manifest: Manifest) -> Plugin {
    runtime
        .load(name, wasm, manifest, None)
        .await
        .unwrap_or_else(|reason| panic!("{name} does not load: {reason}"))
}

/// A fresh runtime, the misbehave plugin with the server's default limits,
/// and a small model.
async fn misbehave() -> (Runtime, Plugin, ModelOnDisk) {
    let runtime = runtime();
    let plugin = load(&runtime, &plugins::test_plugin("misbehave")).await;
    (runtime, plugin, small_model())
}

/// A model's verified directory and its record, as `fetch` hands them over.
pub(super) struct ModelOnDisk {
    dir: TempDir,
    model: TrainedModel,
}

impl ModelOnDisk {
    fn new(job_id: &str, files: &[(&str, Vec<u8>)]) -> Self {
        let dir = TempDir::new().unwrap();
        let mut records = Vec::new();
        for (path, bytes) in files {
            let host_path = dir.path().join(path);
            std::fs::create_dir_all(host_path.parent().unwrap()).unwrap();
            std::fs::write(&host_path, bytes).unwrap();
            records.push(ModelFile {
                path: path.to_string(),
                size_bytes: bytes.len() as u64,
                sha256: Some(sha256_hex(bytes)),
                format: None,
            });
        }
        let model = TrainedModel {
            id: 1,
            name: job_id.to_string(),
            job_id: job_id.to_string(),
            base_model: Some("meta-llama/Llama-3.1-8B".into()),
            model_size: Some("8B".into()),
            dataset: Some("support-tickets".into()),
            num_examples: Some(1000),
            num_train_steps: Some(250),
            final_loss: Some(0.42),
            params_json: r#"{"lr": 0.0002}"#.into(),
            source: "http://127.0.0.1:1/{job_id}/{path}".into(),
            files: records,
            created_at: "2026-11-29T00:00:00Z".into(),
            created_by: None,
            signature: None,
        };
        Self { dir, model }
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

pub(super) fn small_model() -> ModelOnDisk {
    ModelOnDisk::new(
        "small-lora",
        &[
            ("adapter_config.json", br#"{"r": 8}"#.to_vec()),
            ("adapter_model.safetensors", noise(2, 4096)),
        ],
    )
}

/// Nested directories, an empty file and incompressible bytes.
fn archive_model() -> ModelOnDisk {
    ModelOnDisk::new(
        "support-bot-lora",
        &[
            ("adapter_config.json", br#"{"r": 16, "alpha": 32}"#.to_vec()),
            ("adapter/adapter_model.safetensors", noise(3, 256 * 1024)),
            (
                "tokenizer/nested/deeper/tokenizer.json",
                b"{\"vocab\": {}}".to_vec(),
            ),
            ("tokenizer/empty.txt", Vec::new()),
        ],
    )
}

pub(super) fn deploy_call<'a>(
    model: &'a ModelOnDisk,
    out_dir: &'a Path,
    deploy_id: i64,
    options: &'a str,
) -> DeployCall<'a> {
    DeployCall {
        deploy_id,
        model: &model.model,
        model_dir: model.dir(),
        out_dir,
        record: None,
        options_json: options,
    }
}

pub(super) fn log_reporter(deploy_id: i64) -> Arc<dyn Reporter> {
    Arc::new(LogReporter::new("test", Some(deploy_id)))
}

/// Runs one deployment into a fresh out-dir, which it returns for inspection.
pub(super) async fn deploy(
    runtime: &Runtime,
    plugin: &Plugin,
    model: &ModelOnDisk,
    deploy_id: i64,
    options: Value,
) -> (Result<Deployed, CallError>, TempDir) {
    let out = TempDir::new().unwrap();
    let options = options.to_string();
    let call = deploy_call(model, out.path(), deploy_id, &options);
    let cancel = CancellationToken::new();
    let result = tokio::time::timeout(
        HANG_GUARD,
        runtime.deploy(plugin, call, log_reporter(deploy_id), &cancel),
    )
    .await
    .unwrap_or_else(|_| panic!("deployment {deploy_id} ({options}) hangs"));
    (result, out)
}

#[track_caller]
fn expect_failure(result: Result<Deployed, CallError>) -> CallError {
    match result {
        Ok(deployed) => panic!("expected the deployment to fail, it returned {deployed:?}"),
        Err(error) => error,
    }
}

/// Proves the runtime (and this plugin's pre-instance) survived whatever the
/// previous call did: misbehave's `ok` mode deploys normally.
async fn assert_still_deploys(runtime: &Runtime, plugin: &Plugin, model: &ModelOnDisk) {
    let (result, out) = deploy(runtime, plugin, model, 99, json!({"mode": "ok"})).await;
    let deployed =
        result.unwrap_or_else(|e| panic!("a good deployment after the fault failed: {e}"));
    assert_eq!(deployed.reference, "ok");
    assert_eq!(
        Value::Object(deployed.details),
        json!({"files": model.model.files.len(), "deploy_id": 99})
    );
    assert_eq!(
        tree(out.path()),
        BTreeMap::from([("ok.txt".to_string(), b"ok".to_vec())])
    );
}

async fn assert_archive_deploys(runtime: &Runtime, plugin: &Plugin, model: &ModelOnDisk) {
    let (result, out) = deploy(runtime, plugin, model, 5, json!({})).await;
    let deployed = result.unwrap_or_else(|e| panic!("archive failed: {e}"));
    assert_archive(&deployed, out.path(), model, 5);
}

/// The out-dir holds exactly one archive, named by the ref, whose entries
/// are the model's files byte for byte and whose size and hash the details
/// report.
#[track_caller]
fn assert_archive(deployed: &Deployed, out_dir: &Path, model: &ModelOnDisk, deploy_id: i64) {
    let name = format!("{}-{deploy_id}.tar.gz", model.model.job_id);
    assert_eq!(deployed.reference, format!("/out/{name}"));
    let out = tree(out_dir);
    assert_eq!(
        out.keys().collect::<Vec<_>>(),
        [&name],
        "deployment {deploy_id}"
    );
    let archive = &out[&name];
    let details = Value::Object(deployed.details.clone());
    assert_eq!(
        details,
        json!({"files": model.model.files.len(), "bytes": archive.len(), "sha256": sha256_hex(archive)}),
        "deployment {deploy_id}"
    );
    assert_eq!(
        unpack(archive),
        tree(model.dir()),
        "deployment {deploy_id}: archive contents"
    );
}

/// The only file under `dir` with this extension.
#[track_caller]
fn only_entry(dir: &Path, extension: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one .{extension} in {}: {found:?}",
        dir.display()
    );
    found.into_iter().next().unwrap()
}

/// Records everything a plugin call reports, in order.
#[derive(Default)]
struct Transcript {
    lines: Mutex<Vec<(GuestLevel, String)>>,
    progress: Mutex<Vec<(u64, u64, String)>>,
}

impl Reporter for Transcript {
    fn log(&self, level: GuestLevel, message: &str) {
        self.lines
            .lock()
            .unwrap()
            .push((level, message.to_string()));
    }

    fn progress(&self, done: u64, total: u64, note: &str) {
        self.progress
            .lock()
            .unwrap()
            .push((done, total, note.to_string()));
    }
}
