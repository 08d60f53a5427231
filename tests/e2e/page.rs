//! The admin page: its assets are served without a token while the data
//! stays behind one (in-process), and the whole page in a real browser
//! (`tests/browser/page.py`: Debian's chromium through Playwright, against
//! a real `berth serve`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};

use berth::auth::{Role, Tokens, new_token};

use crate::support::files::FileServer;
use crate::support::router::App;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, model};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_open_and_its_data_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (_, line) = new_token("viewer", Role::Read).unwrap();
    std::fs::write(dir.path().join("tokens"), format!("{line}\n")).unwrap();
    let tokens = Tokens::load(Some(&dir.path().join("tokens")), None)
        .unwrap()
        .unwrap();
    let app = App::start_with_tokens(Backend::Sqlite, Some(std::sync::Arc::new(tokens))).await;
    for (path, content_type, fragment) in [
        (
            "/",
            "text/html; charset=utf-8",
            "<script type=\"module\" src=\"/page/app.js\">",
        ),
        (
            "/page/app.js",
            "text/javascript; charset=utf-8",
            "new TextDecoderStream()",
        ),
        (
            "/page/style.css",
            "text/css; charset=utf-8",
            "prefers-color-scheme: dark",
        ),
    ] {
        let response = app
            .response(Request::get(path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(response.headers()[header::CONTENT_TYPE], content_type);
        assert!(
            response.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .starts_with("default-src 'self'"),
            "{path}"
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert!(
            String::from_utf8_lossy(&body).contains(fragment),
            "{path} lacks {fragment:?}"
        );
    }
    let (status, _) = app.get("/v1/models").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = app.get("/page/other.js").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "only the page's own paths are open"
    );
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What the browser test needs, or a panic saying what to run.
fn browser() -> PathBuf {
    assert!(
        Path::new("/usr/bin/chromium").is_file(),
        "/usr/bin/chromium is missing: run scripts/setup (it runs apt-get install -y chromium)"
    );
    let python = root().join(".venv/bin/python");
    let found = Command::new(&python)
        .args(["-c", "import playwright"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "Playwright for Python is missing from .venv: run scripts/setup"
    );
    python
}

/// The scenarios of `tests/browser/page.py` but the token's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_works_in_a_real_browser() {
    let files = FileServer::start().await;
    let mut berth = Berth::options(Backend::Sqlite)
        .arg("--plugins-poll-ms")
        .arg("200")
        .start()
        .await;
    let model_id = berth
        .register(&model(&files, "sample-lora-1", &adapter_files()))
        .await;
    run_scenarios(&mut berth, model_id, None);
}

/// A server with a token: the page asks for it and sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_asks_for_a_token() {
    const TOKEN: &str = "berth-page-test-token-0123456789abcdef";
    let files = FileServer::start().await;
    let mut berth = Berth::options(Backend::Sqlite)
        .env("BERTH_API_TOKEN", TOKEN)
        .start()
        .await;
    let answer = berth
        .client()
        .post(format!("{}/v1/models", berth.url))
        .bearer_auth(TOKEN)
        .json(&model(&files, "sample-lora-1", &adapter_files()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let model_id = answer.json::<serde_json::Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap();
    run_scenarios(&mut berth, model_id, Some(TOKEN));
}

/// Runs `tests/browser/page.py` against `berth`, each scenario bounded by
/// its own timeouts and the whole run by `LIMIT`, a hang guard.
fn run_scenarios(berth: &mut Berth, model_id: i64, token: Option<&str>) {
    const LIMIT: Duration = Duration::from_secs(300);
    let python = browser();
    let screenshots = root().join("target/browser-screenshots");
    let mut command = Command::new(python);
    command
        .arg(root().join("tests/browser/page.py"))
        .env("BERTH_URL", &berth.url)
        .env("BERTH_MODEL_ID", model_id.to_string())
        .env("BERTH_PLUGINS_DIR", berth.plugins_dir())
        .env("BERTH_SCREENSHOTS", &screenshots)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(token) = token {
        command.env("BERTH_TOKEN", token);
    }
    let mut child = command.spawn().expect("starting tests/browser/page.py");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    // A hang guard: a script stuck past `LIMIT` is killed, which ends its
    // stdout and so the loop below.
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        let timed_out = finished.recv_timeout(LIMIT).is_err();
        if timed_out {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        timed_out
    });
    // The script asks for a restart on its stdout and waits for `ok`.
    let status = tokio::task::block_in_place(|| {
        for line in stdout.lines() {
            let line = line.unwrap();
            assert_eq!(line, "restart", "tests/browser/page.py said {line:?}");
            berth.terminate();
            berth.restart();
            writeln!(stdin, "ok").unwrap();
        }
        child.wait().unwrap()
    });
    let _ = done.send(());
    assert!(
        !guard.join().unwrap(),
        "the browser scenarios did not end within {LIMIT:?}"
    );
    assert!(
        status.success(),
        "browser scenarios failed (above); screenshots in {}; the server's log:\n{}",
        screenshots.display(),
        berth.log()
    );
}
