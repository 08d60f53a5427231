//! The admin page: its assets are served without a token while the data
//! stays behind one (in-process), and the whole page in a real browser
//! (`tests/browser/page.py`: Debian's chromium through Playwright, against
//! a real `berth serve`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};

use berth::auth::{Role, Tokens, new_token};

use crate::support::files::FileServer;
use crate::support::router::App;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, model};

/// From `/`, every file the page loads (the HTML's `/page/` links, each
/// module's imports, followed): each is served without a token, with its
/// content type and the CSP; they are exactly the files of
/// `host/src/http/page/`, so none is left unserved and none unused. The
/// data stays behind the token, and so does anything the prefix does not
/// hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_open_and_its_data_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (_, line) = new_token("viewer", Role::Read).unwrap();
    std::fs::write(dir.path().join("tokens"), format!("{line}\n")).unwrap();
    let tokens = Tokens::load(Some(&dir.path().join("tokens")), None)
        .unwrap()
        .unwrap();
    let app = App::start_with_tokens(Backend::Sqlite, Some(std::sync::Arc::new(tokens))).await;

    let mut served = BTreeSet::new();
    let mut next = vec!["/".to_string()];
    while let Some(path) = next.pop() {
        if !served.insert(path.clone()) {
            continue;
        }
        let (headers, text) = page_file(&app, &path).await;
        let (content_type, linked) = match path.rsplit_once('.').map(|(_, ext)| ext) {
            None => {
                let mut links = quoted_after(&text, &["src=\"", "href=\""]);
                links.retain(|link| link.starts_with("/page/"));
                ("text/html; charset=utf-8", links)
            }
            Some("js") => {
                let imports = quoted_after(&text, &["from \"", "import \""]);
                for import in &imports {
                    assert!(
                        import.starts_with('.'),
                        "{path} imports {import:?}: only the page's own modules, by relative path"
                    );
                }
                ("text/javascript; charset=utf-8", imports)
            }
            Some("css") => ("text/css; charset=utf-8", Vec::new()),
            Some(other) => panic!("{path}: the page serves no .{other} file"),
        };
        assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
        next.extend(linked.iter().map(|link| resolve(&path, link)));
    }
    assert_eq!(
        served,
        source_files(),
        "the files the page loads (left) and those of host/src/http/page/ (right) differ: \
         serve a new one in http/page/mod.rs's ASSETS, import it, or delete it"
    );

    // Revalidating an unchanged file costs no body.
    let (headers, _) = page_file(&app, "/page/app.js").await;
    let etag = headers[header::ETAG].to_str().unwrap().to_string();
    let response = app
        .response(
            Request::get("/page/app.js")
                .header(header::IF_NONE_MATCH, &etag)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(response.headers()[header::ETAG], etag.as_str());

    let (status, _) = app.get("/v1/models").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(
        &app.get("/page/other.js").await,
        StatusCode::NOT_FOUND,
        "/page/other.js: the web page has no such file",
    );
    // The prefix is open, but routing is literal: it opens no data.
    let (status, _) = app.get("/page/../v1/models").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// The models view draws the storage line and a model's view its storage
/// block, both from `GET /v1/storage` (the browser scenarios see them
/// filled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_views_show_the_storage() {
    let app = App::start(Backend::Sqlite).await;
    let (_, models) = page_file(&app, "/page/views/models.js").await;
    assert!(models.contains("storageLine()"), "{models}");
    let (_, model) = page_file(&app, "/page/views/model.js").await;
    assert!(model.contains("storageBlock(model.id)"), "{model}");
    let (_, storage) = page_file(&app, "/page/views/storage.js").await;
    for hook in [
        "api(\"/v1/storage\")",
        "id: \"storage-line\"",
        "id: \"model-storage\"",
        "storage.bytes_on_disk",
        "storage.bytes_saved",
        "storage.budget_bytes",
        "mine.local",
        "mine.bytes",
        "mine.shared_bytes",
        "mine.last_deployed",
    ] {
        assert!(storage.contains(hook), "storage.js lacks {hook}");
    }
}

/// A file of the page, asserting it is served (200, the page's CSP).
async fn page_file(app: &App, path: &str) -> (HeaderMap, String) {
    let response = app
        .response(Request::get(path).body(Body::empty()).unwrap())
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    assert!(
        response.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .starts_with("default-src 'self'"),
        "{path}"
    );
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (headers, String::from_utf8(body.to_vec()).unwrap())
}

/// The double-quoted text after each `opening` in `text`: the HTML's links,
/// a module's static imports (the page's modules import no other way).
fn quoted_after(text: &str, openings: &[&str]) -> Vec<String> {
    openings
        .iter()
        .flat_map(|opening| text.split(opening).skip(1))
        .filter_map(|rest| rest.split_once('"').map(|(quoted, _)| quoted.to_string()))
        .collect()
}

/// `link` as a path, as a browser resolves it from the file at `from`.
fn resolve(from: &str, link: &str) -> String {
    if link.starts_with('/') {
        return link.to_string();
    }
    let mut segments: Vec<&str> = from.split('/').collect();
    segments.pop();
    for segment in link.split('/') {
        match segment {
            "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    segments.join("/")
}

/// The paths at which the page's source files should be served: `/` for
/// `index.html`, `/page/…` for the others.
fn source_files() -> BTreeSet<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/http/page");
    let mut found = BTreeSet::new();
    let mut dirs = vec![dir.clone()];
    while let Some(at) = dirs.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let relative = path.strip_prefix(&dir).unwrap().to_str().unwrap();
            match relative {
                "mod.rs" => {}
                "index.html" => _ = found.insert("/".to_string()),
                _ => _ = found.insert(format!("/page/{relative}")),
            }
        }
    }
    found
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What the browser test needs, or a panic saying what to run.
fn browser() -> PathBuf {
    assert!(
        Path::new("/usr/bin/chromium").is_file(),
        "/usr/bin/chromium is missing: run scripts/setup test (it runs apt-get install -y chromium)"
    );
    let python = root().join(".venv/bin/python");
    let found = Command::new(&python)
        .args(["-c", "import playwright"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "Playwright for Python is missing from .venv: run scripts/setup test"
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
