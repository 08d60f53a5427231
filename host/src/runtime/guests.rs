//! The threads guests run on: an async runtime of the `Runtime`'s own,
//! beside the one that serves HTTP, so a guest computing between two epoch
//! ticks or blocked in a file read (`allow_blocking_current_thread`) holds
//! one of these threads, never one that answers requests. Knows nothing of
//! plugins: it runs futures and hands back their output.

use std::future::Future;

use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

pub(crate) struct GuestThreads {
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
}

impl GuestThreads {
    /// As many threads as cores: guests are CPU-bound or block on the page
    /// cache, so more threads would only take turns.
    pub(crate) fn new() -> std::io::Result<Self> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("berth-guest")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Starts `work` on the guest threads, in the caller's span (so what a
    /// guest logs stays under its request). Dropping the handle aborts it.
    pub(crate) fn spawn<F>(&self, work: F) -> AbortOnDropHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let runtime = self.runtime.as_ref().expect("set until dropped");
        AbortOnDropHandle::new(runtime.spawn(work.in_current_span()))
    }
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        // A runtime may be dropped inside another (the server's, a test's),
        // where waiting for its threads is not allowed: calls still running
        // are cancelled and the threads end on their own.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
