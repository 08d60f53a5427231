//! berth's records: models and their files, deployments and the queue,
//! the event log and webhook state, the stored deployers. The only module
//! with SQL. SQLite and PostgreSQL run the same statements through
//! `sqlx::Any` (`$N` placeholders work on both); where they differ the
//! code asks `Backend` by name, and what only one of them does lives in
//! `sqlite` (group commit, PRAGMAs) or `postgres` (NOTIFY, LISTEN,
//! advisory locks). The schema is `migrations/<backend>/`, applied at
//! connect (`migrations`).
//!
//! `Db` is the facade: reads go to a pool; every write goes through
//! `Db::write`. One file per group of tables: `models`, `deployments`,
//! `queue`, `events` (with `append`), `catalog`, `approvals`, `rules`;
//! `notify` names the wake-ups. Never words
//! a deployment's error: what a sweep, a restart or a cancel records comes
//! from the caller.

use std::sync::Arc;
use std::time::SystemTime;

use futures::future::BoxFuture;
use sqlx::{AnyConnection, AnyPool};
use tokio_util::sync::CancellationToken;

/// The statements of one write, as `Db::write` takes them:
/// `self.write(statements!(|conn| { … }))`. It is the closure over the
/// connection that returns its future boxed, with everything it uses moved
/// in; an async closure cannot stand in, as its future must be `Send` for
/// SQLite's committer task.
macro_rules! statements {
    (|$conn:ident| $body:block) => {
        move |$conn| Box::pin(async move $body)
    };
}

mod append;
mod approvals;
mod catalog;
mod deployments;
pub mod events;
mod migrations;
mod models;
mod notify;
mod postgres;
mod queue;
mod reach;
mod rules;
mod sqlite;
#[cfg(test)]
pub(crate) mod testing;

pub use catalog::{NewVersion, Pushed, StoredVersion};
pub use deployments::{Ending, NewDeployment};
pub use models::LastDeployed;
pub use notify::Topic;
pub use queue::{Beat, CancelAsked, Claim, Runnable};
pub use rules::{CausedDeployment, FiringRow, StoredRule};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a model with job id {0:?} is already registered")]
    DuplicateJob(String),
    #[error("deployment {0} is not running")]
    NotRunning(i64),
    #[error("deployment {0} is not awaiting approval")]
    NotAwaiting(i64),
    #[error("database: {0}")]
    Sql(sqlx::Error),
    /// The database's disk is full: nothing can be written until space is
    /// freed, while reads keep working.
    #[error("the database has no room to write (its disk is full): {0}")]
    NoRoom(sqlx::Error),
    /// The database cannot be reached (down, restarting, cut off) or
    /// gave no connection within `ACQUIRE_TIMEOUT`: a write may not have
    /// been made; the same request can be made again once it is back.
    #[error("the database is unreachable: {0}")]
    Unreachable(sqlx::Error),
    /// The database was migrated by a newer berth: this build does not
    /// know the schema, so it touches nothing.
    #[error(
        "the database's schema has migration {applied}, newer than this build of berth knows (its newest is {known}): a newer berth release migrated it; run that release or a later one against this database, or restore a backup taken before the upgrade"
    )]
    SchemaNewer { applied: i64, known: i64 },
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
        } else if unreachable(&e) {
            Error::Unreachable(e)
        } else {
            Error::Sql(e)
        }
    }
}

impl Error {
    /// Whether the database could not be reached: nothing about the
    /// request itself was wrong, and it may be made again later.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable(_))
    }
}

/// Whether a statement failed because the database could not be reached:
/// no connection (refused, reset, timed out waiting for one), or
/// PostgreSQL ending the session as it shuts down or starts up (class 08,
/// connection exception; 57P01–57P03, admin/crash shutdown and "cannot
/// connect now").
fn unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P0")),
        _ => false,
    }
}

/// How long a statement waits for a connection before it fails as
/// `Unreachable`: short, so a request during an outage is answered (503)
/// well within any client's patience instead of hanging.
pub const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a statement failed because the database's disk is full:
/// SQLite's SQLITE_FULL (13), PostgreSQL's disk_full (53100).
fn no_room(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = e else {
        return false;
    };
    matches!(e.code().as_deref(), Some("13" | "53100"))
}

/// Which database holds the records, told by the URL it was opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A file of one server: its writes are group-committed, its wake-ups
    /// stay in the process.
    Sqlite,
    /// Possibly shared by several servers (and their models volume): row
    /// locks, `NOTIFY`, advisory locks.
    Postgres,
}

