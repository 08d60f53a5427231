//! The sources file's credentials: sent to the URLs under their prefix and
//! to no other host, even through a redirect; refusals say whose were sent;
//! a sources file that cannot be used stops the start.

use super::*;
use crate::fetch::Access;

/// A sources file giving `Authorization: Bearer ${TOKEN}` to `prefix`,
/// with `TOKEN` set to `token`.
fn bearer(prefix: &str, token: &str) -> Access {
    let text = format!(
        "[[source]]\nprefix = \"{prefix}\"\nheaders = {{ Authorization = \"Bearer ${{TOKEN}}\" }}"
    );
    Access::parse(&text, |var| (var == "TOKEN").then(|| token.to_string())).unwrap()
}

#[tokio::test]
async fn the_credentials_of_a_prefix_go_to_the_urls_under_it() {
    let contents = bytes(20, 1000);
    let mut setup = Setup::new(&[("a.bin", contents.clone())]).await;
    setup
        .source
        .with(|s| s.require = Some("Bearer t0ken".into()));
    let prefix = format!("{}/job/", setup.source.base);
    setup.fetcher = setup.fetcher.clone().access(bearer(&prefix, "t0ken"));

    setup.fetch().await.unwrap();
    assert_file(&setup, "a.bin", &contents);
    assert_eq!(
        setup.source.authorizations("job/a.bin"),
        [Some("Bearer t0ken".to_string())]
    );
}

#[tokio::test]
async fn a_redirect_to_another_host_carries_no_credentials() {
    let (moved, kept) = (bytes(21, 1000), bytes(22, 1000));
    let mut setup = Setup::new(&[("moved.bin", moved.clone()), ("kept.bin", kept.clone())]).await;
    let elsewhere = Source::start().await;
    elsewhere.with(|s| s.files.insert("other/moved.bin".into(), moved.clone()));
    setup.source.with(|s| {
        s.redirects.insert(
            "job/moved.bin".into(),
            format!("{}/other/moved.bin?signature=abc", elsewhere.base),
        );
        // A redirect within the prefix keeps them.
        s.redirects
            .insert("job/kept.bin".into(), "/job/renamed/kept.bin".into());
        s.files.insert("job/renamed/kept.bin".into(), kept.clone());
    });
    let prefix = format!("{}/job/", setup.source.base);
    setup.fetcher = setup.fetcher.clone().access(bearer(&prefix, "t0ken"));

    setup.fetch().await.unwrap();
    assert_file(&setup, "moved.bin", &moved);
    assert_file(&setup, "kept.bin", &kept);
    let sent = || Some("Bearer t0ken".to_string());
    assert_eq!(setup.source.authorizations("job/moved.bin"), [sent()]);
    assert_eq!(
        elsewhere.authorizations("other/moved.bin"),
        [None],
        "the other host got the token"
    );
    assert_eq!(setup.source.authorizations("job/kept.bin"), [sent()]);
    assert_eq!(
        setup.source.authorizations("job/renamed/kept.bin"),
        [sent()]
    );
}

#[tokio::test]
async fn a_refusal_says_whose_credentials_were_sent_or_that_none_were() {
    let contents = bytes(23, 1000);
    let mut setup = Setup::new(&[("a.bin", contents)]).await;
    setup
        .source
        .with(|s| s.require = Some("Bearer right".into()));

    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source answered 401 Unauthorized ({}/job/a.bin) and no prefix in \
             the sources file (--sources-file) covers it, so no credentials were sent",
            setup.source.base
        )
    );

    let prefix = format!("{}/job/", setup.source.base);
    setup.fetcher = setup.fetcher.clone().access(bearer(&prefix, "wrong"));
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source answered 401 Unauthorized ({}/job/a.bin) to the credentials \
             of the prefix {prefix} in the sources file: check them",
            setup.source.base
        )
    );
    assert!(!error.contains("wrong"), "the token is not shown");

    // After a redirect: the message names where it went, without its query
    // (a signature, perhaps), and that nothing was sent there.
    let elsewhere = Source::start().await;
    elsewhere.with(|s| s.require = Some("Bearer right".into()));
    setup.source.with(|s| {
        s.require = None;
        s.redirects.insert(
            "job/a.bin".into(),
            format!("{}/other/a.bin?signature=abc", elsewhere.base),
        )
    });
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source answered 401 Unauthorized ({}/job/a.bin, redirected to \
             {}/other/a.bin) and no prefix in the sources file (--sources-file) covers it, \
             so no credentials were sent",
            setup.source.base, elsewhere.base
        )
    );
}

#[tokio::test]
async fn endless_redirects_are_an_error() {
    let setup = Setup::new(&[("a.bin", bytes(24, 10))]).await;
    setup.source.with(|s| {
        s.redirects.insert("job/a.bin".into(), "/job/a.bin".into());
    });
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source redirected more than 10 times ({}/job/a.bin)",
            setup.source.base
        )
    );
    assert_eq!(setup.source.requests("job/a.bin").len(), 11);
}

#[test]
fn a_sources_file_that_cannot_be_used_stops_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sources.toml");
    let cases = [
        (
            "[[source]]\nprefix = \"https://hub.internal/models/\"\n\
             headers = { Authorization = \"Bearer ${BERTH_TEST_UNSET_TOKEN}\" }",
            "prefix \"https://hub.internal/models/\": headers.Authorization: the host environment \
             variable BERTH_TEST_UNSET_TOKEN is not set (set it before starting berth)",
        ),
        (
            "[[source]]\nprefix = \"https://hub.internal/models/\"\ntoken = \"x\"",
            "line 3: unknown field `token`, expected one of `prefix`, `headers`, `options`, \
             `anonymous`",
        ),
    ];
    for (text, expected) in cases {
        std::fs::write(&path, text).unwrap();
        let error = Access::load(&path).unwrap_err().to_string();
        assert_eq!(
            error,
            format!("sources file {}: {expected}", path.display())
        );
    }
}
