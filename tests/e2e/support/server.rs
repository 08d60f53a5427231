//! A real `berth serve` process on loopback, on SQLite or on a fresh
//! database of the PostgreSQL server named by `BERTH_TEST_DATABASE_URL`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::events::Subscription;
use super::{answer_body, plugins};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct Berth {
    pub url: String,
    launch: Launch,
    child: Child,
    log: Arc<Mutex<String>>,
    /// Unmounted before the temp dir holding it is removed.
    _volume: Option<Volume>,
    _temp: Arc<tempfile::TempDir>,
    client: reqwest::Client,
}

/// How to start a test server; `Berth::start` is the common case.
pub struct Options {
    backend: Backend,
    plugins: Vec<(String, PathBuf)>,
    files: Vec<(String, Vec<u8>)>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// `--cache-dir`; `None` leaves the server its own (`DATA_DIR/cache`).
    cache_dir: Option<PathBuf>,
    /// The data dir on a filesystem of its own of this many MiB.
    volume_mib: Option<u64>,
    /// The database, models dir and plugins folder of several servers.
    shared: Option<Shared>,
    /// With `shared`: a plugins folder of this server's own.
    own_plugins: bool,
    /// A SQLite database to start from (a restored backup).
    restore: Option<PathBuf>,
}

/// What several servers acting as one service share: one PostgreSQL
/// database, one models volume and one plugins folder. Each server keeps
/// its own data dir (its id, its out-dirs).
#[derive(Clone)]
pub struct Shared {
    pub database_url: String,
    pub models_dir: PathBuf,
    pub plugins_dir: PathBuf,
    _temp: Arc<tempfile::TempDir>,
}

impl Shared {
    /// A fresh database on the test PostgreSQL server, and empty folders.
    pub async fn new() -> Self {
        Self::on(fresh_postgres_database().await)
    }

    /// The database at `database_url`, and empty folders.
    pub fn on(database_url: String) -> Self {
        let temp = Arc::new(tempfile::tempdir().unwrap());
        let models_dir = temp.path().join("models");
        let plugins_dir = temp.path().join("plugins");
        std::fs::create_dir_all(&plugins_dir).unwrap();
        Self {
            database_url,
            models_dir,
            plugins_dir,
            _temp: temp,
        }
    }

    /// The same service, reaching its database at `database_url` (the
    /// same database through a proxy).
    pub fn with_database_url(&self, database_url: String) -> Self {
        Self {
            database_url,
            ..self.clone()
        }
    }
}

impl Options {
    /// Compiles plugins into this server's own cache instead of the one
    /// the test servers share (which spares each server compiling the
    /// Python and JavaScript components again).
    pub fn private_cache(mut self) -> Self {
        self.cache_dir = None;
        self
    }

    /// Keeps compiled code in `dir` (`--cache-dir`).
    pub fn cache_dir(mut self, dir: &Path) -> Self {
        self.cache_dir = Some(dir.to_path_buf());
        self
    }

    /// Adds `NAME.wasm` to the server's plugins folder.
    pub fn plugin(mut self, name: &str, wasm: PathBuf) -> Self {
        self.plugins.push((name.to_string(), wasm));
        self
    }

    /// Adds any file (a manifest `NAME.toml`, say) to the plugins folder.
    pub fn plugins_file(mut self, file: &str, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push((file.to_string(), contents.into()));
        self
    }

    /// Runs on `shared`'s database, models dir and plugins folder (the
    /// backend must be PostgreSQL); plugins added here go into the shared
    /// folder.
    pub fn shared(mut self, shared: &Shared) -> Self {
        assert_eq!(
            self.backend,
            Backend::Postgres,
            "servers share a PostgreSQL database"
        );
        self.args.extend([
            "--models-dir".to_string(),
            shared.models_dir.display().to_string(),
        ]);
        self.shared = Some(shared.clone());
        self
    }

    /// Keeps a plugins folder of its own while sharing the rest.
    pub fn own_plugins(mut self) -> Self {
        self.own_plugins = true;
        self
    }

