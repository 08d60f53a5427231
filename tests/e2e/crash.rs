//! Crash loops: `kill -9` of a real `berth serve` at random moments while
//! it fetches (throttled, some files in pieces) and while a deployer runs,
//! many times over on one data dir, each followed by a restart. After each:
//! no file under a real name holds anything but its recorded bytes, the
//! interrupted row is failed saying what was running, and the next
//! deployment of the same model completes, asking the source for each
//! file's bytes at most once more. The restart also tells subscribers: the
//! event log holds the interrupted deployment's `deployment.failed`.
//!
//! The moments come from a seeded generator; the seed is printed.
//! `BERTH_CRASH_SEED` repeats a run, `BERTH_CRASH_TRIALS` sets the number of
//! trials per backend (`scripts/crash-loop` runs many).

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::support::files::{Fault, FileServer};
use crate::support::server::{Backend, Berth};
use crate::support::{bytes, eventually, model, on_both_backends, sha256_hex, tree};

on_both_backends!(
    kill_9_at_random_moments_loses_no_byte_and_no_record,
    a_kill_as_the_deployer_starts_fails_the_row_as_deploying,
    a_fetched_model_is_deploying_from_its_insert_and_a_kill_says_so,
    a_restart_publishes_the_failure_of_what_the_killed_run_left,
);

/// Trials per backend unless `BERTH_CRASH_TRIALS` says otherwise: enough
/// to kill in both phases a few times within CI's budget.
const DEFAULT_TRIALS: u64 = 6;
/// The pause before each 64 KiB chunk the source sends: a fetch of the
/// model below takes about a second, long enough to be killed midway.
const THROTTLE: Duration = Duration::from_millis(50);
/// A kill aimed at the fetch comes this long at most after the row says
/// `fetching`: a little longer than the fetch, so some land just after it.
const FETCH_WINDOW_MS: u64 = 1000;
/// A kill aimed at the deployer comes this long at most after the row says
/// `deploying`; the deployer sleeps far longer.
const DEPLOY_WINDOW_MS: u64 = 800;

const FETCHING: &str = "interrupted while fetching the model: the server stopped before it finished (killed or crashed?)";
const DEPLOYING: &str =
    "interrupted while deploying: the server stopped before it finished (killed or crashed?)";

/// A seeded generator (SplitMix64): the same seed, the same moments.
struct Dice(u64);

impl Dice {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound
    }
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}")),
    )
}

/// Three files: one small, one read in pieces (`--fetch-piece-mib 1`), one
/// in a single stream, nested. The small one is every trial's, and the
/// nested one every third trial's, so kills also come while files are
/// linked from the blob store.
fn model_files(trial: u64) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("config.json", br#"{"r": 16}"#.to_vec()),
        (
            "weights.bin",
            bytes(100 + trial, 2 * 1024 * 1024 + 512 * 1024 + 7),
        ),
        (
            "tokenizer/vocab.bin",
            bytes(200 + trial % 3, 600 * 1024 + 3),
        ),
    ]
}

