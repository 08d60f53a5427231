//! API tokens: who may read, who may change, what is open, who is recorded
//! as `created_by`; and, where a process matters, the refusal to serve an
//! open API beyond loopback, a token file changed while the server runs,
//! and the CLI with a token.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use berth::auth::{Role, Tokens, new_token};

use crate::support::files::FileServer;
use crate::support::router::{App, Rule};
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, eventually, model, on_both_backends};

/// A tokens file with a `read` token and a `deploy` token; returns their
/// tokens, with the loaded tokens.
fn tokens(dir: &Path) -> (String, String, Arc<Tokens>) {
    let (reader, reader_line) = new_token("viewer", Role::Read).unwrap();
    let (deployer, deployer_line) = new_token("ci", Role::Deploy).unwrap();
    let file = dir.join("tokens");
    std::fs::write(
        &file,
        format!("# who may call\n{reader_line}\n{deployer_line}\n"),
    )
    .unwrap();
    let tokens = Tokens::load(Some(&file), None).unwrap().unwrap();
    (reader, deployer, Arc::new(tokens))
}

on_both_backends!(
    tokens_decide_who_may_read_and_who_may_change,
    without_tokens_nothing_is_asked_and_nobody_is_recorded,
);

async fn tokens_decide_who_may_read_and_who_may_change(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (reader, deployer, tokens) = tokens(dir.path());
    let app = App::start_with_tokens(backend, Some(tokens)).await;
    let files = FileServer::start().await;
    let registration = model(&files, "job-auth", &adapter_files());

    // Without a token, or with one the server does not know: 401, with the
    // challenge a client needs.
    let anonymous = app.with_token(None);
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (Method::GET, "/v1/models", None, StatusCode::UNAUTHORIZED, "needs an API token: send the header Authorization: Bearer TOKEN"),
        (Method::POST, "/v1/models", Some(registration.clone()), StatusCode::UNAUTHORIZED, "(the CLI: --token or BERTH_TOKEN)"),
        (Method::GET, "/v1/events", None, StatusCode::UNAUTHORIZED, "needs an API token: send"),
        (Method::GET, "/v1/no-such-endpoint", None, StatusCode::UNAUTHORIZED, "needs an API token: send the"),
    ];
    anonymous.check(&rules).await;
    let request = Request::get("/v1/deployers").body(Body::empty()).unwrap();
    let (status, headers, _) = anonymous.send_for_headers(request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers[header::WWW_AUTHENTICATE], r#"Bearer realm="berth""#);

    let wrong = app.with_token(Some("berth_0000000000000000"));
    assert_error(
        &wrong.get("/v1/models").await,
        StatusCode::UNAUTHORIZED,
        "the API token is not accepted: it is unknown or was revoked",
    );
    let mut basic = Request::get("/v1/models").body(Body::empty()).unwrap();
    basic
        .headers_mut()
        .insert(header::AUTHORIZATION, "Basic dXNlcjpwYXNz".parse().unwrap());
    assert_error(
        &anonymous.send(basic).await,
        StatusCode::UNAUTHORIZED,
        "the Authorization header must be `Bearer TOKEN`",
    );

    // Probes need no token.
    for open in ["/healthz"] {
        let (status, _) = anonymous.get(open).await;
        assert_eq!(status, StatusCode::OK, "{open}");
    }

    // The deploy token may change things, and is recorded as their author.
    let ci = app.with_token(Some(&deployer));
    let id = ci.register(&registration).await;
    let (status, stored) = ci.get(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stored["created_by"], "ci");
    let (status, deployment) = ci
        .post(
            &format!("/v1/models/{id}/deployments"),
            &json!({ "deployer": "archive" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["created_by"], "ci");

    // The read token reads everything, and changes nothing.
    let viewer = app.with_token(Some(&reader));
    for path in [
        "/v1/models".to_string(),
        format!("/v1/models/{id}"),
        format!("/v1/models/{id}/deployments"),
        format!("/v1/deployments/{}", deployment["id"]),
        "/v1/deployers".to_string(),
    ] {
        let (status, body) = viewer.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let (status, listed) = viewer.get(&format!("/v1/models/{id}/deployments")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["deployments"][0]["created_by"], "ci");
    let deployments = format!("/v1/models/{id}/deployments");
    let one = format!("/v1/models/{id}");
    let cancel = format!("/v1/deployments/{}/cancel", deployment["id"]);
    let delete_refused = format!("DELETE /v1/models/{id} needs a deploy token");
    #[rustfmt::skip]
    let rules: Vec<Rule> = vec![
        (Method::POST, "/v1/models", Some(registration.clone()), StatusCode::FORBIDDEN, "token viewer has the read role, which may only read; POST /v1/models needs a deploy token"),
        (Method::POST, &deployments, Some(json!({ "deployer": "archive" })), StatusCode::FORBIDDEN, "deployments needs a deploy token"),
        (Method::DELETE, &one, None, StatusCode::FORBIDDEN, &delete_refused),
        (Method::POST, &cancel, None, StatusCode::FORBIDDEN, "/cancel needs a deploy token"),
    ];
    viewer.check(&rules).await;
    let (status, _) = ci.get(&one).await;
    assert_eq!(status, StatusCode::OK, "the refused delete deleted nothing");

    // A refused request's body is read before the refusal is sent, so the
    // client is not reset mid-upload and loses no answer; a body too large
    // to wait for is answered at once, on a connection that then closes.
    for (size, closes) in [(1 << 20, false), (9 << 20, true)] {
        let read = Arc::new(AtomicUsize::new(0));
        let counted = read.clone();
        let chunks = futures::stream::iter((0..size / 4096).map(move |_| {
            counted.fetch_add(4096, Ordering::SeqCst);
            Ok::<_, std::io::Error>(vec![7u8; 4096])
        }));
        let request = Request::put("/v1/blobs/sha256:00")
            .body(Body::from_stream(chunks))
            .unwrap();
        let (status, headers, refused) = viewer.send_for_headers(request).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
        assert_eq!(headers.get(header::CONNECTION).is_some(), closes, "{size}");
        let read = read.load(Ordering::SeqCst);
        if closes {
            assert!(read < size, "{read} of {size} bytes read");
        } else {
            assert_eq!(read, size);
        }
    }
}

async fn without_tokens_nothing_is_asked_and_nobody_is_recorded(backend: Backend) {
    let app = App::start(backend).await;
    let files = FileServer::start().await;
    let id = app
        .register(&model(&files, "job-open", &adapter_files()))
        .await;
    let (status, stored) = app.get(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stored["created_by"], Value::Null);
    let deployments = format!("/v1/models/{id}/deployments");
    let (status, deployment) = app
        .post(&deployments, &json!({ "deployer": "archive" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["created_by"], Value::Null, "{deployment}");
    let (_, listed) = app.get(&deployments).await;
    assert_eq!(listed["deployments"][0]["created_by"], Value::Null);

    // What needs a token when tokens are configured is answered without
    // one, and a token is not looked at.
    let stranger = app.with_token(Some("berth_0000000000000000"));
    let reads = [
        "/v1/models".to_string(),
        format!("/v1/models/{id}"),
        deployments,
        format!("/v1/deployments/{}", deployment["id"]),
        "/v1/deployers".to_string(),
    ];
    for caller in [&app, &stranger] {
        for path in &reads {
            let (status, body) = caller.get(path).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
        }
        let (status, body) = caller.get("/v1/no-such-endpoint").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        let cancel = format!("/v1/deployments/{}/cancel", deployment["id"]);
        let (status, body) = caller.post(&cancel, &json!({})).await;
        assert_eq!(status, StatusCode::CONFLICT, "it has ended: {body}");
    }
    stranger.events().await;
}

#[tokio::test]
async fn an_open_api_is_refused_beyond_loopback_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--plugins-dir")
            .arg(dir.path().join("plugins"))
            .args(extra)
            .env_remove("BERTH_API_TOKEN")
            .env_remove("BERTH_API_TOKENS_FILE")
            .env_remove("BERTH_INSECURE_NO_AUTH")
            .output()
            .unwrap()
    };
    let refused = serve(&[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("refusing to serve 0.0.0.0:0 without API tokens")
            && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );
    // A token too short to be safe is refused as well, before listening.
    let short = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("BERTH_API_TOKEN", "short")
        .output()
        .unwrap();
    assert!(!short.status.success());
    assert!(
        String::from_utf8_lossy(&short.stderr).contains("BERTH_API_TOKEN is too short"),
        "{}",
        String::from_utf8_lossy(&short.stderr)
    );
}

#[tokio::test]
async fn an_insecure_server_beyond_loopback_starts_and_says_so() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--insecure-no-auth",
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .arg("--plugins-dir")
        .arg(dir.path().join("plugins"))
        .env_remove("BERTH_API_TOKEN")
        .env_remove("BERTH_API_TOKENS_FILE")
        .env("BERTH_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let read = tokio::task::spawn_blocking(move || {
        let mut seen = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("berth is listening") {
                break;
            }
        }
        seen
    });
    let seen = tokio::time::timeout(std::time::Duration::from_secs(120), read)
        .await
        .expect("berth serve did not start within 2 minutes")
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains("berth is listening"), "{seen}");
    assert!(
        seen.contains("without API tokens (--insecure-no-auth): anyone who reaches it may register, deploy and delete"),
        "{seen}"
    );
}