    /// Puts the data dir (the SQLite database, models, out-dirs) on a
    /// tmpfs of `mib` MiB, so the test can fill it: needs root.
    pub fn data_volume_mib(mut self, mib: u64) -> Self {
        self.volume_mib = Some(mib);
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    pub async fn start(self) -> Berth {
        self.launch(true).await
    }

    /// Starts on a copy of the SQLite database `backup`, placed where the
    /// server keeps its own (a restore).
    pub fn restored_from(mut self, backup: &Path) -> Self {
        assert_eq!(self.backend, Backend::Sqlite, "a backup is a SQLite file");
        self.restore = Some(backup.to_path_buf());
        self
    }

    /// Starts the server and returns as soon as it listens, while it may
    /// still be loading its plugins folder.
    pub async fn start_listening(self) -> Berth {
        self.launch(false).await
    }

    async fn launch(self, wait_loaded: bool) -> Berth {
        let temp = Arc::new(tempfile::tempdir().unwrap());
        let data_dir = temp.path().join("data");
        let plugins_dir = match &self.shared {
            Some(shared) if !self.own_plugins => shared.plugins_dir.clone(),
            _ => temp.path().join("plugins"),
        };
        std::fs::create_dir_all(&plugins_dir).unwrap();
        let volume = self.volume_mib.map(|mib| Volume::mount(&data_dir, mib));
        for (name, wasm) in &self.plugins {
            place(wasm, &plugins_dir.join(format!("{name}.wasm")));
        }
        for (file, contents) in &self.files {
            std::fs::write(plugins_dir.join(file), contents).unwrap();
        }
        if let Some(backup) = &self.restore {
            std::fs::create_dir_all(&data_dir).unwrap();
            std::fs::copy(backup, data_dir.join("berth.db")).unwrap();
        }
        let database_url = match (&self.shared, self.backend) {
            (Some(shared), _) => shared.database_url.clone(),
            (None, Backend::Sqlite) => format!("sqlite://{}", data_dir.join("berth.db").display()),
            (None, Backend::Postgres) => fresh_postgres_database().await,
        };
        let mut args = self.args;
        if let Some(dir) = &self.cache_dir {
            args.extend(["--cache-dir".to_string(), dir.display().to_string()]);
        }
        let launch = Launch {
            data_dir,
            plugins_dir,
            database_url,
            args,
            env: self.env,
            wait_loaded,
        };
        let (child, url, log) = launch.spawn(None);
        Berth {
            url,
            launch,
            child,
            log,
            _volume: volume,
            _temp: temp,
            client: reqwest::Client::new(),
        }
    }
}

/// Puts a plugin into a folder other servers may be watching: unchanged
/// if it is there already, else whole at once (a temp name, a rename).
fn place(wasm: &Path, at: &Path) {
    let bytes = std::fs::read(wasm).unwrap();
    if std::fs::read(at).is_ok_and(|there| there == bytes) {
        return;
    }
    let temp = at.with_extension("wasm.part");
    std::fs::write(&temp, bytes).unwrap();
    std::fs::rename(temp, at).unwrap();
}

/// A small tmpfs mounted for one test server, unmounted when dropped.
struct Volume(PathBuf);

impl Volume {
    fn mount(at: &Path, mib: u64) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .status()
            .expect("running mount");
        assert!(
            mounted.success(),
            "this test mounts a {mib} MiB tmpfs to fill a disk, which needs root: run the tests as root (CI does)"
        );
        Self(at.to_path_buf())
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

impl Berth {
    /// A server with the `archive` example and the `misbehave` test plugin.
    pub async fn start(backend: Backend) -> Self {
        Self::options(backend).start().await
    }

    pub async fn start_with(backend: Backend, args: &[&str]) -> Self {
        args.iter()
            .fold(Self::options(backend), |o, a| o.arg(a))
            .start()
            .await
    }

    /// The default plugins, to add to.
    pub fn options(backend: Backend) -> Options {
        plugins::defaults()
            .into_iter()
            .fold(Self::bare(backend), |o, (name, wasm)| o.plugin(name, wasm))
    }