async fn kill_9_at_random_moments_loses_no_byte_and_no_record(backend: Backend) {
    let seed = env_number("BERTH_CRASH_SEED").unwrap_or_else(|| getrandom::u64().unwrap());
    let trials = env_number("BERTH_CRASH_TRIALS").unwrap_or(DEFAULT_TRIALS);
    println!("crash loop on {backend:?}: {trials} trials, BERTH_CRASH_SEED={seed}");
    let mut dice = Dice(seed);
    let files = FileServer::start().await;
    // A budget of about three models, so copies are evicted as trials go.
    let mut berth = Berth::options(backend)
        .arg("--fetch-piece-mib")
        .arg("1")
        .arg("--models-max-gib")
        .arg("0.01")
        .start()
        .await;
    let mut recorded: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for trial in 0..trials {
        let aim = if trial % 2 == 0 {
            "fetching"
        } else {
            "deploying"
        };
        let job = format!("job-crash-{trial}");
        let contents = model_files(trial);
        let id = berth.register(&model(&files, &job, &contents)).await;
        for (path, _) in &contents {
            files.fault(&job, path, Some(Fault::Slow(THROTTLE)));
        }
        let started = berth
            .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
            .await;
        let deploy_id = started["id"].as_i64().unwrap();
        let seen = eventually(
            || format!("trial {trial}: deployment {deploy_id} {aim}"),
            async || {
                let (_, row) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
                assert!(
                    row["status"] == "queued" || row["status"] == "running",
                    "trial {trial}: {row}"
                );
                (row["phase"] == aim).then_some(row)
            },
        )
        .await;
        let window = if aim == "fetching" {
            FETCH_WINDOW_MS
        } else {
            DEPLOY_WINDOW_MS
        };
        let delay = dice.below(window);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        berth.kill9();

        // What the kill left on disk, before anything can tidy it.
        let models = berth.data_dir().join("models");
        let mut in_place = 0;
        let mut partials = Vec::new();
        for (path, on_disk) in tree(&models) {
            let name = path.rsplit('/').next().unwrap();
            if path.starts_with(".berth/") {
                continue;
            }
            if name.starts_with(".fetch-") {
                partials.push(path);
                continue;
            }
            if path.starts_with(".dropping-") {
                // A copy an eviction was dropping: no record vouches for it.
                continue;
            }
            if path.starts_with(".blobs/") {
                // A blob, or a link being put in its place, holds the
                // bytes its name says.
                let hex = name.trim_start_matches('.').split('.').next().unwrap();
                assert_eq!(
                    sha256_hex(&on_disk),
                    hex,
                    "trial {trial} (seed {seed}): the blob {path} holds other bytes"
                );
                continue;
            }
            let (file_job, file) = path.split_once('/').unwrap();
            let trial_of: u64 = file_job
                .strip_prefix("job-crash-")
                .unwrap()
                .parse()
                .unwrap();
            let expected = model_files(trial_of)
                .into_iter()
                .find(|(p, _)| *p == file)
                .unwrap_or_else(|| panic!("trial {trial}: {path} is not a model file"))
                .1;
            assert!(
                on_disk.len() == expected.len() && sha256_hex(&on_disk) == sha256_hex(&expected),
                "trial {trial} (seed {seed}): {path} holds {} bytes that are not its recorded {} \
                 (a half file under a real name)",
                on_disk.len(),
                expected.len()
            );
            in_place += usize::from(file_job == job);
        }
        let out_dir = std::path::PathBuf::from(seen["out_dir"].as_str().unwrap());
        let deployer_started = out_dir.exists();

        berth.restart();
        let (_, row) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
        let error = row["error"].as_str().unwrap_or_default().to_string();
        let summary = format!(
            "trial {trial} (seed {seed}): aimed at {aim}, killed {delay} ms after; \
             {in_place}/{} files in place, partials {partials:?}, out dir {}; recorded {error:?}",
            contents.len(),
            if deployer_started { "made" } else { "not made" },
        );
        println!("{summary}");
        assert_eq!(row["status"], "failed", "{summary}");
        let expected = if aim == "deploying" || deployer_started {
            DEPLOYING
        } else if in_place < contents.len() {
            FETCHING
        } else {
            // Every file in place, the deployer not yet started: between
            // the two phases, either is true.
            error.as_str()
        };
        if error != expected {
            failures.push(format!("{summary}: expected {expected:?}"));
        }
        *recorded.entry(error.clone()).or_default() += 1;
        assert!(
            !out_dir.exists(),
            "{summary}: the failed deployment's output directory {} is left",
            out_dir.display()
        );

        // The next deployment of the same model completes, each file
        // asked of the source at most once more.
        files.forget_served();
        for (path, _) in &contents {
            files.fault(&job, path, None);
        }
        let (status, body) = berth.deploy(id, "misbehave", json!({})).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{summary}: the next deployment: {body}"
        );
        let dir = berth.model_dir(&job);
        let on_disk = tree(&dir);
        let served: Vec<String> = contents
            .iter()
            .map(|(path, bytes)| format!("{path} {}/{}", files.served(&job, path), bytes.len()))
            .collect();
        println!("trial {trial}: the next deployment completed; bytes served: {served:?}");
        for (path, bytes) in &contents {
            let served = files.served(&job, path);
            assert!(
                served <= bytes.len() as u64,
                "{summary}: {path} ({} bytes) was served {served} bytes after the restart",
                bytes.len()
            );
            assert!(
                on_disk.get(*path) == Some(bytes),
                "{summary}: {path} is not the source's"
            );
        }
        assert_eq!(
            on_disk.len(),
            contents.len(),
            "{summary}: only the model's files remain: {:?}",
            on_disk.keys()
        );
    }
    println!("crash loop on {backend:?}: recorded {recorded:#?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The moment the crash loop hits only now and then, made certain: a kill
/// as soon as the deployer's output directory appears (the deployer starts
/// right after) finds the row saying `deploying`, not a phase flushed
/// before.
async fn a_kill_as_the_deployer_starts_fails_the_row_as_deploying(backend: Backend) {
    let files = FileServer::start().await;
    let mut berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-edge", &model_files(0)))
        .await;
    let started = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    // An idle server takes it at once, giving it an out-dir.
    assert_eq!(started["status"], "running", "{started}");
    let out_dir = std::path::PathBuf::from(started["out_dir"].as_str().unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !out_dir.exists() {
        assert!(std::time::Instant::now() < deadline, "no output directory");
        std::thread::sleep(Duration::from_millis(1));
    }
    berth.kill9();
    berth.restart();
    let (_, row) = berth
        .get(&format!("/v1/deployments/{}", started["id"]))
        .await;
    assert_eq!(row["status"], "failed");
    assert_eq!(row["error"], DEPLOYING);
}

/// A server with room takes a deployment at its insert. A model already
/// fetched and verified is not fetched again: its row is inserted
/// `deploying`, with no later write of the phase, so a kill right after
/// the answer, whether or not the deployer started yet, fails it as
/// interrupted while deploying. A model not fetched yet starts `fetching`.
async fn a_fetched_model_is_deploying_from_its_insert_and_a_kill_says_so(backend: Backend) {
    let files = FileServer::start().await;
    let mut berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-insert", &model_files(0)))
        .await;
    let first = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "ok" }))
        .await;
    assert_eq!(
        (&first["status"], &first["phase"]),
        (&json!("running"), &json!("fetching")),
        "{first}"
    );
    let path = format!("/v1/deployments/{}", first["id"]);
    eventually(
        || "the first deployment completes".to_string(),
        async || {
            let (_, row) = berth.get(&path).await;
            (row["status"] == "completed").then_some(())
        },
    )
    .await;
    let started = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    assert_eq!(started["phase"], "deploying", "{started}");
    berth.kill9();
    berth.restart();
    let (_, row) = berth
        .get(&format!("/v1/deployments/{}", started["id"]))
        .await;
    assert_eq!(row["status"], "failed");
    assert_eq!(row["error"], DEPLOYING);
}