#[tokio::test]
async fn a_token_added_to_the_file_is_accepted_without_a_restart_and_a_removed_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    let (first, first_line) = new_token("first", Role::Read).unwrap();
    std::fs::write(&file, format!("{first_line}\n")).unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--api-tokens-file")
        .arg(file.to_str().unwrap())
        .start()
        .await;
    let status_with = |token: String| {
        let (client, url) = (berth.client().clone(), berth.url.clone());
        async move {
            client
                .get(format!("{url}/v1/models"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(status_with(first.clone()).await, StatusCode::OK);
    let (second, second_line) = new_token("second", Role::Deploy).unwrap();
    assert_eq!(status_with(second.clone()).await, StatusCode::UNAUTHORIZED);

    // Replaced whole, as an editor or a config manager does.
    let tmp = dir.path().join("tokens.tmp");
    std::fs::write(&tmp, format!("{second_line}\n")).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    eventually(
        || "the new token to be accepted".into(),
        async || (status_with(second.clone()).await == StatusCode::OK).then_some(()),
    )
    .await;
    assert_eq!(
        status_with(first.clone()).await,
        StatusCode::UNAUTHORIZED,
        "the removed token is revoked"
    );

    // A broken file keeps the tokens read before, and the log says why.
    std::fs::write(&file, "second deploy not-a-hash\n").unwrap();
    eventually(
        || "the broken tokens file to be reported".into(),
        async || berth.log().contains("not the token itself").then_some(()),
    )
    .await;
    assert_eq!(status_with(second.clone()).await, StatusCode::OK);
}

#[tokio::test]
async fn the_cli_sends_its_token_and_says_when_one_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    let (token, line) = new_token("cli", Role::Read).unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("{line}\n")).unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--api-tokens-file")
        .arg(file.to_str().unwrap())
        .start()
        .await;
    let run = |token: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_berth"));
        command
            .args(["models", "--server", &berth.url])
            .env_remove("BERTH_TOKEN");
        if let Some(token) = token {
            command.env("BERTH_TOKEN", token);
        }
        command.output().unwrap()
    };
    let refused = run(None);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("needs an API token"), "{stderr}");
    let listed = run(Some(&token));
    assert_eq!(
        listed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(String::from_utf8_lossy(&listed.stdout).contains("no models are registered"));

    // `berth token new` prints a token that its printed line accepts.
    let new = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["token", "new", "robot", "--role", "deploy"])
        .output()
        .unwrap();
    assert!(new.status.success());
    let printed = String::from_utf8_lossy(&new.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&new.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("robot deploy "))
        .unwrap_or_else(|| panic!("no token-file line in:\n{stderr}"));
    assert!(!line.contains(&printed), "the line holds only the hash");
    std::fs::write(dir.path().join("robot"), format!("{line}\n")).unwrap();
    let tokens = Tokens::load(Some(&dir.path().join("robot")), None)
        .unwrap()
        .unwrap();
    assert_eq!(
        tokens.caller(&printed).map(|c| c.name),
        Some("robot".into())
    );
}
