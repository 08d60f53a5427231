//! What a deployer may reach: the `http-publish` example uploading to a
//! loopback mirror through the real server, the manifest's `allowed_hosts`
//! as the only way out (no manifest, another host, a redirect elsewhere),
//! its `env` as the only variables a plugin sees, and bad manifests refused
//! with their reason while the other plugins load.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::mirror::{Answer, Mirror};
use crate::support::server::{Backend, Berth, Options};
use crate::support::tls::TestCa;
use crate::support::{adapter_files, assert_error, bytes, model, on_both_backends, plugins};

on_both_backends!(
    http_publish_uploads_byte_identical_files_with_the_token,
    without_a_manifest_no_request_leaves_the_sandbox,
    a_manifest_for_another_host_lets_nothing_through,
    a_redirect_to_an_ungranted_host_is_not_followed,
    a_mirror_that_says_no_fails_the_deployment_naming_file_and_status,
    http_publish_refuses_bad_options_before_anything_is_fetched,
    a_plugin_sees_only_the_environment_its_manifest_grants,
    bad_manifests_reject_their_plugin_and_spare_the_others,
    http_publish_uploads_over_https_to_a_mirror_of_an_internal_ca_given_with_ca_file,
);

const TOKEN: &str = "s3cret-token-4711";

/// A server offering `http-publish` with a manifest granting `allowed_hosts`
/// (none when `None`) and the token from the server's environment.
async fn berth_with_publisher(backend: Backend, allowed_hosts: Option<&[String]>) -> Berth {
    publisher_options(Berth::options(backend), allowed_hosts)
        .start()
        .await
}

/// `options` with `http-publish` and its manifest, as `berth_with_publisher`.
fn publisher_options(options: Options, allowed_hosts: Option<&[String]>) -> Options {
    let mut options = options
        .plugin("http-publish", plugins::test_plugin("http-publish-0-1"))
        .env("TEST_MIRROR_TOKEN", TOKEN);
    if let Some(hosts) = allowed_hosts {
        let manifest = format!(
            "allowed_hosts = {}\nenv = {{ MIRROR_TOKEN = \"${{TEST_MIRROR_TOKEN}}\" }}\n",
            json!(hosts)
        );
        options = options.plugins_file("http-publish.toml", manifest);
    }
    options
}

/// The model every test here publishes: the usual adapter and a name that
/// needs escaping in a URL.
fn publish_files() -> Vec<(&'static str, Vec<u8>)> {
    let mut files = adapter_files();
    files.push(("notes/read me.txt", bytes(3, 1000)));
    files
}

