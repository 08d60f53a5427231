//! Timing and printing: medians over rounds, percentiles over calls, and a
//! table per benchmark that puts each figure beside its baseline.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Runs `script` with `sh -c`, failing on a non-zero exit; returns its
/// wall time and standard output.
pub fn sh(script: &str) -> anyhow::Result<(Duration, String)> {
    let started = Instant::now();
    let output = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .context("cannot run sh")?;
    let elapsed = started.elapsed();
    if !output.status.success() {
        bail!(
            "`{script}` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok((
        elapsed,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

/// CPU seconds (user + system) used so far by this process and by the
/// children it has waited for: the work a run did, which a busy machine
/// distorts less than its wall time.
pub fn cpu_seconds() -> f64 {
    let used = |who| {
        // SAFETY: getrusage fills the struct we hand it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut usage) };
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        seconds(usage.ru_utime) + seconds(usage.ru_stime)
    };
    used(libc::RUSAGE_SELF) + used(libc::RUSAGE_CHILDREN)
}

/// CPU seconds (user + system) process `pid` used so far.
pub fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which may hold spaces.
    let rest = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ") ".
    (ticks(11) + ticks(12)) / 100.0
}

/// The highest VmRSS (KiB) of process `pid`, sampled every 10 ms from
/// `start` until `stop`: a peak VmHWM alone would also count what the
/// process reached before the measured work.
pub struct PeakRss {
    peak: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<()>,
}

impl PeakRss {
    pub fn start(pid: u32) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    peak.fetch_max(status_kib(pid, "VmRSS"), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        Self {
            peak,
            done,
            sampler,
        }
    }

    /// The peak, KiB.
    pub fn stop(self) -> u64 {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.sampler.join();
        self.peak.load(Ordering::Relaxed)
    }
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`); 0 when unknown.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Flushes every dirty page, so a timed run does not pay for the previous
/// run's writeback.
pub fn settle() {
    let _ = Command::new("sync").status();
}

/// The load average over the last minute, 5 and 15 minutes: printed with
/// CPU-bound figures, which a busy machine shrinks.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn median(samples: &[f64]) -> f64 {
    percentile(samples, 50.0)
}

/// Nearest-rank percentile.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn gbps(bytes: u64, seconds: f64) -> String {
    format!("{:.2} GB/s", bytes as f64 / seconds / 1e9)
}

pub fn secs(seconds: f64) -> String {
    if seconds < 0.01 {
        format!("{:.3} ms", seconds * 1e3)
    } else {
        format!("{seconds:.3} s")
    }
}

pub fn micros(seconds: f64) -> String {
    format!("{:.0} µs", seconds * 1e6)
}

/// One benchmark's figures: what was measured, its value, and how it
/// compares with the baseline row (or that it is the baseline).
pub struct Table {
    title: String,
    rows: Vec<[String; 3]>,
}

impl Table {
    pub fn new(title: &str) -> Self {
        Self {
            title: title.into(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, what: &str, value: String, versus: String) {
        self.rows.push([what.into(), value, versus]);
    }

    pub fn print(&self) {
        let widths: Vec<usize> = (0..3)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        println!("\n## {}\n", self.title);
        for row in &self.rows {
            println!(
                "  {:<w0$}  {:>w1$}  {}",
                row[0],
                row[1],
                row[2],
                w0 = widths[0],
                w1 = widths[1]
            );
        }
    }
}

/// "1.23× faster than X" / "0.80× the speed of X", from two times.
pub fn speed_vs(ours: f64, baseline: f64, name: &str) -> String {
    format!("{:.2}× the speed of {name}", baseline / ours)
}
