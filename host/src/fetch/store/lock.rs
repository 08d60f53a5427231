//! One fetch per model directory at a time, across threads and processes
//! that share the disk: an exclusive `flock` on a lock file beside the
//! model directories (not inside, where deployers would see it). Waiters in
//! this process queue on an async mutex first, so they are woken in turn
//! the moment the lock is free instead of polling the file. Servers on
//! other machines sharing the volume also take a `SharedLocks` lock named
//! after the lock file: file locks on network filesystems cannot be
//! trusted.

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

/// Locks every server sharing the models volume sees, whatever machine
/// it runs on (a PostgreSQL advisory lock).
pub trait SharedLocks: Send + Sync {
    /// Waits for the lock named `key`; held until the guard is dropped.
    fn lock<'a>(
        &'a self,
        key: &'a str,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Box<dyn Send + Sync>>>;
}

type Queues = Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>;

/// The in-process queue of each lock file in use.
fn queues() -> &'static Queues {
    static QUEUES: OnceLock<Queues> = OnceLock::new();
    QUEUES.get_or_init(Queues::default)
}

/// Held while a model directory is being filled; released on drop.
pub(crate) struct DirLock {
    path: PathBuf,
    file: Option<File>,
    shared: Option<Box<dyn Send + Sync>>,
    turn: Option<OwnedMutexGuard<()>>,
}

impl DirLock {
    /// Waits for the lock without blocking a thread, so a cancelled waiter
    /// simply stops waiting.
    pub(crate) async fn acquire(
        path: &Path,
        shared: Option<&dyn SharedLocks>,
    ) -> std::io::Result<Self> {
        let queue = queues()
            .lock()
            .expect("lock queues")
            .entry(path.to_path_buf())
            .or_default()
            .clone();
        let turn = queue.lock_owned().await;
        let shared = match shared {
            Some(locks) => {
                let key = path.file_name().unwrap_or_default().to_string_lossy();
                Some(locks.lock(&key).await?)
            }
            None => None,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        // Only another process can hold the file lock now; it is polled.
        let mut pause = Duration::from_millis(5);
        loop {
            match file.try_lock() {
                Ok(()) => {
                    return Ok(Self {
                        path: path.to_path_buf(),
                        file: Some(file),
                        shared,
                        turn: Some(turn),
                    });
                }
                Err(TryLockError::WouldBlock) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // The file lock goes first, so the next waiter of this process
        // finds it free when the queue admits it.
        self.file.take();
        self.shared.take();
        let mut queues = queues().lock().expect("lock queues");
        self.turn.take();
        // Forget the queue when nobody else holds or waits for it: the map
        // and nothing else refers to it.
        if queues
            .get(&self.path)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            queues.remove(&self.path);
        }
    }
}
