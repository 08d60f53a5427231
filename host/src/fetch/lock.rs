//! One fetch per model directory at a time, across threads and processes
//! that share the disk: an exclusive `flock` on a lock file beside the
//! model directories (not inside, where deployers would see it).

use std::fs::{File, TryLockError};
use std::path::Path;
use std::time::Duration;

/// Held while a model directory is being filled; released on drop.
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Waits for the lock without blocking a thread, so a cancelled waiter
    /// simply stops waiting.
    pub(crate) async fn acquire(path: &Path) -> std::io::Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = File::options().create(true).truncate(false).write(true).open(path)?;
        let mut pause = Duration::from_millis(5);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Self { _file: file }),
                Err(TryLockError::WouldBlock) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}
