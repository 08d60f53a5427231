//! Sources behind certificates of an internal CA, HTTPS and object store:
//! trusted only with that CA (`--ca-file`).

use super::*;
use crate::fetch::Access;
use crate::trust::Trust;

#[tokio::test]
async fn an_https_source_signed_by_an_internal_ca_is_trusted_only_with_the_ca_file() {
    let ca = TestCa::new("internal CA");
    let contents = bytes(40, 1000);
    let mut setup = Setup::on(Source::start_tls(&ca).await, &[("a.bin", contents.clone())]);
    let unknown_ca = format!(
        "file a.bin: cannot reach the source ({}/job/a.bin): invalid peer certificate: \
         UnknownIssuer (the certificate is signed by a CA berth does not trust: give the server \
         that CA with --ca-file)",
        setup.source.base
    );
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(error, unknown_ca);

    let dir = tempfile::tempdir().unwrap();
    let another = TestCa::new("another CA").write(dir.path(), "another.pem");
    setup.fetcher = setup
        .fetcher
        .clone()
        .trust(Trust::load(&another).unwrap())
        .unwrap();
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(error, unknown_ca, "another CA vouches for nothing here");

    let ca_file = ca.write(dir.path(), "ca.pem");
    setup.fetcher = setup
        .fetcher
        .clone()
        .trust(Trust::load(&ca_file).unwrap())
        .unwrap();
    setup.fetch().await.unwrap();
    assert_file(&setup, "a.bin", &contents);
}

/// An S3-compatible store behind a certificate of an internal CA: its
/// client trusts the CA of `--ca-file` too. The store here has no objects,
/// so a request that got through is answered "no such key".
#[tokio::test]
async fn an_object_store_signed_by_an_internal_ca_is_reached_only_with_the_ca_file() {
    let ca = TestCa::new("store CA");
    let no_such_key = || async {
        (
            StatusCode::NOT_FOUND,
            "<Error><Code>NoSuchKey</Code><Message>none here</Message></Error>",
        )
    };
    let addr = test_tls::serve(
        Router::new().fallback(no_such_key),
        ca.server(&["127.0.0.1"]),
    )
    .await;
    let endpoint = format!("https://{addr}");
    let access = Access::parse(
        &format!(
            "[[source]]\nprefix = \"s3://models/\"\noptions = {{ endpoint = \"{endpoint}\", \
             region = \"us-east-1\", access_key_id = \"k\", secret_access_key = \"s\" }}"
        ),
        |_| None,
    )
    .unwrap();
    let mut setup = Setup::new(&[("a.bin", bytes(41, 100))]).await;
    setup.model.source = "s3://models/{job_id}/{path}".to_string();
    setup.fetcher = setup.fetcher.clone().access(access);
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "file a.bin: cannot reach the store at {endpoint} (s3://models/job/a.bin): "
        )) && error.ends_with(
            "invalid peer certificate: UnknownIssuer (the certificate is signed by a CA berth \
             does not trust: give the server that CA with --ca-file)"
        ),
        "{error}"
    );

    let dir = tempfile::tempdir().unwrap();
    let trust = Trust::load(&ca.write(dir.path(), "ca.pem")).unwrap();
    // The credentials stay: trust replaces only the clients.
    setup.fetcher = setup.fetcher.clone().trust(trust).unwrap();
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        "file a.bin: the store has no object s3://models/job/a.bin"
    );
}
