//! Where a running plugin's voice goes: its `log` and `progress` calls and
//! its stdout/stderr lines. The runtime hands them to a [`Reporter`] and keeps
//! the tail of stderr, because a panic's message or a Python traceback is
//! only ever written there. What reaches the server's own log is escaped to
//! one line per record and held to a budget per call (a deployment), so a
//! plugin can neither forge the server's lines nor flood its log.

use crate::model::{OwnCall, Receipt};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::AsyncWrite;

use super::caps;
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
    /// `bytes` more of a put are on their way to a target.
    fn publishing(&self, bytes: u64) {
        let _ = bytes;
    }
    /// A put is done: called before the guest sees its receipt.
    fn published(&self, receipt: &Receipt) {
        let _ = receipt;
    }
    /// A request of the deployer's own under a target has ended (its
    /// answer read or dropped, or none came): what it was and moved.
    fn called(&self, call: &OwnCall) {
        let _ = call;
    }
    /// A sentence of the host's about this call (an outgoing request the
    /// gate refused), for the call's own log beside the guest's lines: a
    /// guest often sees only a closed stream, and its author reads the
    /// deployment's log. The host has written it to the server log
    /// already, so by default it goes nowhere else.
    fn host_line(&self, _message: &str) {}
}

/// What one call (a deployment) writes to the server log in full: this many
/// records or bytes, whichever comes first. The rest is counted.
pub const SERVER_LOG_LINES: u64 = 1000;
pub const SERVER_LOG_BYTES: u64 = 256 << 10;
/// Past the budget, how often a summary line says how much more was written.
pub const SERVER_LOG_SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// Writes to the server log, tagged with plugin and deployment: each
/// message one record, up to the budget, then summaries at intervals and
/// a last one when the reporter is dropped (the call ended).
pub struct LogReporter {
    plugin: String,
    deploy_id: Option<i64>,
    budget: Mutex<Budget>,
}

impl LogReporter {
    pub fn new(plugin: &str, deploy_id: Option<i64>) -> Self {
        Self {
            plugin: plugin.to_string(),
            deploy_id,
            budget: Mutex::new(Budget::default()),
        }
    }

    /// Whether a record of `bytes` goes to the server log; past the budget,
    /// writes the summary that is due instead.
    fn admit(&self, bytes: usize) -> bool {
        let verdict = self
            .budget
            .lock()
            .expect("log budget lock")
            .admit(bytes as u64, Instant::now());
        match verdict {
            Verdict::Write => true,
            Verdict::Count => false,
            Verdict::Exhausted => {
                self.warn(&format!(
                    "{} reached its budget of the server log ({SERVER_LOG_LINES} lines or {}): \
                     what it writes from now on is counted here every {}{}",
                    self.subject(),
                    crate::human::size(SERVER_LOG_BYTES),
                    crate::human::duration(SERVER_LOG_SUMMARY_EVERY),
                    self.see_also()
                ));
                false
            }
            Verdict::Summary(more) => {
                self.summarize(more, "so far");
                false
            }
        }
    }

    fn summarize(&self, more: Counted, when: &str) {
        self.warn(&format!(
            "{} wrote {} more lines ({}) past its server log budget {when}{}",
            self.subject(),
            more.lines,
            crate::human::size(more.bytes),
            self.see_also()
        ));
    }

    fn subject(&self) -> String {
        match self.deploy_id {
            Some(id) => format!("deployment {id}"),
            None => format!("plugin {}", self.plugin),
        }
    }

    fn see_also(&self) -> String {
        match self.deploy_id {
            Some(id) => format!("; see /v1/deployments/{id}/logs"),
            None => String::new(),
        }
    }

    fn warn(&self, message: &str) {
        let (plugin, deploy_id) = (&self.plugin, self.deploy_id);
        tracing::warn!(plugin, deploy_id, "{message}");
    }
}

impl Drop for LogReporter {
    fn drop(&mut self) {
        let more = self.budget.get_mut().map(Budget::unreported);
        if let Ok(Some(more)) = more {
            self.summarize(more, "in all");
        }
    }
}

impl Reporter for LogReporter {
    fn log(&self, level: GuestLevel, message: &str) {
        let message = one_line(message);
        if !self.admit(message.len()) {
            return;
        }
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

    /// The host's own line, outside the guest's budget: one a request
    /// (`max_calls` bounds them).
    fn called(&self, call: &OwnCall) {
        tracing::info!(
            target: "berth::publish",
            plugin = %self.plugin,
            deploy_id = self.deploy_id,
            "{call}"
        );
    }

    /// The host's own line, outside the guest's budget: one a put.
    fn published(&self, receipt: &Receipt) {
        tracing::info!(
            target: "berth::publish",
            plugin = %self.plugin,
            deploy_id = self.deploy_id,
            to = %receipt.target,
            key = %receipt.key,
            bytes = receipt.bytes,
            "published {} ({}, sha256 {})",
            receipt.url,
            crate::human::size(receipt.bytes),
            receipt.sha256
        );
    }

    fn progress(&self, done: u64, total: u64, note: &str) {
        let note = one_line(note);
        if !self.admit(note.len()) {
            return;
        }
        let (plugin, deploy_id) = (&self.plugin, self.deploy_id);
        tracing::debug!(target: "berth::plugin", plugin, deploy_id, done, total, "progress: {note}");
    }
}

/// Guest text as one line: newlines, other control characters (terminal
/// escapes among them) and Unicode's line separators written as escapes,
/// so what a plugin says can never start a line of the server's own.
pub(crate) fn one_line(text: &str) -> Cow<'_, str> {
    let breaks = |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}');
    if !text.chars().any(breaks) {
        return Cow::Borrowed(text);
    }
    let mut line = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            c if breaks(c) => {
                let _ = write!(line, "\\u{{{:x}}}", u32::from(c));
            }
            c => line.push(c),
        }
    }
    Cow::Owned(line)
}

