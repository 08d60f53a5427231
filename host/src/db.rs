//! berth's records: models, their files, deployments. The only module with
//! SQL. SQLite and PostgreSQL run the same statements through `sqlx::Any`
//! (`$N` placeholders work on both); what differs between them lives in
//! `migrations/sqlite/` and `migrations/postgres/`, applied at connect.

use std::sync::Arc;
use std::time::SystemTime;

use futures::future::BoxFuture;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyConnection, AnyPool, Row};
use tokio_util::sync::CancellationToken;

use crate::model::{Deployment, ModelFile, Outcome, Phase, Progress, Status, TrainedModel};

mod catalog;
pub mod events;
mod locks;
mod notify;
mod queue;

pub use catalog::{NewVersion, Pushed, StoredVersion};
pub use notify::Topic;
pub use queue::{Beat, CancelAsked, Claim, Runnable};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a model with job id {0:?} is already registered")]
    DuplicateJob(String),
    #[error("deployment {0} is not running")]
    NotRunning(i64),
    #[error("database: {0}")]
    Sql(sqlx::Error),
    /// The database's disk is full: nothing can be written until space is
    /// freed, while reads keep working.
    #[error("the database has no room to write (its disk is full): {0}")]
    NoRoom(sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database holds a value berth cannot read: {0}")]
    Corrupt(String),
    /// Another write of the same group commit failed, so this one was not
    /// made either; nothing of it is stored and it may be tried again.
    #[error("the database did not take the write: {0}")]
    Unwritten(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        if no_room(&e) {
            Error::NoRoom(e)
        } else {
            Error::Sql(e)
        }
    }
}

/// Whether a statement failed because the database's disk is full:
/// SQLite's SQLITE_FULL (13), PostgreSQL's disk_full (53100).
fn no_room(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = e else {
        return false;
    };
    matches!(e.code().as_deref(), Some("13" | "53100"))
}

/// The schema's migrations, compiled in: (version, description, SQL) per
/// backend, one entry per file of `migrations/<backend>/`. Listed by hand
/// rather than by `sqlx::migrate!`, whose macro compiles both database
/// drivers a second time; a test keeps the list and the folders in step.
const SQLITE_MIGRATIONS: Migrations = Migrations(&[
    (
        1,
        "initial",
        include_str!("../../migrations/sqlite/0001_initial.sql"),
    ),
    (
        2,
        "live deployments",
        include_str!("../../migrations/sqlite/0002_live_deployments.sql"),
    ),
    (
        3,
        "created by",
        include_str!("../../migrations/sqlite/0003_created_by.sql"),
    ),
    (
        4,
        "queue",
        include_str!("../../migrations/sqlite/0004_queue.sql"),
    ),
    (
        5,
        "events",
        include_str!("../../migrations/sqlite/0005_events.sql"),
    ),
    (
        6,
        "catalog",
        include_str!("../../migrations/sqlite/0006_catalog.sql"),
    ),
]);
const POSTGRES_MIGRATIONS: Migrations = Migrations(&[
    (
        1,
        "initial",
        include_str!("../../migrations/postgres/0001_initial.sql"),
    ),
    (
        2,
        "live deployments",
        include_str!("../../migrations/postgres/0002_live_deployments.sql"),
    ),
    (
        3,
        "created by",
        include_str!("../../migrations/postgres/0003_created_by.sql"),
    ),
    (
        4,
        "queue",
        include_str!("../../migrations/postgres/0004_queue.sql"),
    ),
    (
        5,
        "events",
        include_str!("../../migrations/postgres/0005_events.sql"),
    ),
    (
        6,
        "catalog",
        include_str!("../../migrations/postgres/0006_catalog.sql"),
    ),
]);

