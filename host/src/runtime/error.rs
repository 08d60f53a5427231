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
    #[error("did not finish within its time limit of {} (timeout_s in its manifest raises it)", crate::human::duration(*.limit))]
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
