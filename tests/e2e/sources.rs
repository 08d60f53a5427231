//! Sources that need credentials, through the real server: a model in an
//! S3-compatible store (moto's, `tests/moto/`) deployed with the keys of
//! the server's sources file, which appear in no answer and no log line;
//! a model registered without files, which are listed at its prefix; and
//! a sources file or a CA file that cannot be used, which stops the start.

use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::moto;
use crate::support::server::{Backend, Berth};
use crate::support::{bytes, sha256_hex};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_in_an_object_store_is_deployed_with_the_servers_credentials() {
    let moto = moto::Moto::start(&["e2e-models"]);
    let store = AmazonS3Builder::new()
        .with_endpoint(&moto.endpoint)
        .with_allow_http(true)
        .with_region(&moto.region)
        .with_access_key_id(&moto.access_key_id)
        .with_secret_access_key(&moto.secret_access_key)
        .with_bucket_name("e2e-models")
        .build()
        .unwrap();
    let files = [
        ("adapter_model.safetensors", bytes(31, 2 * 1024 * 1024)),
        ("config/adapter_config.json", bytes(32, 400)),
    ];
    for (path, contents) in &files {
        store
            .put(
                &Key::from(format!("job-s3/{path}")),
                contents.clone().into(),
            )
            .await
            .unwrap();
    }
    let temp = tempfile::tempdir().unwrap();
    let sources_file = temp.path().join("sources.toml");
    std::fs::write(
        &sources_file,
        format!(
            "[[source]]\nprefix = \"s3://e2e-models/\"\noptions = {{ endpoint = \"{}\", \
             region = \"{}\", access_key_id = \"{}\", secret_access_key = \"${{MOTO_SECRET}}\" }}",
            moto.endpoint, moto.region, moto.access_key_id
        ),
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(sources_file.to_str().unwrap())
        .env("MOTO_SECRET", &moto.secret_access_key)
        .start()
        .await;

    let id = berth
        .register(&json!({
            "name": "s3", "job_id": "job-s3", "base_model": "b", "model_size": "s", "dataset": "d",
            "num_examples": 1, "num_train_steps": 1,
            "source": "s3://e2e-models/{job_id}/{path}",
            "files": files.iter().map(|(path, contents)| json!({
                "path": path, "size_bytes": contents.len(), "sha256": sha256_hex(contents),
            })).collect::<Vec<_>>(),
        }))
        .await;
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (path, contents) in &files {
        assert!(
            std::fs::read(berth.model_dir("job-s3").join(path)).unwrap() == *contents,
            "{path} is the store's"
        );
    }
    let (_, model) = berth.get(&format!("/v1/models/{id}")).await;
    let (_, deployments) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    for (what, text) in [
        ("the model", model.to_string()),
        ("its deployments", deployments.to_string()),
        ("the log", berth.log()),
    ] {
        assert!(
            !text.contains(&moto.secret_access_key),
            "{what} show the secret"
        );
    }
    assert!(
        berth.log().contains("sources file loaded"),
        "{}",
        berth.log()
    );
}

/// A server whose sources file gives `bucket` moto's endpoint and keys
/// (the secret through the environment), and the folder holding the file.
async fn serving(moto: &moto::Moto, bucket: &str) -> (tempfile::TempDir, Berth) {
    let temp = tempfile::tempdir().unwrap();
    let sources_file = temp.path().join("sources.toml");
    std::fs::write(
        &sources_file,
        format!(
            "[[source]]\nprefix = \"s3://{bucket}/\"\noptions = {{ endpoint = \"{}\", \
             region = \"{}\", access_key_id = \"{}\", secret_access_key = \"${{MOTO_SECRET}}\" }}",
            moto.endpoint, moto.region, moto.access_key_id
        ),
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .arg("--sources-file")
        .arg(sources_file.to_str().unwrap())
        .env("MOTO_SECRET", &moto.secret_access_key)
        .start()
        .await;
    (temp, berth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_registered_without_files_has_them_listed_at_its_prefix_and_deploys() {
    let moto = moto::Moto::start(&["e2e-listed"]);
    let kept = ("adapter_model.safetensors", bytes(41, 2 * 1024 * 1024 + 3));
    let unkept = ("config/adapter_config.json", bytes(42, 400));
    let put = |path: &str, contents: &[u8], sha256| {
        moto.put_by_boto3(
            "e2e-listed",
            &format!("runs/job-listed/{path}"),
            contents,
            sha256,
        )
    };
    put(kept.0, &kept.1, true);
    put(unkept.0, &unkept.1, false);
    // A folder marker, as a console leaves one: no file.
    put("config/", b"", false);
    let (_temp, berth) = serving(&moto, "e2e-listed").await;

    let (status, model) = berth
        .post(
            "/v1/models",
            &json!({
                "name": "listed", "job_id": "job-listed",
                "source": "s3://e2e-listed/runs/{job_id}/",
            }),
        )
        .await;

    assert_eq!(status, StatusCode::CREATED, "{model}");
    assert_eq!(model["source"], "s3://e2e-listed/runs/{job_id}/{path}");
    assert_eq!(
        model["files"],
        json!([
            { "path": kept.0, "sha256": sha256_hex(&kept.1), "size_bytes": kept.1.len(), "format": null },
            { "path": unkept.0, "sha256": null, "size_bytes": unkept.1.len(), "format": null },
        ]),
        "each object's size, and the sha256 only where the store keeps one (the format: once fetched)"
    );
    let id = model["id"].as_i64().unwrap();
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for (path, contents) in [&kept, &unkept] {
        assert!(
            std::fs::read(berth.model_dir("job-listed").join(path)).unwrap() == *contents,
            "{path} is the store's"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_without_files_at_an_empty_prefix_is_refused_and_records_nothing() {
    let moto = moto::Moto::start(&["e2e-empty"]);
    let (_temp, berth) = serving(&moto, "e2e-empty").await;
    // Given, even empty, the files are the registration's: nothing is
    // listed (here a listing would be refused).
    let (status, given) = berth
        .post(
            "/v1/models",
            &json!({
                "name": "given", "job_id": "job-given",
                "source": "s3://e2e-empty/runs/{job_id}/{path}", "files": [],
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{given}");
    assert_eq!(given["files"], json!([]));
    let (_, before) = berth.get("/v1/models").await;

    let (status, refused) = berth
        .post(
            "/v1/models",
            &json!({
                "name": "none", "job_id": "job-none",
                "source": "s3://e2e-empty/runs/{job_id}/",
            }),
        )
        .await;

    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(
        refused,
        json!({ "error": "the store has no objects under s3://e2e-empty/runs/job-none/: \
                          check the prefix, or give the files in the registration" })
    );
    let (_, after) = berth.get("/v1/models").await;
    assert_eq!(after, before, "nothing is recorded");
}

#[test]
fn a_sources_file_that_cannot_be_used_stops_the_start() {
    let temp = tempfile::tempdir().unwrap();
    let sources_file = temp.path().join("sources.toml");
    std::fs::write(
        &sources_file,
        "[[source]]\nprefix = \"https://hub.internal/models/\"\n\
         headers = { Authorization = \"Bearer ${BERTH_E2E_UNSET_TOKEN}\" }",
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(temp.path().join("data"))
        .arg("--sources-file")
        .arg(&sources_file)
        .env_remove("BERTH_E2E_UNSET_TOKEN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!(
        "error: sources file {}: prefix \"https://hub.internal/models/\": headers.Authorization: \
         the host environment variable BERTH_E2E_UNSET_TOKEN is not set (set it before starting berth)",
        sources_file.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(
        !temp.path().join("data").exists(),
        "nothing was opened before the sources file was read"
    );
}

#[test]
fn a_ca_file_that_cannot_be_used_stops_the_start() {
    let temp = tempfile::tempdir().unwrap();
    let not_pem = temp.path().join("ca.der");
    std::fs::write(&not_pem, b"\x30\x82\x01\x0a").unwrap();
    let absent = temp.path().join("absent.pem");
    for (file, problem) in [
        (
            &not_pem,
            "holds no certificate (expected PEM: -----BEGIN CERTIFICATE----- blocks)",
        ),
        (
            &absent,
            "cannot read it: No such file or directory (os error 2)",
        ),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(temp.path().join("data"))
            .env("BERTH_CA_FILE", file)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        let expected = format!("error: --ca-file {}: {problem}", file.display());
        assert!(stderr.contains(&expected), "{stderr}");
        assert!(
            !temp.path().join("data").exists(),
            "nothing was opened before the CA file was read"
        );
    }
}