/// A restart fails what the killed run left running and publishes it, as
/// a lease sweep does for another server's: the event log holds one
/// `deployment.failed` for it, with the recorded error, before anything
/// the restarted server runs.
async fn a_restart_publishes_the_failure_of_what_the_killed_run_left(backend: Backend) {
    let files = FileServer::start().await;
    let mut berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-restart", &model_files(0)))
        .await;
    let left = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 600_000 }))
        .await;
    assert_eq!(left["status"], "running", "{left}");
    berth.kill9();
    berth.restart();
    let (_, row) = berth.get(&format!("/v1/deployments/{}", left["id"])).await;
    assert_eq!(row["status"], "failed", "{row}");

    let (status, next) = berth.deploy(id, "misbehave", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{next}");
    let mut log = berth.events_from("?after=0", None).await;
    let events = log
        .until(|events| {
            events
                .iter()
                .any(|e| e.kind == "deployment.completed" && e.data["deploy_id"] == next["id"])
        })
        .await;
    // Its start may have died with the process, unwritten; its end is
    // the restart's to publish.
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e.data["deploy_id"] == left["id"] && e.kind == "deployment.failed")
        .map(|e| &e.data["error"])
        .collect();
    assert_eq!(failed, [&row["error"]], "the killed deployment's failures");
}
