//! Interrupted downloads continued: from the bytes kept, with the hash
//! from the checkpoint when the partial is untouched since, hashed again
//! otherwise, and downloaded whole when the kept bytes prove wrong.

use super::*;
use crate::fetch::partial::Checkpoint;
use crate::fetch::ranges::Ranges;
use crate::fetch::sha::Sha256 as HashState;
use crate::fetch::store::stamp::Stamp;

#[tokio::test]
async fn a_broken_off_download_continues_where_it_stopped() {
    let contents = bytes(1, BIG);
    let setup = Setup::new(&[("w/big.bin", contents.clone())]).await;
    setup.source.with(|s| s.cut_after = Some(2 * 1024 * 1024));

    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file w/big.bin: the download broke off"),
        "{error}"
    );
    assert_eq!(
        setup.on_disk(),
        ["w/.fetch-big.bin"],
        "only the partial download, under its temp name"
    );
    let kept = std::fs::metadata(setup.path("w/.fetch-big.bin"))
        .unwrap()
        .len();
    assert!(kept > 0 && kept <= 2 * 1024 * 1024, "kept {kept} bytes");

    // The process lived through the interruption: it left a checkpoint of
    // its hash, outside the model directory.
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/w/big.bin.json");
    assert!(record.exists(), "no checkpoint at {}", record.display());

    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "w/big.bin", &contents);
    assert_eq!(setup.on_disk(), ["w/big.bin"]);
    assert!(!record.exists(), "the checkpoint is used up");
    assert_eq!(
        setup.source.requests("job/w/big.bin"),
        [None, Some(format!("bytes={kept}-"))]
    );
}

#[tokio::test]
async fn kept_bytes_are_hashed_again_and_a_wrong_partial_is_downloaded_whole() {
    let contents = bytes(2, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    // What an earlier attempt left, with one byte changed since.
    let mut partial = contents[..BIG / 2].to_vec();
    partial[1000] ^= 0xff;
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &partial).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [Some(format!("bytes={}-", BIG / 2)), None]
    );
}

/// A download of `big.bin` cut halfway: the setup, the file's contents,
/// the kept partial, its checkpoint record and how many bytes were kept.
async fn cut_halfway(seed: u8) -> (Setup, Vec<u8>, PathBuf, PathBuf, u64) {
    let contents = bytes(seed, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.source.with(|s| s.cut_after = Some(BIG / 2));
    setup.fetch().await.unwrap_err();
    let partial = setup.path(".fetch-big.bin");
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/big.bin.json");
    let kept = std::fs::metadata(&partial).unwrap().len();
    (setup, contents, partial, record, kept)
}

#[tokio::test]
async fn a_partial_changed_since_its_checkpoint_is_hashed_again() {
    let (setup, contents, partial, record, kept) = cut_halfway(12).await;
    let kept = kept as usize;
    let sha256 = sha(&contents);
    // Same length, mtime put back, one byte different: the checkpoint's
    // hash no longer describes the file, and its stamp says so.
    let mtime = std::fs::metadata(&partial).unwrap().modified().unwrap();
    let mut changed = contents[..kept].to_vec();
    changed[100] ^= 0x01;
    std::fs::write(&partial, &changed).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&partial)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::copy(&record, record.with_extension("copy")).unwrap();
    assert!(Checkpoint::take(&record, &partial, &sha256).is_none());

    // Through a fetch: the kept bytes are hashed again, found wrong, and the
    // file is downloaded whole.
    std::fs::rename(record.with_extension("copy"), &record).unwrap();
    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [None, Some(format!("bytes={kept}-")), None]
    );
}

#[tokio::test]
async fn an_untouched_partial_is_continued_from_its_checkpoint() {
    let (setup, contents, partial, record, kept) = cut_halfway(13).await;
    std::fs::copy(&record, record.with_extension("copy")).unwrap();
    let hashed =
        Checkpoint::take(&record, &partial, &sha(&contents)).expect("the checkpoint vouches");
    assert_eq!(hashed.have, Ranges::prefix(kept));
    assert_eq!(
        hashed.hash.map(|h| h.len()),
        Some(kept),
        "the checkpoint's hash covers every kept byte"
    );

    // Through a fetch: continued from the kept bytes with a range request,
    // verified, and the checkpoint used up.
    std::fs::rename(record.with_extension("copy"), &record).unwrap();
    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [None, Some(format!("bytes={kept}-"))]
    );
    assert!(!record.exists(), "the checkpoint is used up");
}

#[tokio::test]
async fn a_checkpoint_is_believed_without_reading_the_kept_bytes_back() {
    let (setup, contents, partial, record, kept) = cut_halfway(15).await;
    // A checkpoint that vouches for the partial as it is, with the hash of
    // other bytes of the same length: were the kept bytes read back and
    // hashed, the file would verify at once; believed, the file fails its
    // hash and is downloaded whole.
    let mut other = HashState::default();
    other.update(&vec![0; kept as usize]);
    let stamp = Stamp::of(&std::fs::metadata(&partial).unwrap(), Some(&sha(&contents)));
    Checkpoint::new(stamp, other, Ranges::prefix(kept))
        .save(&record)
        .unwrap();

    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [None, Some(format!("bytes={kept}-")), None]
    );
}

