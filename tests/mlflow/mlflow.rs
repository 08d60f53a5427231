//! Starts `tests/mlflow/serve.py`, a real MLflow tracking server on a free
//! loopback port, once per test process, and drives it with MLflow's own
//! client (`tests/mlflow/registry.py`). Included with `#[path]` by the
//! end-to-end tests (`tests/e2e/support`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

#[allow(clippy::duplicate_mod)]
#[path = "../served.rs"]
mod served;

/// The running server: SQLite records, artifacts served through its proxy,
/// webhooks allowed to call plain http on loopback.
pub struct Mlflow {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// How long the server took to answer `/health`.
    pub start_ms: u64,
    _served: served::Served,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `MLmodel` file each logged version holds (MLflow 3 registers a
/// run's folder only with one).
pub const MLMODEL: &str = "artifact_path: model\nflavors: {}\n";

const MISSING: &str = "run scripts/setup test, which installs mlflow into .venv-mlflow";

impl Mlflow {
    /// The one server of this test process, started on first use (it stops
    /// when the process exits).
    pub fn shared() -> &'static Mlflow {
        static SERVER: OnceLock<Mlflow> = OnceLock::new();
        SERVER.get_or_init(|| {
            let mut command = Command::new(root().join(".venv-mlflow/bin/python"));
            command.arg(root().join("tests/mlflow/serve.py"));
            let served = served::Served::start(command, "mlflow server", MISSING);
            Mlflow {
                url: served.field("url"),
                start_ms: served.said["start_ms"].as_u64().unwrap_or_default(),
                _served: served,
            }
        })
    }

    /// Runs `registry.py` with `args` against this server, on a blocking
    /// thread; what it printed last.
    pub async fn client(&self, args: &[&str]) -> serde_json::Value {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let url = self.url.clone();
        tokio::task::spawn_blocking(move || {
            let output = Command::new(root().join(".venv-mlflow/bin/python"))
                .arg(root().join("tests/mlflow/registry.py"))
                .args(&args)
                .env("MLFLOW_TRACKING_URI", url)
                .output()
                .unwrap_or_else(|e| panic!("cannot run MLflow's client: {e}; {MISSING}"));
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "registry.py {args:?} failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let last = stdout.lines().last().unwrap_or_default();
            serde_json::from_str(last).unwrap_or_else(|_| panic!("registry.py said {stdout}"))
        })
        .await
        .unwrap()
    }

    /// Logs `files` (path, contents; an `MLmodel` is added) as a run's model
    /// and registers them as a new version of `name`: its number and run id.
    pub async fn version(&self, name: &str, files: &[(&str, Vec<u8>)]) -> (String, String) {
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("MLmodel"), MLMODEL).unwrap();
        for (path, contents) in files {
            let at = folder.path().join(path);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(at, contents).unwrap();
        }
        let said = self
            .client(&["version", name, folder.path().to_str().unwrap()])
            .await;
        (
            said["version"].as_str().unwrap().to_string(),
            said["run_id"].as_str().unwrap().to_string(),
        )
    }

    /// Points `alias` of `name` at `version`.
    pub async fn alias(&self, name: &str, alias: &str, version: &str) {
        self.client(&["alias", name, alias, version]).await;
    }
}
