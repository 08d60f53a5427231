//! The fetcher and the listing against real emulators of the other two
//! clouds, each started once for this test binary on a free loopback port:
//! fake-gcs-server for `gs://` (it accepts any credential, so what is
//! tested there is that one is required, and that the configured file is
//! read) and Azurite for `az://` (it checks Shared Key and SAS signatures).
//! Fetched in pieces and continued, listed with sizes only, refused
//! credentials named without their value.

use std::sync::OnceLock;

use object_store::ObjectStoreExt;
use object_store::path::Path as Key;
use object_store::signer::Signer;

use super::s3_tests::{contents, continued, fetch, fetcher, model};
use crate::fetch::Access;
use crate::fetch::source::discover::Found;

#[path = "../../../../tests/azurite/azurite.rs"]
mod azurite;
#[path = "../../../../tests/fake-gcs/fake_gcs.rs"]
mod fake_gcs;
use azurite::Azurite;
use fake_gcs::FakeGcs;

/// The bucket and the container the emulators are started with.
const BUCKET: &str = "berth-test";

fn gcs() -> &'static FakeGcs {
    static GCS: OnceLock<FakeGcs> = OnceLock::new();
    GCS.get_or_init(|| FakeGcs::start(&[BUCKET]))
}

fn azurite() -> &'static Azurite {
    static AZURITE: OnceLock<Azurite> = OnceLock::new();
    AZURITE.get_or_init(|| Azurite::start(&[BUCKET]))
}

/// A sources file of one `[[source]]` entry for `prefix`, with `body`.
fn access(prefix: &str, body: &str) -> Access {
    Access::parse(
        &format!("[[source]]\nprefix = \"{prefix}\"\n{body}"),
        |_| None,
    )
    .unwrap()
}

async fn put(store: &dyn object_store::ObjectStore, job: &str, files: &[(&str, Vec<u8>)]) {
    for (path, contents) in files {
        let key = Key::from(format!("{job}/{path}"));
        store.put(&key, contents.clone().into()).await.unwrap();
    }
}

async fn put_gcs(job: &str, files: &[(&str, Vec<u8>)]) {
    for (path, contents) in files {
        gcs()
            .put(BUCKET, &format!("{job}/{path}"), contents.clone())
            .await;
    }
}

/// A service-account key file in `dir`.
fn service_account_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("service-account.json");
    std::fs::write(&path, fake_gcs::service_account_key()).unwrap();
    path
}

fn gcs_access(credential: &str) -> Access {
    access(
        &format!("gs://{BUCKET}/"),
        &format!(
            "options = {{ base_url = \"{}\", {credential} }}",
            gcs().endpoint
        ),
    )
}

#[tokio::test]
async fn a_gcs_model_is_fetched_in_pieces_and_continued_with_a_service_account() {
    let data = contents(11, 32 << 20);
    let files = [("big.bin", data.clone())];
    put_gcs("gcs-pieces", &files).await;
    let keys = tempfile::tempdir().unwrap();
    let file = service_account_file(keys.path());
    let (models, fetcher) = fetcher(gcs_access(&format!(
        "service_account = \"{}\"",
        file.display()
    )));
    let model = model(
        "gcs-pieces",
        format!("gs://{BUCKET}/{{job_id}}/{{path}}"),
        &files,
    );
    continued(models, fetcher, model, data, 4).await;
}

