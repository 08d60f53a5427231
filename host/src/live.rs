//! Deployments running in this process, as they run: how to cancel each
//! (and why it was cancelled), where it stands, what its deployer said.
//! Callbacks from the fetcher and the guest only touch memory here; the
//! pipeline flushes progress to the database and the event stream at a
//! bounded rate.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::fetch;
use crate::model::{Deployment, OwnCall, Phase, Progress, Receipt};
use crate::runtime::{GuestLevel, LogReporter, Reporter};

/// A deployment's log keeps at most this many bytes; older lines go first.
const MAX_LOG_BYTES: usize = 256 * 1024;

#[derive(Default)]
pub struct Live {
    running: Mutex<HashMap<i64, Arc<Running>>>,
}

impl Live {
    pub fn insert(&self, running: Arc<Running>) {
        self.running
            .lock()
            .expect("live lock")
            .insert(running.deploy_id, running);
    }

    pub fn remove(&self, deploy_id: i64) {
        self.running.lock().expect("live lock").remove(&deploy_id);
    }

    pub fn all(&self) -> Vec<Arc<Running>> {
        self.running
            .lock()
            .expect("live lock")
            .values()
            .cloned()
            .collect()
    }

    pub fn get(&self, deploy_id: i64) -> Option<Arc<Running>> {
        self.running
            .lock()
            .expect("live lock")
            .get(&deploy_id)
            .cloned()
    }
}

pub struct Running {
    pub deploy_id: i64,
    cancel: CancellationToken,
    finished: CancellationToken,
    /// The row as its end was recorded here.
    ended: OnceLock<Deployment>,
    reason: OnceLock<String>,
    state: Mutex<State>,
    log: LogReporter,
    /// When the lease this server took on it was computed (a lease
    /// before its row's `lease_until`): the fence counts from here until
    /// a beat renews it.
    leased_at: std::time::Instant,
}

struct State {
    phase: Phase,
    progress: Progress,
    /// Changed since the last `take_update`.
    dirty: bool,
    lines: VecDeque<String>,
    bytes: usize,
    dropped: usize,
    /// Every put into a publishing target so far, in order.
    published: Vec<Receipt>,
}

impl Running {
    pub fn new(deploy_id: i64, plugin: &str, cancel: CancellationToken) -> Self {
        Self {
            deploy_id,
            cancel,
            finished: CancellationToken::new(),
            ended: OnceLock::new(),
            reason: OnceLock::new(),
            state: Mutex::new(State {
                phase: Phase::Fetching,
                progress: Progress::default(),
                // The row was recorded with this phase and no progress.
                dirty: false,
                lines: VecDeque::new(),
                bytes: 0,
                dropped: 0,
                published: Vec::new(),
            }),
            log: LogReporter::new(plugin, Some(deploy_id)),
            leased_at: std::time::Instant::now(),
        }
    }

    /// The same, leased from `at` rather than now.
    pub fn leased_from(mut self, at: std::time::Instant) -> Self {
        self.leased_at = at;
        self
    }

    pub fn leased_at(&self) -> std::time::Instant {
        self.leased_at
    }

    /// Stops the deployment; the first reason given is the one recorded.
    pub fn cancel(&self, reason: &str) {
        let _ = self.reason.set(reason.to_string());
        self.cancel.cancel();
    }

