//! What is refused: bytes that fail their hash (never kept), a source
//! whose size contradicts the record, a model that would not fit (both
//! before a byte is asked for).

use super::*;

#[tokio::test]
async fn wrong_bytes_are_never_kept() {
    let contents = bytes(7, BIG);
    let mut setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.model.files[0].sha256 = Some("0".repeat(64));
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file big.bin: sha256 mismatch: expected 0000"),
        "{error}"
    );
    assert_eq!(setup.on_disk(), Vec::<String>::new());
}

#[tokio::test]
async fn wrong_bytes_in_pieces_are_never_kept() {
    let (mut setup, _) = in_pieces(25, 4).await;
    setup.model.files[0].sha256 = Some("0".repeat(64));
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file big.bin: sha256 mismatch: expected 0000"),
        "{error}"
    );
    assert_eq!(setup.on_disk(), Vec::<String>::new());
}

#[tokio::test]
async fn a_source_whose_size_differs_from_the_record_is_refused_before_downloading() {
    for connections in [1, 4] {
        let (mut setup, _) = in_pieces(27, connections).await;
        setup.model.files[0].size_bytes += 1;
        let error = setup.fetch().await.unwrap_err().to_string();
        let expected = format!(
            "file big.bin: the source has {BIG} bytes for this file, but the record says {}",
            BIG + 1
        );
        assert!(error.starts_with(&expected), "{connections}: {error}");
        assert_eq!(setup.on_disk(), Vec::<String>::new(), "{connections}");
    }
}

#[tokio::test]
async fn a_model_that_would_not_fit_is_refused_before_a_byte_is_asked_for() {
    let contents = bytes(30, 1000);
    let mut setup = Setup::new(&[("huge.bin", contents.clone()), ("small.bin", contents)]).await;
    // Recorded as a petabyte: no test machine has the room.
    setup.model.files[0].size_bytes = 1 << 50;
    let error = setup.fetch().await.unwrap_err();
    assert!(matches!(error, Error::NoRoom { needed, .. } if needed == (1 << 50) + 1000));
    let error = error.to_string();
    assert!(
        error.contains("the missing files need 1.0 PiB, but the volume has")
            && error.contains("free some space, or move --models-dir"),
        "{error}"
    );
    assert!(setup.source.requests("job/huge.bin").is_empty());
    assert!(setup.source.requests("job/small.bin").is_empty());

    // The reserve counts too: a small model that would eat into it.
    let (mut setup, _) = in_pieces(31, 1).await;
    setup.fetcher = setup.fetcher.clone().reserve(1 << 60);
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(error.contains("berth keeps 1024 PiB of it"), "{error}");
    assert!(setup.source.requests("job/big.bin").is_empty());
}