#[tokio::test]
async fn a_gcs_credential_file_that_cannot_be_used_is_named_not_shown() {
    let keys = tempfile::tempdir().unwrap();
    let file = keys.path().join("key.json");
    let secret = "-----BEGIN PRIVATE KEY-----\\nnot-a-key-but-secret\\n-----END PRIVATE KEY-----";
    std::fs::write(
        &file,
        format!(r#"{{"private_key": "{secret}", "private_key_id": "k", "client_email": "e@x"}}"#),
    )
    .unwrap();
    let files = [("a.bin", contents(1, 10))];
    let (_models, fetcher) = fetcher(gcs_access(&format!(
        "service_account = \"{}\"",
        file.display()
    )));
    let model = model(
        "gcs-bad-key",
        format!("gs://{BUCKET}/{{job_id}}/{{path}}"),
        &files,
    );
    let error = fetch(&fetcher, &model).await.unwrap_err().to_string();
    assert!(
        error.contains(&format!("the store for gs://{BUCKET}/ cannot be set up")),
        "{error}"
    );
    assert!(!error.contains("not-a-key-but-secret"), "{error}");
}

#[tokio::test]
async fn an_anonymous_gcs_entry_reads_without_a_credential() {
    let files = [
        ("a.bin", contents(2, 5000)),
        ("sub/b.json", contents(3, 10)),
    ];
    put_gcs("gcs-anonymous", &files).await;
    let entry = format!(
        "anonymous = true\noptions = {{ base_url = \"{}\" }}",
        gcs().endpoint
    );
    let (_models, fetcher) = fetcher(access(&format!("gs://{BUCKET}/"), &entry));
    let source = format!("gs://{BUCKET}/{{job_id}}/{{path}}");
    let dir = fetch(&fetcher, &model("gcs-anonymous", source, &files))
        .await
        .unwrap();
    for (path, contents) in &files {
        assert!(
            std::fs::read(dir.join(path)).unwrap() == *contents,
            "{path}"
        );
    }
}

#[tokio::test]
async fn an_azure_model_is_fetched_in_pieces_and_continued_with_the_account_key() {
    let az = azurite();
    let data = contents(12, 32 << 20);
    let files = [("big.bin", data.clone())];
    put(&az.client(BUCKET), "az-pieces", &files).await;
    let (models, fetcher) = fetcher(azure_access(&format!("account_key = \"{}\"", az.key)));
    let model = model(
        "az-pieces",
        format!("az://{}/{BUCKET}/{{job_id}}/{{path}}", az.account),
        &files,
    );
    continued(models, fetcher, model, data, 4).await;
}

fn azure_access(credential: &str) -> Access {
    let az = azurite();
    access(
        &format!("az://{}/{BUCKET}/", az.account),
        &format!(
            "options = {{ endpoint = \"{}\", {credential} }}",
            az.endpoint
        ),
    )
}

#[tokio::test]
async fn an_azure_blob_is_fetched_with_a_sas_token() {
    let az = azurite();
    let files = [("a.bin", contents(4, 70_000))];
    let client = az.client(BUCKET);
    put(&client, "az-sas", &files).await;
    let signed = client
        .signed_url(
            http::Method::GET,
            &Key::from("az-sas/a.bin"),
            std::time::Duration::from_secs(600),
        )
        .await
        .unwrap();
    let sas = signed.query().unwrap().to_string();
    let (_models, fetcher) = fetcher(azure_access(&format!("sas_token = \"{sas}\"")));
    let source = format!("az://{}/{BUCKET}/{{job_id}}/{{path}}", az.account);
    let dir = fetch(&fetcher, &model("az-sas", source, &files))
        .await
        .unwrap();
    assert!(std::fs::read(dir.join("a.bin")).unwrap() == files[0].1);
}

#[tokio::test]
async fn refused_azure_credentials_are_named_never_shown() {
    let az = azurite();
    let files = [("a.bin", contents(5, 100))];
    put(&az.client(BUCKET), "az-refused", &files).await;
    // Another account's key: well formed, wrong.
    let wrong =
        "bm90LXRoZS1rZXktYnV0LWEtc2VjcmV0LW9mLTY0LWJ5dGVzLWxvbmctZW5vdWdoLXRvLWJlLWEta2V5IQ==";
    let source = format!("az://{}/{BUCKET}/{{job_id}}/{{path}}", az.account);
    let cases = [
        (
            format!("account_key = \"{wrong}\""),
            "the account key of az://",
        ),
        (
            "sas_token = \"sv=2021-08-06&sr=c&sp=r&se=2099-01-01T00%3A00%3A00Z&sig=AAAA\""
                .to_string(),
            "the SAS token of az://",
        ),
    ];
    for (credential, named) in cases {
        let (_models, fetcher) = fetcher(azure_access(&credential));
        let error = fetch(&fetcher, &model("az-refused", source.clone(), &files))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("the store refused the credentials for az://") && error.contains(named),
            "{credential}: {error}"
        );
        for secret in [wrong, "sig=AAAA", &az.key] {
            assert!(!error.contains(secret), "{error}");
        }
    }
}

