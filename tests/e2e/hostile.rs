//! A hostile deployer against a real server with credentialed targets: the
//! `publish-probe` test plugin tries what broke the promise that a deployer
//! never holds a target's credential (issue 44), against a mirror that
//! echoes every request (`TRACE`, error bodies that quote the request, the
//! `Authorization` header echoed back), a registry stand-in whose errors
//! quote the `Authorization` it was sent, `..;` paths, and a flood of
//! zero-byte puts. Asserted from the outside: no form of a secret in
//! anything the plugin reads (its steps' outcomes, which it returns as its
//! details), its log, its record, an event or the server log; nothing
//! reached outside a target's url; the record stays bounded.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::path;
use crate::support::events::ended;
use crate::support::files::FileServer;
use crate::support::mirror::{Answer, Mirror};
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model, plugins};

/// 43 characters, as the token of the finding was.
const MIRROR_SECRET: &str = "mirror-token-5e1d9a7c0b3f4e2a8d6c1b0a9f8e7d6";
const REGISTRY_USER: &str = "robot";
const REGISTRY_PASSWORD: &str = "registry-pw-8c2f1e77";

/// Every form of a secret the plugin must never read: the values, the
/// Basic pair and its base64, and any 12-character piece of the token (a
/// cut that leaves most of it).
fn leaks(text: &str) -> Vec<String> {
    let pair = format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}");
    let mut forms = vec![
        REGISTRY_PASSWORD.to_string(),
        STANDARD.encode(&pair),
        STANDARD.encode(format!("Bearer {MIRROR_SECRET}")),
    ];
    for start in 0..=MIRROR_SECRET.len() - 12 {
        forms.push(MIRROR_SECRET[start..start + 12].to_string());
    }
    forms.into_iter().filter(|f| text.contains(f)).collect()
}

#[track_caller]
fn assert_no_secret(what: &str, text: &str) {
    let found = leaks(text);
    assert!(found.is_empty(), "{what} holds {found:?}: {text}");
}