    /// Cancelled when the deployment is cancelled or the server stops.
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Marks the run over, with the row that recorded its end (none when
    /// another server had ended it first).
    pub fn finish(&self, ended: Option<Deployment>) {
        if let Some(row) = ended {
            let _ = self.ended.set(row);
        }
        self.finished.cancel();
    }

    /// The row that recorded its end here, once `finished`: a caller
    /// waiting here needs no read of it.
    pub fn ended(&self) -> Option<&Deployment> {
        self.ended.get()
    }

    pub fn is_finished(&self) -> bool {
        self.finished.is_cancelled()
    }

    /// Resolves once the deployment's outcome is recorded.
    pub async fn finished(&self) {
        self.finished.cancelled().await;
    }

    pub fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    pub fn set_phase(&self, phase: Phase) {
        let mut state = self.state.lock().expect("running lock");
        state.phase = phase;
        state.dirty = true;
    }

    pub fn phase(&self) -> Phase {
        self.state.lock().expect("running lock").phase
    }

    /// The current phase and progress, if they changed since last asked.
    pub fn take_update(&self) -> Option<(Phase, Progress)> {
        let mut state = self.state.lock().expect("running lock");
        std::mem::take(&mut state.dirty).then(|| (state.phase, state.progress.clone()))
    }

    pub fn snapshot(&self) -> Progress {
        self.state.lock().expect("running lock").progress.clone()
    }

    /// What it put into publishing targets so far.
    pub fn published(&self) -> Vec<Receipt> {
        self.state.lock().expect("running lock").published.clone()
    }

    /// How many puts it has made so far.
    pub fn published_count(&self) -> usize {
        self.state.lock().expect("running lock").published.len()
    }

    /// The deployer's log lines so far, oldest first.
    pub fn logs(&self) -> String {
        let state = self.state.lock().expect("running lock");
        let mut text = String::new();
        if state.dropped > 0 {
            text.push_str(&format!("[{} earlier lines dropped]\n", state.dropped));
        }
        for line in &state.lines {
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

impl fetch::Observer for Running {
    fn fetched(&self, bytes_done: u64, bytes_total: u64, files_done: usize, files_total: usize) {
        let mut state = self.state.lock().expect("running lock");
        let p = &mut state.progress;
        (p.bytes_done, p.bytes_total, p.files_done, p.files_total) =
            (bytes_done, bytes_total, files_done, files_total);
        state.dirty = true;
    }
}

impl Reporter for Running {
    fn log(&self, level: GuestLevel, message: &str) {
        self.log.log(level, message);
        self.keep(format!("{} {message}", level.as_str()));
    }

    /// Into the deployment's log only: the server log has it already.
    /// Marked `berth` where a guest's line has its level, so a plugin
    /// cannot write a line that reads as the host's.
    fn host_line(&self, message: &str) {
        self.keep(format!("berth {message}"));
    }

    fn progress(&self, done: u64, total: u64, note: &str) {
        self.log.progress(done, total, note);
        let mut state = self.state.lock().expect("running lock");
        let p = &mut state.progress;
        (p.deployer_done, p.deployer_total) = (done, total);
        p.deployer_note = note.to_string();
        state.dirty = true;
    }

    fn publishing(&self, bytes: u64) {
        let mut state = self.state.lock().expect("running lock");
        state.progress.published_bytes += bytes;
        state.dirty = true;
    }

    /// Counted in the progress, which is always kept, and said in the
    /// deployment's log, which keeps its newest lines.
    fn called(&self, call: &OwnCall) {
        self.log.called(call);
        self.keep(format!("berth {call}"));
        let mut state = self.state.lock().expect("running lock");
        let p = &mut state.progress;
        p.calls += 1;
        p.calls_sent_bytes += call.sent;
        p.calls_received_bytes += call.received;
        state.dirty = true;
    }

    fn published(&self, receipt: &Receipt) {
        self.log.published(receipt);
        let mut state = self.state.lock().expect("running lock");
        // `publishing` has counted the put's bytes already, each once
        // whatever the retries, and puts of a batch overlap: the count
        // is left as it is.
        state.progress.published_files += 1;
        state.published.push(receipt.clone());
        state.dirty = true;
    }
}

impl Running {
    /// Keeps one line of the deployment's log, dropping the oldest past
    /// the bound.
    fn keep(&self, line: String) {
        let mut state = self.state.lock().expect("running lock");
        state.bytes += line.len() + 1;
        state.lines.push_back(line);
        while state.bytes > MAX_LOG_BYTES {
            let Some(old) = state.lines.pop_front() else {
                break;
            };
            state.bytes -= old.len() + 1;
            state.dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_are_bounded_and_say_what_was_dropped() {
        let running = Running::new(1, "p", CancellationToken::new());
        let line = "x".repeat(1000);
        for _ in 0..300 {
            running.log(GuestLevel::Info, &line);
        }
        let logs = running.logs();
        assert!(logs.len() <= MAX_LOG_BYTES + 100, "{}", logs.len());
        assert!(
            logs.starts_with("[40 earlier lines dropped]\n"),
            "{}",
            &logs[..40]
        );
    }

    #[test]
    fn updates_are_reported_once_and_the_first_cancel_reason_wins() {
        let running = Running::new(1, "p", CancellationToken::new());
        assert!(running.take_update().is_none(), "nothing new at the start");
        running.progress(1, 2, "half");
        let (phase, progress) = running.take_update().unwrap();
        assert_eq!(
            (
                phase,
                progress.deployer_done,
                progress.deployer_note.as_str()
            ),
            (Phase::Fetching, 1, "half")
        );
        running.cancel("cancelled");
        running.cancel("later");
        assert_eq!(running.reason(), Some("cancelled"));
    }
}