    /// No plugins at all.
    pub fn bare(backend: Backend) -> Options {
        Options {
            backend,
            plugins: Vec::new(),
            files: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            cache_dir: Some(plugins::shared_cache()),
            volume_mib: None,
            shared: None,
            own_plugins: false,
            restore: None,
        }
    }

    pub fn data_dir(&self) -> &Path {
        &self.launch.data_dir
    }

    /// The id this server records as the owner of what it runs.
    pub fn server_id(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("server-id"))
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn plugins_dir(&self) -> &Path {
        &self.launch.plugins_dir
    }

    /// Stops the process the hard way: no shutdown code runs.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Starts the (stopped) server once more and waits for it to end by
    /// itself before it listens (a failpoint's abort at start); its exit
    /// status and log.
    pub fn run_to_exit(&self) -> (std::process::ExitStatus, String) {
        let port = self.url.rsplit(':').next().unwrap().to_string();
        let output = self
            .launch
            .command(Some(&port))
            .output()
            .expect("running the berth binary");
        (
            output.status,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Waits for the server to end by itself (a failpoint's abort).
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        for _ in 0..1200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the server did not end within 60 s; its log:\n{}",
            self.log()
        );
    }

    /// Asks the server to stop (SIGTERM) and waits until it has.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.stop_by("TERM")
    }

    /// Sends the signal `SIG{name}` and waits for the server to exit.
    pub fn stop_by(&mut self, name: &str) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "berth did not stop within 30s of SIG{name}; its log:\n{}",
            self.log()
        );
    }

