//! The verification record: what it vouches for (an unchanged model, ready
//! without the lock or a byte read) and what it does not (a file changed
//! behind berth's back).

use std::time::SystemTime;

use super::*;
use crate::fetch::META_DIR;
use crate::fetch::store::lock::DirLock;

/// Changes a fetched file behind berth's back; the next fetch must notice.
type Tamper = fn(&Path, &[u8]);

#[tokio::test]
async fn the_verification_record_vouches_only_for_untouched_files() {
    let rewrite_in_place: Tamper = |path, contents| {
        let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
        let mut changed = contents.to_vec();
        changed[12345] ^= 0x01;
        std::fs::write(path, &changed).unwrap();
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    };
    let truncate: Tamper = |path, _| {
        let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_len(1000).unwrap();
        file.set_modified(mtime).unwrap();
    };
    let replace: Tamper = |path, contents| {
        // Another file of the same size and mtime renamed over it.
        let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
        let other = path.with_file_name("other");
        let mut changed = contents.to_vec();
        changed[0] ^= 0x01;
        std::fs::write(&other, &changed).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        std::fs::rename(&other, path).unwrap();
    };
    let delete: Tamper = |path, _| std::fs::remove_file(path).unwrap();
    // The blob store's name links the same inode: bytes changed in place
    // damage the blob too, and are downloaded again; a name given other
    // bytes, or none, gets the intact blob back without a download.
    let cases = [
        ("rewritten in place", rewrite_in_place, 2),
        ("truncated", truncate, 2),
        ("replaced", replace, 1),
        ("deleted", delete, 1),
    ];

    for (case, tamper, downloads) in cases {
        let contents = bytes(8, BIG);
        let kept = bytes(9, 1000);
        let setup = Setup::new(&[("big.bin", contents.clone()), ("kept.bin", kept.clone())]).await;
        setup.fetch().await.unwrap();
        tamper(&setup.path("big.bin"), &contents);

        setup.fetch().await.unwrap();
        assert_file(&setup, "big.bin", &contents);
        assert_file(&setup, "kept.bin", &kept);
        assert_eq!(
            setup.source.requests("job/big.bin").len(),
            downloads,
            "{case}: fetched again"
        );
        assert_eq!(
            setup.source.requests("job/kept.bin").len(),
            1,
            "{case}: the untouched file is kept"
        );
        assert_eq!(setup.on_disk(), ["big.bin", "kept.bin"], "{case}");
    }
}

#[tokio::test]
async fn an_unchanged_model_is_ready_without_the_lock_or_its_bytes() {
    let contents = bytes(10, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.fetch().await.unwrap();

    // Another fetch holds the directory: only the record can answer.
    let meta = setup.fetcher.models_dir.join(META_DIR);
    let held = DirLock::acquire(&meta.join("job.lock"), None)
        .await
        .unwrap();
    let refetch = tokio::time::timeout(Duration::from_secs(30), setup.fetch()).await;
    assert!(
        refetch
            .expect("the fetch did not wait for the lock")
            .is_ok()
    );
    drop(held);

    // Without the record, the bytes are read again, but not downloaded.
    std::fs::remove_file(meta.join("job.stamps.json")).unwrap();
    let before = std::fs::metadata(setup.path("big.bin"))
        .unwrap()
        .modified()
        .unwrap();
    setup.fetch().await.unwrap();
    assert_eq!(setup.source.requests("job/big.bin").len(), 1);
    assert!(
        meta.join("job.stamps.json").exists(),
        "the record is written again"
    );
    let after: SystemTime = std::fs::metadata(setup.path("big.bin"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after, "the file was not rewritten");
}

#[tokio::test]
async fn a_re_hash_still_catches_a_damaged_file_without_a_record() {
    let contents = bytes(11, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.fetch().await.unwrap();
    let meta = setup.fetcher.models_dir.join(META_DIR);
    std::fs::remove_file(meta.join("job.stamps.json")).unwrap();
    let mut damaged = contents.clone();
    damaged[BIG - 1] ^= 0x80;
    std::fs::write(setup.path("big.bin"), &damaged).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.source.requests("job/big.bin").len(), 2);
}
