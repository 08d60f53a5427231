//! Starts a test server's script that prints one JSON line once it serves
//! and serves until its standard input closes (`tests/moto/serve.py`,
//! `tests/azurite/serve.js`, `tests/fake-gcs/serve.py`), and reads that
//! line. Included with `#[path]` by each server's own file.

use std::io::BufRead;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// A running server and what it said when it started.
pub struct Served {
    pub said: serde_json::Value,
    /// Held open: the server stops when it closes, that is when this
    /// process exits, however it exits (or when this is dropped).
    _stdin: ChildStdin,
    _child: Child,
}

impl Served {
    /// Runs `command`; panics with `missing` (what to run to install the
    /// server) if it cannot start.
    pub fn start(mut command: Command, name: &str, missing: &str) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}; {missing}"));
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{name} did not start within 2 minutes"));
        let said = serde_json::from_str(&line)
            .unwrap_or_else(|_| panic!("{name} did not start (its error is above); {missing}"));
        Self {
            said,
            _stdin: child.stdin.take().expect("piped"),
            _child: child,
        }
    }

    /// A string the server said, by name.
    pub fn field(&self, name: &str) -> String {
        self.said[name]
            .as_str()
            .unwrap_or_else(|| panic!("the server did not say its {name}"))
            .to_string()
    }
}
