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
                [(
                    "www-authenticate",
                    format!(r#"Bearer realm="{realm}",service="test",scope="repository:m:pull""#),
                )],
            )
                .into_response()
        }
    };
    let manifest = {
        let guarded = guarded.clone();
        move |headers: HeaderMap| async move {
            guarded(
                headers,
                ([("content-type", manifest::OCI_MANIFEST)], MANIFEST).into_response(),
            )
        }
    };
    let blob = move |headers: HeaderMap| async move {
        guarded(
            headers,
            (StatusCode::TEMPORARY_REDIRECT, [("location", "/storage/a")]).into_response(),
        )
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
                |State(c): State<Counts>,
                 headers: HeaderMap,
                 Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    c.tokens.fetch_add(1, Ordering::SeqCst);
                    let basic = format!(
                        "Basic {}",
                        base64::engine::general_purpose::STANDARD.encode("ci:right")
                    );
                    let ok = headers.get("authorization").and_then(|v| v.to_str().ok())
                        == Some(basic.as_str())
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
    Registry::new(
        http,
        addr,
        login,
        Some(format!("the sources file's prefix oci://{addr}/")),
    )
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
    assert_eq!(
        counts.tokens.load(Ordering::SeqCst),
        1,
        "one token for the scope"
    );
    assert_eq!(
        counts.leaked.load(Ordering::SeqCst),
        0,
        "the redirect carried credentials"
    );
}

#[tokio::test]
async fn a_refused_or_missing_login_is_named_without_its_secret() {
    let addr = start(Counts::default()).await;
    let e = client(&addr, Some("wrong"))
        .manifest("m", "t")
        .await
        .unwrap_err();
    assert!(matches!(e, super::Error::Answered(_)), "{e:?}");
    let e = e.to_string();
    assert_eq!(
        e,
        format!(
            "the registry {addr} refused the login of the sources file's prefix oci://{addr}/ for m: check them"
        )
    );
    assert!(!e.contains("wrong"));
    let http = reqwest::Client::new();
    let e = Registry::new(http, &addr, None, None)
        .manifest("m", "t")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "the registry {addr} asks for a login for m and none is configured"
        )),
        "{e}"
    );
}

/// No answer at all is told apart from an answer: what a publisher tries
/// again.
#[tokio::test]
async fn a_registry_that_does_not_answer_is_unreachable() {
    let http = reqwest::Client::new();
    let e = Registry::new(http, "127.0.0.1:9", None, None)
        .manifest("m", "t")
        .await
        .unwrap_err();
    match e {
        super::Error::Unreachable(said) => {
            assert!(
                said.starts_with("cannot reach the registry 127.0.0.1:9"),
                "{said}"
            )
        }
        other => panic!("not unreachable: {other:?}"),
    }
}

use super::test_registry as real;

/// Against the CNCF registry: an artifact pushed by hand is read back as
/// files, by tag and by digest, with and without a login.
#[tokio::test]
async fn a_real_registry_serves_a_pushed_model_by_tag_and_digest() {
    for registry in [real::Registry::start(), real::Registry::with_login()] {
        let files = [
            ("config.json", b"{\"r\": 8}".to_vec()),
            ("w/model.bin", vec![7u8; 70_000]),
        ];
        let (digest, pushed) = registry.push_model("team/ft", "job-1", &files).await;
        let login = registry.basic_auth.then(|| Login {
            username: real::USER.into(),
            password: real::PASSWORD.into(),
        });
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let client = Registry::new(http, &registry.host, login, None);
        let (by_tag, manifest, _) = client.manifest("team/ft", "job-1").await.unwrap();
        assert_eq!(by_tag, digest);
        let listed = manifest.files().unwrap();
        let want: Vec<_> = pushed
            .iter()
            .map(|p| (p.path.clone(), p.size, p.sha256.clone()))
            .collect();
        let got: Vec<_> = listed
            .iter()
            .map(|f| (f.path.clone(), f.size, f.sha256.clone()))
            .collect();
        assert_eq!(got, want);
        let (by_digest, _, _) = client
            .manifest("team/ft", &format!("sha256:{digest}"))
            .await
            .unwrap();
        assert_eq!(by_digest, digest);

        let blob = client
            .blob("team/ft", &pushed[1].sha256, Some("bytes=10-19".into()))
            .await
            .unwrap();
        assert_eq!(blob.status(), 206);
        assert_eq!(blob.bytes().await.unwrap().as_ref(), &[7u8; 10]);
        assert_eq!(
            client
                .blob_size("team/ft", &pushed[1].sha256, Access::Pull)
                .await
                .unwrap(),
            Some(70_000)
        );
        assert_eq!(
            client
                .blob_size("team/ft", &"0".repeat(64), Access::Pull)
                .await
                .unwrap(),
            None
        );

        let e = client.manifest("team/ft", "job-2").await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the registry {} has no manifest oci://{}/team/ft:job-2",
                registry.host, registry.host
            )
        );
        if registry.basic_auth {
            let http = reqwest::Client::new();
            let wrong = Login {
                username: real::USER.into(),
                password: "nope".into(),
            };
            let e = Registry::new(
                http,
                &registry.host,
                Some(wrong),
                Some("the test's login".into()),
            )
            .manifest("team/ft", "job-1")
            .await
            .unwrap_err()
            .to_string();
            assert!(e.contains("refused the login of the test's login"), "{e}");
        }
    }
}
