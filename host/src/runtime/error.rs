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
    #[error("{}", out_of_stack(.output))]
    OutOfStack { output: String },
    #[error(
        "wrote more than its output quota of {} to /out ({} when it was stopped); out_mib in its manifest raises it",
        crate::human::size(*.limit_mib << 20), crate::human::size(*.held)
    )]
    OverQuota { limit_mib: u64, held: u64 },
    #[error("{}", exited(*.status))]
    Exited { status: i32 },
    #[error("cancelled")]
    Cancelled,
    /// The plugin answered `ok(..)` with something berth cannot accept.
    #[error("{0}")]
    BadResult(String),
    /// Something the plugin handed back was past one of `caps`.
    #[error("{0}")]
    OverCap(String),
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

fn out_of_stack(output: &str) -> String {
    let said = "ran out of stack (an endless or too deep recursion?)";
    if output.is_empty() {
        said.to_string()
    } else {
        format!("{said}; the end of its stderr:\n{output}")
    }
}

/// WASI 0.2's `exit` carries success or failure only, so a guest's libc
/// turns every non-zero status into 1; only `exit-with-code` would say more.
fn exited(status: i32) -> String {
    match status {
        0 => "exited (status 0) without returning a result".to_string(),
        1 => "exited with an error status (a process exit with a non-zero code; WASI 0.2 passes \
              on only that it failed, not the number)"
            .to_string(),
        status => format!("exited with error status {status}"),
    }
}
