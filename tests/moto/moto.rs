//! Starts `tests/moto/serve.py`, moto's S3-compatible server on a free
//! loopback port, and reads what it printed. Included with `#[path]` by the
//! object-store tests (`host/src/fetch/store_tests.rs`), the end-to-end
//! tests (`tests/e2e/support`) and the benchmark
//! (`benches/perf/store.rs`).

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// The running server and the keys of its one user.
pub struct Moto {
    pub endpoint: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Held open: the server stops when it closes, that is when this
    /// process exits, however it exits.
    _stdin: ChildStdin,
    _child: Child,
}

impl Moto {
    /// Starts a server with `buckets`; panics, saying what to run, if moto
    /// is not installed.
    pub fn start(buckets: &[&str]) -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let python = root.join(".venv/bin/python");
        let missing = "run scripts/setup test, which installs moto[server] into .venv";
        let mut child = Command::new(&python)
            .arg(root.join("tests/moto/serve.py"))
            .args(buckets)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {missing}", python.display()));
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("moto's server did not start within 2 minutes"));
        let started: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| {
            panic!("moto's server did not start (its error is above); {missing}")
        });
        let field = |name: &str| {
            started[name]
                .as_str()
                .unwrap_or_else(|| panic!("moto's server did not say its {name}"))
                .to_string()
        };
        Self {
            endpoint: field("endpoint"),
            region: field("region"),
            access_key_id: field("access_key_id"),
            secret_access_key: field("secret_access_key"),
            _stdin: child.stdin.take().expect("piped"),
            _child: child,
        }
    }
}
