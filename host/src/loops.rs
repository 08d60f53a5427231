//! The server's long-lived loops, supervised: each runs under a name in
//! the one set `serve` makes (`Loops`), and one that ends before the
//! server's stop (it returned, or it panicked) is not a silent hole: it is
//! an error in the log naming it and how it ended, a count in
//! `berth_loops_ended_total{name}`, and a reason for `/readyz` to answer
//! 503 naming it (`Loops::ended`). A loop whose end must change what the
//! server does says so (`spawn_then`: the fence's end stops what runs
//! here). A task that ends by design when its work is done (`spawn_once`)
//! counts only when it panics.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The supervised set of one server. Cheap to clone.
#[derive(Clone)]
pub struct Loops {
    stop: CancellationToken,
    ended: Arc<Mutex<Vec<String>>>,
}

impl Loops {
    /// A set whose loops may end once `stop` is cancelled, and not before.
    pub fn new(stop: CancellationToken) -> Self {
        Self {
            stop,
            ended: Arc::default(),
        }
    }

    /// Runs `task`, a loop that runs until the server stops, as `name`.
    pub fn spawn(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        self.spawn_then(name, task, |_| {})
    }

    /// As `spawn`, and `then(how)` if it ends before the server's stop.
    pub fn spawn_then(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
        then: impl FnOnce(&str) + Send + 'static,
    ) -> JoinHandle<()> {
        self.start(name, task, false, then)
    }

    /// Runs `task`, which ends when its work is done, as `name`: only a
    /// panic counts as its end.
    pub fn spawn_once(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        self.start(name, task, true, |_| {})
    }

    fn start(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
        once: bool,
        then: impl FnOnce(&str) + Send + 'static,
    ) -> JoinHandle<()> {
        let this = self.clone();
        let task = crate::failpoint::loop_panic(name).then(|()| task);
        tokio::spawn(async move {
            let how = match AssertUnwindSafe(task).catch_unwind().await {
                Ok(()) if once => return,
                Ok(()) => "it returned".to_string(),
                Err(panic) => format!("it panicked: {}", panic_message(&*panic)),
            };
            if this.stop.is_cancelled() {
                return;
            }
            tracing::error!(
                loop_name = name,
                "the {name} ended while the server runs ({how}); /readyz answers 503 until the \
                 server is restarted"
            );
            crate::metrics::loop_ended(name);
            this.ended
                .lock()
                .expect("never poisoned")
                .push(format!("the {name} ended ({how})"));
            then(&how);
        })
    }

    /// Watches `task`, a loop started elsewhere (the database's own) as
    /// `name`.
    pub fn watch(&self, name: &'static str, task: JoinHandle<()>) {
        self.spawn(name, async move {
            if let Err(e) = task.await
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        });
    }

    /// What ended before the server's stop, each as a sentence; empty
    /// while every loop runs.
    pub fn ended(&self) -> Vec<String> {
        self.ended.lock().expect("never poisoned").clone()
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_loop_that_ends_before_the_stop_is_named_and_its_end_acted_on() {
        let stop = CancellationToken::new();
        let loops = Loops::new(stop.clone());
        let (told, heard) = tokio::sync::oneshot::channel();
        loops
            .spawn_then("fence", async { panic!("out of luck") }, move |how| {
                told.send(how.to_string()).unwrap();
            })
            .await
            .unwrap();
        assert_eq!(heard.await.unwrap(), "it panicked: out of luck");
        loops.spawn("queue worker", async {}).await.unwrap();
        // Done by design: not an end.
        loops.spawn_once("adoption", async {}).await.unwrap();
        assert_eq!(
            loops.ended(),
            [
                "the fence ended (it panicked: out of luck)",
                "the queue worker ended (it returned)"
            ]
        );
        // After the stop, an end is what is expected.
        stop.cancel();
        loops.spawn("rules follower", async {}).await.unwrap();
        loops
            .spawn_once("adoption", async { panic!("late") })
            .await
            .unwrap();
        assert_eq!(loops.ended().len(), 2);
    }
}