#[derive(Debug, Clone, Copy)]
struct Migrations(&'static [(i64, &'static str, &'static str)]);

impl sqlx::migrate::MigrationSource<'static> for Migrations {
    fn resolve(
        self,
    ) -> futures::future::BoxFuture<
        'static,
        std::result::Result<Vec<sqlx::migrate::Migration>, sqlx::error::BoxDynError>,
    > {
        let migrations = self
            .0
            .iter()
            .map(|&(version, description, sql)| {
                sqlx::migrate::Migration::new(
                    version,
                    description.into(),
                    sqlx::migrate::MigrationType::Simple,
                    sql.into(),
                    false,
                )
            })
            .collect();
        Box::pin(std::future::ready(Ok(migrations)))
    }
}

#[derive(Clone)]
pub struct Db {
    /// Reads, and on PostgreSQL writes too.
    pool: AnyPool,
    /// On SQLite, every write: see `Committer`.
    committer: Option<Committer>,
    /// What other servers on this database (and this one) said changed.
    wakeups: Arc<notify::Wakeups>,
    /// Cancelled by `close`: stops listening.
    closing: CancellationToken,
}

/// Group commit, for SQLite. SQLite has one writer at a time and syncs
/// each commit to disk, so writes made one by one wait for each other's
/// syncs (and, on several connections, sleep in its busy handler). Here
/// one task owns the only writing connection; each write queues to it,
/// and the task runs every write that is waiting in one transaction, each
/// in a savepoint of its own (a write that fails leaves the others
/// intact), and answers each caller only after the COMMIT: a write is as
/// durable as before when its caller hears back, and one sync carries
/// many. PostgreSQL groups concurrent commits itself.
#[derive(Clone)]
struct Committer {
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    /// Cancelled by `Db::close`: the task hands its connection back.
    closing: CancellationToken,
    /// The task's connection's pool, to close.
    pool: AnyPool,
}

/// One write, as the committer runs it.
type Job = Box<dyn for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Ran> + Send>;

/// A write that ran, before the commit decides its fate.
struct Ran {
    ok: bool,
    no_room: bool,
    /// Answers the caller: with its own outcome, unless the transaction
    /// did not commit (the reason given).
    answer: Answer,
}

type Answer = Box<dyn FnOnce(Option<&Unwritten>) + Send>;

/// Why a group of writes did not commit.
struct Unwritten {
    no_room: bool,
    message: String,
}

impl Unwritten {
    fn error(&self) -> Error {
        let cause = sqlx::Error::Protocol(self.message.clone());
        if self.no_room {
            Error::NoRoom(cause)
        } else {
            Error::Unwritten(self.message.clone())
        }
    }
}

/// The most writes one transaction carries.
const GROUP: usize = 64;

impl Committer {
    fn start(mut conn: sqlx::pool::PoolConnection<sqlx::Any>, pool: AnyPool) -> Self {
        let (jobs, mut queue) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let closing = CancellationToken::new();
        let stop = closing.clone();
        tokio::spawn(async move {
            let mut group = Vec::with_capacity(GROUP);
            loop {
                // Writes already queued are made before closing.
                let received = tokio::select! {
                    biased;
                    received = queue.recv_many(&mut group, GROUP) => received,
                    _ = stop.cancelled() => 0,
                };
                if received == 0 {
                    return;
                }
                commit_group(&mut conn, std::mem::take(&mut group)).await;
            }
        });
        Self {
            jobs,
            closing,
            pool,
        }
    }
}

