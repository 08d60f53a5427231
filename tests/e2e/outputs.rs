//! What a deployer hands back, through a real server: outputs past their
//! caps, stacks that ran out, exits and bad JSON end in a failed row whose
//! error says what happened; what a deployer writes reaches the server's
//! own log one escaped record per line and only up to its budget.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, eventually, model, on_both_backends};

on_both_backends!(
    each_fault_is_stored_as_a_failed_row_with_a_sentence_naming_it,
    a_failed_deployments_output_directory_is_removed_and_a_completed_ones_kept,
);

async fn a_failed_deployments_output_directory_is_removed_and_a_completed_ones_kept(
    backend: Backend,
) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-out", &adapter_files()))
        .await;
    let out_dir = |deployment: &Value| {
        std::path::PathBuf::from(deployment["out_dir"].as_str().expect("an out_dir"))
    };

    let (status, failed) = berth
        .deploy(id, "misbehave", json!({"mode": "error"}))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert!(!out_dir(&failed).exists(), "{}", out_dir(&failed).display());

    let (status, completed) = berth.deploy(id, "misbehave", json!({"mode": "ok"})).await;
    assert_eq!(status, StatusCode::OK, "{completed}");
    assert_eq!(
        std::fs::read_to_string(out_dir(&completed).join("ok.txt")).unwrap(),
        "ok"
    );
}

