//! HTTP mirror targets against a loopback mirror that checks the
//! `Authorization` header and the body's `Content-Digest`: the conformance
//! suite (`http_conforms`), and a 5xx tried again, a redirect is refused without the credentials
//! going anywhere else, a file that is not the verified one is refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::conformance::{Target, conforms};
use super::testing::{assert_not_the_verified_one, file, file_body, key};
use super::{Body, Error, Publishers};
use crate::targets::Targets;
use crate::trust::Trust;

const TOKEN: &str = "Bearer s3cret-mirror-token";

/// What the mirror holds and saw.
#[derive(Default)]
struct Mirror {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    /// PUTs to answer 500 before taking one.
    fail: AtomicU32,
    puts: AtomicU32,
    /// Where `/moved/…` sends requests.
    moved_to: Mutex<String>,
    /// Every request's headers, for the redirect target.
    seen: Mutex<Vec<HeaderMap>>,
}

/// The mirror: `PUT` and `HEAD` under any path, with `Authorization:
/// TOKEN`; a PUT is taken only if its body hashes to its `Content-Digest`
/// (and `Repr-Digest`) and is as long as its `Content-Length`.
async fn mirror(
    State(mirror): State<Arc<Mirror>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    mirror.seen.lock().unwrap().push(headers.clone());
    let path = uri.path().to_string();
    if let Some(rest) = path.strip_prefix("/moved/") {
        let to = format!("{}/{rest}", mirror.moved_to.lock().unwrap());
        return (StatusCode::TEMPORARY_REDIRECT, [("location", to)]).into_response();
    }
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some(TOKEN) {
        // Echoes what it got: berth must not quote it back.
        let said = format!("unauthorized: got {}", auth.unwrap_or("nothing"));
        return (StatusCode::UNAUTHORIZED, said).into_response();
    }
    match method {
        Method::PUT => {
            mirror.puts.fetch_add(1, Ordering::SeqCst);
            if mirror
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return (StatusCode::INTERNAL_SERVER_ERROR, "busy, try again").into_response();
            }
            let expected = format!(
                "sha-256=:{}:",
                base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&body))
            );
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            if header("content-digest") != Some(&expected)
                || header("repr-digest") != Some(&expected)
            {
                return (StatusCode::BAD_REQUEST, "digest mismatch").into_response();
            }
            if header("content-length") != Some(&body.len().to_string()) {
                return (StatusCode::BAD_REQUEST, "length mismatch").into_response();
            }
            let etag = format!("\"{}\"", &hex::encode(Sha256::digest(&body))[..16]);
            mirror.objects.lock().unwrap().insert(path, body.to_vec());
            (StatusCode::CREATED, [("etag", etag)]).into_response()
        }
        Method::HEAD => match mirror.objects.lock().unwrap().get(&path) {
            Some(object) => {
                let etag = format!("\"{}\"", &hex::encode(Sha256::digest(object))[..16]);
                (
                    StatusCode::OK,
                    [("content-length", object.len().to_string()), ("etag", etag)],
                )
                    .into_response()
            }
            None => StatusCode::NOT_FOUND.into_response(),
        },
        _ => StatusCode::METHOD_NOT_ALLOWED.into_response(),
    }
}

