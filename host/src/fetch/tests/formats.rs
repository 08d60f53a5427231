//! Formats told by the fetch: each file's, in the files' order, whether it
//! was downloaded or vouched for; a safetensors header that does not hold
//! fails the fetch, and the record never vouches for that copy.

use super::*;
use crate::model::Format;

/// A safetensors file of `header`, then `data` zeros.
fn safetensors(header: &str, data: usize) -> Vec<u8> {
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend(vec![0u8; data]);
    file
}

async fn fetch_known(setup: &Setup) -> Result<crate::fetch::Fetched, Error> {
    setup
        .fetcher
        .fetch_known(&setup.model, Arc::new(Quiet), &CancellationToken::new())
        .await
}

#[tokio::test]
async fn formats_are_told_whether_downloaded_or_vouched_for() {
    let weights = safetensors(
        r#"{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
        4,
    );
    let setup = Setup::new(&[
        ("config.json", br#"{"r": 8}"#.to_vec()),
        ("w.safetensors", weights),
        ("opt.pt", b"\x80\x02}q\x00.".to_vec()),
        ("notes.txt", b"trained on tickets".to_vec()),
    ])
    .await;
    let told = [
        Format::Json,
        Format::Safetensors,
        Format::Pickle,
        Format::Other,
    ];
    let downloaded = fetch_known(&setup).await.unwrap();
    assert_eq!(downloaded.formats, told);
    assert!(setup.fetcher.verified(&setup.model).is_some());
    let vouched = fetch_known(&setup).await.unwrap();
    assert_eq!(
        vouched, downloaded,
        "the vouched copy's heads tell the same"
    );
}

#[tokio::test]
async fn a_header_that_does_not_hold_fails_the_fetch_and_is_never_vouched_for() {
    let overlapping = safetensors(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
        6,
    );
    let setup = Setup::new(&[
        ("config.json", b"{}".to_vec()),
        ("w.safetensors", overlapping.clone()),
    ])
    .await;
    let refused = setup.fetch().await.unwrap_err();
    let Error::File { path, reason } = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(path, "w.safetensors");
    assert!(
        reason.starts_with("is not a valid safetensors file: tensors \"a\" and \"b\" overlap"),
        "{reason}"
    );
    // The bytes are the registered ones and stay; the copy is not vouched
    // for, so the next fetch looks again and refuses again.
    assert_file(&setup, "w.safetensors", &overlapping);
    assert!(setup.fetcher.verified(&setup.model).is_none());
    assert_eq!(setup.fetch().await.unwrap_err(), refused);
    assert!(setup.fetcher.verified(&setup.model).is_none());
}
