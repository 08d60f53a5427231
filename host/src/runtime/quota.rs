//! The out-dir quota: how much a deployment's `/out` may hold. WASI gives
//! no hook on a guest's writes, so the directory is measured while the
//! deployer runs, at an interval that grows with the cost of measuring it,
//! and once more when the call returns: a deployer is stopped at most one
//! interval's worth of writing past its quota, and a completed deployment
//! never holds more than it. Reads sizes only, never a file's contents;
//! never follows a symlink.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The shortest pause between two measurements.
const FIRST_INTERVAL: Duration = Duration::from_millis(20);
/// Measuring may take at most this share of the time (a huge tree is
/// measured less often).
const MEASURING_SHARE: u32 = 10;

/// Every file, directory or link counts at least one block, so a deployer
/// cannot exhaust the volume's inodes with empty files under its quota.
const BLOCK: u64 = 4096;

/// The bytes a directory tree takes: each entry's apparent size or its
/// allocated blocks, whichever is more (a sparse file counts its length,
/// a preallocated one its blocks), and at least one block. Entries that
/// vanish while it is walked count nothing.
pub(crate) fn used(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut pending: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let size = meta.len().max(meta.blocks().saturating_mul(512)).max(BLOCK);
            total = total.saturating_add(size);
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    total
}

/// Resolves once `dir` holds more than `limit` bytes.
pub(crate) async fn exceeded(dir: PathBuf, limit: u64) {
    let mut interval = FIRST_INTERVAL;
    loop {
        tokio::time::sleep(interval).await;
        let clock = Instant::now();
        let walked = dir.clone();
        let Ok(bytes) = tokio::task::spawn_blocking(move || used(&walked)).await else {
            // The runtime is shutting down; the call ends with it.
            return std::future::pending().await;
        };
        if bytes > limit {
            return;
        }
        interval = FIRST_INTERVAL.max(clock.elapsed() * MEASURING_SHARE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lengths_blocks_and_entries_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(used(dir.path()), 0);
        std::fs::write(dir.path().join("small"), b"x").unwrap();
        assert_eq!(used(dir.path()), BLOCK, "a 1-byte file takes a block");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/ten"), vec![7u8; 10 * BLOCK as usize]).unwrap();
        assert_eq!(used(dir.path()), BLOCK + BLOCK + 10 * BLOCK);
        // Sparse: its length counts, though it holds no blocks.
        let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        assert_eq!(used(dir.path()), 12 * BLOCK + (1 << 30));
        // A link to something huge counts as a link.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![0u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        assert_eq!(used(dir.path()), 13 * BLOCK + (1 << 30));
    }

    #[tokio::test]
    async fn resolves_once_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let watching = tokio::spawn(exceeded(dir.path().to_path_buf(), 3 * BLOCK));
        std::fs::write(dir.path().join("a"), vec![1u8; 3 * BLOCK as usize]).unwrap();
        tokio::time::sleep(FIRST_INTERVAL * 5).await;
        assert!(!watching.is_finished(), "at the limit is within it");
        std::fs::write(dir.path().join("b"), b"one more").unwrap();
        tokio::time::timeout(Duration::from_secs(10), watching)
            .await
            .expect("noticed within seconds")
            .unwrap();
    }
}