async fn http_publish_uploads_byte_identical_files_with_the_token(backend: Backend) {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Store).await;
    let berth = berth_with_publisher(backend, Some(&[mirror.host()])).await;
    let contents = publish_files();
    let id = berth
        .register(&model(&files, "job-publish", &contents))
        .await;

    let base_url = format!("http://{}/mirror/v1/", mirror.host());
    let (status, deployment) = berth
        .deploy(id, "http-publish", json!({ "base_url": base_url }))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed");
    let deploy_id = deployment["id"].as_i64().unwrap();
    assert_eq!(
        deployment["ref"],
        format!("http://{}/mirror/v1/{deploy_id}/", mirror.host())
    );
    let total: usize = contents.iter().map(|(_, b)| b.len()).sum();
    let listed: Vec<Value> = contents
        .iter()
        .map(|(path, b)| json!({ "path": path, "bytes": b.len(), "status": 201 }))
        .collect();
    assert_eq!(
        deployment["details"],
        json!({ "files": listed, "bytes": total })
    );

    // One PUT per file, in order, at its escaped path, byte-identical, with the token.
    let received = mirror.received();
    let paths: Vec<_> = received.iter().map(|r| r.path.as_str()).collect();
    let prefix = format!("/mirror/v1/{deploy_id}");
    assert_eq!(
        paths,
        [
            format!("{prefix}/adapter_config.json"),
            format!("{prefix}/adapter_model.safetensors"),
            format!("{prefix}/tokenizer/tokenizer.json"),
            format!("{prefix}/notes/read%20me.txt"),
        ]
    );
    for (request, (path, bytes)) in received.iter().zip(&contents) {
        assert_eq!(request.method, "PUT", "{path}");
        assert!(request.body == *bytes, "{path}: the mirror got other bytes");
        assert_eq!(
            request.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str()),
            "{path}"
        );
        assert_eq!(
            request.content_type.as_deref(),
            Some("application/octet-stream"),
            "{path}"
        );
        assert_eq!(request.content_length, Some(bytes.len() as u64), "{path}");
    }
    let (_, stored) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
    assert_eq!(stored, deployment, "the row holds the ref and details");
    assert!(
        !berth.log().contains(TOKEN),
        "the token never reaches the server's log"
    );

    // A variable the manifest does not grant is simply not there: no token sent.
    let (status, second) = berth
        .deploy(
            id,
            "http-publish",
            json!({ "base_url": base_url, "token_env": "TEST_MIRROR_TOKEN" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let received = mirror.received();
    assert_eq!(received.len(), 2 * contents.len());
    assert!(
        received[contents.len()..]
            .iter()
            .all(|r| r.authorization.is_none())
    );
}

async fn without_a_manifest_no_request_leaves_the_sandbox(backend: Backend) {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Store).await;
    let berth = berth_with_publisher(backend, None).await;
    let id = berth
        .register(&model(&files, "job-no-manifest", &publish_files()))
        .await;

    let base_url = format!("http://{}/mirror", mirror.host());
    let answer = berth
        .deploy(id, "http-publish", json!({ "base_url": base_url }))
        .await;
    assert_error(
        &answer,
        StatusCode::BAD_GATEWAY,
        &format!(
            "adapter_config.json: the host refused the request to {}: not in allowed_hosts of the plugin's manifest",
            mirror.host()
        ),
    );
    assert_eq!(answer.1["status"], "failed");
    assert_eq!(mirror.received().len(), 0);
}

async fn a_manifest_for_another_host_lets_nothing_through(backend: Backend) {
    let files = FileServer::start().await;
    let granted = Mirror::start(Answer::Store).await;
    let other = Mirror::start(Answer::Store).await;
    let berth = berth_with_publisher(backend, Some(&[granted.host()])).await;
    let id = berth
        .register(&model(&files, "job-other-host", &publish_files()))
        .await;

    // Another port of the same address, and the granted port under another
    // name for the same address: both are other hosts.
    let port = granted.addr.port();
    for host in [other.host(), format!("localhost:{port}")] {
        let base_url = format!("http://{host}/mirror");
        assert_error(
            &berth
                .deploy(id, "http-publish", json!({ "base_url": base_url }))
                .await,
            StatusCode::BAD_GATEWAY,
            &format!("the host refused the request to {host}: not in allowed_hosts"),
        );
    }
    assert_eq!(granted.received().len(), 0);
    assert_eq!(other.received().len(), 0);
}

async fn a_redirect_to_an_ungranted_host_is_not_followed(backend: Backend) {
    let files = FileServer::start().await;
    let elsewhere = Mirror::start(Answer::Store).await;
    let granted = Mirror::start(Answer::Redirect(format!("http://{}", elsewhere.host()))).await;
    let berth = berth_with_publisher(backend, Some(&[granted.host()])).await;
    let id = berth
        .register(&model(&files, "job-redirect", &publish_files()))
        .await;

    let base_url = format!("http://{}/mirror", granted.host());
    let answer = berth
        .deploy(id, "http-publish", json!({ "base_url": base_url }))
        .await;
    let deploy_id = &answer.1["id"];
    assert_error(
        &answer,
        StatusCode::BAD_GATEWAY,
        &format!(
            "adapter_config.json: the mirror answered 307 to PUT http://{}/mirror/{deploy_id}/adapter_config.json \
             (a redirect to http://{}/mirror/{deploy_id}/adapter_config.json; http-publish does not follow redirects",
            granted.host(),
            elsewhere.host()
        ),
    );
    assert_eq!(answer.1["status"], "failed");
    assert_eq!(
        granted.received().len(),
        1,
        "the first file's PUT, and nothing after it"
    );
    assert_eq!(
        elsewhere.received().len(),
        0,
        "the redirect's target never heard from the plugin"
    );
}

async fn a_mirror_that_says_no_fails_the_deployment_naming_file_and_status(backend: Backend) {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Store).await;
    mirror.answer(
        "tokenizer/tokenizer.json",
        Answer::Status(507, "quota exceeded for /mirror"),
    );
    let berth = berth_with_publisher(backend, Some(&[mirror.host()])).await;
    let id = berth
        .register(&model(&files, "job-refused", &publish_files()))
        .await;

    let base_url = format!("http://{}/mirror", mirror.host());
    let answer = berth
        .deploy(id, "http-publish", json!({ "base_url": base_url }))
        .await;
    let deploy_id = &answer.1["id"];
    assert_error(
        &answer,
        StatusCode::BAD_GATEWAY,
        &format!(
            "tokenizer/tokenizer.json: the mirror answered 507 to PUT http://{}/mirror/{deploy_id}/tokenizer/tokenizer.json: quota exceeded for /mirror",
            mirror.host()
        ),
    );
    // The files before it went up; the one after was never tried.
    assert_eq!(mirror.received().len(), 3);
}