impl Backend {
    fn of(url: &str) -> Self {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            Backend::Sqlite
        }
    }

    pub fn is_postgres(self) -> bool {
        self == Backend::Postgres
    }

    /// Ends a `SELECT` of rows to change so that other servers skip the
    /// rows it takes instead of waiting for them. SQLite has one writer
    /// (one server): nothing to skip.
    pub fn skip_locked(self) -> &'static str {
        match self {
            Backend::Postgres => " FOR UPDATE SKIP LOCKED",
            Backend::Sqlite => "",
        }
    }
}

#[derive(Clone)]
pub struct Db {
    backend: Backend,
    /// Reads, and on PostgreSQL writes too.
    pool: AnyPool,
    /// On SQLite, and only there, every write: see `sqlite::Committer`.
    committer: Option<sqlite::Committer>,
    /// What other servers on this database (and this one) said changed.
    wakeups: Arc<notify::Wakeups>,
    /// Cancelled by `close`: stops listening.
    closing: CancellationToken,
    /// The last answer to "does the database answer?", for `/readyz`.
    reach: Arc<reach::Reach>,
    /// Its own loops (the SQLite committer, the PostgreSQL listener),
    /// until `tasks` hands them to a supervisor.
    tasks: Arc<std::sync::Mutex<Vec<Task>>>,
}

/// One of the database's own loops, with its name.
pub type Task = (&'static str, tokio::task::JoinHandle<()>);

/// `status` as an SQL literal, for a statement that finds rows by their
/// status. Written into the statement, not bound: PostgreSQL plans a
/// prepared statement once for any value after five runs, and that plan of
/// `status = $1` reads the whole table (most rows have ended, so any status
/// looks common); a literal is planned for what the table holds, where
/// queued and running rows are few: the index on status.
fn status_is(status: crate::model::Status) -> String {
    format!("status = '{}'", status.as_str())
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

impl Db {
    /// Connects (creating a SQLite file if missing) and applies migrations.
    pub async fn connect(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of(url);
        let wakeups = Arc::new(notify::Wakeups::new());
        let closing = CancellationToken::new();
        let (pool, committer, task) = match backend {
            Backend::Sqlite => {
                let url = sqlite::url(url);
                let pool = sqlite::pool(&url, 8).await?;
                migrations::apply(&pool, backend).await?;
                let (committer, task) = sqlite::Committer::start(&url).await?;
                (pool, Some(committer), ("SQLite committer", task))
            }
            Backend::Postgres => {
                let pool = postgres::pool(url, 16).await?;
                migrations::apply(&pool, backend).await?;
                let task = postgres::listen(url, wakeups.clone(), closing.clone());
                (pool, None, ("PostgreSQL listener", task))
            }
        };
        Ok(Self {
            backend,
            pool,
            committer,
            wakeups,
            closing,
            reach: Arc::new(reach::Reach::default()),
            tasks: Arc::new(std::sync::Mutex::new(vec![task])),
        })
    }

    /// Its own loops, each with its name, for a supervisor to watch
    /// (`crate::loops`); asked once.
    pub fn tasks(&self) -> Vec<Task> {
        std::mem::take(&mut *self.tasks.lock().expect("never poisoned"))
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Tells every server on this database (this one included) that
    /// `topic` changed. Made after the write it reports was committed.
    pub async fn notify(&self, topic: Topic, payload: &str) -> Result<()> {
        match self.backend {
            Backend::Postgres => postgres::notify(&self.pool, topic, payload).await,
            Backend::Sqlite => {
                self.wakeups.deliver(topic, payload.to_string());
                Ok(())
            }
        }
    }

    /// Hears what `notify` said from now on, from any server.
    pub fn wakeups(&self, topic: Topic) -> tokio::sync::broadcast::Receiver<String> {
        self.wakeups.subscribe(topic)
    }

    pub async fn close(&self) {
        self.closing.cancel();
        if let Some(committer) = &self.committer {
            committer.close().await;
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
        if let Some(committer) = &self.committer {
            return committer.write(work).await;
        }
        let pool = self.pool.clone();
        uncancelled(async move {
            let mut tx = pool.begin().await?;
            let value = work(&mut tx).await?;
            tx.commit().await?;
            Ok(value)
        })
        .await
    }
}

/// Runs `transaction` on a task of its own: a caller that goes away (a
/// client that left, a beat that timed out) must not cancel a transaction
/// midway. sqlx 0.8 does not roll back a `begin` cancelled after its BEGIN
/// was sent, and the connection would go back to the pool inside that
/// transaction (the soak saw PostgreSQL's "there is no transaction in
/// progress" notices).
async fn uncancelled<T: Send + 'static>(
    transaction: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(transaction)
        .await
        .unwrap_or_else(|e| match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(Error::Unwritten("the server is stopping".into())),
        })
}
