//! The outgoing-HTTP gate and publishing targets, with the 0.1.0
//! `http-publish` test plugin and a loopback mirror: a request under a
//! granted http target's URL passes without `allowed_hosts` and the mirror
//! sees the target's credentials, which the plugin never held; a plugin
//! that sets its own header of that name is refused with a sentence naming
//! the header and never its value; the same host outside the target's path
//! gets no credentials; every refusal is in the deployment's log. Through
//! the real server (the sources file is its flag) and `berth plugin run`
//! (`--targets-file`, `--env`, `--deploy-id`).

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{berth_command, expect_success, lossy, path};
use crate::support::events::ended;
use crate::support::files::FileServer;
use crate::support::mirror::{Answer, Mirror, Received};
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model, plugins};

/// The target's credential, in the server's environment only.
const TARGET_SECRET: &str = "target-secret-7f3a9";
/// A token the `own-token` plugin is granted and sends itself.
const GUEST_TOKEN: &str = "guest-token-c21b4";

/// A sources file with the target `mirror` at `/mirror/` of the mirror's
/// address, and `by-name` at `/named/` of `localhost` on its port: a name
/// that resolves to this machine.
fn sources(mirror: &Mirror) -> String {
    format!(
        r#"
[[target]]
name = "mirror"
url = "http://{host}/mirror/"
headers = {{ Authorization = "Bearer ${{TEST_TARGET_SECRET}}" }}
call = {{ methods = ["PUT"] }}

[[target]]
name = "by-name"
url = "http://localhost:{port}/named/"
headers = {{ Authorization = "Bearer ${{TEST_TARGET_SECRET}}" }}
call = {{ methods = ["PUT"] }}
"#,
        host = mirror.host(),
        port = mirror.addr.port()
    )
}

#[track_caller]
fn assert_no_secret(what: &str, text: &str) {
    for secret in [TARGET_SECRET, GUEST_TOKEN] {
        assert!(!text.contains(secret), "{what} holds {secret}: {text}");
    }
}

