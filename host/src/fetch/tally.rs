//! A fetch's progress, counted across its parallel downloads and told to
//! its `Observer` as it grows. Counts only: never reads or writes a file.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Observer;

/// Counts a fetch's progress across its parallel downloads.
pub(crate) struct Tally {
    progress: Arc<dyn Observer>,
    total_bytes: u64,
    total_files: usize,
    bytes: AtomicU64,
    files: AtomicUsize,
}

impl Tally {
    pub(crate) fn new(progress: Arc<dyn Observer>, total_bytes: u64, total_files: usize) -> Self {
        Self {
            progress,
            total_bytes,
            total_files,
            bytes: AtomicU64::new(0),
            files: AtomicUsize::new(0),
        }
    }

    /// `n` more bytes arrived (or were found already in place).
    pub(crate) fn bytes(&self, n: u64) {
        let done = self.bytes.fetch_add(n, Ordering::Relaxed) + n;
        let files = self.files.load(Ordering::Relaxed);
        self.progress
            .fetched(done, self.total_bytes, files, self.total_files);
    }

    /// Takes back bytes reported for an attempt that is being redone.
    pub(crate) fn rewind(&self, n: u64) {
        self.bytes.fetch_sub(n, Ordering::Relaxed);
    }

    /// One more file is in place, with `bytes` of it not counted before.
    pub(crate) fn file_done(&self, bytes: u64) {
        let files = self.files.fetch_add(1, Ordering::Relaxed) + 1;
        let done = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.progress
            .fetched(done, self.total_bytes, files, self.total_files);
    }
}