async fn each_fault_is_stored_as_a_failed_row_with_a_sentence_naming_it(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let id = berth
        .register(&model(&files, "job-outputs", &adapter_files()))
        .await;
    #[rustfmt::skip]
    let cases = [
        (json!({"mode": "huge-ref"}), "deployer misbehave: returned a ref of 10 MiB; a ref may be at most 4 KiB (put the rest into details)"),
        (json!({"mode": "huge-ref", "bytes": 20 << 20}), "deployer misbehave: returned a result larger than 16 MiB, the most berth copies out of a deployer in one piece (a ref may be at most 4 KiB, details 1 MiB, an error 32 KiB)"),
        (json!({"mode": "huge-details", "bytes": 2 << 20}), "deployer misbehave: returned details-json of 2.0 MiB; details may be at most 1 MiB"),
        (json!({"mode": "deep-details"}), "deployer misbehave: returned details-json nested more than 64 levels deep; details may nest arrays and objects at most 64 levels"),
        (json!({"mode": "stack-overflow"}), "deployer misbehave: ran out of stack (an endless or too deep recursion?)"),
        (json!({"mode": "call-stack-overflow"}), "deployer misbehave: ran out of stack (an endless or too deep recursion?)"),
        (json!({"mode": "exit", "status": 3}), "deployer misbehave: exited with an error status (a process exit with a non-zero code; WASI 0.2 passes on only that it failed, not the number)"),
        (json!({"mode": "lone-surrogate"}), r"deployer misbehave: returned details-json that is not valid JSON: \ud83d at byte 15 is a lone UTF-16 surrogate, which encodes no character (a string cut inside a surrogate pair?)"),
    ];
    for (options, expected) in cases {
        let (status, answered) = berth.deploy(id, "misbehave", options.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_GATEWAY,
            "{options}: {} {}",
            answered["status"],
            answered["error"]
        );
        let deploy_id = answered["id"].as_i64().unwrap();
        let (_, stored) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
        assert_eq!(stored["status"], "failed", "{options}");
        assert_eq!(stored["error"], expected, "{options}");
        assert_eq!(stored["ref"], Value::Null, "{options}");
    }

    // The deployer's own error is kept, cut to its cap with a note.
    let (status, answered) = berth
        .deploy(id, "misbehave", json!({"mode": "huge-error"}))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let error = answered["error"].as_str().unwrap();
    let kept = format!("deployer misbehave: {}", "e".repeat(32 << 10));
    assert_eq!(
        error,
        format!("{kept}… [truncated: the error was 10 MiB, berth keeps 32 KiB]")
    );

    // A 10 MiB log line is cut; the deployment completes.
    let (status, answered) = berth
        .deploy(id, "misbehave", json!({"mode": "long-log-line"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{}", answered["error"]);
    assert_eq!(answered["status"], "completed");
}

/// The server log's lines about deployment `deploy_id`'s deployer.
fn guest_lines(log: &str, deploy_id: i64) -> Vec<&str> {
    let tag = format!("deploy_id={deploy_id}");
    log.lines()
        .filter(|line| line.contains("berth::plugin") && line.contains(&tag))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_deployment_reaches_the_server_log_only_up_to_its_budget() {
    const LINES: u64 = 100_000;
    let files = FileServer::start().await;
    let berth = Berth::start(Backend::Sqlite).await;
    let id = berth
        .register(&model(&files, "job-flood", &adapter_files()))
        .await;

    let (status, answered) = berth
        .deploy(
            id,
            "misbehave",
            json!({"mode": "log-flood", "lines": LINES}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    let deploy_id = answered["id"].as_i64().unwrap();

    // The last summary is written when the deployment's reporter goes.
    let expected = format!("{} more lines", LINES - 1000);
    let log = eventually(
        || format!("the summary of deployment {deploy_id} in the log"),
        async || {
            let log = berth.log();
            log.contains(&expected).then_some(log)
        },
    )
    .await;
    let guest = guest_lines(&log, deploy_id);
    let guest_bytes: usize = guest.iter().map(|line| line.len() + 1).sum();
    let summaries: Vec<&str> = log
        .lines()
        .filter(|line| line.contains(&format!("deployment {deploy_id} ")))
        .filter(|line| line.contains("budget"))
        .collect();
    println!(
        "deployment {deploy_id} wrote {LINES} lines: {} reached the server log, {guest_bytes} bytes; summaries: {summaries:#?}",
        guest.len()
    );
    assert_eq!(guest.len(), 1000, "the budget's lines, no more");
    assert!(guest_bytes < 256 << 10, "{guest_bytes} bytes");
    assert!(
        summaries[0].contains(&format!(
            "deployment {deploy_id} reached its budget of the server log (1000 lines or 256 KiB)"
        )),
        "{summaries:#?}"
    );
    assert!(
        summaries.iter().any(|line| line.contains(&expected)
            && line.contains(&format!("see /v1/deployments/{deploy_id}/logs"))),
        "{summaries:#?}"
    );

    // The deployment's own log keeps its last lines, as before.
    let logs = berth.deployment_log(&json!(deploy_id)).await;
    assert!(logs.len() <= (256 << 10) + 100, "{}", logs.len());
    assert!(
        logs.trim_end()
            .ends_with(&format!("flood line {} on stdout", LINES - 1)),
        "{}",
        &logs[logs.len() - 200..]
    );

    // A fresh deployment has a budget of its own.
    let (status, answered) = berth
        .deploy(id, "misbehave", json!({"mode": "stdio"}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let next = answered["id"].as_i64().unwrap();
    assert!(guest_lines(&berth.log(), next).len() >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployer_cannot_forge_a_line_of_the_server_log() {
    let files = FileServer::start().await;
    let berth = Berth::start(Backend::Sqlite).await;
    let id = berth
        .register(&model(&files, "job-forge", &adapter_files()))
        .await;

    let (status, answered) = berth
        .deploy(id, "misbehave", json!({"mode": "forged-log"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    let deploy_id = answered["id"].as_i64().unwrap();

    let log = berth.log();
    let forged: Vec<&str> = log.lines().filter(|l| l.contains("forged")).collect();
    assert_eq!(forged.len(), 1, "{forged:#?}");
    let line = forged[0];
    assert!(line.contains("berth::plugin"), "{line}");
    assert!(line.contains(&format!("deploy_id={deploy_id}")), "{line}");
    assert!(
        line.contains(
            r"innocent\n2026-12-01T00:00:00.000000Z ERROR berth: forged line\r\u{1b}[2Kalso forged"
        ),
        "{line}"
    );
}