fn app(state: Arc<Mirror>) -> axum::Router {
    axum::Router::new()
        .fallback(mirror)
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Serves a mirror on a free loopback port; its base URL.
async fn serve(state: Arc<Mirror>) -> String {
    let app = app(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

/// Publishers for targets "mirror" (`url`, the right token) and "stranger"
/// (`url`, a wrong one).
fn publishers(url: &str) -> Publishers {
    publishers_trusting(url, &Trust::default())
}

fn publishers_trusting(url: &str, trust: &Trust) -> Publishers {
    let text = format!(
        "[[target]]\nname = \"mirror\"\nurl = \"{url}\"\nheaders = {{ Authorization = \"${{MIRROR_TOKEN}}\" }}\n\
         [[target]]\nname = \"stranger\"\nurl = \"{url}\"\nheaders = {{ Authorization = \"Bearer wrong-token\" }}\n"
    );
    let targets = Targets::parse(&text, "sources.toml", |var| {
        (var == "MIRROR_TOKEN").then(|| TOKEN.to_string())
    })
    .unwrap();
    Publishers::new(Arc::new(targets), trust)
}

#[tokio::test]
async fn a_mirror_answering_500_once_is_tried_again() {
    let state = Arc::new(Mirror::default());
    state.fail.store(1, Ordering::SeqCst);
    let base = serve(state.clone()).await;
    let publisher = publishers(&format!("{base}/")).get("mirror").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, sha256) = file(dir.path(), 1 << 20);
    let sent = AtomicU64::new(0);
    let progress = |n: u64| {
        sent.fetch_add(n, Ordering::Relaxed);
    };
    let body = Body::File {
        path,
        bytes: contents.len() as u64,
        sha256: Some(sha256),
        vouched: None,
    };
    publisher
        .put(&key("m.bin"), body, &progress, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(state.puts.load(Ordering::SeqCst), 2);
    assert_eq!(state.objects.lock().unwrap().get("/m.bin"), Some(&contents));
    assert_eq!(
        sent.load(Ordering::Relaxed),
        contents.len() as u64,
        "bytes sent again are not counted twice"
    );

    // Always failing: the last answer is reported after a few tries.
    state.fail.store(100, Ordering::SeqCst);
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    let error = publisher
        .put(&key("n.bin"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "target \"mirror\" ({base}/) refused the upload of n.bin: it answered 500 Internal \
             Server Error: busy, try again"
        )
    );
    assert_eq!(state.puts.load(Ordering::SeqCst), 2 + 4);
}

#[tokio::test]
async fn a_redirect_is_refused_and_its_target_never_sees_the_credentials() {
    let elsewhere = Arc::new(Mirror::default());
    let elsewhere_base = serve(elsewhere.clone()).await;
    let state = Arc::new(Mirror::default());
    *state.moved_to.lock().unwrap() = elsewhere_base.clone();
    let base = serve(state.clone()).await;
    let publisher = publishers(&format!("{base}/moved/")).get("mirror").unwrap();
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
    };
    let error = publisher
        .put(&key("x.json"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Refused { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "target \"mirror\" ({base}/moved/) refused the upload of x.json: it answered 307 \
             Temporary Redirect, to {elsewhere_base}/x.json: berth does not follow a target's \
             redirects (its credentials would go along); set the target's url to where the \
             mirror takes uploads"
        )
    );
    assert!(
        elsewhere.seen.lock().unwrap().is_empty(),
        "nothing went to the redirect's target"
    );

    let error = publisher
        .stat(&key("x.json"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("it answered 307 Temporary Redirect"),
        "{error}"
    );
    assert!(elsewhere.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_file_that_is_not_the_verified_one_never_reaches_the_mirror_whole() {
    let state = Arc::new(Mirror::default());
    let base = serve(state.clone()).await;
    let publisher = publishers(&format!("{base}/")).get("mirror").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (path, contents, _) = file(dir.path(), (1 << 20) + 3);
    let wrong = "ab".repeat(32);
    let body = file_body(&path, &contents, Some(&wrong));
    let error = publisher
        .put(&key("m.bin"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Source { .. }), "{error:?}");
    let error = error.to_string();
    assert_not_the_verified_one(&error, "mirror", "m.bin", &path, &wrong);
    assert!(state.objects.lock().unwrap().is_empty());
    assert_eq!(
        state.puts.load(Ordering::SeqCst),
        0,
        "the body never came whole: no PUT was handled"
    );
}

#[tokio::test]
async fn wrong_credentials_name_the_target_and_never_the_secret() {
    let state = Arc::new(Mirror::default());
    let base = serve(state.clone()).await;
    let publisher = publishers(&format!("{base}/")).get("stranger").unwrap();
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    let error = publisher
        .put(&key("x"), body, &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        format!(
            "target \"stranger\" ({base}/) refused the upload of x: it answered 401 Unauthorized: \
             unauthorized: got (redacted)"
        )
    );
}

#[tokio::test]
async fn a_put_to_a_closed_port_is_reported_unreachable_and_cancel_stops_the_tries() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let publisher = publishers(&format!("{base}/")).get("mirror").unwrap();
    let cancel = CancellationToken::new();
    let started = std::time::Instant::now();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        stop.cancel();
    });
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    let error = publisher
        .put(&key("x"), body, &|_| {}, &cancel)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Cancelled), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));

    let error = publisher.stat(&key("x")).await.unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "cannot reach target \"mirror\" ({base}/) for the look-up of x: "
        )),
        "{error}"
    );
}

#[tokio::test]
async fn an_https_mirror_is_trusted_through_the_ca_file_as_sources_are() {
    let state = Arc::new(Mirror::default());
    let ca = crate::test_tls::TestCa::new("mirror-ca");
    let address = crate::test_tls::serve(app(state.clone()), ca.server(&["127.0.0.1"])).await;
    let url = format!("https://{address}/");
    let body = || Body::Bytes {
        bytes: bytes::Bytes::from_static(b"{}"),
        content_type: "application/json".into(),
    };

    let untrusting = publishers(&url).get("mirror").unwrap();
    let error = untrusting
        .put(&key("x.json"), body(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!(
            "cannot reach target \"mirror\" ({url}) for the upload of x.json: "
        )) && error.ends_with(
            " (the certificate is signed by a CA berth does not trust: give the server that CA \
             with --ca-file)"
        ),
        "{error}"
    );

    let dir = tempfile::tempdir().unwrap();
    let trust = Trust::load(&ca.write(dir.path(), "ca.pem")).unwrap();
    let trusting = publishers_trusting(&url, &trust).get("mirror").unwrap();
    trusting
        .put(&key("x.json"), body(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        state
            .objects
            .lock()
            .unwrap()
            .get("/x.json")
            .map(Vec::as_slice),
        Some(&b"{}"[..])
    );
}

#[tokio::test]
async fn http_conforms() {
    let state = Arc::new(Mirror::default());
    let base = serve(state.clone()).await;
    let publishers = publishers(&format!("{base}/base/"));
    let url = publishers.get("mirror").unwrap().url(&key("x")).unwrap();
    let base_path = url.strip_suffix("/x").unwrap().to_string();
    let held = state.clone();
    let target = Target {
        publisher: publishers.get("mirror").unwrap(),
        key: |check, path| key(&format!("{check}/{path}")),
        read_back: Box::new(move |k| {
            let path = format!(
                "{}/{}",
                base_path,
                k.segments().map(escaped).collect::<Vec<_>>().join("/")
            );
            let path = url::Url::parse(&path).unwrap().path().to_string();
            let found = held.objects.lock().unwrap().get(&path).cloned();
            Box::pin(async move { found })
        }),
        // A mirror takes a body whole or not at all.
        leftovers: Box::new(|| Box::pin(async { Vec::new() })),
        secret: Some(TOKEN.to_string()),
        stranger: Some((
            publishers.get("stranger").unwrap(),
            "Bearer wrong-token".to_string(),
        )),
        refused_key: None,
        told_while_sending: false,
    };
    conforms(&target).await;
}

/// A key's segment as a url path holds it.
fn escaped(segment: &str) -> String {
    let mut url = url::Url::parse("http://h/").unwrap();
    url.path_segments_mut().unwrap().push(segment);
    url.path()[1..].to_string()
}
