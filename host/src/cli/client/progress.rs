//! How a running deployment looks while `berth deploy` or `berth plugin run
//! -v` waits, and how far the client's own work on a folder is (`Meter`:
//! hashing, uploading): one redrawn line with a bar on a terminal,
//! occasional plain lines otherwise (a log, a CI job). Writes only to
//! stderr, so stdout holds just the result.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::text;
use crate::http::json::{Phase, Progress};

/// Without a terminal, a line when the phase changes and at most this often
/// in between: enough to show life without flooding a log.
const PLAIN_EVERY: Duration = Duration::from_secs(2);
const BAR_WIDTH: usize = 24;

pub struct ProgressView {
    /// What the lines are about: `deployment 12`, `plugin archive`.
    subject: String,
    terminal: bool,
    /// The terminal's width: a longer line would wrap, and `\r` would then
    /// redraw only its last part.
    width: usize,
    drawn: bool,
    /// The phase of the last plain line, and whether it knew the totals.
    last_stage: Option<(Phase, bool)>,
    last_plain: Option<Instant>,
}

impl ProgressView {
    pub fn new(subject: String) -> Self {
        // The bar is drawn on stderr, so stderr's terminal is the one
        // whose width matters (shells do not export $COLUMNS).
        let width = terminal_size::terminal_size_of(std::io::stderr())
            .map(|(terminal_size::Width(w), _)| usize::from(w))
            .filter(|&w| w > 20)
            .unwrap_or(80);
        Self {
            subject,
            terminal: std::io::stderr().is_terminal(),
            width,
            drawn: false,
            last_stage: None,
            last_plain: None,
        }
    }

    /// A message on a line of its own; the bar comes back with the next update.
    pub fn say(&mut self, message: &str) {
        self.clear();
        eprintln!("{message}");
    }

    /// `phase` and `progress` as the server reports them (an event's or a
    /// deployment's `phase` and `progress` fields).
    pub fn update(&mut self, phase: Phase, progress: &Progress) {
        let words = describe(phase, progress);
        if self.terminal {
            let bar = fraction(phase, progress)
                .map(|f| format!("{} ", bar(f, BAR_WIDTH)))
                .unwrap_or_default();
            let line = text::truncate(&format!("{} {bar}{words}", self.subject), self.width - 1);
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K{line}");
            let _ = stderr.flush();
            self.drawn = true;
        } else {
            // A fetch's first report may come before its totals are known;
            // the one that brings them is worth a line too.
            let stage = (phase, sized(progress));
            let changed = self.last_stage.as_ref() != Some(&stage);
            let due = self.last_plain.is_none_or(|at| at.elapsed() >= PLAIN_EVERY);
            if changed || due {
                eprintln!("{}: {words}", self.subject);
                self.last_stage = Some(stage);
                self.last_plain = Some(Instant::now());
            }
        }
    }

    /// Erases the bar, so that what is printed next starts on a clean line.
    pub fn clear(&mut self) {
        if self.drawn {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
            self.drawn = false;
        }
    }
}

/// How far the client's own work on bytes is: `what` (`hashing 3 files`),
/// a bar, the bytes done of `total` and, for transfers, the rate; redrawn
/// on a terminal, a plain line every few seconds otherwise for a transfer.
pub struct Meter {
    done: Arc<AtomicU64>,
    /// Wakes the drawer at once: a finished command does not wait out its
    /// pause (up to `PLAIN_EVERY`).
    finished: CancellationToken,
    drawer: Option<tokio::task::JoinHandle<()>>,
}

/// How often a meter's line is redrawn on a terminal.
const REDRAW: Duration = Duration::from_millis(200);

impl Meter {
    /// Starts drawing. `transfer`: bytes sent somewhere, shown with their
    /// rate and, without a terminal, as a line every `PLAIN_EVERY` (signs
    /// of life in a log); other work is drawn on a terminal only.
    pub fn start(what: String, total: u64, transfer: bool) -> Self {
        let done = Arc::new(AtomicU64::new(0));
        let finished = CancellationToken::new();
        let terminal = std::io::stderr().is_terminal();
        let drawer = (terminal || transfer).then(|| {
            let (done, finished) = (done.clone(), finished.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let every = if terminal { REDRAW } else { PLAIN_EVERY };
                loop {
                    tokio::select! {
                        _ = finished.cancelled() => break,
                        _ = tokio::time::sleep(every) => {}
                    }
                    let line = meter_line(
                        &what,
                        done.load(Ordering::Relaxed),
                        total,
                        started.elapsed(),
                        transfer,
                    );
                    if terminal {
                        redraw(&line);
                    } else {
                        eprintln!("{line}");
                    }
                }
                if terminal {
                    redraw("");
                }
            })
        });
        Self {
            done,
            finished,
            drawer,
        }
    }

    /// The count of bytes done, for the work to add to.
    pub fn done(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }

    /// Stops drawing and clears the line.
    pub async fn finish(self) {
        self.finished.cancel();
        if let Some(drawer) = self.drawer {
            let _ = drawer.await;
        }
    }
}

