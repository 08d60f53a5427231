//! The token flow against a registry stand-in on loopback (the CNCF
//! registry of the e2e tests speaks only Basic): a 401 with a Bearer
//! challenge, a token earned once per scope with the login, a blob
//! redirect followed without credentials.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::*;
use base64::Engine;
use sha2::{Digest, Sha256};

#[derive(Clone, Default)]
struct Counts {
    tokens: Arc<AtomicUsize>,
    leaked: Arc<AtomicUsize>,
}

const MANIFEST: &str = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[{"mediaType":"application/octet-stream","digest":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","size":3,"annotations":{"org.opencontainers.image.title":"a.bin"}}]}"#;

async fn start(counts: Counts) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let realm = format!("http://{addr}/token");
    let guarded = move |headers: HeaderMap, body: Response| {
        if headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer tok-1") {
            body
        } else {
            (
                StatusCode::UNAUTHORIZED,
                [("www-authenticate", format!(r#"Bearer realm="{realm}",service="test",scope="repository:m:pull""#))],
            )
                .into_response()
        }
    };
    let manifest = {
        let guarded = guarded.clone();
        move |headers: HeaderMap| async move {
            guarded(headers, ([("content-type", manifest::OCI_MANIFEST)], MANIFEST).into_response())
        }
    };
    let blob = move |headers: HeaderMap| async move {
        guarded(headers, (StatusCode::TEMPORARY_REDIRECT, [("location", "/storage/a")]).into_response())
    };
    let app = axum::Router::new()
        .route("/v2/m/manifests/t", get(manifest))
        .route("/v2/m/blobs/{digest}", get(blob))
        .route(
            "/storage/a",
            get(|State(c): State<Counts>, headers: HeaderMap| async move {
                if headers.contains_key("authorization") {
                    c.leaked.fetch_add(1, Ordering::SeqCst);
                }
                "abc"
            }),
        )
        .route(
            "/token",
            get(
                |State(c): State<Counts>, headers: HeaderMap, Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    c.tokens.fetch_add(1, Ordering::SeqCst);
                    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("ci:right"));
                    let ok = headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(basic.as_str())
                        && q.get("scope").map(String::as_str) == Some("repository:m:pull")
                        && q.get("service").map(String::as_str) == Some("test");
                    if ok {
                        (StatusCode::OK, r#"{"token":"tok-1","expires_in":300}"#).into_response()
                    } else {
                        StatusCode::UNAUTHORIZED.into_response()
                    }
                },
            ),
        )
        .with_state(counts);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr.to_string()
}

fn client(addr: &str, password: Option<&str>) -> Registry {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = password.map(|p| Login {
        username: "ci".into(),
        password: p.into(),
    });
    Registry::new(http, addr, login, Some(format!("the sources file's prefix oci://{addr}/")))
}

#[tokio::test]
async fn a_bearer_challenge_earns_one_token_for_every_request_of_its_scope() {
    let counts = Counts::default();
    let addr = start(counts.clone()).await;
    let registry = client(&addr, Some("right"));
    let (digest, manifest, _) = registry.manifest("m", "t").await.unwrap();
    assert_eq!(digest, hex::encode(Sha256::digest(MANIFEST)));
    assert_eq!(manifest.files().unwrap()[0].path, "a.bin");
    let blob = registry.blob("m", &"a".repeat(64), None).await.unwrap();
    assert_eq!(blob.text().await.unwrap(), "abc");
    assert_eq!(counts.tokens.load(Ordering::SeqCst), 1, "one token for the scope");
    assert_eq!(counts.leaked.load(Ordering::SeqCst), 0, "the redirect carried credentials");
}

#[tokio::test]
async fn a_refused_or_missing_login_is_named_without_its_secret() {
    let addr = start(Counts::default()).await;
    let e = client(&addr, Some("wrong")).manifest("m", "t").await.unwrap_err();
    assert_eq!(
        e,
        format!("the registry {addr} refused the login of the sources file's prefix oci://{addr}/ for m: check them")
    );
    assert!(!e.contains("wrong"));
    let http = reqwest::Client::new();
    let e = Registry::new(http, &addr, None, None).manifest("m", "t").await.unwrap_err();
    assert!(e.starts_with(&format!("the registry {addr} asks for a login for m and none is configured")), "{e}");
}