/// Runs `jobs` in one transaction and answers each. A job left unrun (the
/// transaction broke) is dropped, which tells its caller it was not made.
async fn commit_group(conn: &mut AnyConnection, jobs: Vec<Job>) {
    async fn run(conn: &mut AnyConnection, sql: &str) -> std::result::Result<(), sqlx::Error> {
        sqlx::query(sql).execute(conn).await.map(drop)
    }
    if let Err(e) = run(conn, "BEGIN IMMEDIATE").await {
        tracing::warn!(
            "could not begin a transaction for {} writes: {e}",
            jobs.len()
        );
        return;
    }
    let mut ran = Vec::with_capacity(jobs.len());
    let mut broken = None;
    for job in jobs {
        if let Err(e) = run(conn, "SAVEPOINT one_write").await {
            broken = Some(e);
            break;
        }
        let outcome = job(conn).await;
        let ended = if outcome.ok {
            run(conn, "RELEASE one_write").await
        } else {
            // SQLite may have rolled the whole transaction back itself (a
            // full disk): then this fails and the group is given up.
            match run(conn, "ROLLBACK TO one_write").await {
                Ok(()) => run(conn, "RELEASE one_write").await,
                Err(e) => Err(e),
            }
        };
        ran.push(outcome);
        if let Err(e) = ended {
            broken = Some(e);
            break;
        }
    }
    let committed = match broken {
        Some(e) => Err(e),
        None => run(conn, "COMMIT").await,
    };
    let unwritten = committed.err().map(|e| Unwritten {
        no_room: no_room(&e) || ran.iter().any(|r| r.no_room),
        message: e.to_string(),
    });
    if unwritten.is_some() {
        let _ = run(conn, "ROLLBACK").await;
    }
    for outcome in ran {
        (outcome.answer)(unwritten.as_ref());
    }
}

/// A deployment about to start.
pub struct NewDeployment<'a> {
    pub model_id: i64,
    pub deployer: &'a str,
    pub options_json: &'a str,
    pub dir: &'a str,
    /// The sha256 of the deployer's `.wasm` that checked the options.
    pub plugin_sha256: &'a str,
    pub created_by: Option<&'a str>,
}

/// How a deployment ended, and what it left to keep.
pub struct Ending<'a> {
    pub outcome: &'a Outcome,
    pub duration_ms: i64,
    pub progress: &'a Progress,
    pub logs: &'a str,
}

pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// The clock of leases and liveness: Unix milliseconds, as stored. The
/// servers sharing a database must agree on it to well within a lease.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    millis(since)
}

/// A duration in the milliseconds the records store.
pub fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

const MODEL_COLUMNS: &str = "id, name, job_id, base_model, model_size, dataset, num_examples, \
     num_train_steps, final_loss, params, source, created_at, created_by";
const DEPLOYMENT_COLUMNS: &str = "id, model_id, deployer, options, status, phase, progress, dir, \
     out_dir, ref, details, error, duration_ms, created_at, completed_at, created_by, plugin_sha256, \
     server_id, started_at";

impl Db {
    /// Connects (creating a SQLite file if missing) and applies migrations.
    pub async fn connect(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
        let url = if postgres || url.contains("mode=") {
            url.to_string()
        } else {
            format!("{url}{}mode=rwc", if url.contains('?') { '&' } else { '?' })
        };
        let pool = Self::pool(&url, postgres, if postgres { 16 } else { 8 }).await?;
        let migrations = if postgres {
            POSTGRES_MIGRATIONS
        } else {
            SQLITE_MIGRATIONS
        };
        sqlx::migrate::Migrator::new(migrations)
            .await?
            .run(&pool)
            .await?;
        let committer = if postgres {
            None
        } else {
            let writer = Self::pool(&url, postgres, 1).await?;
            Some(Committer::start(writer.acquire().await?, writer))
        };
        let wakeups = Arc::new(notify::Wakeups::new());
        let closing = CancellationToken::new();
        if postgres {
            let (wakeups, stop) = (wakeups.clone(), closing.clone());
            tokio::spawn(async move { wakeups.listen(&url, stop).await });
        }
        Ok(Self {
            pool,
            committer,
            wakeups,
            closing,
        })
    }

    /// Whether this is PostgreSQL, where several servers may share the
    /// records.
    pub fn shared(&self) -> bool {
        self.committer.is_none()
    }

    /// Tells every server on this database (this one included) that
    /// `topic` changed. Made after the write it reports was committed.
    pub async fn notify(&self, topic: Topic, payload: &str) -> Result<()> {
        if self.shared() {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(topic.channel())
                .bind(payload)
                .execute(&self.pool)
                .await?;
        } else {
            self.wakeups.deliver(topic, payload.to_string());
        }
        Ok(())
    }

