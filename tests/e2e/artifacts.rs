//! The artifacts API in-process: listing and streaming what a deployer
//! wrote, and refusing every way out of the output directory a plugin could
//! plant (symlinks, hard links, `..`, absolute paths, things that are not
//! regular files).

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::json;

use crate::support::files::FileServer;
use crate::support::router::{App, Rule};
use crate::support::server::Backend;
use crate::support::{adapter_files, model};

/// A completed `archive` deployment: its id, out-dir and archive name.
async fn archived(app: &App, files: &FileServer) -> (i64, PathBuf, String) {
    let id = app
        .register(&model(files, "job-art", &adapter_files()))
        .await;
    let (status, deployment) = app
        .post(
            &format!("/v1/models/{id}/deployments"),
            &json!({ "deployer": "archive" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let reference = deployment["ref"].as_str().unwrap();
    let name = reference.strip_prefix("/out/").unwrap().to_string();
    let out_dir = PathBuf::from(deployment["out_dir"].as_str().unwrap());
    (deployment["id"].as_i64().unwrap(), out_dir, name)
}

/// What a plugin could leave behind to reach outside its directory.
fn plant(out_dir: &Path) {
    let outside = out_dir.parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "not for plugins").unwrap();
    std::fs::create_dir_all(out_dir.join("nested")).unwrap();
    std::fs::write(out_dir.join("nested/notes.txt"), "written by the deployer").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), out_dir.join("link-out")).unwrap();
    std::os::unix::fs::symlink(&outside, out_dir.join("dir-link")).unwrap();
    std::os::unix::fs::symlink("nested/notes.txt", out_dir.join("link-in")).unwrap();
    std::fs::hard_link(outside.join("secret.txt"), out_dir.join("hard-out")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_are_listed_and_streamed_and_escapes_refused() {
    let files = FileServer::start().await;
    let app = App::start(Backend::Sqlite).await;
    let (id, out_dir, archive) = archived(&app, &files).await;
    plant(&out_dir);

    let (status, listing) = app.get(&format!("/v1/deployments/{id}/files")).await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    let paths: Vec<&str> = listing["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, [archive.as_str(), "nested/notes.txt"], "{listing}");
    let notes = &listing["files"][1];
    assert_eq!(notes["size_bytes"], 23);
    assert!(
        notes["modified"].as_str().unwrap().ends_with('Z'),
        "{notes}"
    );
    assert_eq!(listing["truncated"], false);

    let files_of = format!("/v1/deployments/{id}/files");
    // One refusal a line: the path (`{files_of}` stands for this
    // deployment's files), the status and a fragment of the sentence.
    #[rustfmt::skip]
    let refusals: &[(&str, StatusCode, &str)] = &[
        ("{files_of}/link-out", StatusCode::NOT_FOUND, "link-out: it is a symbolic link"),
        ("{files_of}/link-in", StatusCode::NOT_FOUND, "link-in: it is a symbolic link; only regular files"),
        ("{files_of}/dir-link/secret.txt", StatusCode::NOT_FOUND, "a directory on its path is a symbolic link"),
        ("{files_of}/hard-out", StatusCode::NOT_FOUND, "it is a hard link"),
        ("{files_of}/nested", StatusCode::NOT_FOUND, "it is a directory"),
        ("{files_of}/nested/notes.txt/x", StatusCode::NOT_FOUND, "a component of its path is not a directory"),
        ("{files_of}/missing.bin", StatusCode::NOT_FOUND, "missing.bin: no such file in the deployment's output directory"),
        ("{files_of}/nested/../../outside/secret.txt", StatusCode::BAD_REQUEST, "`..` is refused"),
        ("{files_of}/%2E%2E/outside/secret.txt", StatusCode::BAD_REQUEST, "\"../outside/secret.txt\": `..`"),
        ("{files_of}//etc/passwd", StatusCode::BAD_REQUEST, "absolute paths are refused"),
        ("{files_of}/nested//notes.txt", StatusCode::BAD_REQUEST, "empty segments"),
        ("/v1/deployments/999/files", StatusCode::NOT_FOUND, "deployment 999 does not exist"),
        ("/v1/deployments/998/files/a.bin", StatusCode::NOT_FOUND, "deployment 998 does not exist"),
        ("/v1/deployments/x/files/a.bin", StatusCode::BAD_REQUEST, "\"x\" is not an id"),
    ];
    let paths: Vec<String> = refusals
        .iter()
        .map(|(path, _, _)| path.replace("{files_of}", &files_of))
        .collect();
    let rules: Vec<Rule> = refusals
        .iter()
        .zip(&paths)
        .map(|((_, status, fragment), path)| (Method::GET, path.as_str(), None, *status, *fragment))
        .collect();
    app.check(&rules).await;

    // The whole archive, streamed with its length and name.
    let on_disk = std::fs::read(out_dir.join(&archive)).unwrap();
    let response = app
        .response(get(&format!("{files_of}/{archive}"), None))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers[header::CONTENT_LENGTH], on_disk.len().to_string());
    assert_eq!(headers[header::ACCEPT_RANGES], "bytes");
    let disposition = headers[header::CONTENT_DISPOSITION].to_str().unwrap();
    assert!(
        disposition.starts_with(&format!("attachment; filename=\"{archive}\"")),
        "{disposition}"
    );
    assert_eq!(body(response).await, on_disk);

    // A span of it.
    let response = app
        .response(get(&format!("{files_of}/{archive}"), Some("bytes=10-19")))
        .await;
    assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        response.headers()[header::CONTENT_RANGE],
        format!("bytes 10-19/{}", on_disk.len())
    );
    assert_eq!(response.headers()[header::CONTENT_LENGTH], "10");
    assert_eq!(body(response).await, &on_disk[10..20]);

    // Past its end.
    let response = app
        .response(get(
            &format!("{files_of}/{archive}"),
            Some(&format!("bytes={}-", on_disk.len())),
        ))
        .await;
    assert_eq!(response.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(
        response.headers()[header::CONTENT_RANGE],
        format!("bytes */{}", on_disk.len())
    );

    // A nested file.
    let response = app
        .response(get(&format!("{files_of}/nested/notes.txt"), None))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body(response).await, b"written by the deployer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_without_an_output_directory_lists_nothing() {
    let files = FileServer::start().await;
    let app = App::start(Backend::Sqlite).await;
    let (id, out_dir, _) = archived(&app, &files).await;
    std::fs::remove_dir_all(&out_dir).unwrap();
    let (status, listing) = app.get(&format!("/v1/deployments/{id}/files")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing, json!({ "files": [], "truncated": false }));
    let answer = app.get(&format!("/v1/deployments/{id}/files/a.bin")).await;
    crate::support::assert_error(&answer, StatusCode::NOT_FOUND, "a.bin: no such file");
}

fn get(path: &str, range: Option<&str>) -> Request<Body> {
    let request = Request::get(path);
    let request = match range {
        Some(range) => request.header(header::RANGE, range),
        None => request,
    };
    request.body(Body::empty()).unwrap()
}

async fn body(response: axum::response::Response) -> Vec<u8> {
    axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap()
        .to_vec()
}
