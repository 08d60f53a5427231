//! A large file read in pieces over several connections: every piece asked
//! for once, cut-off pieces kept with a checkpoint and only the rest asked
//! for, and one stream where pieces cannot help.

use super::*;
use crate::fetch::cut::pieces as cut;
use crate::fetch::partial::Checkpoint;
use crate::fetch::store::stamp::Stamp;

/// The `(first, end)` byte spans of `bytes=FIRST-LAST` ranges.
fn spans(requests: &[Option<String>]) -> Vec<(u64, u64)> {
    requests
        .iter()
        .map(|range| {
            let range = range.as_deref().expect("a range request");
            let (first, last) = range
                .strip_prefix("bytes=")
                .unwrap()
                .split_once('-')
                .unwrap();
            (first.parse().unwrap(), last.parse::<u64>().unwrap() + 1)
        })
        .collect()
}

#[tokio::test]
async fn a_large_file_is_read_in_pieces_over_several_connections_and_verified() {
    let (setup, contents) = in_pieces(20, 4).await;
    // 3.2 MB/s a connection: the file outlasts the windows in which the
    // connections are added (`pace`).
    setup
        .source
        .with(|s| s.slow = Some(Duration::from_millis(20)));
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);

    // Every piece asked for once, in file order, covering the file exactly.
    let spans = spans(&setup.source.requests("job/big.bin"));
    let mut sorted = spans.clone();
    sorted.sort();
    let expected: Vec<(u64, u64)> = (0..BIG as u64)
        .step_by(PIECE as usize)
        .map(|start| (start, (start + PIECE).min(BIG as u64)))
        .collect();
    assert_eq!(sorted, expected);
    let most = setup.source.with(|s| s.most_in_flight);
    assert!(
        (2..=4).contains(&most),
        "{most} answers at once, with 4 connections"
    );
    assert!(
        !setup.fetcher.models_dir.join(".berth/job.resume").exists(),
        "no checkpoint is left once the file is in place"
    );
}

#[tokio::test]
async fn files_fetched_at_once_share_the_connections_beyond_their_first() {
    let (a, b) = (bytes(22, BIG), bytes(23, BIG));
    let mut setup = Setup::new(&[("a.bin", a.clone()), ("b.bin", b.clone())]).await;
    setup.fetcher = setup.fetcher.clone().split(Split {
        connections: 4,
        piece_bytes: PIECE,
    });
    setup
        .source
        .with(|s| s.slow = Some(Duration::from_millis(20)));
    setup.fetch().await.unwrap();
    assert_file(&setup, "a.bin", &a);
    assert_file(&setup, "b.bin", &b);
    // Each file its first, and 3 spare between them: 5, where each file
    // on its own would take 4.
    let most = setup.source.with(|s| s.most_in_flight);
    assert!(
        (3..=5).contains(&most),
        "{most} answers at once for two files with 4 connections at most"
    );
    // Every spare connection, queued and kept chunk was given back.
    assert_eq!(setup.fetcher.allowance.free(), [3, 16, 40]);
}

#[tokio::test]
async fn a_source_that_allows_one_connection_gets_one_and_the_file_arrives() {
    let (setup, contents) = in_pieces(25, 4).await;
    setup.source.with(|s| {
        s.slow = Some(Duration::from_millis(20));
        s.most_allowed = Some(1);
    });
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    let asked = setup.source.requests("job/big.bin").len();
    let pieces = BIG.div_ceil(PIECE as usize);
    assert!(
        asked > pieces,
        "a second connection was tried: {asked} requests for {pieces} pieces"
    );
    assert_eq!(setup.source.with(|s| s.most_in_flight), 1);
}

#[tokio::test]
async fn a_small_file_or_a_single_connection_keeps_one_stream() {
    for (connections, piece_bytes) in [(1, PIECE), (4, BIG as u64 / 2 + 1)] {
        let contents = bytes(21, BIG);
        let mut setup = Setup::new(&[("big.bin", contents.clone())]).await;
        setup.fetcher = setup.fetcher.clone().split(Split {
            connections,
            piece_bytes,
        });
        setup.fetch().await.unwrap();
        assert_file(&setup, "big.bin", &contents);
        assert_eq!(setup.source.requests("job/big.bin"), [None]);
    }
}

