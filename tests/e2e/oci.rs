//! Models in an OCI registry (Debian's CNCF distribution registry,
//! `tests/registry/`), through the real server: registered by tag with
//! their files read from the manifest and the source pinned (a tag moved
//! later changes nothing); files fetched as blobs by digest over several
//! connections, with the sources file's login; a damaged blob fails its
//! verification; a wrong login, a bad reference, a missing tag and a
//! manifest naming no file are each refused with a sentence.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::proxy::Proxy;
use crate::support::registry::{PASSWORD, Registry, USER};
use crate::support::server::{Backend, Berth};
use crate::support::{bytes, sha256_hex};

const REPO: &str = "team/support-bot";

/// A registry with a login, a counting proxy in front of it that caps each
/// connection at 2 MB/s (as a CDN would: more connections pay, clearly
/// enough on a loaded machine), and berth with a sources file giving
/// `password` for the proxy's `oci://` prefix.
struct Setup {
    registry: Registry,
    proxy: Proxy,
    berth: Berth,
    _temp: tempfile::TempDir,
}

async fn setup(password: &str) -> Setup {
    let registry = Registry::with_login();
    let proxy = Proxy::capped(registry.host.parse().unwrap(), Some(2_000_000)).await;
    let temp = tempfile::tempdir().unwrap();
    let sources_file = temp.path().join("sources.toml");
    std::fs::write(
        &sources_file,
        format!(
            "[[source]]\nprefix = \"oci://{}/team/\"\n\
             options = {{ username = \"{USER}\", password = \"${{REGISTRY_PASSWORD}}\" }}",
            proxy.addr
        ),
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(sources_file.to_str().unwrap())
        .arg("--fetch-piece-mib")
        .arg("1")
        .env("REGISTRY_PASSWORD", password)
        .start()
        .await;
    Setup {
        registry,
        proxy,
        berth,
        _temp: temp,
    }
}

fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("adapter_config.json", bytes(81, 300)),
        ("weights/adapter_model.safetensors", bytes(82, 12 << 20)),
    ]
}