#[tokio::test]
async fn a_checkpoint_in_the_old_format_is_not_read_and_the_kept_bytes_are_hashed_again() {
    let (setup, contents, partial, record, kept) = cut_halfway(14).await;
    // What berth wrote before checkpoints had a format: the state words of
    // its own SHA-256, the length, the bytes of the unfinished block. The
    // stamp still vouches for the file, so only the format can turn it down.
    // The words are not those of the kept bytes: were they believed, the
    // file would fail its hash and be downloaded whole.
    let new: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    let old = serde_json::json!({
        "stamp": new["stamp"],
        "hash": {
            "state": [0x6a09_e667_u32, 0xbb67_ae85_u32, 0x3c6e_f372_u32, 0xa54f_f53a_u32,
                      0x510e_527f_u32, 0x9b05_688c_u32, 0x1f83_d9ab_u32, 0x5be0_cd19_u32],
            "len": kept,
            "pending": contents[(kept - kept % 64) as usize..kept as usize],
        },
    });
    std::fs::write(&record, serde_json::to_vec(&old).unwrap()).unwrap();
    std::fs::copy(&record, record.with_extension("copy")).unwrap();
    assert!(Checkpoint::take(&record, &partial, &sha(&contents)).is_none());
    assert!(!record.exists(), "the old checkpoint is used up");

    // Through a fetch: continued from the kept bytes, which are hashed
    // again, and verified whole.
    std::fs::rename(record.with_extension("copy"), &record).unwrap();
    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [None, Some(format!("bytes={kept}-"))]
    );
}

#[tokio::test]
async fn a_source_without_ranges_is_read_from_the_start() {
    let contents = bytes(3, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.source.with(|s| s.ignore_ranges = true);
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &contents[..1000]).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);
}

#[tokio::test]
async fn a_complete_partial_is_verified_without_asking_the_source() {
    let contents = bytes(4, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &contents).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert!(setup.source.requests("job/big.bin").is_empty());
}

#[tokio::test]
async fn a_partial_longer_than_the_file_or_of_a_file_without_hash_is_not_continued() {
    let contents = bytes(5, BIG);
    let mut setup = Setup::new(&[("a.bin", contents.clone()), ("b.bin", contents.clone())]).await;
    setup.model.files[1].sha256 = None;
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-a.bin"), vec![0; BIG + 1]).unwrap();
    std::fs::write(setup.path(".fetch-b.bin"), vec![0; 1000]).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "a.bin", &contents);
    assert_file(&setup, "b.bin", &contents);
    assert_eq!(setup.source.requests("job/a.bin"), [None]);
    assert_eq!(setup.source.requests("job/b.bin"), [None]);
    assert_eq!(setup.on_disk(), ["a.bin", "b.bin"]);
}

#[tokio::test]
async fn a_cancelled_download_keeps_its_bytes_for_the_next_fetch() {
    let contents = bytes(6, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup
        .source
        .with(|s| s.slow = Some(Duration::from_millis(20)));
    let cancel = CancellationToken::new();
    let fetching = setup.fetcher.fetch(&setup.model, Arc::new(Quiet), &cancel);
    let partial = setup.path(".fetch-big.bin");
    let watch = async {
        while std::fs::metadata(&partial).map_or(0, |m| m.len()) < 256 * 1024 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
    };
    let (fetched, ()) = tokio::join!(fetching, watch);
    assert_eq!(fetched, Err(Error::Cancelled));

    setup.source.with(|s| s.slow = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    let requests = setup.source.requests("job/big.bin");
    assert_eq!(requests.len(), 2);
    let resumed_at: u64 = requests[1]
        .as_deref()
        .unwrap()
        .trim_start_matches("bytes=")
        .trim_end_matches('-')
        .parse()
        .unwrap();
    assert!(resumed_at >= 256 * 1024, "resumed at {resumed_at}");
}

/// The longest name a filesystem allows is downloaded, broken off,
/// continued from its checkpoint and linked from the blob store: berth's
/// own names for it (the partial, the checkpoint, a link's temporary name)
/// are short, so none overflows the 255-byte limit.
#[tokio::test]
async fn the_longest_file_name_is_fetched_resumed_and_linked() {
    let name = format!("w/{}", "n".repeat(255));
    let contents = bytes(7, BIG);
    let setup = Setup::new(&[(&name, contents.clone())]).await;
    setup.source.with(|s| s.cut_after = Some(BIG / 2));

    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(error.contains("the download broke off"), "{error}");
    let short = sha("n".repeat(255).as_bytes());
    assert_eq!(setup.on_disk(), [format!("w/.fetch-{short}")]);
    let record = setup
        .fetcher
        .models_dir
        .join(format!(".berth/job.resume/w/{short}.json"));
    assert!(record.exists(), "no checkpoint at {}", record.display());

    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, &name, &contents);
    assert_eq!(setup.on_disk(), [name.as_str()]);
    let requests = setup.source.requests(&format!("job/{name}"));
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1].is_some(),
        "continued with a range: {requests:?}"
    );

    // Another model with the same file gets it from the blob store: its
    // source (under another job id) serves nothing.
    let other = TrainedModel::from_files(
        "other",
        setup.model.source.clone(),
        setup.model.files.clone(),
    );
    setup
        .fetcher
        .fetch(&other, Arc::new(Quiet), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(setup.fetcher.dir_of("other").join(&name)).unwrap(),
        contents
    );
    assert!(setup.source.requests(&format!("other/{name}")).is_empty());
}