#[tokio::test]
async fn pieces_cut_off_are_kept_with_a_checkpoint_and_only_the_rest_is_asked_for() {
    let (setup, contents) = in_pieces(22, 4).await;
    // Every answer breaks off after 100 KiB; the first comes so slowly
    // that a second connection is added meanwhile, which gives its piece
    // back when it breaks off. The first then leaves its piece
    // part-written, so the kept bytes have holes.
    setup.source.with(|s| {
        s.cut_after = Some(100 * 1024);
        s.slow_at_start = Some(Duration::from_millis(600));
    });
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file big.bin: the download broke off"),
        "{error}"
    );
    assert_eq!(setup.on_disk(), [".fetch-big.bin"]);
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/big.bin.json");
    let partial = setup.path(".fetch-big.bin");
    let asked_first = setup.source.requests("job/big.bin").len();
    let kept = Checkpoint::take(&record.clone(), &partial, &sha(&contents));
    let kept = kept.expect("the checkpoint vouches for the kept pieces");
    assert!(
        !kept.have.is_prefix(),
        "pieces after a gap are kept: {:?}",
        kept.have
    );
    let hashed = kept.hash.as_ref().unwrap().len();
    assert!(hashed <= kept.have.contiguous());
    let partial_bytes = std::fs::read(&partial).unwrap();
    for (start, end) in kept.have.iter() {
        let (start, end) = (start as usize, end as usize);
        assert!(
            partial_bytes[start..end] == contents[start..end],
            "kept bytes {start}..{end} are the source's"
        );
    }

    // Put the record back (take used it up) and continue.
    let checkpoint = Checkpoint::new(
        Stamp::of(&std::fs::metadata(&partial).unwrap(), Some(&sha(&contents))),
        kept.hash.clone().unwrap(),
        kept.have.clone(),
    );
    checkpoint.save(&record).unwrap();
    setup.source.with(|s| {
        s.cut_after = None;
        s.slow_at_start = None;
    });
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);
    let requests = setup.source.requests("job/big.bin");
    let asked: Vec<(u64, u64)> = spans(&requests[asked_first..]);
    let mut expected = Vec::new();
    for (start, end) in kept.have.missing(BIG as u64) {
        expected.extend(cut(&[(start, end)], PIECE).map(|p| (p.start, p.end)));
    }
    let mut asked_sorted = asked.clone();
    asked_sorted.sort();
    assert_eq!(
        asked_sorted, expected,
        "only the missing bytes were asked for"
    );
}

#[tokio::test]
async fn a_cancelled_download_in_pieces_continues_from_its_checkpoint() {
    let (setup, contents) = in_pieces(23, 4).await;
    setup
        .source
        .with(|s| s.slow = Some(Duration::from_millis(20)));
    let cancel = CancellationToken::new();
    let fetching = setup.fetcher.fetch(&setup.model, Arc::new(Quiet), &cancel);
    let watch = async {
        while setup.source.with(|s| s.requests.len()) < 6 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
    };
    let (fetched, ()) = tokio::join!(fetching, watch);
    assert_eq!(fetched, Err(Error::Cancelled));
    // The writer threads record the checkpoint after the fetch is dropped.
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/big.bin.json");
    for _ in 0..500 {
        if record.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(record.exists(), "no checkpoint at {}", record.display());
    let asked_first = setup.source.requests("job/big.bin").len();

    setup.source.with(|s| s.slow = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    let again: u64 = spans(&setup.source.requests("job/big.bin")[asked_first..])
        .iter()
        .map(|(start, end)| end - start)
        .sum();
    assert!(
        again < BIG as u64,
        "asked for {again} of {BIG} bytes again: the kept pieces were not used"
    );
}

#[tokio::test]
async fn a_source_that_ignores_ranges_is_read_in_one_stream_instead() {
    let (setup, contents) = in_pieces(24, 4).await;
    setup.source.with(|s| s.ignore_ranges = true);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [Some(format!("bytes=0-{}", PIECE - 1))],
        "the whole file came in answer to the first piece"
    );
}

#[tokio::test]
async fn pieces_left_without_a_checkpoint_are_hashed_and_then_downloaded_whole() {
    // What a kill -9 in the middle of a download in pieces leaves: a file
    // of full length with holes, and no checkpoint.
    let (setup, contents) = in_pieces(26, 4).await;
    let mut holes = contents.clone();
    holes[PIECE as usize..2 * PIECE as usize].fill(0);
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &holes).unwrap();
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);
}
