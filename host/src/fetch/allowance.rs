//! What every file fetched in pieces at once shares (`pieces`): the
//! connections beyond each file's first, the chunks on their way to the
//! disk threads and the chunks kept for the hashes. One budget for them
//! all is what bounds a server's memory however many files it fetches.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::partial::QUEUE;

/// The most written chunks kept in memory for the hashes of all files
/// fetched at once. A chunk can hold on to its connection's read buffer
/// (up to hyper's 400 KiB) however small it is, so chunks are counted, not
/// their bytes: this bounds what they keep to 16 MiB, and it is reached
/// only when a hash falls behind.
const FRESH_CHUNKS: usize = 40;

/// What every file this process fetches in pieces at once shares: the
/// connections beyond each file's first, the chunks queued for the disks,
/// and the written chunks kept in memory for the hashes. Each file alone
/// may use all of it; several at once hold no more than one would.
#[derive(Clone)]
pub(crate) struct Allowance {
    /// The most connections one file is read over (`--fetch-connections`).
    pub(super) most: usize,
    /// `most - 1` permits, one for each connection beyond a file's first.
    pub(super) spare: Arc<Semaphore>,
    /// `QUEUE` permits, one for each chunk on its way to a disk thread.
    pub(super) queued: Arc<Semaphore>,
    /// `FRESH_CHUNKS` permits, one for each chunk kept for a hash.
    pub(super) kept: Arc<Semaphore>,
}

impl Allowance {
    pub(crate) fn new(connections: usize) -> Self {
        Self {
            most: connections.max(1),
            spare: Arc::new(Semaphore::new(connections.saturating_sub(1))),
            queued: Arc::new(Semaphore::new(QUEUE)),
            kept: Arc::new(Semaphore::new(FRESH_CHUNKS)),
        }
    }

    /// Connections, queued chunks and kept chunks none of the files holds
    /// now.
    #[cfg(test)]
    pub(crate) fn free(&self) -> [usize; 3] {
        [&self.spare, &self.queued, &self.kept].map(|s| s.available_permits())
    }
}