    /// Starts the server again on the same data, database and port.
    pub fn restart(&mut self) {
        let port = self.url.rsplit(':').next().unwrap().to_string();
        let (child, url, log) = self.launch.spawn(Some(&port));
        self.child = child;
        self.url = url;
        self.log = log;
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log once it holds `text`: lines are read from the server's
    /// stderr as they come, so a line written before a response can reach
    /// the test after it.
    pub async fn logged(&self, text: &str) -> String {
        super::eventually(
            || format!("the log to say {text:?}:\n{}", self.log()),
            async || {
                let log = self.log();
                log.contains(text).then_some(log)
            },
        )
        .await
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        answer(response).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        answer(response).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .delete(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        answer(response).await
    }

    /// Subscribes to `/v1/events`; events published from now on arrive.
    pub async fn events(&self) -> Subscription {
        self.events_from("", None).await
    }

    /// Subscribes to `/v1/events{query}` (`?after=N`), sending
    /// `Last-Event-ID` if given.
    pub async fn events_from(&self, query: &str, last_event_id: Option<i64>) -> Subscription {
        let mut request = self.client.get(format!("{}/v1/events{query}", self.url));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Subscription::new(response.bytes_stream())
    }

    /// Registers a model and returns its id, asserting success.
    pub async fn register(&self, model: &Value) -> i64 {
        let (status, body) = self.post("/v1/models", model).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_i64().unwrap()
    }

    pub async fn deploy(
        &self,
        model_id: i64,
        deployer: &str,
        options: Value,
    ) -> (StatusCode, Value) {
        let body = serde_json::json!({ "deployer": deployer, "options": options });
        self.post(&format!("/v1/models/{model_id}/deployments"), &body)
            .await
    }

    /// The deployment's log (`GET /v1/deployments/{id}/logs`).
    pub async fn deployment_log(&self, deploy_id: &serde_json::Value) -> String {
        self.client()
            .get(format!("{}/v1/deployments/{deploy_id}/logs", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Asks to cancel the deployment whose row is `row`: the answer.
    pub async fn cancel(&self, row: &Value) -> (StatusCode, Value) {
        let path = format!("/v1/deployments/{}/cancel", row["id"]);
        self.post(&path, &serde_json::json!({})).await
    }

    /// Starts a deployment in the background (`?wait=false`): its row,
    /// asserting the 202 (running if the server took it at once, queued
    /// if it was full or others waited).
    pub async fn deploy_detached(&self, model_id: i64, deployer: &str, options: Value) -> Value {
        let body = serde_json::json!({ "deployer": deployer, "options": options });
        let (status, running) = self
            .post(
                &format!("/v1/models/{model_id}/deployments?wait=false"),
                &body,
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{running}");
        assert!(
            running["status"] == "queued" || running["status"] == "running",
            "{running}"
        );
        running
    }

    /// The model's directory on the server's disk.
    pub fn model_dir(&self, job_id: &str) -> PathBuf {
        self.launch.data_dir.join("models").join(job_id)
    }
}

impl Drop for Berth {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    (status, answer_body(response.text().await.unwrap()))
}

/// Everything needed to start (and restart) the same server.
struct Launch {
    data_dir: PathBuf,
    plugins_dir: PathBuf,
    database_url: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Whether starting waits for the plugins folder to be loaded too.
    wait_loaded: bool,
}

impl Launch {
    /// Starts `berth serve` and waits until it listens; its stderr is kept.
    fn command(&self, port: Option<&str>) -> Command {
        let listen = format!("127.0.0.1:{}", port.unwrap_or("0"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
        command
            .args(["serve", "--listen", &listen, "--data-dir"])
            .arg(&self.data_dir)
            .arg("--plugins-dir")
            .arg(&self.plugins_dir)
            .args(["--database-url", &self.database_url])
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("BERTH_LOG", "info,berth=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }

    fn spawn(&self, port: Option<&str>) -> (Child, String, Arc<Mutex<String>>) {
        let mut child = self
            .command(port)
            .spawn()
            .expect("starting the berth binary");
        let (url, log) = wait_until_listening(&mut child, self.wait_loaded);
        (child, url, log)
    }
}

/// Waits until the server listens and, if `wait_loaded`, has loaded its
/// plugins folder (it listens first, then loads); returns its URL and its
/// growing log.
fn wait_until_listening(child: &mut Child, wait_loaded: bool) -> (String, Arc<Mutex<String>>) {
    let log = Arc::new(Mutex::new(String::new()));
    let (ready_tx, ready_rx) = mpsc::channel();
    let (loaded_tx, loaded_rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // Kept before it is signalled, so whoever wakes finds it.
            {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
            if let Some(at) = line.find("berth is listening on ") {
                let rest = &line[at + "berth is listening on ".len()..];
                // The address ends at a space (text logs) or at the end of
                // the JSON string holding the message.
                let _ = ready_tx.send(
                    rest.split(|c: char| c.is_whitespace() || c == '"')
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
            if line.contains("plugins folder loaded: ready") {
                let _ = loaded_tx.send(());
            }
        }
    });
    let url = ready_rx.recv_timeout(Duration::from_secs(120));
    let loaded = match (&url, wait_loaded) {
        (Ok(_), true) => Some(loaded_rx.recv_timeout(Duration::from_secs(300))),
        (Ok(_), false) => Some(Ok(())),
        (Err(_), _) => None,
    };
    match (url, loaded) {
        (Ok(url), Some(Ok(()))) => (url, log),
        (url, _) => {
            let _ = child.kill();
            panic!(
                "berth did not {}; its log:\n{}",
                if url.is_ok() {
                    "load its plugins folder within 5 minutes"
                } else {
                    "start listening"
                },
                log.lock().unwrap()
            );
        }
    }
}

/// A new, empty database on the PostgreSQL server of
/// `BERTH_TEST_DATABASE_URL`: its URL.
pub async fn fresh_postgres_database() -> String {
    use sqlx::Connection;
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let admin = std::env::var("BERTH_TEST_DATABASE_URL").expect(
        "BERTH_TEST_DATABASE_URL is not set: run `make test`, or point it at a PostgreSQL server \
         (scripts/pg-test-server starts one)",
    );
    let name = format!(
        "berth_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .expect("connecting to BERTH_TEST_DATABASE_URL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let mut url = url::Url::parse(&admin).unwrap();
    url.set_path(&name);
    url.to_string()
}

/// `count` servers on `shared`'s database and folders, each with `args`.
pub async fn servers(shared: &Shared, count: usize, args: &[&str]) -> Vec<Berth> {
    let mut started = Vec::new();
    for _ in 0..count {
        let options = args
            .iter()
            .fold(Berth::options(Backend::Postgres).shared(shared), |o, a| {
                o.arg(a)
            });
        started.push(options.start().await);
    }
    started
}
