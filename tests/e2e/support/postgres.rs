//! A PostgreSQL server of a test's own, which the test may stop, kill and
//! start again while berth servers use it: the shared test server must
//! stay up for every other test. Made and run by `scripts/pg-test-server`
//! in a folder of its own, on a port of its own.

use std::path::PathBuf;
use std::process::Command;

pub struct OwnPostgres {
    pub url: String,
    port: u16,
    dir: tempfile::TempDir,
}

impl OwnPostgres {
    /// A new cluster, started (initdb and start: a few seconds).
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // The server runs as `postgres` when the tests run as root.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut own = Self {
            url: String::new(),
            port,
            dir,
        };
        own.url = own.run("start").await;
        own
    }

    /// Starts it again after a stop or a kill.
    pub async fn restart(&self) {
        self.run("start").await;
    }

    /// A fast shutdown: sessions are ended, the server exits.
    pub async fn stop(&self) {
        self.run("stop").await;
    }

    /// `kill -9`: no shutdown; the next start recovers.
    pub async fn kill(&self) {
        self.run("kill").await;
    }

    fn command(&self, what: &str) -> Command {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-test-server");
        let mut command = Command::new(script);
        command
            .arg(what)
            .env_remove("BERTH_TEST_DATABASE_URL")
            .env("BERTH_TEST_PG_PORT", self.port.to_string())
            .env("BERTH_TEST_PG_DIR", self.dir.path().join("pg"));
        command
    }

    /// What the script printed (a start prints the URL).
    async fn run(&self, what: &str) -> String {
        let mut command = self.command(what);
        let out = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "pg-test-server {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.command("stop").output();
    }
}
