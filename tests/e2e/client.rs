//! The client commands — `berth deploy`, `models`, `deployments`,
//! `deployers` — as a person runs them: the real binary, `--server` pointing
//! at a real server (SQLite: the commands only see the HTTP API).

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::files::{Fault, FileServer};
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, bytes, model};

/// Guards against a hang only; every command here ends in seconds.
const HANG: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn command(server: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
    command
        .args(args)
        .args(["--server", server])
        .env_remove("BERTH_SERVER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn finished(child: tokio::process::Child) -> Run {
    let output = tokio::time::timeout(HANG, child.wait_with_output())
        .await
        .expect("berth hung")
        .unwrap();
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn berth(server: &str, args: &[&str]) -> Run {
    finished(command(server, args).spawn().unwrap()).await
}

/// The line of `text` that starts with `start`, for asserting on one row.
#[track_caller]
fn line<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starts with {start:?} in:\n{text}"))
}

/// A row's cells: tables separate columns by at least two spaces.
fn cells(row: &str) -> Vec<&str> {
    row.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploying_by_job_id_shows_progress_and_prints_the_outcome() {
    let files = FileServer::start().await;
    let berth_server = Berth::start(Backend::Sqlite).await;
    let contents = vec![
        ("big.bin", bytes(11, 3 * 1024 * 1024)),
        ("config.json", b"{}".to_vec()),
    ];
    let id = berth_server
        .register(&model(&files, "job-cli", &contents))
        .await;
    // Slow enough for progress to be reported while fetching.
    files.fault(
        "job-cli",
        "big.bin",
        Some(Fault::Slow(Duration::from_millis(30))),
    );

    let run = berth(
        &berth_server.url,
        &["deploy", "job-cli", "archive", "--option", "level=9"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let (_, listed) = berth_server
        .get(&format!("/v1/models/{id}/deployments"))
        .await;
    let stored = &listed["deployments"][0];
    assert_eq!(stored["status"], "completed");
    assert_eq!(stored["options"], json!({ "level": 9 }));
    let deploy_id = stored["id"].to_string();
    assert_eq!(line(&run.stdout, "id"), format!("id        {deploy_id}"));
    assert_eq!(line(&run.stdout, "status"), "status    completed");
    assert_eq!(
        line(&run.stdout, "ref"),
        format!("ref       {}", stored["ref"].as_str().unwrap())
    );
    assert!(
        line(&run.stdout, "details").contains("\"files\":2"),
        "{}",
        run.stdout
    );
    line(&run.stdout, "duration");
    // Progress goes to stderr, as plain lines when it is not a terminal.
    assert!(
        run.stderr.contains(&format!(
            "deployment {deploy_id}: archive is deploying model {id} (job-cli)"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains(&format!("deployment {deploy_id}: fetching ")),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains(" / 3.0 MiB"), "{}", run.stderr);

    // By id, options from both flags, the stored row as JSON on stdout.
    files.fault("job-cli", "big.bin", None);
    let run = berth(
        &berth_server.url,
        &[
            "deploy",
            &id.to_string(),
            "misbehave",
            "--options",
            r#"{"mode": "stdio", "ms": 1}"#,
            "--option",
            "ms=5",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let printed: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(printed["status"], "completed");
    assert_eq!(printed["ref"], "ok");
    assert_eq!(printed["options"], json!({ "mode": "stdio", "ms": 5 }));
    assert_eq!(
        printed,
        berth_server
            .get(&format!("/v1/deployments/{}", printed["id"]))
            .await
            .1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_deployment_exits_1_with_its_error() {
    let files = FileServer::start().await;
    let berth_server = Berth::start(Backend::Sqlite).await;
    berth_server
        .register(&model(&files, "job-fail", &adapter_files()))
        .await;

    let run = berth(
        &berth_server.url,
        &["deploy", "job-fail", "misbehave", "--option", "mode=error"],
    )
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(line(&run.stdout, "status"), "status    failed");
    assert_eq!(
        line(&run.stdout, "error"),
        "error     deployer misbehave: the deployer said no"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_server_refuses_is_explained() {
    let files = FileServer::start().await;
    let berth_server = Berth::start(Backend::Sqlite).await;
    let id = berth_server
        .register(&model(&files, "job-refused", &adapter_files()))
        .await;
    let url = &berth_server.url;

    let run = berth(url, &["deploy", "no-such-job", "archive"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(
        run.stderr,
        format!(
            "error: no model has the id or job id \"no-such-job\" on {url}: `berth models` lists the registered ones\n"
        )
    );
    assert_eq!(run.stdout, "");

    let run = berth(url, &["deployments", "42"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("no model has the id or job id \"42\""),
        "{run:?}"
    );

    // The server's own sentence, as it said it.
    let run = berth(url, &["deploy", "job-refused", "no-such-deployer"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let (_, refused) = berth_server
        .post(
            &format!("/v1/models/{id}/deployments"),
            &json!({ "deployer": "no-such-deployer" }),
        )
        .await;
    assert_eq!(
        run.stderr,
        format!("error: {}\n", refused["error"].as_str().unwrap())
    );

    let run = berth(
        url,
        &[
            "deploy",
            "job-refused",
            "misbehave",
            "--option",
            "mode=nonsense",
        ],
    )
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("unknown mode \"nonsense\""), "{run:?}");

    let run = berth(
        url,
        &["deploy", "job-refused", "archive", "--options", "[1]"],
    )
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(
        run.stderr,
        "error: --options must be a JSON object, like '{\"level\": 9}'\n"
    );

    let (_, listed) = berth_server
        .get(&format!("/v1/models/{id}/deployments"))
        .await;
    assert_eq!(
        listed["deployments"],
        json!([]),
        "nothing refused was started"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_list_models_deployments_and_deployers() {
    let files = FileServer::start().await;
    let berth_server = Berth::options(Backend::Sqlite)
        .plugins_file("broken.wasm", "not wasm")
        .start()
        .await;
    let url = &berth_server.url;

    let run = berth(url, &["models"]).await;
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (
            Some(0),
            format!("no models are registered on {url}\n").as_str()
        )
    );

    let first = berth_server
        .register(&model(&files, "job-one", &adapter_files()))
        .await;
    let second = berth_server
        .register(&model(&files, "job-two", &[("w.bin", bytes(3, 1000))]))
        .await;
    let run = berth(url, &["models"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let header = cells(line(&run.stdout, "ID"));
    assert_eq!(
        header,
        [
            "ID",
            "JOB ID",
            "NAME",
            "BASE MODEL",
            "FILES",
            "SIZE",
            "CREATED (UTC)",
            "BY"
        ]
    );
    let row = cells(line(&run.stdout, &format!(" {first}  job-one")));
    assert_eq!(
        row[..6],
        [
            &first.to_string(),
            "job-one",
            "job-one adapter",
            "meta-llama/Llama-3.1-8B",
            "3",
            "2.0 MiB"
        ]
    );
    let row = cells(line(&run.stdout, &format!(" {second}  job-two")));
    assert_eq!(row[4..6], ["1", "1000 bytes"]);

    let (_, completed) = berth_server.deploy(first, "archive", json!({})).await;
    let (_, failed) = berth_server
        .deploy(first, "misbehave", json!({ "mode": "error" }))
        .await;
    let run = berth(url, &["deployments", "job-one"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let rows: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        cells(rows[0]),
        [
            "ID",
            "DEPLOYER",
            "STATUS",
            "DURATION",
            "REF / ERROR",
            "CREATED (UTC)",
            "BY"
        ]
    );
    assert_eq!(rows.len(), 3, "newest first, one row each:\n{}", run.stdout);
    assert_eq!(
        cells(rows[1])[..3],
        [&failed["id"].to_string(), "misbehave", "failed"]
    );
    assert_eq!(
        cells(rows[1])[4],
        "deployer misbehave: the deployer said no"
    );
    assert_eq!(
        cells(rows[2])[..3],
        [&completed["id"].to_string(), "archive", "completed"]
    );
    assert_eq!(cells(rows[2])[4], completed["ref"].as_str().unwrap());

    let run = berth(
        url,
        &["deployments", &first.to_string(), "--limit", "1", "--json"],
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let listed: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(listed["deployments"].as_array().unwrap().len(), 1);
    assert_eq!(listed["deployments"][0]["id"], failed["id"]);

    let run = berth(url, &["deployments", "job-two"]).await;
    assert_eq!(
        run.stdout,
        format!("model {second} (job-two) has no deployments yet\n")
    );

    let run = berth(url, &["deployers"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        cells(line(&run.stdout, "NAME")),
        [
            "NAME",
            "ORIGIN",
            "VERSION",
            "DESCRIPTION",
            "NETWORK",
            "TARGETS"
        ]
    );
    // A folder deployer has no version: its cell is empty.
    assert_eq!(
        cells(line(&run.stdout, "misbehave ")),
        [
            "misbehave",
            "folder",
            "Misbehaves on request (berth's sandbox tests)",
            "none",
            "none"
        ]
    );
    assert_eq!(cells(line(&run.stdout, "archive "))[0], "archive");
    assert!(
        run.stdout.contains("\nplugins the server refused:\nFILE "),
        "{}",
        run.stdout
    );
    assert_eq!(
        cells(line(&run.stdout, "broken.wasm"))[..2],
        ["broken.wasm", "folder"]
    );

    let run = berth(url, &["models", "--json"]).await;
    let listed: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(listed, berth_server.get("/v1/models").await.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_exits_2_with_a_sentence() {
    // A port that was free a moment ago: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let expected = format!(
        "error: cannot reach berth at {url}: connection refused (is `berth serve` running?)\n"
    );
    for args in [
        &["models"][..],
        &["deployers"],
        &["deployments", "1"],
        &["deploy", "1", "archive"],
    ] {
        let run = berth(&url, args).await;
        assert_eq!(
            (run.code, run.stderr.as_str(), run.stdout.as_str()),
            (Some(2), expected.as_str(), ""),
            "{args:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_cancels_the_deployment_on_the_server() {
    let files = FileServer::start().await;
    let berth_server = Berth::start(Backend::Sqlite).await;
    let id = berth_server
        .register(&model(&files, "job-ctrl-c", &adapter_files()))
        .await;

    let child = command(
        &berth_server.url,
        &["deploy", "job-ctrl-c", "misbehave", "--option", "mode=loop"],
    )
    .spawn()
    .unwrap();
    let pid = child.id().unwrap();
    let mut running = Value::Null;
    for _ in 0..1200 {
        let (_, listed) = berth_server
            .get(&format!("/v1/models/{id}/deployments"))
            .await;
        if listed["deployments"][0]["phase"] == "deploying" {
            running = listed["deployments"][0].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        running["status"],
        "running",
        "the deployer never started; server log:\n{}",
        berth_server.log()
    );

    let kill = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let run = finished(child).await;
    assert_eq!(run.code, Some(130), "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("cancelling deployment {}", running["id"])),
        "{run:?}"
    );
    assert_eq!(line(&run.stdout, "error"), "error     cancelled");
    let (_, stored) = berth_server
        .get(&format!("/v1/deployments/{}", running["id"]))
        .await;
    assert_eq!(
        (&stored["status"], &stored["error"]),
        (&json!("failed"), &json!("cancelled"))
    );
}

/// `berth deployers push | versions | rollback | rm` against a real server:
/// the manifest beside the file goes along, each command says what it did,
/// and a refusal is the server's sentence with exit status 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployers_are_pushed_listed_rolled_back_and_removed() {
    let server = Berth::start(Backend::Sqlite).await;
    let url = &server.url;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("packer.wasm");
    std::fs::copy(crate::support::plugins::example("archive"), &file).unwrap();
    std::fs::write(dir.path().join("packer.toml"), "memory_mib = 64\n").unwrap();
    let file = file.display().to_string();

    let run = berth(url, &["deployers", "push", &file]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .starts_with("deployer packer now serves version 1 (sha256 "),
        "{run:?}"
    );
    assert!(run.stdout.contains("(with its manifest "), "{run:?}");
    // Asking for no more than version 1: served at once.
    let misbehave = dir.path().join("misbehave.wasm");
    std::fs::copy(
        crate::support::plugins::test_plugin("misbehave"),
        &misbehave,
    )
    .unwrap();
    std::fs::write(dir.path().join("misbehave.toml"), "memory_mib = 64\n").unwrap();
    let misbehave = misbehave.display().to_string();
    let run = berth(url, &["deployers", "push", &misbehave, "--name", "packer"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .starts_with("deployer packer now serves version 2"),
        "{run:?}"
    );
    // Asking for more: held, version 2 goes on serving.
    let wider = dir.path().join("wider.wasm");
    std::fs::copy(&misbehave, &wider).unwrap();
    std::fs::write(dir.path().join("wider.toml"), "memory_mib = 128\n").unwrap();
    let wider = wider.display().to_string();
    let run = berth(url, &["deployers", "push", &wider, "--name", "packer"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .starts_with("deployer packer: version 3 (sha256 ")
            && run.stdout.contains("is stored but held"),
        "{run:?}"
    );

    let run = berth(url, &["deployers"]).await;
    assert_eq!(
        cells(line(&run.stdout, "packer "))[..3],
        ["packer", "api", "2"],
        "{run:?}"
    );
    let run = berth(url, &["deployers", "versions", "packer"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let rows: Vec<Vec<&str>> = run.stdout.lines().map(cells).collect();
    assert_eq!(rows[0][..3], ["VERSION", "SHA256", "SIZE"], "{run:?}");
    assert_eq!(rows[1][0], "1", "{run:?}");
    assert_eq!(rows[2][..2], ["*", "2"], "{run:?}");
    assert_eq!(rows[3][0], "3", "{run:?}");

    let run = berth(url, &["deployers", "rollback", "packer"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .starts_with("deployer packer now serves version 1"),
        "{run:?}"
    );
    let run = berth(url, &["deployers", "rollback", "packer"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(
        run.stderr,
        "error: deployer packer has no version before the one it serves (version 1)\n"
    );
    let run = berth(url, &["deployers", "push", &file, "--name", "archive"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr
            .contains("is declared in this server's plugins folder"),
        "{run:?}"
    );

    let run = berth(url, &["deployers", "rm", "packer"]).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout,
        format!("removed deployer packer and its versions from {url}\n")
    );
    let run = berth(url, &["deployers", "rm", "packer"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
}
