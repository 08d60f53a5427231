//! Why a plugin call did not produce a result. Messages are written for the
//! person who reads the deployment's error; the caller adds the subject
//! (`deployer archive: …`).

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CallError {
    /// The plugin answered `err(..)`: its own words.
    #[error("{0}")]
    Refused(String),
    #[error("{}", crashed(.trap, .output))]
    Crashed { trap: String, output: String },
    #[error(
        "ran out of memory: its limit is {limit_mib} MiB (memory_mib in its manifest raises it)"
    )]
    OutOfMemory { limit_mib: u64 },
    #[error("did not finish within its time limit of {} (timeout_s in its manifest raises it)", human(*.limit))]
    TimedOut { limit: Duration },
    #[error("cancelled")]
    Cancelled,
    /// The plugin answered `ok(..)` with something berth cannot accept.
    #[error("{0}")]
    BadResult(String),
    /// The sandbox could not be prepared (a directory missing, say).
    #[error("could not prepare its sandbox: {0}")]
    Sandbox(String),
}

fn crashed(trap: &str, output: &str) -> String {
    if output.is_empty() {
        format!("crashed ({trap}) and wrote nothing to stderr")
    } else {
        format!("crashed ({trap}); the end of its stderr:\n{output}")
    }
}

/// `90s` → `1m 30s`: limits are set in seconds, read in minutes.
pub(crate) fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) if d.as_millis() < 1000 => format!("{}ms", d.as_millis().max(s as u128)),
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_secs(45)), "45s");
        assert_eq!(human(Duration::from_secs(1800)), "30m");
        assert_eq!(human(Duration::from_secs(90)), "1m 30s");
        assert_eq!(human(Duration::from_secs(7260)), "2h 1m");
    }
}
