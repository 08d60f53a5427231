//! The outgoing-HTTP gate with publishing targets, in-process: the runtime
//! handed a target (`Runtime::targets`), the 0.1.0 `http-publish` plugin
//! granted it by its manifest, and a loopback mirror. What each request
//! carried is what the mirror saw; what the gate refused is what the
//! call's reporter was told (`Reporter::host_line`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth::runtime::{CallError, Engines, GuestLevel, Manifest, Plugin, Reporter, Runtime};
use berth::targets::Targets;
use serde_json::json;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use super::optimized::{deploy_call, small_model};
use crate::support::mirror::{Answer, Mirror};
use crate::support::plugins;

const SECRET: &str = "in-process-secret-51d0";
const OWN_TOKEN: &str = "own-token-93e7";

/// A hang guard, far above any call here.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// The host's lines of one call, and the guest's.
#[derive(Default)]
struct HostLines {
    host: Mutex<Vec<String>>,
    guest: Mutex<Vec<String>>,
}

impl Reporter for HostLines {
    fn log(&self, _level: GuestLevel, message: &str) {
        self.guest.lock().unwrap().push(message.to_string());
    }

    fn progress(&self, _done: u64, _total: u64, _note: &str) {}

    fn host_line(&self, message: &str) {
        self.host.lock().unwrap().push(message.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_gets_its_headers_from_the_host_and_a_guests_own_is_refused() {
    let mirror = Mirror::start(Answer::Store).await;
    let host = mirror.host();
    let sources = format!(
        "[[target]]\nname = \"mirror\"\nurl = \"http://{host}/up/\"\n\
         headers = {{ Authorization = \"Bearer {SECRET}\" }}\n\
         call = {{ methods = [\"PUT\"] }}\n"
    );
    let targets = Targets::parse(&sources, "sources.toml", |_| None).unwrap();
    let runtime = Runtime::new(Default::default(), None, Engines::optimized())
        .unwrap()
        .targets(Arc::new(targets));
    let wasm = std::fs::read(plugins::test_plugin("http-publish-0-1")).unwrap();
    let load = |name: &'static str, manifest: String| {
        let (runtime, wasm) = (&runtime, wasm.clone());
        async move {
            let manifest = Manifest::parse(&manifest, |_| None).unwrap();
            runtime
                .load(name, wasm, manifest, None)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    };
    let granted = load("granted", "targets = [\"mirror\"]".into()).await;
    let own = load(
        "own-token",
        format!("targets = [\"mirror\"]\nenv = {{ MIRROR_TOKEN = \"{OWN_TOKEN}\" }}"),
    )
    .await;
    let model = small_model();
    let run = async |plugin: &Plugin, base: &str, id: i64| {
        let out = TempDir::new().unwrap();
        let options = json!({ "base_url": format!("http://{host}/{base}") }).to_string();
        let lines = Arc::new(HostLines::default());
        let call = deploy_call(&model, out.path(), id, &options);
        let result = tokio::time::timeout(
            HANG_GUARD,
            runtime.deploy(plugin, call, lines.clone(), &CancellationToken::new()),
        )
        .await
        .expect("the deployment hangs");
        (result, lines)
    };

    // Under the target: the host's header, on every file.
    let (result, lines) = run(&granted, "up", 3).await;
    result.unwrap();
    let received = mirror.received();
    assert_eq!(received.len(), 2);
    for request in &received {
        assert!(request.path.starts_with("/up/3/"), "{}", request.path);
        assert_eq!(
            request.authorization.as_deref(),
            Some(format!("Bearer {SECRET}").as_str())
        );
    }
    assert!(lines.host.lock().unwrap().is_empty());

    // Outside it, with no allowed_hosts: refused, and the call told why.
    let (result, lines) = run(&granted, "down", 4).await;
    assert!(matches!(result, Err(CallError::Refused(_))), "{result:?}");
    assert_eq!(
        *lines.host.lock().unwrap(),
        [format!(
            "outgoing request to {host} refused: not in allowed_hosts (the plugin's manifest \
             grants: none), and under none of its targets: mirror (http://{host}/up/)"
        )]
    );

    // Its own Authorization under the target: refused, the guest told the
    // sentence; neither value anywhere.
    let (result, lines) = run(&own, "up", 5).await;
    let sentence = format!(
        "it sets its own authorization header under target \"mirror\" (http://{host}/up/), \
         whose credentials berth adds; leave the header out"
    );
    match &result {
        Err(CallError::Refused(e)) => assert!(
            e.ends_with(&format!(
                "the request to {host} failed: refused by berth: {sentence}"
            )),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
    let host_lines = lines.host.lock().unwrap().clone();
    assert_eq!(
        host_lines,
        [format!("outgoing request to {host} refused: {sentence}")]
    );
    let said = format!(
        "{result:?} {host_lines:?} {:?}",
        lines.guest.lock().unwrap()
    );
    for secret in [SECRET, OWN_TOKEN] {
        assert!(!said.contains(secret), "{secret} in {said}");
    }
    assert_eq!(
        mirror.received().len(),
        2,
        "nothing more reached the mirror"
    );
}
