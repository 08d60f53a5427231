//! MLflow's model registry as a way in, against a real MLflow server
//! (`tests/mlflow/`, one per test process): a version registered from
//! `mlflow+http://SERVER/NAME@ALIAS` pinned with its files and bytes; the
//! webhook MLflow sends (created through its own API) registering a
//! followed alias's version and firing a rule once, however often it is
//! delivered, and refusing what it did not sign; the catch-up at start
//! registering what arrived while berth was down, nothing twice; and the
//! refusals (unknown alias or version, a server that does not answer, a
//! refused credential named by its sources-file entry, never shown).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::mlflow::{MLMODEL, Mlflow};
use crate::support::server::{Backend, Berth};
use crate::support::{assert_error, bytes, eventually, on_both_backends, sha256_hex};

/// A sources file following `follow` on MLflow, with `HOOK_SECRET` for its
/// webhook, read again every `catch_up_s`.
fn sources(dir: &std::path::Path, mlflow: &Mlflow, follow: &[&str], catch_up_s: u64) -> String {
    let path = dir.join("sources.toml");
    std::fs::write(
        &path,
        format!(
            "[[mlflow]]\nserver = \"{}\"\nwebhook_secret = \"${{HOOK_SECRET}}\"\nfollow = {follow:?}\ncatch_up_s = {catch_up_s}\n",
            mlflow.url
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

const SECRET: &str = "e2e-hook-secret-never-shown";

async fn models(berth: &Berth) -> Vec<Value> {
    let (_, listed) = berth.get("/v1/models").await;
    listed["models"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_is_registered_by_its_alias_pinned_with_its_files_and_bytes() {
    let mlflow = Mlflow::shared();
    eprintln!("MLflow server started in {} ms", mlflow.start_ms);
    let one = [
        ("weights/model.bin", bytes(61, 300_000)),
        ("config.json", bytes(62, 100)),
    ];
    let two = [
        ("weights/model.bin", bytes(63, 200_000)),
        ("config.json", bytes(64, 100)),
    ];
    let (v1, run1) = mlflow.version("e2e-pin", &one).await;
    let (v2, _) = mlflow.version("e2e-pin", &two).await;
    mlflow.alias("e2e-pin", "champion", &v1).await;

    let temp = tempfile::tempdir().unwrap();
    let berth = Berth::options(Backend::Sqlite).start().await;
    let source = format!("mlflow+http://{}/e2e-pin@champion", &mlflow.url[7..]);
    let body = json!({ "name": "e2e-pin", "job_id": "pin-1", "source": source });
    let (status, model) = berth.post("/v1/models", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{model}");
    let params = &model["params"];
    assert_eq!(params["mlflow_name"], "e2e-pin");
    assert_eq!(params["mlflow_version"], v1.as_str());
    assert_eq!(params["mlflow_alias"], "champion");
    assert_eq!(params["mlflow_run_id"], run1.as_str());
    assert!(
        params["mlflow_run_url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/runs/{run1}")),
        "{params}"
    );
    assert!(
        params["mlflow_digests"]
            .as_str()
            .unwrap()
            .contains("checked by its size")
    );
    let files: Vec<(String, u64, Value)> = model["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().into(),
                f["size_bytes"].as_u64().unwrap(),
                f["sha256"].clone(),
            )
        })
        .collect();
    assert_eq!(
        files,
        [
            ("MLmodel".into(), MLMODEL.len() as u64, Value::Null),
            ("config.json".into(), 100, Value::Null),
            ("weights/model.bin".into(), 300_000, Value::Null),
        ],
        "sizes as MLflow lists them; no digest: MLflow keeps none"
    );
    assert!(
        model["source"]
            .as_str()
            .unwrap()
            .contains("/api/2.0/mlflow-artifacts/artifacts/")
    );

    // The alias moves: the registered model stays the version it pinned,
    // and the same registration now names another version's files.
    mlflow.alias("e2e-pin", "champion", &v2).await;
    let (_, again) = berth.get(&format!("/v1/models/{}", model["id"])).await;
    assert_eq!(again, model, "a moved alias changes no registered model");
    let (status, refused) = berth.post("/v1/models", &body).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");

    let (status, deployed) = berth
        .deploy(model["id"].as_i64().unwrap(), "archive", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployed}");
    assert_eq!(deployed["status"], "completed", "{deployed}");
    for (path, contents) in &one {
        assert_eq!(
            sha256_hex(&std::fs::read(berth.model_dir("pin-1").join(path)).unwrap()),
            sha256_hex(contents),
            "{path} is version {v1}'s, not the alias's new version's"
        );
    }

    // Refusals: a sentence, a 400, nothing recorded.
    let server = &mlflow.url[7..];
    let cases = [
        (
            format!("mlflow+http://{server}/e2e-pin@nope"),
            "Registered model alias nope not found",
        ),
        (
            format!("mlflow+http://{server}/e2e-pin/99"),
            "Model Version (name=e2e-pin, version=99) not found",
        ),
        (
            format!("mlflow+http://{server}/e2e-none/1"),
            "Model Version (name=e2e-none, version=1) not found",
        ),
        (
            "mlflow+http://127.0.0.1:1/e2e-pin/1".to_string(),
            "cannot reach the MLflow server http://127.0.0.1:1/",
        ),
        (
            format!("mlflow+http://{server}/e2e-pin"),
            "names no version or alias",
        ),
    ];
    for (source, expected) in cases {
        let answer = berth
            .post(
                "/v1/models",
                &json!({ "name": "x", "job_id": "pin-bad", "source": source }),
            )
            .await;
        assert_error(&answer, StatusCode::BAD_REQUEST, expected);
    }
    assert_eq!(
        models(&berth).await.len(),
        1,
        "nothing recorded by a refusal"
    );
    drop(temp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_credential_names_its_sources_file_entry_and_never_the_secret() {
    // A tracking server that refuses every credential, as MLflow's Basic
    // auth does a wrong password.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let _ = stream
                .write_all(
                    b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
    });
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("sources.toml");
    std::fs::write(
        &file,
        format!(
            "[[source]]\nprefix = \"http://127.0.0.1:{port}/\"\n\
             headers = {{ Authorization = \"Basic ${{MLFLOW_BASIC}}\" }}\n"
        ),
    )
    .unwrap();
    let secret = "YWRtaW46bm90LXRoZS1wYXNzd29yZA==";
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(file.to_str().unwrap())
        .env("MLFLOW_BASIC", secret)
        .start()
        .await;
    let source = format!("mlflow+http://127.0.0.1:{port}/iris@champion");
    let answer = berth
        .post(
            "/v1/models",
            &json!({ "name": "iris", "job_id": "cred-1", "source": source }),
        )
        .await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        &format!(
            "answered 401 Unauthorized to the credentials of the prefix http://127.0.0.1:{port}/ in the sources file: check them"
        ),
    );
    assert!(!answer.1.to_string().contains(secret));
    assert!(!berth.log().contains(secret), "the credential logged");
    assert!(models(&berth).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_registers_a_followed_alias_and_fires_a_rule_once() {
    let mlflow = Mlflow::shared();
    let temp = tempfile::tempdir().unwrap();
    // No catch-up but the one at start (before the alias is set): what
    // registers the version is the webhook, not a reading that raced it.
    let file = sources(temp.path(), mlflow, &["e2e-hook@champion"], 3600);
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(&file)
        .env("HOOK_SECRET", SECRET)
        .start()
        .await;
    let rule = json!({
        "name": "champion",
        "when": { "event": "model_registered" },
        "match": { "params": { "mlflow_alias": "champion" } },
        "deploy": { "deployer": "archive", "options": {} },
    });
    let (status, body) = berth.post("/v1/rules", &rule).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    mlflow
        .client(&["webhook", &format!("{}/v1/hooks/mlflow", berth.url), SECRET])
        .await;

    // A new version is not followed by itself (only e2e-hook@champion is);
    // giving it the alias sends the webhook that registers it.
    let (v1, _) = mlflow
        .version("e2e-hook", &[("model.bin", bytes(71, 5000))])
        .await;
    mlflow.alias("e2e-hook", "champion", &v1).await;
    let job = format!("mlflow-e2e-hook-champion-v{v1}");
    let model = eventually(
        || format!("the webhook to register {job}:\n{}", berth.log()),
        async || {
            models(&berth)
                .await
                .into_iter()
                .find(|m| m["job_id"] == job.as_str())
        },
    )
    .await;
    assert_eq!(model["created_by"], "MLflow webhook");
    // The event says where it came from too.
    let mut events = berth.events_from("?after=0", None).await;
    let seen = events
        .until(|seen| seen.iter().any(|e| e.data["job_id"] == job.as_str()))
        .await;
    let registered = seen
        .iter()
        .find(|e| e.data["job_id"] == job.as_str())
        .unwrap();
    assert_eq!(registered.kind, "model.registered");
    assert_eq!(
        registered.data["by"], "MLflow webhook",
        "{:?}",
        registered.data
    );
    assert_eq!(model["params"]["mlflow_alias"], "champion");
    assert_eq!(model["params"]["mlflow_version"], v1.as_str());

    // The same delivery again (MLflow's retry, or a copy): nothing new.
    let payload = json!({
        "entity": "model_version_alias", "action": "created", "timestamp": "now",
        "data": { "name": "e2e-hook", "alias": "champion", "version": v1 },
    })
    .to_string();
    let now = (berth_now() as i64).to_string();
    let send = async |timestamp: &str, signature: String| {
        let answer = berth
            .client()
            .post(format!("{}/v1/hooks/mlflow", berth.url))
            .header("X-MLflow-Delivery-Id", "copy-1")
            .header("X-MLflow-Timestamp", timestamp)
            .header("X-MLflow-Signature", signature)
            .body(payload.clone())
            .send()
            .await
            .unwrap();
        let status = answer.status();
        (status, answer.json::<Value>().await.unwrap())
    };
    let signed = berth::mlflow::hook::sign(SECRET, "copy-1", &now, payload.as_bytes());
    let (status, again) = send(&now, signed).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["outcome"], "registered already");
    assert_eq!(again["model_id"], model["id"]);

    // Unsigned by the secret, or signed long ago: refused, nothing recorded.
    let wrong = berth::mlflow::hook::sign("another secret", "copy-1", &now, payload.as_bytes());
    let answer = send(&now, wrong).await;
    assert_error(
        &answer,
        StatusCode::UNAUTHORIZED,
        "matches no webhook_secret",
    );
    let old = (berth_now() as i64 - 3600).to_string();
    let replayed = berth::mlflow::hook::sign(SECRET, "copy-1", &old, payload.as_bytes());
    let answer = send(&old, replayed).await;
    assert_error(
        &answer,
        StatusCode::UNAUTHORIZED,
        "an old delivery replayed",
    );
    let unsigned = berth
        .client()
        .post(format!("{}/v1/hooks/mlflow", berth.url))
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
    let said: Value = unsigned.json().await.unwrap();
    assert!(
        said["error"]
            .as_str()
            .unwrap()
            .contains("X-MLflow-Delivery-Id"),
        "{said}"
    );
    // Signed, but no payload of MLflow's: 400, nothing recorded.
    let garbage = b"{\"entity\": 1}";
    let answer = berth
        .client()
        .post(format!("{}/v1/hooks/mlflow", berth.url))
        .header("X-MLflow-Delivery-Id", "copy-2")
        .header("X-MLflow-Timestamp", &now)
        .header(
            "X-MLflow-Signature",
            berth::mlflow::hook::sign(SECRET, "copy-2", &now, garbage),
        )
        .body(garbage.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    // Signed, followed, but a version MLflow does not have: 502 (MLflow
    // retries a 5xx) with MLflow's words, nothing recorded.
    let missing = json!({
        "entity": "model_version_alias", "action": "created",
        "data": { "name": "e2e-hook", "alias": "champion", "version": "99" },
    })
    .to_string();
    let answer = berth
        .client()
        .post(format!("{}/v1/hooks/mlflow", berth.url))
        .header("X-MLflow-Delivery-Id", "copy-3")
        .header("X-MLflow-Timestamp", &now)
        .header(
            "X-MLflow-Signature",
            berth::mlflow::hook::sign(SECRET, "copy-3", &now, missing.as_bytes()),
        )
        .body(missing)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::BAD_GATEWAY);
    let said: Value = answer.json().await.unwrap();
    assert!(
        said["error"]
            .as_str()
            .unwrap()
            .contains("Model Version (name=e2e-hook, version=99) not found"),
        "{said}"
    );

    // The rule fired once: one deployment of the model, completed.
    let id = model["id"].as_i64().unwrap();
    let rows = eventually(
        || "the rule's deployment to complete".into(),
        async || {
            let (_, rows) = berth.get(&format!("/v1/models/{id}/deployments")).await;
            let rows = rows["deployments"].as_array().cloned().unwrap_or_default();
            rows.iter()
                .all(|r| r["status"] == "completed")
                .then_some(rows)
                .filter(|r| !r.is_empty())
        },
    )
    .await;
    // Long enough for a second firing to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, later) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(later["deployments"].as_array().unwrap().len(), 1, "{later}");
    assert_eq!(rows[0]["created_by"], "rule:champion");
    let registered = models(&berth).await;
    assert_eq!(
        registered
            .iter()
            .filter(|m| m["params"]["mlflow_name"] == "e2e-hook")
            .count(),
        1,
        "{registered:?}"
    );
    assert!(!berth.log().contains(SECRET), "the secret logged");
}

on_both_backends!(the_catch_up_registers_what_came_while_berth_was_down_and_nothing_twice);

async fn the_catch_up_registers_what_came_while_berth_was_down_and_nothing_twice(backend: Backend) {
    let mlflow = Mlflow::shared();
    // A registered model per backend's run: the server is shared.
    let name = format!("e2e-catch-{backend:?}").to_lowercase();
    let (v1, _) = mlflow.version(&name, &[("a.bin", bytes(81, 1000))]).await;
    let temp = tempfile::tempdir().unwrap();
    let file = sources(temp.path(), mlflow, &[&name], 1);
    let mut berth = Berth::options(backend)
        .arg("--sources-file")
        .arg(&file)
        .env("HOOK_SECRET", SECRET)
        .start()
        .await;
    let jobs = async |berth: &Berth| -> Vec<String> {
        let mut jobs: Vec<String> = models(berth)
            .await
            .iter()
            .map(|m| m["job_id"].as_str().unwrap().to_string())
            .collect();
        jobs.sort();
        jobs
    };
    let first = format!("mlflow-{name}-v{v1}");
    eventually(
        || {
            format!(
                "the catch-up at start to register {first}:\n{}",
                berth.log()
            )
        },
        async || (jobs(&berth).await == [first.clone()]).then_some(()),
    )
    .await;

    berth.terminate();
    let (v2, _) = mlflow.version(&name, &[("a.bin", bytes(82, 1000))]).await;
    berth.restart();
    let second = format!("mlflow-{name}-v{v2}");
    eventually(
        || {
            format!(
                "the catch-up after the restart to register {second}:\n{}",
                berth.log()
            )
        },
        async || (jobs(&berth).await.contains(&second)).then_some(()),
    )
    .await;
    // Several readings later (one a second), still one model per version.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(jobs(&berth).await, [first, second]);
}

/// The Unix time in seconds.
fn berth_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