/// `uploading 2 files [####----] 1 GiB / 4 GiB, 512 MiB/s`; the rate only
/// for transfers (`rate`).
fn meter_line(what: &str, done: u64, total: u64, took: Duration, rate: bool) -> String {
    let fraction = if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    };
    let mut line = format!(
        "{what} {} {} / {}",
        bar(fraction, BAR_WIDTH),
        crate::human::size(done),
        crate::human::size(total)
    );
    if rate && took.as_secs_f64() > 0.0 {
        let per_second = (done as f64 / took.as_secs_f64()) as u64;
        line.push_str(&format!(", {}/s", crate::human::size(per_second)));
    }
    line
}

/// Redraws the line on the terminal.
fn redraw(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "\r\x1b[2K{line}");
    let _ = stderr.flush();
}

/// Whether the fetch's totals are known yet.
fn sized(progress: &Progress) -> bool {
    progress.files_total > 0
}

/// `fetching 12 MiB / 24.5 MiB (49%), 1/3 files`,
/// `deploying 3/10 (30%), copying shards`.
fn describe(phase: Phase, progress: &Progress) -> String {
    let percent = |f: Option<f64>| {
        f.map(|f| format!(" ({:.0}%)", f * 100.0))
            .unwrap_or_default()
    };
    match phase {
        Phase::Fetching if !sized(progress) => "fetching".to_string(),
        Phase::Fetching => format!(
            "fetching {} / {}{}, {}/{} files",
            crate::human::size(progress.bytes_done),
            crate::human::size(progress.bytes_total),
            percent(fraction(phase, progress)),
            progress.files_done,
            progress.files_total,
        ),
        Phase::Deploying => {
            let deployer = &progress.deployer;
            let mut words = "deploying".to_string();
            if deployer.total > 0 {
                words.push_str(&format!(" {}/{}", deployer.done, deployer.total));
                words.push_str(&percent(fraction(phase, progress)));
            }
            let note = deployer
                .note
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            if !note.is_empty() {
                words.push_str(", ");
                words.push_str(&note);
            }
            let published = &progress.published;
            if published.bytes > 0 {
                words.push_str(&format!(
                    ", published {} ({} {})",
                    crate::human::size(published.bytes),
                    published.files,
                    if published.files == 1 {
                        "file"
                    } else {
                        "files"
                    }
                ));
            }
            words
        }
    }
}

/// How far along the current phase is, when the numbers say.
fn fraction(phase: Phase, progress: &Progress) -> Option<f64> {
    let (done, total) = match phase {
        Phase::Fetching => (progress.bytes_done, progress.bytes_total),
        Phase::Deploying => (progress.deployer.done, progress.deployer.total),
    };
    (total > 0).then(|| (done.min(total) as f64) / (total as f64))
}

/// `[#########---------------]`
pub(super) fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(width - filled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::json::DeployerProgress;

    /// With time paused, a sleep the drawer waited out would move the
    /// clock: a finished meter returns without waiting for its next line.
    #[tokio::test(start_paused = true)]
    async fn a_meter_finishes_at_once_not_at_its_next_line() {
        let meter = Meter::start("uploading 1 files".into(), 100, true);
        tokio::task::yield_now().await;
        let before = tokio::time::Instant::now();
        meter.finish().await;
        assert_eq!(tokio::time::Instant::now(), before);
    }

    fn progress(bytes_done: u64, files_done: usize, done: u64, total: u64, note: &str) -> Progress {
        Progress {
            bytes_done,
            bytes_total: 4 * 1024 * 1024,
            deployer: DeployerProgress {
                done,
                note: note.into(),
                total,
            },
            files_done,
            files_total: 3,
            published: Default::default(),
            calls: Default::default(),
        }
    }

    #[test]
    fn progress_reads_as_a_sentence_fragment() {
        let check = |phase: Phase, progress: Progress, expected: &str| {
            assert_eq!(describe(phase, &progress), expected, "{phase:?}");
        };
        check(
            Phase::Fetching,
            progress(1024 * 1024, 1, 0, 0, ""),
            "fetching 1 MiB / 4 MiB (25%), 1/3 files",
        );
        check(Phase::Fetching, Progress::default(), "fetching");
        check(Phase::Deploying, progress(0, 3, 0, 0, ""), "deploying");
        check(
            Phase::Deploying,
            progress(0, 3, 3, 10, "copying\nshards"),
            "deploying 3/10 (30%), copying shards",
        );
        check(
            Phase::Deploying,
            progress(0, 3, 0, 0, "packing"),
            "deploying, packing",
        );
        let mut publishing = progress(0, 3, 1, 3, "uploading");
        publishing.published.bytes = 3 * 1024 * 1024;
        publishing.published.files = 1;
        check(
            Phase::Deploying,
            publishing,
            "deploying 1/3 (33%), uploading, published 3 MiB (1 file)",
        );
    }

    #[test]
    fn the_bar_fills_with_the_fraction() {
        assert_eq!(bar(0.0, 4), "[----]");
        assert_eq!(bar(0.5, 4), "[##--]");
        assert_eq!(bar(1.5, 4), "[####]");
        let no_totals = Progress {
            bytes_done: 5,
            ..Progress::default()
        };
        assert_eq!(fraction(Phase::Fetching, &no_totals), None);
    }
}
