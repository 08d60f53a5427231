//! Where a running plugin's voice goes: its `log` and `progress` calls and
//! its stdout/stderr lines. The runtime hands them to a [`Reporter`] and keeps
//! the tail of stderr, because a panic's message or a Python traceback is
//! only ever written there.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl GuestLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            GuestLevel::Debug => "debug",
            GuestLevel::Info => "info",
            GuestLevel::Warn => "warn",
            GuestLevel::Error => "error",
        }
    }
}

/// Receives what one plugin call says. Implementations must be cheap: they
/// run inside the guest's host calls.
pub trait Reporter: Send + Sync {
    fn log(&self, level: GuestLevel, message: &str);
    fn progress(&self, done: u64, total: u64, note: &str);
}

/// Writes everything to the server log, tagged with plugin and deployment.
pub struct LogReporter {
    pub plugin: String,
    pub deploy_id: Option<i64>,
}

impl Reporter for LogReporter {
    fn log(&self, level: GuestLevel, message: &str) {
        let (plugin, deploy_id) = (&self.plugin, self.deploy_id);
        match level {
            GuestLevel::Debug => {
                tracing::debug!(target: "berth::plugin", plugin, deploy_id, "{message}")
            }
            GuestLevel::Info => {
                tracing::info!(target: "berth::plugin", plugin, deploy_id, "{message}")
            }
            GuestLevel::Warn => {
                tracing::warn!(target: "berth::plugin", plugin, deploy_id, "{message}")
            }
            GuestLevel::Error => {
                tracing::error!(target: "berth::plugin", plugin, deploy_id, "{message}")
            }
        }
    }

    fn progress(&self, done: u64, total: u64, note: &str) {
        let (plugin, deploy_id) = (&self.plugin, self.deploy_id);
        tracing::debug!(target: "berth::plugin", plugin, deploy_id, done, total, "progress: {note}");
    }
}

/// How much of stderr is kept for the error text of a crashed call.
const TAIL_BYTES: usize = 4096;
/// A line longer than this is cut, so one endless line cannot grow memory.
const MAX_LINE_BYTES: usize = 16 * 1024;

/// One of the guest's output streams (stdout or stderr), split into lines
/// that go to the reporter; stderr also keeps its tail.
#[derive(Clone)]
pub(crate) struct GuestOutput {
    inner: Arc<Mutex<OutputInner>>,
}

struct OutputInner {
    level: GuestLevel,
    reporter: Arc<dyn Reporter>,
    line: Vec<u8>,
    tail: Option<VecDeque<u8>>,
}

impl GuestOutput {
    pub(crate) fn stdout(reporter: Arc<dyn Reporter>) -> Self {
        Self::new(GuestLevel::Info, reporter, false)
    }

    pub(crate) fn stderr(reporter: Arc<dyn Reporter>) -> Self {
        Self::new(GuestLevel::Warn, reporter, true)
    }

    fn new(level: GuestLevel, reporter: Arc<dyn Reporter>, keep_tail: bool) -> Self {
        Self {
            inner: Arc::new(Mutex::new(OutputInner {
                level,
                reporter,
                line: Vec::new(),
                tail: keep_tail.then(VecDeque::new),
            })),
        }
    }

    /// The last few KiB written, flushed of any partial line, trimmed.
    pub(crate) fn tail(&self) -> String {
        let mut inner = self.inner.lock().expect("guest output lock");
        inner.flush_line();
        let bytes: Vec<u8> = inner.tail.iter().flatten().copied().collect();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}

impl OutputInner {
    fn write(&mut self, bytes: &[u8]) {
        if let Some(tail) = &mut self.tail {
            tail.extend(bytes);
            let excess = tail.len().saturating_sub(TAIL_BYTES);
            tail.drain(..excess);
        }
        for &byte in bytes {
            if byte == b'\n' {
                self.flush_line();
            } else if self.line.len() < MAX_LINE_BYTES {
                self.line.push(byte);
            }
        }
    }

    fn flush_line(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let line = String::from_utf8_lossy(&self.line);
        self.reporter.log(self.level, line.trim_end());
        self.line.clear();
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.lock().expect("guest output lock").write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.lock().expect("guest output lock").flush_line();
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Lines(Mutex<Vec<String>>);

    impl Reporter for Lines {
        fn log(&self, _level: GuestLevel, message: &str) {
            self.0.lock().unwrap().push(message.to_string());
        }
        fn progress(&self, _: u64, _: u64, _: &str) {}
    }

    #[test]
    fn output_is_split_into_lines_and_stderr_keeps_a_bounded_tail() {
        let lines = Arc::new(Lines::default());
        let out = GuestOutput::stderr(lines.clone());
        {
            let mut inner = out.inner.lock().unwrap();
            inner.write(b"first\nsec");
            inner.write(b"ond\n");
            inner.write(&vec![b'x'; TAIL_BYTES * 2]);
        }
        assert_eq!(lines.0.lock().unwrap()[..2], ["first", "second"]);
        let tail = out.tail();
        assert_eq!(tail.len(), TAIL_BYTES, "the tail is bounded");
        assert_eq!(
            lines.0.lock().unwrap().len(),
            3,
            "tail() flushes the partial line"
        );
    }
}