async fn http_publish_refuses_bad_options_before_anything_is_fetched(backend: Backend) {
    let files = FileServer::start().await;
    let berth = berth_with_publisher(backend, Some(&["127.0.0.1:9".to_string()])).await;
    let id = berth
        .register(&model(&files, "job-options", &publish_files()))
        .await;
    let cases = [
        (json!({}), "option \"base_url\" is required"),
        (
            json!({ "base_url": "ftp://mirror/x" }),
            "the scheme must be http or https",
        ),
        (
            json!({ "base_url": "mirror.internal/x" }),
            "expected an http:// or https:// URL",
        ),
        (
            json!({ "base_url": 5 }),
            "option \"base_url\" must be a string",
        ),
        (json!({ "base_url": "http:///x" }), "has no host"),
        (
            json!({ "base_url": "http://m:99999/x" }),
            "the port \"99999\" must be a number",
        ),
        (
            json!({ "base_url": "http://m/x?y=1" }),
            "must not have a query or fragment",
        ),
        (
            json!({ "base_url": "http://user:pw@m/x" }),
            "must not contain credentials",
        ),
        (
            json!({ "base_url": "http://m/x", "token_env": "1X" }),
            "option \"token_env\" must name an environment variable",
        ),
        (
            json!({ "base_url": "http://m/x", "bse_url": 1 }),
            "unknown option \"bse_url\"",
        ),
    ];
    for (options, expected) in cases {
        let answer = berth.deploy(id, "http-publish", options).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, expected);
    }
    assert_eq!(files.total_hits(), 0);
    let (_, listing) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    assert_eq!(listing["deployments"], json!([]));
}

