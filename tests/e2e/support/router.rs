//! The real API in-process: `berth::http::app` assembled as `serve` does,
//! over a real database (a named in-memory SQLite, or a fresh database of the
//! PostgreSQL server), the real runtime with the default plugins, and a
//! fetcher; requests go through `tower::ServiceExt::oneshot`. For the API's
//! rules, which need no process, no port and no signal.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use berth::auth::Tokens;
use berth::catalog::Catalog;
use berth::db::Db;
use berth::deployers::Deployers;
use berth::events::Events;
use berth::fetch::Fetcher;
use berth::http::ApiContext;
use berth::loops::Loops;
use berth::pipeline::Pipeline;
use berth::runtime::{CodeCache, Engines, Limits, Runtime};
use berth::targets::Targets;

use super::events::Subscription;
use super::server::{Backend, fresh_postgres_database};
use super::{answer_body, assert_error, plugins};

/// One API rule: a request (method, path, JSON body) and the refusal it
/// earns (status, a fragment of its sentence). Tables of rules keep one rule
/// a line, under `#[rustfmt::skip]`.
pub type Rule<'a> = (Method, &'a str, Option<Value>, StatusCode, &'a str);

/// The largest plugin the in-process API takes: small, so that a test can
/// send a larger one cheaply.
pub const MAX_PLUGIN_BYTES: usize = 4 << 20;

pub struct App {
    app: axum::Router,
    /// Sent as `Authorization: Bearer` with every request.
    token: Option<String>,
    _temp: Arc<tempfile::TempDir>,
}

impl App {
    /// The API with the `archive` example and the `misbehave` test plugin,
    /// the ones `Berth::start` serves.
    pub async fn start(backend: Backend) -> Self {
        Self::start_with_tokens(backend, None).await
    }

    /// The same API, accepting only `tokens` (as `--api-tokens-file` does).
    pub async fn start_with_tokens(backend: Backend, tokens: Option<Arc<Tokens>>) -> Self {
        Self::start_with(backend, tokens, Targets::default()).await
    }

    /// The same API, with the publishing targets of a sources file.
    pub async fn start_with_targets(backend: Backend, targets: Targets) -> Self {
        Self::start_with(backend, None, targets).await
    }

    async fn start_with(backend: Backend, tokens: Option<Arc<Tokens>>, targets: Targets) -> Self {
        Self::start_with_plugins(backend, tokens, targets, &plugins::defaults()).await
    }

