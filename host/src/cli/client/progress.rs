//! How a running deployment looks while `berth deploy` or `berth plugin run
//! -v` waits: one redrawn line with a bar on a terminal, occasional plain
//! lines otherwise (a log, a CI job). Writes only to stderr, so stdout holds
//! just the result.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::text;

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
    last_stage: Option<(String, bool)>,
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
    pub fn update(&mut self, phase: &str, progress: &Value) {
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
            let stage = (phase.to_string(), sized(progress));
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

/// Whether the fetch's totals are known yet.
fn sized(progress: &Value) -> bool {
    progress["files_total"].as_u64() > Some(0)
}

/// `fetching 12 MiB / 24.5 MiB (49%), 1/3 files`,
/// `deploying 3/10 (30%), copying shards`.
fn describe(phase: &str, progress: &Value) -> String {
    let number = |v: &Value| v.as_u64().unwrap_or(0);
    let percent = |f: Option<f64>| {
        f.map(|f| format!(" ({:.0}%)", f * 100.0))
            .unwrap_or_default()
    };
    match phase {
        "fetching" if !sized(progress) => "fetching".to_string(),
        "fetching" => format!(
            "fetching {} / {}{}, {}/{} files",
            crate::human::size(number(&progress["bytes_done"])),
            crate::human::size(number(&progress["bytes_total"])),
            percent(fraction(phase, progress)),
            number(&progress["files_done"]),
            number(&progress["files_total"]),
        ),
        "deploying" => {
            let deployer = &progress["deployer"];
            let mut words = "deploying".to_string();
            if number(&deployer["total"]) > 0 {
                let counted = format!(
                    " {}/{}",
                    number(&deployer["done"]),
                    number(&deployer["total"])
                );
                words.push_str(&counted);
                words.push_str(&percent(fraction(phase, progress)));
            }
            let note = deployer["note"]
                .as_str()
                .unwrap_or("")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            if !note.is_empty() {
                words.push_str(", ");
                words.push_str(&note);
            }
            words
        }
        other => other.to_string(),
    }
}

/// How far along the current phase is, when the numbers say.
fn fraction(phase: &str, progress: &Value) -> Option<f64> {
    let (done, total) = match phase {
        "fetching" => (&progress["bytes_done"], &progress["bytes_total"]),
        "deploying" => (
            &progress["deployer"]["done"],
            &progress["deployer"]["total"],
        ),
        _ => return None,
    };
    let (done, total) = (done.as_u64()?, total.as_u64()?);
    (total > 0).then(|| (done.min(total) as f64) / (total as f64))
}

/// `[#########---------------]`
fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(width - filled))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn progress_reads_as_a_sentence_fragment() {
        let progress = |bytes_done: u64, files_done: u64, done: u64, total: u64, note: &str| {
            json!({
                "bytes_done": bytes_done, "bytes_total": 4 * 1024 * 1024, "files_done": files_done, "files_total": 3,
                "deployer": { "done": done, "total": total, "note": note },
            })
        };
        let check = |phase: &str, progress: Value, expected: &str| {
            assert_eq!(describe(phase, &progress), expected, "{phase} {progress}");
        };
        check(
            "fetching",
            progress(1024 * 1024, 1, 0, 0, ""),
            "fetching 1 MiB / 4 MiB (25%), 1/3 files",
        );
        check(
            "fetching",
            json!({"bytes_total": 0, "files_total": 0}),
            "fetching",
        );
        check("deploying", progress(0, 3, 0, 0, ""), "deploying");
        check(
            "deploying",
            progress(0, 3, 3, 10, "copying\nshards"),
            "deploying 3/10 (30%), copying shards",
        );
        check(
            "deploying",
            progress(0, 3, 0, 0, "packing"),
            "deploying, packing",
        );
        check("queued", json!({}), "queued");
    }

    #[test]
    fn the_bar_fills_with_the_fraction() {
        assert_eq!(bar(0.0, 4), "[----]");
        assert_eq!(bar(0.5, 4), "[##--]");
        assert_eq!(bar(1.5, 4), "[####]");
        assert_eq!(
            fraction("fetching", &json!({"bytes_done": 5, "bytes_total": 0})),
            None
        );
    }
}