    /// Hears what `notify` said from now on, from any server.
    pub fn wakeups(&self, topic: Topic) -> tokio::sync::broadcast::Receiver<String> {
        self.wakeups.subscribe(topic)
    }

    async fn pool(url: &str, postgres: bool, connections: u32) -> Result<AnyPool> {
        Ok(AnyPoolOptions::new()
            .max_connections(connections)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if !postgres {
                        // Foreign keys make `ON DELETE CASCADE` real; the
                        // busy timeout lets writers queue instead of failing.
                        sqlx::query("PRAGMA foreign_keys = ON")
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query("PRAGMA busy_timeout = 10000")
                            .execute(&mut *conn)
                            .await?;
                        sqlx::query("PRAGMA journal_mode = WAL")
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect(url)
            .await?)
    }

    /// Records a model and its files in one transaction; `id` and
    /// `created_at` of the argument are ignored.
    pub async fn insert_model(&self, model: &TrainedModel) -> Result<TrainedModel> {
        let mut model = model.clone();
        model.created_at = now();
        let recorded = model.clone();
        model.id = self
            .write(move |conn| Box::pin(insert_model(conn, recorded)))
            .await?;
        Ok(model)
    }

    pub async fn models(&self) -> Result<Vec<TrainedModel>> {
        let rows = sqlx::query(&format!("SELECT {MODEL_COLUMNS} FROM models ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        let mut models = rows.iter().map(model_row).collect::<Result<Vec<_>>>()?;
        let files = sqlx::query(
            "SELECT model_id, path, size_bytes, sha256 FROM model_files ORDER BY model_id, position",
        )
        .fetch_all(&self.pool)
        .await?;
        for row in &files {
            let model_id: i64 = row.try_get("model_id")?;
            if let Ok(at) = models.binary_search_by_key(&model_id, |m| m.id) {
                models[at].files.push(file_row(row)?);
            }
        }
        Ok(models)
    }

    pub async fn model(&self, id: i64) -> Result<Option<TrainedModel>> {
        let Some(row) = sqlx::query(&format!("SELECT {MODEL_COLUMNS} FROM models WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let mut model = model_row(&row)?;
        let files = sqlx::query(
            "SELECT path, size_bytes, sha256 FROM model_files WHERE model_id = $1 ORDER BY position",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        model.files = files.iter().map(file_row).collect::<Result<_>>()?;
        Ok(Some(model))
    }

    /// Deletes a model with its files' records and its deployments. Returns
    /// false if there was no such model.
    pub async fn delete_model(&self, id: i64) -> Result<bool> {
        self.write(move |conn| {
            Box::pin(async move {
                let deleted = sqlx::query("DELETE FROM models WHERE id = $1")
                    .bind(id)
                    .execute(conn)
                    .await?;
                Ok(deleted.rows_affected() > 0)
            })
        })
        .await
    }

    /// Records a deployment as queued, for a server that has its deployer
    /// at `new.plugin_sha256` to claim (and to give it an out-dir). With
    /// `claim`, and no deployment queued before it, it is recorded running
    /// on that server at once.
    pub async fn insert_deployment(
        &self,
        new: NewDeployment<'_>,
        claim: Option<Claim>,
    ) -> Result<Deployment> {
        let model_id = new.model_id;
        let [deployer, options, dir, plugin_sha256] =
            [new.deployer, new.options_json, new.dir, new.plugin_sha256].map(str::to_string);
        let created_by = new.created_by.map(str::to_string);
        self.write(move |conn| {
            Box::pin(async move {
                let claim = match claim {
                    Some(claim) => sqlx::query("SELECT 1 FROM deployments WHERE status = 'queued' LIMIT 1")
                        .fetch_optional(&mut *conn)
                        .await?
                        .is_none()
                        .then_some(claim),
                    None => None,
                };
                let now = now();
                let (status, server_id, lease_until, phase, started_at) = match &claim {
                    Some(c) => (
                        "running",
                        c.server_id.as_str(),
                        Some(c.lease_until),
                        Some(c.phase.as_str()),
                        Some(now.as_str()),
                    ),
                    None => ("queued", "", None, None, None),
                };
                let row = sqlx::query(&format!(
                    "INSERT INTO deployments (model_id, deployer, options, status, dir, \
                     out_dir, details, server_id, created_at, created_by, plugin_sha256, \
                     lease_until, phase, started_at) \
                     VALUES ($1, $2, $3, $4, $5, '', '{{}}', $6, $7, $8, $9, $10, $11, $12) \
                     RETURNING {DEPLOYMENT_COLUMNS}"
                ))
                .bind(model_id)
                .bind(deployer)
                .bind(options)
                .bind(status)
                .bind(dir)
                .bind(server_id)
                .bind(&now)
                .bind(created_by)
                .bind(plugin_sha256)
                .bind(lease_until)
                .bind(phase)
                .bind(started_at)
                .fetch_one(&mut *conn)
                .await?;
                let deployment = deployment_row(&row)?;
                let Some(claim) = claim else {
                    return Ok(deployment);
                };
                let row = sqlx::query(&format!(
                    "UPDATE deployments SET out_dir = $1 WHERE id = $2 RETURNING {DEPLOYMENT_COLUMNS}"
                ))
                .bind((claim.out_dir)(deployment.id))
                .bind(deployment.id)
                .fetch_one(&mut *conn)
                .await?;
                deployment_row(&row)
            })
        })
        .await
    }

    /// Ends a running deployment. A deployment that already ended (or whose
    /// model was deleted meanwhile) is left as it is: `NotRunning`.
    pub async fn finish_deployment(&self, id: i64, ending: &Ending<'_>) -> Result<Deployment> {
        let progress =
            serde_json::to_string(ending.progress).map_err(|e| Error::Corrupt(e.to_string()))?;
        let (status, reference, details, error) = match ending.outcome {
            Outcome::Completed {
                reference,
                details_json,
            } => (
                Status::Completed,
                Some(reference.as_str()),
                details_json.as_str(),
                None,
            ),
            Outcome::Failed { error } => (Status::Failed, None, "{}", Some(error.as_str())),
        };
        let (reference, details, error) = (
            reference.map(str::to_string),
            details.to_string(),
            error.map(str::to_string),
        );
        let (duration_ms, logs) = (ending.duration_ms, ending.logs.to_string());
        self.write(move |conn| {
            Box::pin(async move {
                let updated = sqlx::query(&format!(
                    "UPDATE deployments SET status = $1, ref = $2, details = $3, error = $4, \
                     duration_ms = $5, completed_at = $6, phase = NULL, logs = $7, progress = $8 \
                     WHERE id = $9 AND status = 'running' RETURNING {DEPLOYMENT_COLUMNS}"
                ))
                .bind(status.as_str())
                .bind(reference)
                .bind(details)
                .bind(error)
                .bind(duration_ms)
                .bind(now())
                .bind(logs)
                .bind(progress)
                .bind(id)
                .fetch_all(conn)
                .await?;
                match updated.first() {
                    Some(row) => deployment_row(row),
                    None => Err(Error::NotRunning(id)),
                }
            })
        })
        .await
    }

    /// Records where a running deployment stands; a no-op once it ended.
    /// The phase never goes back from `deploying`, so an update taken
    /// before the deployer started and written late cannot hide that it
    /// did from the next start's `fail_leftovers`.
    pub async fn update_progress(&self, id: i64, phase: Phase, progress: &Progress) -> Result<()> {
        let progress =
            serde_json::to_string(progress).map_err(|e| Error::Corrupt(e.to_string()))?;
        self.write(move |conn| {
            Box::pin(async move {
                sqlx::query(
                    "UPDATE deployments SET phase = CASE phase WHEN $1 THEN phase ELSE $2 END, \
                     progress = $3 WHERE id = $4 AND status = 'running'",
                )
                .bind(Phase::Deploying.as_str())
                .bind(phase.as_str())
                .bind(progress)
                .bind(id)
                .execute(conn)
                .await?;
                Ok(())
            })
        })
        .await
    }

    /// The guest's log lines of an ended deployment.
    pub async fn deployment_logs(&self, id: i64) -> Result<Option<String>> {
        let row = sqlx::query("SELECT logs FROM deployments WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get("logs")).transpose()?)
    }

    pub async fn deployment(&self, id: i64) -> Result<Option<Deployment>> {
        let row = sqlx::query(&format!(
            "SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(deployment_row).transpose()
    }

    /// Newest first.
    pub async fn deployments_of(&self, model_id: i64, limit: u32) -> Result<Vec<Deployment>> {
        let rows = sqlx::query(&format!(
            "SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE model_id = $1 ORDER BY id DESC LIMIT $2"
        ))
        .bind(model_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(deployment_row).collect()
    }

    /// Fails the deployments a previous run of this server left running,
    /// each with `error` of the phase its row was last recorded in; returns
    /// their rows as failed.
    pub async fn fail_leftovers(
        &self,
        server_id: &str,
        error: impl Fn(Option<Phase>) -> String,
    ) -> Result<Vec<Deployment>> {
        let errors = [
            error(Some(Phase::Fetching)),
            error(Some(Phase::Deploying)),
            error(None),
        ];
        let server_id = server_id.to_string();
        self.write(move |conn| {
            Box::pin(async move {
                let [fetching, deploying, unknown] = errors;
                let rows = sqlx::query(&format!(
                    "UPDATE deployments SET status = 'failed', \
                     error = CASE phase WHEN $1 THEN $2 WHEN $3 THEN $4 ELSE $5 END, \
                     completed_at = $6, phase = NULL \
                     WHERE server_id = $7 AND status = 'running' RETURNING {DEPLOYMENT_COLUMNS}"
                ))
                .bind(Phase::Fetching.as_str())
                .bind(fetching)
                .bind(Phase::Deploying.as_str())
                .bind(deploying)
                .bind(unknown)
                .bind(now())
                .bind(server_id)
                .fetch_all(conn)
                .await?;
                rows.iter().map(deployment_row).collect()
            })
        })
        .await
    }

    pub async fn close(&self) {
        self.closing.cancel();
        if let Some(committer) = &self.committer {
            committer.closing.cancel();
            committer.pool.close().await;
        }
        self.pool.close().await;
    }

    /// Makes one write, in a transaction of its own on PostgreSQL and in
    /// the committer's group on SQLite; returns once it is committed.
    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<T>> + Send + 'static,
    {
        let Some(committer) = &self.committer else {
            let mut tx = self.pool.begin().await?;
            let value = work(&mut tx).await?;
            tx.commit().await?;
            return Ok(value);
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job = job(move |conn| {
            Box::pin(async move {
                let outcome = work(conn).await;
                Ran {
                    ok: outcome.is_ok(),
                    no_room: matches!(outcome, Err(Error::NoRoom(_))),
                    answer: Box::new(move |unwritten: Option<&Unwritten>| {
                        let _ = answer.send(match (outcome, unwritten) {
                            (Ok(_), Some(unwritten)) => Err(unwritten.error()),
                            (outcome, _) => outcome,
                        });
                    }),
                }
            })
        });
        let not_made = || Error::Unwritten("the server is closing its database".into());
        committer.jobs.send(job).map_err(|_| not_made())?;
        answered.await.unwrap_or_else(|_| {
            Err(Error::Unwritten(
                "another write in its transaction broke it; nothing was stored".into(),
            ))
        })
    }
}

/// The statements of `Db::insert_model`.
async fn insert_model(conn: &mut AnyConnection, model: TrainedModel) -> Result<i64> {
    let insert = sqlx::query(
        "INSERT INTO models (name, job_id, base_model, model_size, dataset, num_examples, \
         num_train_steps, final_loss, params, source, created_at, created_by) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id",
    )
    .bind(&model.name)
    .bind(&model.job_id)
    .bind(&model.base_model)
    .bind(&model.model_size)
    .bind(&model.dataset)
    .bind(to_i64(model.num_examples))
    .bind(to_i64(model.num_train_steps));
    // sqlx 0.8's Any driver sends a NULL f64 to PostgreSQL as a `real`
    // and a NULL f32 as a `double precision` (the two are swapped). The
    // connection caches the statement with the first parameter types it
    // saw, so a `real` NULL made every later loss on that connection
    // fail; a NULL f32 keeps the statement `double precision`.
    let insert = match model.final_loss {
        Some(loss) => insert.bind(loss),
        None => insert.bind(None::<f32>),
    };
    let inserted = insert
        .bind(&model.params_json)
        .bind(&model.source)
        .bind(&model.created_at)
        .bind(&model.created_by)
        .fetch_one(&mut *conn)
        .await;
    let id: i64 = match inserted {
        Ok(row) => row.try_get(0)?,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            return Err(Error::DuplicateJob(model.job_id.clone()));
        }
        Err(e) => return Err(e.into()),
    };
    for (position, file) in model.files.iter().enumerate() {
        sqlx::query(
            "INSERT INTO model_files (model_id, position, path, size_bytes, sha256) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id)
        .bind(position as i64)
        .bind(&file.path)
        .bind(to_i64(file.size_bytes))
        .bind(&file.sha256)
        .execute(&mut *conn)
        .await?;
    }
    Ok(id)
}

/// Fixes a closure's signature as a `Job`'s.
fn job<F>(f: F) -> Job
where
    F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Ran> + Send + 'static,
{
    Box::new(f)
}

/// Sizes and counts are u64 in the domain and BIGINT in both databases;
/// validation keeps them below 2^63.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn to_u64(value: i64, column: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::Corrupt(format!("{column} = {value}")))
}

fn model_row(row: &AnyRow) -> Result<TrainedModel> {
    Ok(TrainedModel {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        job_id: row.try_get("job_id")?,
        base_model: row.try_get("base_model")?,
        model_size: row.try_get("model_size")?,
        dataset: row.try_get("dataset")?,
        num_examples: to_u64(row.try_get("num_examples")?, "num_examples")?,
        num_train_steps: to_u64(row.try_get("num_train_steps")?, "num_train_steps")?,
        final_loss: row.try_get("final_loss")?,
        params_json: row.try_get("params")?,
        source: row.try_get("source")?,
        files: Vec::new(),
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
    })
}

fn file_row(row: &AnyRow) -> Result<ModelFile> {
    Ok(ModelFile {
        path: row.try_get("path")?,
        size_bytes: to_u64(row.try_get("size_bytes")?, "size_bytes")?,
        sha256: row.try_get("sha256")?,
    })
}

fn deployment_row(row: &AnyRow) -> Result<Deployment> {
    let status: String = row.try_get("status")?;
    let phase: Option<String> = row.try_get("phase")?;
    let progress: String = row.try_get("progress")?;
    Ok(Deployment {
        id: row.try_get("id")?,
        model_id: row.try_get("model_id")?,
        deployer: row.try_get("deployer")?,
        options_json: row.try_get("options")?,
        status: Status::parse(&status)
            .ok_or_else(|| Error::Corrupt(format!("status = {status:?}")))?,
        phase: phase.as_deref().and_then(Phase::parse),
        progress: serde_json::from_str(&progress).unwrap_or_default(),
        dir: row.try_get("dir")?,
        out_dir: row.try_get("out_dir")?,
        reference: row.try_get("ref")?,
        details_json: row.try_get("details")?,
        error: row.try_get("error")?,
        duration_ms: row.try_get("duration_ms")?,
        created_at: row.try_get("created_at")?,
        completed_at: row.try_get("completed_at")?,
        created_by: row.try_get("created_by")?,
        plugin_sha256: row.try_get("plugin_sha256")?,
        server: Some(row.try_get::<String, _>("server_id")?).filter(|s| !s.is_empty()),
        started_at: row.try_get("started_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(job_id: &str) -> TrainedModel {
        TrainedModel {
            id: 0,
            name: job_id.into(),
            job_id: job_id.into(),
            base_model: "b".into(),
            model_size: "8B".into(),
            dataset: "d".into(),
            num_examples: 1,
            num_train_steps: 1,
            final_loss: None,
            params_json: "{}".into(),
            source: "file:///{job_id}/{path}".into(),
            files: vec![ModelFile {
                path: "a.bin".into(),
                size_bytes: 1,
                sha256: None,
            }],
            created_at: String::new(),
            created_by: None,
        }
    }

    /// Writes made at once share the committer's transactions; one that
    /// fails (a duplicate job id, a deployment of a model that does not
    /// exist) fails alone, with its own error, and the others are stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_made_at_once_commit_together_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let db = Db::connect(&url).await.unwrap();
        let mut writes = tokio::task::JoinSet::new();
        for i in 0..40 {
            let db = db.clone();
            writes.spawn(async move {
                match i % 4 {
                    0 => ("duplicate", db.insert_model(&model("same")).await.err()),
                    1 => {
                        let new = NewDeployment {
                            model_id: 999_999,
                            deployer: "d",
                            options_json: "{}",
                            dir: "/m",
                            plugin_sha256: "ab",
                            created_by: None,
                        };
                        let inserted = db.insert_deployment(new, None).await;
                        ("orphan", inserted.err())
                    }
                    _ => (
                        "model",
                        db.insert_model(&model(&format!("job-{i}"))).await.err(),
                    ),
                }
            });
        }
        let mut errors = std::collections::BTreeMap::<&str, Vec<String>>::new();
        while let Some(joined) = writes.join_next().await {
            let (kind, error) = joined.unwrap();
            errors
                .entry(kind)
                .or_default()
                .extend(error.map(|e| e.to_string()));
        }
        assert!(errors["model"].is_empty(), "{errors:?}");
        assert_eq!(
            errors["duplicate"].len(),
            9,
            "one of ten is stored: {errors:?}"
        );
        assert!(
            errors["duplicate"]
                .iter()
                .all(|e| e.contains("already registered")),
            "{errors:?}"
        );
        assert_eq!(errors["orphan"].len(), 10, "{errors:?}");
        assert!(
            errors["orphan"].iter().all(|e| e.contains("FOREIGN KEY")),
            "{errors:?}"
        );
        let stored = db.models().await.unwrap();
        assert_eq!(stored.len(), 20 + 1);
        assert!(stored.iter().all(|m| m.files.len() == 1));
        db.close().await;
        // Closed: the records are on disk for the next connection.
        let again = Db::connect(&url).await.unwrap();
        assert_eq!(again.models().await.unwrap().len(), 21);
    }

    /// Every file of `migrations/<backend>/` is compiled in, under the
    /// version and description sqlx gives a file of that name, so databases
    /// migrated before the list existed keep matching it.
    #[test]
    fn compiled_in_migrations_are_the_migration_files() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        for (backend, Migrations(listed)) in [
            ("sqlite", SQLITE_MIGRATIONS),
            ("postgres", POSTGRES_MIGRATIONS),
        ] {
            let mut files: Vec<_> = std::fs::read_dir(root.join(backend))
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .collect();
            files.sort();
            let on_disk: Vec<(i64, String, String)> = files
                .iter()
                .map(|path| {
                    let name = path.file_name().unwrap().to_str().unwrap();
                    let (version, rest) =
                        name.strip_suffix(".sql").unwrap().split_once('_').unwrap();
                    let sql = std::fs::read_to_string(path).unwrap();
                    (version.parse().unwrap(), rest.replace('_', " "), sql)
                })
                .collect();
            let compiled: Vec<(i64, String, String)> = listed
                .iter()
                .map(|&(v, d, sql)| (v, d.to_string(), sql.to_string()))
                .collect();
            assert_eq!(
                compiled, on_disk,
                "{backend}: the list in db.rs and the folder differ"
            );
        }
    }
}