    /// The API serving `served` (name, wasm) from its folder, with the
    /// publishing targets of a sources file.
    pub async fn start_with_plugins(
        backend: Backend,
        tokens: Option<Arc<Tokens>>,
        targets: Targets,
        served: &[(&str, std::path::PathBuf)],
    ) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let plugins_dir = temp.path().join("plugins");
        std::fs::create_dir_all(&plugins_dir).unwrap();
        for (name, wasm) in served {
            std::fs::copy(wasm, plugins_dir.join(format!("{name}.wasm"))).unwrap();
        }
        let db = Db::connect(&database_url(backend).await)
            .await
            .expect("opening the test database");
        let targets = Arc::new(targets);
        let runtime = Runtime::new(
            Limits::default(),
            Some(CodeCache::new(plugins::shared_cache())),
            Engines::optimized(),
        )
        .unwrap()
        .targets(targets.clone());
        // 20: `serve`'s default --max-deployers.
        let loaded = runtime.load_dir(&plugins_dir, 20).await;
        let deployers = Arc::new(Deployers::new(Arc::new(runtime), plugins_dir, loaded));
        Self::assemble(db, deployers, tokens, targets, temp)
    }

    /// The API over these parts, as `serve` puts it together; models and
    /// out-dirs go under `temp`.
    fn assemble(
        db: Db,
        deployers: Arc<Deployers>,
        tokens: Option<Arc<Tokens>>,
        targets: Arc<Targets>,
        temp: tempfile::TempDir,
    ) -> Self {
        let fetcher = Fetcher::new(temp.path().join("models"), Duration::from_secs(1800)).unwrap();
        let shutdown = CancellationToken::new();
        let loops = Loops::new(shutdown.clone());
        let events = Events::stored(
            db.clone(),
            "router-test".to_string(),
            berth::http::event_data,
            &loops,
        );
        let pipeline = Arc::new(Pipeline::new(
            db.clone(),
            events.clone(),
            deployers.clone(),
            fetcher.clone(),
            "router-test".to_string(),
            temp.path().join("out"),
            shutdown.clone(),
        ));
        pipeline.start_workers(&loops);
        let catalog = Arc::new(
            Catalog::new(db.clone(), deployers.clone(), events.clone(), 20)
                .with_max_plugin_bytes(MAX_PLUGIN_BYTES),
        );
        let rules = Arc::new(berth::rules::Rules::new(
            db.clone(),
            deployers.clone(),
            Vec::new(),
        ));
        let app = berth::http::app(ApiContext {
            db,
            events,
            deployers,
            catalog,
            rules,
            pipeline,
            fetcher,
            tokens,
            webhook: None,
            targets,
            shutdown,
            models_max_bytes: None,
            loops,
            mlflow: Arc::default(),
        });
        Self {
            app,
            token: None,
            _temp: Arc::new(temp),
        }
    }

    /// The API of a server whose first load of the plugins folder has not
    /// reached `names` yet (and serves nothing).
    pub async fn start_still_loading(names: &[&str]) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(Limits::default(), None, Engines::optimized()).unwrap();
        let deployers = Arc::new(Deployers::loading(
            Arc::new(runtime),
            temp.path().join("plugins"),
            names.iter().map(|n| n.to_string()).collect(),
            Default::default(),
        ));
        let db = Db::connect(&database_url(Backend::Sqlite).await)
            .await
            .unwrap();
        Self::assemble(db, deployers, None, Arc::default(), temp)
    }

    /// The same API, called with `token` (or with none).
    pub fn with_token(&self, token: Option<&str>) -> Self {
        Self {
            app: self.app.clone(),
            token: token.map(str::to_string),
            _temp: self._temp.clone(),
        }
    }

    /// The router itself, for what a whole answer cannot show: the routes
    /// it holds, the status of an answer whose body never ends.
    pub fn router(&self) -> axum::Router {
        self.app.clone()
    }

    /// Sends a request as the test built it (a body without its content
    /// type, say).
    pub async fn send(&self, request: Request<Body>) -> (StatusCode, Value) {
        let (status, _, body) = self.send_for_headers(request).await;
        (status, body)
    }

    /// `send`, with the answer's headers.
    pub async fn send_for_headers(
        &self,
        mut request: Request<Body>,
    ) -> (StatusCode, axum::http::HeaderMap, Value) {
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.headers_mut().insert(header::AUTHORIZATION, value);
        }
        let response = self.response(request).await;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            headers,
            answer_body(String::from_utf8_lossy(&bytes).into_owned()),
        )
    }

    /// The whole response, headers included.
    pub async fn response(&self, request: Request<Body>) -> axum::response::Response {
        self.app.clone().oneshot(request).await.unwrap()
    }

    /// A request with a JSON body, or none.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let request = Request::builder().method(method).uri(path);
        let request = match body {
            Some(json) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json.to_string())),
            None => request.body(Body::empty()),
        };
        self.send(request.unwrap()).await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.request(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.request(Method::POST, path, Some(body)).await
    }

    /// Registers a model and returns its id, asserting success.
    pub async fn register(&self, model: &Value) -> i64 {
        let (status, body) = self.post("/v1/models", model).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_i64().unwrap()
    }

    /// Subscribes to `/v1/events`; events published from now on arrive.
    pub async fn events(&self) -> Subscription {
        self.events_from("", None).await
    }

    /// Subscribes to `/v1/events{query}` (`?after=N`), sending
    /// `Last-Event-ID` if given.
    pub async fn events_from(&self, query: &str, last_event_id: Option<&str>) -> Subscription {
        let mut request = Request::get(format!("/v1/events{query}"));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let request = request.body(Body::empty()).unwrap();
        let response = self.app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/event-stream"
        );
        Subscription::new(response.into_body().into_data_stream())
    }

    /// Sends each rule's request and checks its answer with `assert_error`.
    /// The rules' fragments are distinct, so a failure's message names its
    /// rule.
    pub async fn check(&self, rules: &[Rule<'_>]) {
        let mut fragments = HashSet::new();
        for (_, _, _, _, fragment) in rules {
            assert!(
                fragments.insert(fragment),
                "two rules expect {fragment:?}: make each fragment name its rule"
            );
        }
        for (method, path, body, status, fragment) in rules {
            let answer = self.request(method.clone(), path, body.as_ref()).await;
            assert_error(&answer, *status, fragment);
        }
    }
}

/// A database of this test's own.
async fn database_url(backend: Backend) -> String {
    match backend {
        // `sqlite::memory:` would give each pooled connection a database of
        // its own; a named in-memory database with a shared cache is one
        // database for the whole pool, and gone with it.
        Backend::Sqlite => {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            format!(
                "sqlite:file:berth-router-{}?mode=memory&cache=shared",
                NEXT.fetch_add(1, Ordering::Relaxed)
            )
        }
        Backend::Postgres => fresh_postgres_database().await,
    }
}