#[track_caller]
fn refused(step: &Value, words: &str) -> String {
    let error = step["err"]
        .as_str()
        .unwrap_or_else(|| panic!("not refused ({words}): {step}"));
    assert!(error.contains(words), "{words:?} not in {error:?}");
    error.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_deployer_never_reads_a_targets_credential_nor_takes_it_elsewhere() {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Echo {
        status: 200,
        pad: 0,
    })
    .await;
    // The token placed so that a 300-byte cut falls one character before
    // its end: "authorization: Bearer " is 22 bytes.
    mirror.answer(
        "/quoted",
        Answer::Echo {
            status: 400,
            pad: 300 - 22 - (MIRROR_SECRET.len() - 1),
        },
    );
    let registry = Mirror::start(Answer::RegistryEcho).await;
    let dir = TempDir::new().unwrap();
    let shelf = dir.path().join("shelf");
    std::fs::create_dir(&shelf).unwrap();
    let sources = dir.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            r#"
[[target]]
name = "mirror"
url = "http://{mirror}/base/"
headers = {{ Authorization = "Bearer ${{T_MIRROR}}" }}
call = {{ methods = ["POST"], paths = ["/hooks/*"] }}

[[target]]
name = "registry"
url = "oci://{registry}/team/"
options = {{ username = "{REGISTRY_USER}", password = "${{T_REGISTRY}}" }}

[[target]]
name = "shelf"
url = "file://{shelf}/"
"#,
            mirror = mirror.host(),
            registry = registry.host(),
            shelf = shelf.display()
        ),
    )
    .unwrap();
    let probe = plugins::test_plugin("publish-probe");
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(path(&sources))
        .env("T_MIRROR", MIRROR_SECRET)
        .env("T_REGISTRY", REGISTRY_PASSWORD)
        .plugin("probe", probe.clone())
        .plugins_file("probe.toml", "targets = [\"mirror\", \"registry\"]\n")
        .plugin("flooder", probe.clone())
        .plugins_file("flooder.toml", "targets = [\"shelf\"]\nmax_puts = 150\n")
        .plugin("long-keys", probe)
        .plugins_file(
            "long-keys.toml",
            "targets = [\"shelf\"]\nmax_records_kib = 16\n",
        )
        .start()
        .await;
    let mut events = berth.events_from("?after=0", None).await;
    let id = berth
        .register(&model(&files, "job-hostile", &adapter_files()))
        .await;
    let host = mirror.host();
    let base = format!("http://{host}/base/");
    let post = |url: String| json!({ "http": url, "method": "POST" });

    let (status, done) = berth
        .deploy(
            id,
            "probe",
            json!({ "steps": [
                { "open": "mirror" },
                { "http": format!("{base}hooks/a"), "method": "TRACE" },
                { "http": format!("{base}models/a.bin"), "method": "GET" },
                { "http": format!("{base}models/a.bin"), "method": "DELETE" },
                { "http": format!("{base}hooks/a"), "method": "POST", "body_size": 10000 },
                post(format!("{base}..;/shared/x")),
                post(format!("{base}hooks/%2e%2e/%2e%2e/shared/x")),
                post(format!("{base}hooks/..%3b/..%3b/shared/x")),
                post(format!("http://{host}/shared/x")),
                { "put_bytes": "..;/shared/x", "text": "hi" },
                { "put_bytes": "quoted", "text": "hi" },
                { "url": "..;/shared/x" },
                { "open": "registry" },
                { "put_bytes": "repo:v1/a.txt", "text": "hi" },
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let steps = done["details"]["steps"].as_array().unwrap().clone();
    let deploy_id = done["id"].clone();

    // 1. Its own requests under the target: only what `call` allows.
    refused(&steps[1], "TRACE /hooks/a is not among the requests target");
    refused(&steps[2], "GET /models/a.bin is not among the requests");
    refused(&steps[3], "DELETE /models/a.bin is not among the requests");
    // The allowed one carried the token to the mirror, whose echo came
    // back masked, headers and body.
    let echoed = &steps[4]["ok"];
    assert_eq!(echoed["status"], 200, "{echoed}");
    let body = echoed["body"].as_str().unwrap();
    assert!(body.contains("authorization: ********"), "{body}");
    assert!(body.contains("POST /base/hooks/a"), "{body}");
    assert!(
        echoed["headers"]["x-echo-authorization"]
            .as_str()
            .unwrap()
            .starts_with("********"),
        "{echoed}"
    );
    // 5. `..;` and encoded dots: refused, at the gate and as keys.
    for step in &steps[5..8] {
        refused(
            step,
            "at a target's host berth sends no path a server could read as another",
        );
    }
    // Outside the target, at its host: no credentials, and the manifest
    // grants no host.
    refused(&steps[8], "HttpRequestDenied");
    refused(&steps[9], "has ';', which is not allowed in a key");
    refused(&steps[11], "has ';', which is not allowed in a key");
    // 3, 4. A refusal quoting the request: scrubbed before it is cut.
    let quoted = refused(&steps[10], "it answered 400 Bad Request: xxx");
    assert!(quoted.contains("authorization: (redacted)"), "{quoted}");
    let registry_said = refused(
        &steps[13],
        "it answered 400 Bad Request (BLOB_UPLOAD_INVALID)",
    );
    assert!(!registry_said.contains("you sent"), "{registry_said}");

    // Nothing reached outside the target's url, and the mirror got one
    // request of the deployer's own: the POST it allows.
    let received = mirror.received();
    let paths: Vec<(String, String)> = received
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        paths,
        [
            ("POST".to_string(), "/base/hooks/a".to_string()),
            ("PUT".to_string(), "/base/quoted".to_string()),
        ],
        "{paths:?}"
    );
    assert_eq!(received[0].body.len(), 10000);
    assert_eq!(
        received[0].authorization.as_deref(),
        Some(format!("Bearer {MIRROR_SECRET}").as_str())
    );
    // The registry stand-in saw the login, which the plugin never read.
    assert!(
        registry.received().iter().any(|r| r
            .authorization
            .as_deref()
            .is_some_and(|a| a.starts_with("Basic "))),
        "the registry was asked with the login"
    );

    // 2. The request is on the record with its bytes each way.
    let (_, row) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
    let calls = &row["progress"]["calls"];
    assert_eq!(calls["count"], 1, "{row}");
    assert_eq!(calls["sent_bytes"], 10000, "{row}");
    assert!(calls["received_bytes"].as_u64().unwrap() > 100, "{row}");
    let log = berth.deployment_log(&deploy_id).await;
    assert!(
        log.contains(&format!(
            "berth request POST {base}hooks/a (target \"mirror\"): answered 200, "
        )),
        "{log}"
    );

    // 6. A flood of zero-byte puts stops at the manifest's max_puts, and
    // long keys at its max_records_kib; the record holds what landed.
    let flood = |plugin: &'static str, key: String| {
        let berth = &berth;
        async move {
            let (status, done) = berth
                .deploy(
                    id,
                    plugin,
                    json!({ "target": "shelf", "steps": [{ "flood": 1000, "key": key }] }),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{done}");
            done
        }
    };
    let done = flood("flooder", "z".to_string()).await;
    let outcome = &done["details"]["steps"][0]["ok"];
    assert_eq!(outcome["landed"], 150, "{outcome}");
    assert_eq!(
        outcome["refused"],
        "this deployment has made 150 puts, the most its manifest allows (max_puts)"
    );
    // The deployment lists its first 100 puts and counts them all; its
    // `published` pages every one, in order.
    assert_eq!(done["published"].as_array().unwrap().len(), 100);
    assert_eq!(done["published_total"], json!({ "bytes": 0, "files": 150 }));
    let flooded = done["id"].clone();
    let mut keys = Vec::new();
    let mut after = Some(0);
    while let Some(from) = after {
        let (status, page) = berth
            .get(&format!(
                "/v1/deployments/{flooded}/published?after={from}&limit=60"
            ))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(page["total"], 150);
        for put in page["published"].as_array().unwrap() {
            keys.push(put["key"].as_str().unwrap().to_string());
        }
        after = page["next"].as_u64().map(|n| n as usize);
    }
    let expected: Vec<String> = (0..150).map(|i| format!("z-{i}")).collect();
    assert_eq!(keys, expected);
    let (status, refused) = berth
        .get(&format!("/v1/deployments/{flooded}/published?limit=0"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let done = flood("long-keys", vec!["k".repeat(200); 4].join("/")).await;
    let outcome = &done["details"]["steps"][0]["ok"];
    let landed = outcome["landed"].as_u64().unwrap();
    assert!((5..=12).contains(&landed), "{outcome}");
    assert!(
        outcome["refused"]
            .as_str()
            .unwrap()
            .ends_with("the most its manifest allows (max_records_kib)"),
        "{outcome}"
    );
    assert_eq!(done["published"].as_array().unwrap().len() as u64, landed);
    assert!(done.to_string().len() < 32 << 10, "the record stays small");

    // No form of a secret in anything a plugin or a client reads.
    let last = done["id"].clone();
    for event in events.until(|e| ended(e, &last)).await {
        assert_no_secret(&format!("event {}", event.kind), &event.data.to_string());
    }
    assert_no_secret("the probe's answer", &steps_text(&steps));
    assert_no_secret("the deployment", &row.to_string());
    assert_no_secret("the deployment's log", &log);
    assert_no_secret("the server log", &berth.log());
}

fn steps_text(steps: &[Value]) -> String {
    Value::Array(steps.to_vec()).to_string()
}
