//! What only SQLite does: the file's URL and connection PRAGMAs, and the
//! group commit through which every write goes. Holds no statement of the
//! records; those are shared with PostgreSQL.

use futures::future::BoxFuture;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyConnection, AnyPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Error, Result, no_room};

/// The most writes one transaction carries.
const GROUP: usize = 64;

/// The most writes waiting for the committer; a caller past it waits to
/// queue its write (backpressure rather than an unbounded backlog).
const WAITING: usize = 4 * GROUP;

/// `url`, asking for the file to be created if missing, unless the URL
/// already says how to open it.
pub(super) fn url(url: &str) -> String {
    if url.contains("mode=") {
        return url.to_string();
    }
    format!("{url}{}mode=rwc", if url.contains('?') { '&' } else { '?' })
}

/// A pool of `connections` to the file at `url`.
pub(super) async fn pool(url: &str, connections: u32) -> Result<AnyPool> {
    Ok(AnyPoolOptions::new()
        .max_connections(connections)
        .after_connect(|conn, _| {
            Box::pin(async move {
                // Foreign keys make `ON DELETE CASCADE` real; the busy
                // timeout lets writers queue instead of failing.
                for pragma in [
                    "PRAGMA foreign_keys = ON",
                    "PRAGMA busy_timeout = 10000",
                    "PRAGMA journal_mode = WAL",
                ] {
                    sqlx::query(pragma).execute(&mut *conn).await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?)
}

/// Group commit. SQLite has one writer at a time and syncs each commit to
/// disk, so writes made one by one wait for each other's syncs (and, on
/// several connections, sleep in its busy handler). Here one task owns
/// the only writing connection; each write queues to it, and the task runs
/// every write that is waiting in one transaction, each in a savepoint of
/// its own (a write that fails leaves the others intact), and answers each
/// caller only after the COMMIT: a write is as durable as before when its
/// caller hears back, and one sync carries many. (PostgreSQL groups
/// concurrent commits itself.) The queue is bounded, so a burst of writes
/// makes callers wait rather than pile up; that cannot deadlock, as the
/// task never queues a write (a write's statements get a connection, never
/// the `Db`).
#[derive(Clone)]
pub(super) struct Committer {
    jobs: mpsc::Sender<Job>,
    /// Cancelled by `close`: the task hands its connection back.
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

impl Committer {
    /// Opens the one writing connection to the file at `url` and starts
    /// the task that owns it.
    pub(super) async fn start(url: &str) -> Result<(Self, tokio::task::JoinHandle<()>)> {
        let pool = pool(url, 1).await?;
        let mut conn = pool.acquire().await?;
        let (jobs, mut queue) = mpsc::channel::<Job>(WAITING);
        let closing = CancellationToken::new();
        let stop = closing.clone();
        let task = tokio::spawn(async move {
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
        Ok((
            Self {
                jobs,
                closing,
                pool,
            },
            task,
        ))
    }

    /// Makes `work` in the next group; returns once that group committed.
    pub(super) async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<T>> + Send + 'static,
    {
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
        self.jobs.send(job).await.map_err(|_| not_made())?;
        answered.await.unwrap_or_else(|_| {
            Err(Error::Unwritten(
                "another write in its transaction broke it; nothing was stored".into(),
            ))
        })
    }

    /// Makes the writes already queued, then hands the connection back.
    pub(super) async fn close(&self) {
        self.closing.cancel();
        self.pool.close().await;
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

/// Fixes a closure's signature as a `Job`'s.
fn job<F>(f: F) -> Job
where
    F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Ran> + Send + 'static,
{
    Box::new(f)
}

#[cfg(test)]
mod tests {
    use crate::db::testing::{model, open, url};
    use crate::db::{Db, NewDeployment};

    /// Writes made at once share the committer's transactions; one that
    /// fails (a duplicate job id, a deployment of a model that does not
    /// exist) fails alone, with its own error, and the others are stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_made_at_once_commit_together_and_fail_alone() {
        let (dir, db) = open().await;
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
                        let inserted = db.insert_deployment(new, None, None).await;
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
        let again = Db::connect(&url(&dir)).await.unwrap();
        assert_eq!(again.models().await.unwrap().len(), 21);
    }

    /// More writes at once than the committer's queue holds: the callers
    /// past it wait for room, and every write is made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_past_the_queue_wait_for_room_and_are_made() {
        let (_dir, db) = open().await;
        let mut writes = tokio::task::JoinSet::new();
        let count = 3 * super::WAITING;
        for i in 0..count {
            let db = db.clone();
            writes.spawn(async move { db.insert_model(&model(&format!("job-{i}"))).await });
        }
        while let Some(joined) = writes.join_next().await {
            joined.unwrap().unwrap();
        }
        assert_eq!(db.models().await.unwrap().len(), count);
    }
}