/// The `Authorization` each request carried, by path.
fn authorizations(received: &[Received]) -> Vec<(String, Option<String>)> {
    received
        .iter()
        .map(|r| (r.path.clone(), r.authorization.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_http_target_gets_its_credentials_from_the_host_and_only_under_its_url() {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Store).await;
    let dir = TempDir::new().unwrap();
    let sources_file = dir.path().join("sources.toml");
    std::fs::write(&sources_file, sources(&mirror)).unwrap();
    let publisher = plugins::test_plugin("http-publish-0-1");
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(path(&sources_file))
        .env("TEST_TARGET_SECRET", TARGET_SECRET)
        .env("TEST_GUEST_TOKEN", GUEST_TOKEN)
        // Granted the targets, no variable, no host.
        .plugin("publisher", publisher.clone())
        .plugins_file("publisher.toml", "targets = [\"mirror\", \"by-name\"]\n")
        // The same, holding a token of its own that it sends as Authorization.
        .plugin("own-token", publisher.clone())
        .plugins_file(
            "own-token.toml",
            "targets = [\"mirror\"]\nenv = { MIRROR_TOKEN = \"${TEST_GUEST_TOKEN}\" }\n",
        )
        // Granted the target and its host, for paths outside the target.
        .plugin("outside", publisher)
        .plugins_file(
            "outside.toml",
            format!(
                "targets = [\"mirror\"]\nallowed_hosts = [\"{}\"]\n",
                mirror.host()
            ),
        )
        .start()
        .await;
    let mut events = berth.events_from("?after=0", None).await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-gate", &contents)).await;
    let host = mirror.host();
    let mut ids = Vec::new();

    // Under the target: passes without allowed_hosts, with its header.
    let base_url = format!("http://{host}/mirror");
    let (status, done) = berth
        .deploy(id, "publisher", json!({ "base_url": base_url }))
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let deploy_id = done["id"].clone();
    ids.push(deploy_id.clone());
    let bearer = Some(format!("Bearer {TARGET_SECRET}"));
    let expected: Vec<_> = contents
        .iter()
        .map(|(p, _)| (format!("/mirror/{deploy_id}/{p}"), bearer.clone()))
        .collect();
    assert_eq!(authorizations(&mirror.received()), expected);
    for (request, (file, bytes)) in mirror.received().iter().zip(&contents) {
        assert!(request.body == *bytes, "{file}: the mirror got other bytes");
    }

    // A target named by a host name that resolves to this machine: the
    // operator named it, so it is reached (a manifest's name is not).
    let named = format!("http://localhost:{}/named", mirror.addr.port());
    let (status, done) = berth
        .deploy(id, "publisher", json!({ "base_url": named }))
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    ids.push(done["id"].clone());
    let received = mirror.received();
    assert_eq!(received.len(), 2 * contents.len());
    assert!(
        received[contents.len()..]
            .iter()
            .all(|r| r.path.starts_with("/named/") && r.authorization == bearer),
        "{:?}",
        authorizations(&received)
    );

    // The same host outside the target's path: passes by allowed_hosts,
    // and carries no credentials.
    let elsewhere = format!("http://{host}/elsewhere");
    let (status, done) = berth
        .deploy(id, "outside", json!({ "base_url": elsewhere }))
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    ids.push(done["id"].clone());
    let received = mirror.received();
    assert_eq!(received.len(), 3 * contents.len());
    assert!(
        received[2 * contents.len()..]
            .iter()
            .all(|r| r.path.starts_with("/elsewhere/") && r.authorization.is_none()),
        "{:?}",
        authorizations(&received)
    );

    // Outside the target without allowed_hosts: refused, and the reason is
    // in the deployment's log, where the plugin saw only a denial.
    let (status, failed) = berth
        .deploy(id, "publisher", json!({ "base_url": elsewhere }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_eq!(failed["status"], "failed");
    ids.push(failed["id"].clone());
    let refusal = format!(
        "berth outgoing request to {host} refused: not in allowed_hosts (the plugin's manifest \
         grants: none), and under none of its targets: mirror (http://{host}/mirror/), by-name \
         (http://localhost:{}/named/)",
        mirror.addr.port()
    );
    let log = berth.deployment_log(&failed["id"]).await;
    assert!(log.contains(&refusal), "{log}");
    assert_eq!(mirror.received().len(), 3 * contents.len());

    // Its own Authorization under the target: refused with a sentence that
    // names the header and neither value; nothing reaches the mirror.
    let (status, failed) = berth
        .deploy(id, "own-token", json!({ "base_url": base_url }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_eq!(failed["status"], "failed");
    ids.push(failed["id"].clone());
    let sentence = format!(
        "it sets its own authorization header under target \"mirror\" (http://{host}/mirror/), \
         whose credentials berth adds; leave the header out"
    );
    assert_eq!(
        failed["error"],
        format!(
            "deployer own-token: adapter_config.json: the request to {host} failed: refused by berth: {sentence}"
        ),
        "{failed}"
    );
    let log = berth.deployment_log(&failed["id"]).await;
    assert!(
        log.contains(&format!(
            "berth outgoing request to {host} refused: {sentence}"
        )),
        "{log}"
    );
    assert_eq!(mirror.received().len(), 3 * contents.len());

    // Neither secret in an answer, a deployment's log, the server's log or
    // an event.
    let last = ids.last().unwrap().clone();
    let seen = events.until(|e| ended(e, &last)).await;
    for event in seen {
        assert_no_secret(&format!("event {}", event.kind), &event.data.to_string());
    }
    for deploy_id in &ids {
        let (_, row) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
        assert_no_secret("a deployment", &row.to_string());
        assert_no_secret("a deployment's log", &berth.deployment_log(deploy_id).await);
    }
    assert_no_secret("the server log", &berth.log());
    assert!(
        berth
            .log()
            .contains(&format!("outgoing request to {host} refused: {sentence}")),
        "the server log has the refusal too"
    );
}

/// `berth plugin run` stands in for a server's configuration: the
/// targets of `--targets-file`, `--env` values for the manifest's
/// `${VAR}`s, and the deployment id the plugin sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_run_takes_targets_env_values_and_a_deployment_id() {
    let mirror = Mirror::start(Answer::Store).await;
    let host = mirror.host();
    let scratch = TempDir::new().unwrap();
    let dir = scratch.path().join("model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("weights.bin"), b"weights").unwrap();
    let sources_file = scratch.path().join("sources.toml");
    std::fs::write(&sources_file, sources(&mirror)).unwrap();
    let plugin = |name: &str, manifest: &str| {
        let wasm = scratch.path().join(format!("{name}.wasm"));
        std::fs::copy(plugins::test_plugin("http-publish-0-1"), &wasm).unwrap();
        std::fs::write(scratch.path().join(format!("{name}.toml")), manifest).unwrap();
        wasm
    };
    let targeted = plugin("targeted", "targets = [\"mirror\"]\n");
    let with_env = plugin(
        "with-env",
        &format!("allowed_hosts = [\"{host}\"]\nenv = {{ MIRROR_TOKEN = \"${{TRIAL_TOKEN}}\" }}\n"),
    );
    let run = |wasm: &Path, base: &str, flags: &[&str]| {
        let options = json!({ "base_url": format!("http://{host}/{base}") }).to_string();
        let mut args = vec!["--dir", path(&dir), "--options", &options];
        args.extend(flags);
        let mut command = berth_command(&["plugin", "run"], wasm, &args);
        command.env("TEST_TARGET_SECRET", TARGET_SECRET);
        command.output().expect("the berth binary runs")
    };

    // --targets-file and --deploy-id: the target's header, the id's keys.
    let output = tokio::task::block_in_place(|| {
        run(
            &targeted,
            "mirror",
            &["--targets-file", path(&sources_file), "--deploy-id", "42"],
        )
    });
    let printed: Value = serde_json::from_str(&expect_success(&output)).unwrap();
    assert_eq!(printed["ref"], format!("http://{host}/mirror/42/"));
    // It wrote nothing under /out: the out-dir berth chose is not left behind.
    assert_eq!(printed["out_dir"], Value::Null, "{printed:#}");
    assert_eq!(
        authorizations(&mirror.received()),
        [(
            "/mirror/42/weights.bin".to_string(),
            Some(format!("Bearer {TARGET_SECRET}"))
        )]
    );
    assert_no_secret("plugin run's output", &format!("{output:?}"));

    // --env for the manifest's ${TRIAL_TOKEN}, not exported; an --env it
    // never reads is said; without --deploy-id, an id from the clock.
    let output = tokio::task::block_in_place(|| {
        run(
            &with_env,
            "trial",
            &["--env", "TRIAL_TOKEN=from-the-flag", "--env", "UNREAD=1"],
        )
    });
    let printed: Value = serde_json::from_str(&expect_success(&output)).unwrap();
    let stderr = lossy(&output.stderr);
    let id: i64 = stderr
        .split("plugin with-env: deployment ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no deployment id said in {stderr}"));
    assert!(id > 1_000_000_000_000, "far above a server's ids: {id}");
    assert_eq!(printed["ref"], format!("http://{host}/trial/{id}/"));
    assert_eq!(
        authorizations(&mirror.received())[1..],
        [(
            format!("/trial/{id}/weights.bin"),
            Some("Bearer from-the-flag".to_string())
        )]
    );
    assert!(
        stderr.contains("--env UNREAD: the manifest with-env.toml reads no ${UNREAD}"),
        "{stderr}"
    );

    // Without --targets-file the grant reaches nothing: said before the
    // run, and the refusal is among the plugin's lines with -v.
    let output = tokio::task::block_in_place(|| run(&targeted, "mirror", &["-v"]));
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = lossy(&output.stderr);
    assert!(
        stderr.contains(
            "plugin targeted: its manifest grants targets mirror, but no --targets-file configures them"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "plugin targeted: berth: outgoing request to {host} refused: not in allowed_hosts \
             (the plugin's manifest grants: none)"
        )),
        "{stderr}"
    );
    assert_eq!(
        mirror.received().len(),
        2,
        "nothing more reached the mirror"
    );
}