/// Lines and bytes a call wrote past its budget.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counted {
    lines: u64,
    bytes: u64,
}

/// One call's account of the server log.
#[derive(Debug, Default)]
struct Budget {
    written: Counted,
    /// Past the budget, in all.
    over: Counted,
    /// `over` as of the last summary, and when it was written.
    summarized: Counted,
    summarized_at: Option<Instant>,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Write,
    /// The first record past the budget: say so, then count.
    Exhausted,
    Count,
    Summary(Counted),
}

impl Budget {
    fn admit(&mut self, bytes: u64, now: Instant) -> Verdict {
        let w = &mut self.written;
        if self.over.lines == 0 && w.lines < SERVER_LOG_LINES && w.bytes + bytes <= SERVER_LOG_BYTES
        {
            w.lines += 1;
            w.bytes += bytes;
            return Verdict::Write;
        }
        self.over.lines += 1;
        self.over.bytes += bytes;
        let Some(at) = self.summarized_at else {
            self.summarized_at = Some(now);
            return Verdict::Exhausted;
        };
        if now.duration_since(at) < SERVER_LOG_SUMMARY_EVERY {
            return Verdict::Count;
        }
        self.summarized_at = Some(now);
        self.summarized = self.over;
        Verdict::Summary(self.over)
    }

    /// What was counted past the budget since the last summary, if anything.
    fn unreported(&mut self) -> Option<Counted> {
        (self.over != self.summarized).then_some(self.over)
    }
}

/// How much of stderr is kept for the error text of a crashed call.
const TAIL_BYTES: usize = 4096;

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
    /// Bytes of the current line past `LOG_LINE_BYTES`, not kept.
    cut: usize,
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
                cut: 0,
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
            } else if self.line.len() < caps::LOG_LINE_BYTES {
                self.line.push(byte);
            } else {
                self.cut += 1;
            }
        }
    }

    fn flush_line(&mut self) {
        if self.line.is_empty() {
            return;
        }
        let line = String::from_utf8_lossy(&self.line);
        if self.cut == 0 {
            self.reporter.log(self.level, line.trim_end());
        } else {
            let total = self.line.len() + self.cut;
            let note = caps::cut_note("the line", total, caps::LOG_LINE_BYTES);
            self.reporter.log(self.level, &format!("{line}{note}"));
        }
        self.line.clear();
        self.cut = 0;
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

    #[test]
    fn a_long_output_line_is_cut_with_a_note() {
        let lines = Arc::new(Lines::default());
        let out = GuestOutput::stdout(lines.clone());
        out.inner
            .lock()
            .unwrap()
            .write(format!("{}\nnext\n", "o".repeat(10 << 20)).as_bytes());
        let lines = lines.0.lock().unwrap();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with(&"o".repeat(caps::LOG_LINE_BYTES)));
        assert!(
            lines[0].ends_with("o… [truncated: the line was 10 MiB, berth keeps 16 KiB]"),
            "{}",
            &lines[0][16380..]
        );
        assert_eq!(lines[1], "next");
    }

    #[test]
    fn guest_text_reaches_the_server_log_as_one_line() {
        #[rustfmt::skip]
        let cases = [
            ("plain words", "plain words"),
            ("two\nlines", "two\\nlines"),
            ("cr\rover\x1b[2Kwritten", "cr\\rover\\u{1b}[2Kwritten"),
            ("tab\tand\u{2028}separator", "tab\\tand\\u{2028}separator"),
            ("é and 日本", "é and 日本"),
        ];
        for (text, expected) in cases {
            assert_eq!(one_line(text), expected, "{text:?}");
        }
    }

    #[test]
    fn the_server_log_budget_writes_then_counts_then_summarizes_at_intervals() {
        let start = Instant::now();
        let mut budget = Budget::default();
        for _ in 0..SERVER_LOG_LINES {
            assert_eq!(budget.admit(10, start), Verdict::Write);
        }
        assert_eq!(budget.admit(10, start), Verdict::Exhausted);
        assert_eq!(budget.admit(10, start), Verdict::Count);
        let later = start + SERVER_LOG_SUMMARY_EVERY;
        let two = Counted {
            lines: 3,
            bytes: 30,
        };
        assert_eq!(budget.admit(10, later), Verdict::Summary(two));
        assert_eq!(budget.unreported(), None, "nothing new since the summary");
        assert_eq!(budget.admit(10, later), Verdict::Count);
        assert_eq!(
            budget.unreported(),
            Some(Counted {
                lines: 4,
                bytes: 40
            })
        );

        // Bytes count too; a record that would pass the byte budget ends it.
        let mut budget = Budget::default();
        assert_eq!(budget.admit(SERVER_LOG_BYTES - 1, start), Verdict::Write);
        assert_eq!(budget.admit(2, start), Verdict::Exhausted);
        assert_eq!(budget.admit(1, start), Verdict::Count, "never writes again");
    }
}
