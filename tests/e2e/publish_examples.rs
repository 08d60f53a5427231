//! The `berth:deployer@0.2.0` examples publishing through the real server:
//! `s3-publish` (Python) into moto's S3-compatible bucket and `http-publish`
//! (Rust) onto a loopback mirror, each through a `[[target]]` of the
//! sources file that its manifest grants. The plugins hold no credential:
//! what lands at the destination is compared byte for byte with the model,
//! with the receipts and with the deployment's record, and the secrets
//! appear in no answer and no log line.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::files::FileServer;
use crate::support::mirror::{Answer, Mirror};
use crate::support::moto;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, assert_error, bytes, model, plugins, sha256_hex};

const MIRROR_TOKEN: &str = "mirror-token-0b7e";

/// What deployment `id`'s record says was put, one entry per put (target,
/// key, url, bytes, sha256, etag), as `GET /v1/deployments/{id}` shows it.
async fn recorded_puts(berth: &Berth, id: &Value) -> Vec<Value> {
    let (status, deployment) = berth.get(&format!("/v1/deployments/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    deployment["published"]
        .as_array()
        .unwrap_or_else(|| panic!("no \"published\" list in the deployment: {deployment}"))
        .clone()
}

/// Every object under `prefix` in the bucket, by key.
async fn objects(store: &AmazonS3, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = store
        .list(Some(&Key::from(prefix)))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

async fn object(store: &AmazonS3, key: &str) -> Vec<u8> {
    let got = store.get(&Key::from(key)).await;
    let got = got.unwrap_or_else(|e| panic!("{key}: {e}"));
    got.bytes().await.unwrap().to_vec()
}

/// A 3-file model into a bucket: the objects are the model's bytes, the
/// manifest's receipts and the deployment's record agree; a second
/// deployment skips what is already there with its size and puts what is
/// not, and nothing is duplicated; the `target` option may be left out
/// with one target granted; an ungranted target and an unknown option are
/// refused with sentences; a 0.1.0 example deploys beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_publish_puts_a_model_and_its_manifest_into_a_bucket() {
    let moto = moto::Moto::start(&["releases"]);
    let store = AmazonS3Builder::new()
        .with_endpoint(&moto.endpoint)
        .with_allow_http(true)
        .with_region(&moto.region)
        .with_access_key_id(&moto.access_key_id)
        .with_secret_access_key(&moto.secret_access_key)
        .with_bucket_name("releases")
        .build()
        .unwrap();
    let temp = tempfile::tempdir().unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"releases\"\nurl = \"s3://releases/models/\"\n\
             options = {{ endpoint = \"{}\", region = \"{}\", access_key_id = \"{}\", \
             secret_access_key = \"${{MOTO_SECRET}}\" }}\n",
            moto.endpoint, moto.region, moto.access_key_id
        ),
    )
    .unwrap();
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .plugin("s3-publish", plugins::example("s3-publish"))
        .plugins_file("s3-publish.toml", "targets = [\"releases\"]\n")
        // A 0.1.0 plugin on the same server.
        .plugin("model-card", plugins::example("model-card"))
        .arg("--sources-file")
        .arg(sources.to_str().unwrap())
        .env("MOTO_SECRET", &moto.secret_access_key)
        .start()
        .await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-s3p", &contents)).await;

    let (status, first) = berth
        .deploy(
            id,
            "s3-publish",
            json!({ "target": "releases", "prefix": "team/a/" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "completed", "{first}");
    let deploy_id = first["id"].as_i64().unwrap();
    let folder = format!("team/a/job-s3p/deploy-{deploy_id}");
    let manifest_key = format!("models/{folder}/manifest.json");
    assert_eq!(first["ref"], format!("s3://releases/{manifest_key}"));
    let mut keys: Vec<String> = contents
        .iter()
        .map(|(path, _)| format!("{folder}/{path}"))
        .collect();
    keys.push(format!("{folder}/manifest.json"));
    let total: usize = contents.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(
        first["details"],
        json!({ "target": "releases", "files": 3, "bytes": total, "skipped": 0, "keys": keys })
    );

    // Under the target's prefix, exactly these objects, each the model's bytes.
    let mut expected: Vec<String> = keys.iter().map(|k| format!("models/{k}")).collect();
    expected.sort();
    assert_eq!(objects(&store, "models").await, expected);
    for (path, bytes) in &contents {
        let key = format!("models/{folder}/{path}");
        assert!(object(&store, &key).await == *bytes, "{key}: other bytes");
    }

    // The manifest lists each file with its receipt; the record has the same puts.
    let manifest: Value = serde_json::from_slice(&object(&store, &manifest_key).await).unwrap();
    assert_eq!(manifest["model"], "job-s3p adapter");
    assert_eq!(manifest["job_id"], "job-s3p");
    assert_eq!(manifest["deploy_id"], deploy_id);
    let listed = manifest["files"].as_array().unwrap();
    assert_eq!(listed.len(), contents.len(), "{manifest}");
    let puts = recorded_puts(&berth, &first["id"]).await;
    assert_eq!(puts.len(), contents.len() + 1, "{first}");
    // The files are put two at a time: recorded as each landed.
    for (entry, (path, bytes)) in listed.iter().zip(&contents) {
        let key = format!("{folder}/{path}");
        let put = puts
            .iter()
            .find(|put| put["key"] == key)
            .unwrap_or_else(|| panic!("{key} not recorded in {puts:?}"));
        assert_eq!(entry["path"], *path);
        assert_eq!(entry["key"], key);
        assert_eq!(entry["skipped"], false);
        assert_eq!(entry["bytes"], bytes.len());
        assert_eq!(entry["sha256"], sha256_hex(bytes), "{path}");
        assert_eq!(entry["url"], format!("s3://releases/models/{key}"));
        for field in ["key", "url", "bytes", "sha256", "etag"] {
            assert_eq!(put[field], entry[field], "{path}: {field} of {put}");
        }
        assert_eq!(put["target"], "releases", "{put}");
    }
    let manifest_put = puts.last().unwrap();
    assert_eq!(manifest_put["key"], format!("{folder}/manifest.json"));
    assert_eq!(
        manifest_put["sha256"],
        sha256_hex(&object(&store, &manifest_key).await)
    );

    // The next deployment's folder, seeded: one file already there with its
    // size (skipped), one of another size (put again, whole).
    let next = format!("team/a/job-s3p/deploy-{}", deploy_id + 1);
    let (same, stale) = (&contents[0], &contents[2]);
    store
        .put(
            &Key::from(format!("models/{next}/{}", same.0)),
            same.1.clone().into(),
        )
        .await
        .unwrap();
    store
        .put(
            &Key::from(format!("models/{next}/{}", stale.0)),
            bytes(9, 10).into(),
        )
        .await
        .unwrap();
    let (status, second) = berth
        .deploy(
            id,
            "s3-publish",
            json!({ "target": "releases", "prefix": "team/a" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(
        second["id"],
        deploy_id + 1,
        "the seeded folder is this deployment's"
    );
    assert_eq!(second["details"]["skipped"], 1, "{second}");
    let manifest: Value =
        serde_json::from_slice(&object(&store, &format!("models/{next}/manifest.json")).await)
            .unwrap();
    let skipped: Vec<&Value> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &f["skipped"])
        .collect();
    assert_eq!(skipped, [true, false, false], "{manifest}");
    for (path, bytes) in &contents {
        let key = format!("models/{next}/{path}");
        assert!(object(&store, &key).await == *bytes, "{key}: other bytes");
    }
    // The skipped file was not put, so it is not recorded as a put.
    assert_eq!(
        recorded_puts(&berth, &second["id"]).await.len(),
        contents.len()
    );
    assert_eq!(
        objects(&store, "models").await.len(),
        2 * (contents.len() + 1)
    );

    // One target granted: the option may be left out.
    let (status, third) = berth.deploy(id, "s3-publish", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{third}");
    assert_eq!(
        third["ref"],
        format!(
            "s3://releases/models/job-s3p/deploy-{}/manifest.json",
            third["id"]
        )
    );

    // Refusals: before anything is put, each with its sentence.
    let before = objects(&store, "").await;
    let refused = berth
        .deploy(id, "s3-publish", json!({ "target": "elsewhere" }))
        .await;
    assert_error(
        &refused,
        StatusCode::BAD_GATEWAY,
        "target \"elsewhere\" is not granted to it",
    );
    let refused = berth
        .deploy(
            id,
            "s3-publish",
            json!({ "target": "releases", "prefx": "x" }),
        )
        .await;
    assert_error(
        &refused,
        StatusCode::BAD_REQUEST,
        "unknown option \"prefx\": the s3-publish deployer accepts only \"target\"",
    );
    assert_eq!(objects(&store, "").await, before);

    // A 0.1.0 example on the same server deploys as before.
    let (status, card) = berth.deploy(id, "model-card", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{card}");
    assert_eq!(card["ref"], "/out/README.md");

    let (_, deployments) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    for (what, text) in [
        ("the deployments", deployments.to_string()),
        ("the log", berth.log()),
    ] {
        assert!(
            !text.contains(&moto.secret_access_key),
            "{what} show the secret"
        );
    }
}

/// A server whose sources file defines `mirror` (the loopback mirror, with
/// its token as a header) and grants it to `http-publish`.
async fn berth_with_mirror_target(mirror: &Mirror) -> (Berth, tempfile::TempDir) {
    let temp = tempfile::tempdir().unwrap();
    let sources = temp.path().join("sources.toml");
    std::fs::write(
        &sources,
        format!(
            "[[target]]\nname = \"mirror\"\nurl = \"http://{}/base/\"\n\
             headers = {{ Authorization = \"Bearer ${{TEST_MIRROR_TOKEN}}\" }}\n\
             call = {{ methods = [\"POST\"], paths = [\"/*/done\"] }}\n",
            mirror.host()
        ),
    )
    .unwrap();
    let berth = Berth::options(Backend::Sqlite)
        .plugin("http-publish", plugins::example("http-publish"))
        .plugins_file("http-publish.toml", "targets = [\"mirror\"]\n")
        .arg("--sources-file")
        .arg(sources.to_str().unwrap())
        .env("TEST_MIRROR_TOKEN", MIRROR_TOKEN)
        .start()
        .await;
    (berth, temp)
}

/// The model's files go up with the target's token, which the plugin never
/// holds, byte for byte at their escaped keys; the plugin's own `POST
/// …/done` gets the token from the host too and lists the receipts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_publish_puts_a_model_on_a_mirror_target_and_tells_it_when_done() {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Store).await;
    let (berth, _temp) = berth_with_mirror_target(&mirror).await;
    let mut contents = adapter_files();
    contents.push(("notes/read me.txt", bytes(3, 1000)));
    let id = berth.register(&model(&files, "job-hp", &contents)).await;

    let (status, deployment) = berth
        .deploy(
            id,
            "http-publish",
            json!({ "target": "mirror", "prefix": "v1", "notify": true }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let deploy_id = deployment["id"].as_i64().unwrap();
    let base = format!("http://{}/base", mirror.host());
    let folder = format!("v1/job-hp/deploy-{deploy_id}");
    assert_eq!(deployment["ref"], format!("{base}/{folder}/"));
    let details = &deployment["details"];
    let total: usize = contents.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(details["bytes"], total, "{details}");
    assert_eq!(
        details["notified"],
        json!({ "url": format!("{base}/{folder}/done"), "status": 201 })
    );

    let received = mirror.received();
    assert_eq!(received.len(), contents.len() + 1, "{received:?}");
    let bearer = format!("Bearer {MIRROR_TOKEN}");
    // The files are put two at a time, the POST after them all.
    for (path, bytes) in &contents {
        let at = format!("/base/{folder}/{}", path.replace(' ', "%20"));
        let request = received[..contents.len()]
            .iter()
            .find(|request| request.path == at)
            .unwrap_or_else(|| panic!("nothing was put at {at}"));
        assert_eq!(request.method, "PUT", "{path}");
        assert!(request.body == *bytes, "{path}: the mirror got other bytes");
        assert_eq!(
            request.authorization.as_deref(),
            Some(bearer.as_str()),
            "{path}"
        );
        // RFC 9530: the mirror can check what it received.
        let digest = format!("sha-256=:{}:", BASE64.encode(Sha256::digest(bytes)));
        let sent: Vec<_> = ["content-digest", "repr-digest"]
            .iter()
            .filter_map(|name| request.headers.get(*name)?.to_str().ok())
            .collect();
        assert!(sent.contains(&digest.as_str()), "{path}: digests {sent:?}");
    }
    let done = received.last().unwrap();
    assert_eq!(done.method, "POST");
    assert_eq!(done.path, format!("/base/{folder}/done"));
    assert_eq!(
        done.authorization.as_deref(),
        Some(bearer.as_str()),
        "the host adds the target's header to the plugin's own request"
    );
    let told: Value = serde_json::from_slice(&done.body).unwrap();
    assert_eq!(told["deploy_id"], deploy_id);
    assert_eq!(told["files"], details["files"]);
    for (file, (path, bytes)) in details["files"].as_array().unwrap().iter().zip(&contents) {
        assert_eq!(file["path"], *path);
        assert_eq!(file["key"], format!("{folder}/{path}"));
        assert_eq!(file["sha256"], sha256_hex(bytes), "{path}");
        assert_eq!(file["bytes"], bytes.len(), "{path}");
    }
    let puts = recorded_puts(&berth, &deployment["id"]).await;
    assert_eq!(
        puts.len(),
        contents.len(),
        "the POST is no put: {deployment}"
    );

    let (_, stored) = berth.get(&format!("/v1/deployments/{deploy_id}")).await;
    for (what, text) in [
        ("the deployment", stored.to_string()),
        ("the log", berth.log()),
    ] {
        assert!(!text.contains(MIRROR_TOKEN), "{what} show the token");
    }
}

/// A mirror that refuses the `done` POST fails the deployment with its
/// status and answer; the puts before it stay recorded. Options are
/// checked before anything is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_publish_names_a_refused_notice_and_refuses_bad_options() {
    let files = FileServer::start().await;
    let mirror = Mirror::start(Answer::Store).await;
    mirror.answer("/done", Answer::Status(503, "mirror is reindexing"));
    let (berth, _temp) = berth_with_mirror_target(&mirror).await;
    let contents = adapter_files();
    let id = berth.register(&model(&files, "job-hp-no", &contents)).await;

    let answer = berth
        .deploy(
            id,
            "http-publish",
            json!({ "target": "mirror", "notify": true }),
        )
        .await;
    let deploy_id = &answer.1["id"];
    assert_error(
        &answer,
        StatusCode::BAD_GATEWAY,
        &format!(
            "the mirror answered 503 to POST http://{}/base/job-hp-no/deploy-{deploy_id}/done: mirror is reindexing",
            mirror.host()
        ),
    );
    assert_eq!(mirror.received().len(), contents.len() + 1);
    assert_eq!(
        recorded_puts(&berth, deploy_id).await.len(),
        contents.len(),
        "a failed deployment lists what it did put"
    );

    let hits = files.total_hits();
    for (options, expected) in [
        (
            json!({ "target": "mirror", "notify": "yes" }),
            "option \"notify\" must be true or false, not \"yes\"",
        ),
        (
            json!({ "target": "mirror", "prefix": "a/../b" }),
            "option \"prefix\" \"a/../b\" has an empty, . or .. segment",
        ),
        (
            json!({ "target": 5 }),
            "option \"target\" must be a target's name, not 5",
        ),
        (
            json!({ "target": "mirror", "base_url": "http://x" }),
            "unknown option \"base_url\"",
        ),
    ] {
        let answer = berth.deploy(id, "http-publish", options).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, expected);
    }
    assert_eq!(
        files.total_hits(),
        hits,
        "nothing fetched for refused options"
    );
}