async fn a_plugin_sees_only_the_environment_its_manifest_grants(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::options(backend)
        .plugins_file("misbehave.toml", "env = { A = \"${TEST_GRANTED}\" }\n")
        .env("TEST_GRANTED", "one")
        .env("TEST_NOT_GRANTED", "two")
        .start()
        .await;
    let id = berth
        .register(&model(&files, "job-env", &adapter_files()))
        .await;
    let (status, deployment) = berth
        .deploy(id, "misbehave", json!({ "mode": "env" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    // Not the server's PATH, HOME or its other variables: exactly the grant.
    assert_eq!(deployment["details"]["env"], json!({ "A": "one" }));
}

async fn bad_manifests_reject_their_plugin_and_spare_the_others(backend: Backend) {
    // (plugin name, its manifest, what the reason says)
    let cases = [
        (
            "missing-env",
            "env = { MIRROR_TOKEN = \"${BERTH_TEST_NEVER_SET}\" }",
            "env.MIRROR_TOKEN: the host environment variable BERTH_TEST_NEVER_SET is not set",
        ),
        (
            "unknown-key",
            "allowed_host = [\"127.0.0.1:9\"]",
            "unknown field `allowed_host`",
        ),
        (
            "bad-host",
            "allowed_hosts = [\"mirror.internal/models\"]",
            "allowed host \"mirror.internal/models\"",
        ),
        (
            "bad-memory",
            "memory_mib = 0",
            "memory_mib = 0: must be between",
        ),
        ("bad-type", "timeout_s = \"long\"", "invalid type"),
        ("not-toml", "allowed_hosts = [", "manifest not-toml.toml"),
    ];
    let mut options = berth_options_with_publisher(backend);
    for (name, manifest, _) in &cases {
        options = options
            .plugin(name, plugins::test_plugin("http-publish-0-1"))
            .plugins_file(&format!("{name}.toml"), *manifest);
    }
    let berth = options.start().await;

    let (status, body) = berth.get("/v1/deployers").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<_> = body["deployers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].clone())
        .collect();
    assert_eq!(names, ["archive", "http-publish", "misbehave"], "{body}");
    let rejected: BTreeMap<String, String> = body["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["file"].as_str().unwrap().to_string(),
                r["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(rejected.len(), cases.len(), "{body}");
    for (name, _, expected) in cases {
        let reason = &rejected[&format!("{name}.wasm")];
        assert!(
            reason.starts_with(&format!("manifest {name}.toml: ")),
            "{name}: {reason}"
        );
        assert!(
            reason.contains(expected),
            "{name}: expected {expected:?} in {reason:?}"
        );
    }
}

/// The default plugins and `http-publish` with a valid manifest.
fn berth_options_with_publisher(backend: Backend) -> Options {
    Berth::options(backend)
        .plugin("http-publish", plugins::test_plugin("http-publish-0-1"))
        .plugins_file(
            "http-publish.toml",
            "allowed_hosts = [\"127.0.0.1:9\"]\nenv = { MIRROR_TOKEN = \"${TEST_MIRROR_TOKEN}\" }\n",
        )
        .env("TEST_MIRROR_TOKEN", TOKEN)
}

/// A granted host *name* that resolves to this machine: the name is in the
/// manifest, but the address it leads to is internal and is not, so
/// nothing leaves; granting the address itself is what the tests above do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_name_that_resolves_to_an_internal_address_is_refused() {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Store).await;
    let name = format!("localhost:{}", mirror.addr.port());
    let berth = berth_with_publisher(Backend::Sqlite, Some(std::slice::from_ref(&name))).await;
    let id = berth
        .register(&model(&files, "job-internal", &publish_files()))
        .await;
    let base_url = format!("http://{name}/mirror");
    let (status, failed) = berth
        .deploy(id, "http-publish", json!({ "base_url": base_url }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_eq!(failed["status"], "failed");
    assert_eq!(mirror.received().len(), 0, "nothing reached the mirror");
    let log = berth
        .logged(&format!(
            "outgoing request to {name} refused: localhost resolves to"
        ))
        .await;
    assert!(
        log.contains("an internal address; grant the address itself in allowed_hosts"),
        "{log}"
    );
}

/// A mirror on HTTPS whose certificate an internal CA signed: the upload
/// fails the certificate check while the server trusts only the public
/// roots, and goes through, byte for byte, once the server is given the CA
/// with `--ca-file`. Granted by address, so reached at exactly that
/// address by the gate's own connection.
async fn http_publish_uploads_over_https_to_a_mirror_of_an_internal_ca_given_with_ca_file(
    backend: Backend,
) {
    let files = FileServer::start().await;
    let ca = TestCa::new("mirror CA");
    let mirror = Mirror::start_tls(Answer::Store, &ca).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write(dir.path(), "mirror-ca.pem");
    let base_url = format!("https://{}/mirror/v1/", mirror.host());
    let contents = publish_files();

    let untrusting = berth_with_publisher(backend, Some(&[mirror.host()])).await;
    let id = untrusting
        .register(&model(&files, "job-https", &contents))
        .await;
    let (status, failed) = untrusting
        .deploy(id, "http-publish", json!({ "base_url": base_url }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_eq!(failed["status"], "failed");
    assert_eq!(
        failed["error"],
        format!(
            "deployer http-publish: adapter_config.json: {}: its TLS certificate is not trusted",
            mirror.host()
        )
    );
    let log = untrusting.log();
    assert!(
        log.contains(&format!(
            "outgoing request to {} failed: TLS with 127.0.0.1 at {} failed: invalid peer certificate: \
             UnknownIssuer (the certificate is signed by a CA berth does not trust: give the \
             server that CA with --ca-file)",
            mirror.host(),
            mirror.host()
        )),
        "{log}"
    );
    assert_eq!(mirror.received().len(), 0);

    let options = Berth::options(backend)
        .arg("--ca-file")
        .arg(ca_file.to_str().unwrap());
    let berth = publisher_options(options, Some(&[mirror.host()]))
        .start()
        .await;
    let id = berth.register(&model(&files, "job-https", &contents)).await;
    let (status, deployment) = berth
        .deploy(id, "http-publish", json!({ "base_url": base_url }))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed");
    let received = mirror.received();
    assert_eq!(received.len(), contents.len());
    for (request, (path, bytes)) in received.iter().zip(&contents) {
        assert_eq!(request.method, "PUT", "{path}");
        assert!(request.body == *bytes, "{path}: the mirror got other bytes");
    }
    assert!(berth.log().contains("CA file loaded"), "{}", berth.log());
}