/// A registration of `files` at `source`, each with its digest.
fn model(job_id: &str, source: &str, files: &[(&str, Vec<u8>)]) -> Value {
    json!({
        "name": "oci", "job_id": job_id, "base_model": "b", "model_size": "s", "dataset": "d",
        "source": source,
        "files": files.iter().map(|(path, contents)| json!({
            "path": path, "size_bytes": contents.len(), "sha256": sha256_hex(contents),
        })).collect::<Vec<_>>(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_in_a_registry_is_fetched_by_digest_over_several_connections() {
    let s = setup(PASSWORD).await;
    let files = files();
    let (digest, _) = s.registry.push_model(REPO, "job-oci", &files).await;
    let source = format!("oci://{}/{REPO}@sha256:{digest}", s.proxy.addr);
    let id = s.berth.register(&model("job-oci", &source, &files)).await;
    let before = s.proxy.accepted();

    let (status, body) = s.berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "completed", "{body}");
    for (path, contents) in &files {
        assert!(
            std::fs::read(s.berth.model_dir("job-oci").join(path)).unwrap() == *contents,
            "{path} is the registry's blob"
        );
    }
    let connections = s.proxy.accepted() - before;
    assert!(
        connections >= 3,
        "12 MiB in 1 MiB pieces came over {connections} connections"
    );
    assert!(
        !s.berth.log().contains(PASSWORD),
        "the log shows the password"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_blob_fails_verification_and_a_wrong_login_is_named() {
    let s = setup(PASSWORD).await;
    let files = files();
    let (digest, pushed) = s.registry.push_model(REPO, "job-bad", &files).await;
    // Same size, other bytes: only the digest can tell.
    let config = &pushed[0];
    std::fs::write(s.registry.blob_file(&config.sha256), bytes(99, 300)).unwrap();
    let source = format!("oci://{}/{REPO}@sha256:{digest}", s.proxy.addr);
    // Same size: the registration's check of the source passes it.
    let id = s.berth.register(&model("job-bad", &source, &files)).await;
    let (_, body) = s.berth.deploy(id, "archive", json!({})).await;
    assert_eq!(body["status"], "failed", "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "file adapter_config.json: sha256 mismatch: expected {}, got {} (oci://{}/{REPO}@sha256:{})",
            config.sha256,
            sha256_hex(&bytes(99, 300)),
            s.proxy.addr,
            config.sha256
        )),
        "{error}"
    );
    assert!(
        !s.berth
            .model_dir("job-bad")
            .join("adapter_config.json")
            .exists(),
        "a damaged file is never put in place"
    );

    let wrong = setup("not-the-password").await;
    let (digest, _) = wrong.registry.push_model(REPO, "job-login", &files).await;
    let source = format!("oci://{}/{REPO}@sha256:{digest}", wrong.proxy.addr);
    // The registration's check of the source meets the refused login
    // first; registered unchecked, the deployment meets it.
    let mut login = model("job-login", &source, &files);
    let (status, refused) = wrong.berth.post("/v1/models", &login).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("refused the login of the sources file's prefix"),
        "{refused}"
    );
    login["check_source"] = json!(false);
    let id = wrong.berth.register(&login).await;
    let (_, body) = wrong.berth.deploy(id, "archive", json!({})).await;
    assert_eq!(body["status"], "failed", "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "the registry {0} refused the login of the sources file's prefix oci://{0}/team/ for {REPO}: check them",
            wrong.proxy.addr
        )),
        "{error}"
    );
    assert!(!error.contains("not-the-password"));
}

/// A registration by reference, without files.
fn by_reference(job_id: &str, source: &str) -> Value {
    json!({
        "name": "oci", "job_id": job_id, "base_model": "b", "source": source,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_registered_by_tag_is_pinned_and_deploys_its_bytes_after_the_tag_moves() {
    let s = setup(PASSWORD).await;
    let files = files();
    let (digest, pushed) = s.registry.push_model(REPO, "latest-run", &files).await;
    let host = s.proxy.addr;
    let (status, model) = s
        .berth
        .post(
            "/v1/models",
            &by_reference("job-tag", &format!("oci://{host}/{REPO}:latest-run")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{model}");
    assert_eq!(
        model["source"],
        format!("oci://{host}/{REPO}@sha256:{digest}")
    );
    let listed: Vec<(String, u64, String)> = model["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().into(),
                f["size_bytes"].as_u64().unwrap(),
                f["sha256"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want: Vec<(String, u64, String)> = pushed
        .iter()
        .map(|p| (p.path.clone(), p.size, p.sha256.clone()))
        .collect();
    assert_eq!(listed, want);

    // The tag now names another model; the registered one keeps its own.
    let other = vec![("adapter_config.json", bytes(91, 300))];
    s.registry.push_model(REPO, "latest-run", &other).await;
    let (status, body) = s
        .berth
        .deploy(model["id"].as_i64().unwrap(), "archive", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (path, contents) in &files {
        assert!(
            std::fs::read(s.berth.model_dir("job-tag").join(path)).unwrap() == *contents,
            "{path}: the pinned bytes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_a_registry_cannot_list_are_refused_with_a_sentence() {
    let s = setup(PASSWORD).await;
    let host = s.proxy.addr;
    s.registry.push_model(REPO, "job-1", &files()).await;
    // A manifest whose layers name no file.
    let blob = s.registry.push_blob(REPO, b"raw".to_vec()).await;
    let config = s.registry.push_blob(REPO, b"{}".to_vec()).await;
    s.registry
        .push_manifest(
            REPO,
            "untitled",
            &json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{config}"), "size": 2},
                "layers": [{"mediaType": "application/octet-stream", "digest": format!("sha256:{blob}"), "size": 3}],
            }),
        )
        .await;
    let cases = [
        (
            format!("oci://{host}/Team/x:1"),
            "the repository \"Team/x\" must be lowercase".to_string(),
        ),
        (
            format!("oci://{host}/{REPO}:job-2"),
            format!("the registry {host} has no manifest oci://{host}/{REPO}:job-2"),
        ),
        (
            format!("oci://{host}/{REPO}:untitled"),
            format!("oci://{host}/{REPO}:untitled: none of the manifest's 1 layers names a file"),
        ),
    ];
    for (source, wanted) in cases {
        let answer = s
            .berth
            .post("/v1/models", &by_reference("job-no", &source))
            .await;
        crate::support::assert_error(&answer, StatusCode::BAD_REQUEST, &wanted);
    }

    let wrong = setup("not-the-password").await;
    wrong.registry.push_model(REPO, "job-1", &files()).await;
    let source = format!("oci://{}/{REPO}:job-1", wrong.proxy.addr);
    let answer = wrong
        .berth
        .post("/v1/models", &by_reference("job-no", &source))
        .await;
    crate::support::assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        &format!(
            "the registry {0} refused the login of the sources file's prefix oci://{0}/team/",
            wrong.proxy.addr
        ),
    );
    for berth in [&s.berth, &wrong.berth] {
        let (_, models) = berth.get("/v1/models").await;
        assert_eq!(
            models["models"],
            json!([]),
            "a refused registration stored a model"
        );
    }
}