#[tokio::test]
async fn an_azure_entry_without_a_credential_asks_managed_identity_and_says_so() {
    let az = azurite();
    let files = [("a.bin", contents(6, 100))];
    put(&az.client(BUCKET), "az-none", &files).await;
    // Managed identity at a closed loopback port: nothing answers.
    let (_models, fetcher) = fetcher(azure_access("msi_endpoint = \"http://127.0.0.1:1/token\""));
    let source = format!("az://{}/{BUCKET}/{{job_id}}/{{path}}", az.account);
    let error = fetch(&fetcher, &model("az-none", source, &files))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!(
            "no credential for az://{}/{BUCKET}/az-none/a.bin",
            az.account
        )) && error.contains(&format!(
            "the sources file's entry az://{}/{BUCKET}/ names none",
            az.account
        )) && error.contains("managed identity")
            && error.contains("anonymous = true"),
        "{error}"
    );
}

#[tokio::test]
async fn an_anonymous_azure_entry_is_refused_by_a_private_container() {
    let az = azurite();
    let files = [("a.bin", contents(7, 100))];
    put(&az.client(BUCKET), "az-anonymous", &files).await;
    let entry = format!(
        "anonymous = true\noptions = {{ endpoint = \"{}\" }}",
        az.endpoint
    );
    let prefix = format!("az://{}/{BUCKET}/", az.account);
    let (_models, fetcher) = fetcher(access(&prefix, &entry));
    let source = format!("{prefix}{{job_id}}/{{path}}");
    let error = fetch(&fetcher, &model("az-anonymous", source, &files))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!(
            "the sources file's entry {prefix} says anonymous = true"
        )),
        "{error}"
    );
}

#[tokio::test]
async fn azure_and_gcs_prefixes_are_listed_with_sizes_and_no_sha256() {
    let az = azurite();
    let files = [
        ("a.bin", contents(8, 3000)),
        ("sub/b.json", contents(9, 10)),
    ];
    put(&az.client(BUCKET), "az-listed", &files).await;
    put_gcs("gcs-listed", &files).await;
    let expected: Vec<Found> = files
        .iter()
        .map(|(path, contents)| Found {
            path: path.to_string(),
            size_bytes: contents.len() as u64,
            sha256: None,
        })
        .collect();
    let keys = tempfile::tempdir().unwrap();
    let file = service_account_file(keys.path());
    let gcs_sources = super::Sources::new(crate::trust::Trust::default())
        .unwrap()
        .with_access(gcs_access(&format!(
            "service_account = \"{}\"",
            file.display()
        )));
    let azure_sources = super::Sources::new(crate::trust::Trust::default())
        .unwrap()
        .with_access(azure_access(&format!("account_key = \"{}\"", az.key)));
    let cases = [
        (
            &gcs_sources,
            format!("gs://{BUCKET}/{{job_id}}/"),
            "gcs-listed",
        ),
        (
            &azure_sources,
            format!("az://{}/{BUCKET}/{{job_id}}/", az.account),
            "az-listed",
        ),
        (
            &azure_sources,
            format!(
                "https://{}.blob.core.windows.net/{BUCKET}/{{job_id}}/",
                az.account
            ),
            "az-listed",
        ),
    ];
    for (sources, source, job) in cases {
        let found = sources.discover(&source, job).await.unwrap();
        assert_eq!(found.source, format!("{source}{{path}}"));
        assert_eq!(found.files, expected, "{source}");
    }
}

#[tokio::test]
async fn a_missing_container_is_named() {
    let az = azurite();
    let files = [("a.bin", contents(10, 10))];
    // An entry for the whole account, so its key covers the container.
    let account = || {
        access(
            &format!("az://{}/", az.account),
            &format!(
                "options = {{ endpoint = \"{}\", account_key = \"{}\" }}",
                az.endpoint, az.key
            ),
        )
    };
    let (_models, fetcher) = fetcher(account());
    let source = format!("az://{}/no-such-container/{{job_id}}/{{path}}", az.account);
    let error = fetch(&fetcher, &model("az-missing", source.clone(), &files))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("has no container no-such-container"),
        "{error}"
    );
    let sources = super::Sources::new(crate::trust::Trust::default())
        .unwrap()
        .with_access(account());
    let listed = format!("az://{}/no-such-container/{{job_id}}/", az.account);
    let error = sources.discover(&listed, "j").await.unwrap_err();
    assert!(
        error.contains("has no container no-such-container"),
        "{error}"
    );
}
