//! What only PostgreSQL does, for servers sharing one database: wake-ups
//! sent as `NOTIFY` and heard by one `LISTEN`ing connection per server,
//! the advisory lock that orders event appends, and the advisory locks of
//! model directories on a shared volume. Holds no statement of the
//! records; those are shared with SQLite.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::any::AnyPoolOptions;
use sqlx::postgres::PgListener;
use sqlx::{AnyConnection, AnyPool, Connection, Executor, Row};
use tokio_util::sync::CancellationToken;

use super::notify::{TOPICS, Topic, Wakeups};
use super::{Db, Result};
use crate::fetch::SharedLocks;

/// The key of the advisory lock every append takes, so that appends commit
/// one after the other and ids become visible in id order: a reader
/// following `id > cursor` never sees a later id before an earlier one
/// that was still to commit. ("berth ev" in ASCII.)
pub(super) const APPEND_LOCK: i64 = 0x6265_7274_6820_6576;

/// How often a waiter for a model directory's lock asks again, at most:
/// locks are held for a fetch.
const RETRY_MAX: Duration = Duration::from_millis(200);

/// A pooled connection idle this long is pinged before it is handed out.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A pool of `connections` to the database at `url`. A connection is
/// pinged before use only when it sat idle (`PING_AFTER_IDLE`): a ping on
/// every use was a round trip of each query's, a fifth of a deployment's;
/// one in use a moment ago is up unless the server just went away, which
/// the query then says as any outage.
pub(super) async fn pool(url: &str, connections: u32) -> Result<AnyPool> {
    Ok(AnyPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(super::ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(
                async move { Ok(meta.idle_for < PING_AFTER_IDLE || conn.ping().await.is_ok()) },
            )
        })
        .connect(url)
        .await?)
}

/// Runs `work` in a transaction and ends it with the SQL `work` answers
/// (statements written out, the last a `COMMIT`), sent as one simple
/// query: a write whose last statement holds a lock until the commit
/// holds it for no round trip (`append::appended_and_committed`).
/// `uncancelled`, as `Db::write`. Anything that fails rolls back; a
/// connection that cannot is closed rather than pooled mid-transaction.
pub(super) async fn ending_with<T, F>(pool: &AnyPool, work: F) -> Result<T>
where
    T: Send + 'static,
    F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<(T, String)>> + Send + 'static,
{
    let pool = pool.clone();
    super::uncancelled(async move {
        let mut pooled = pool.acquire().await?;
        let conn: &mut AnyConnection = &mut pooled;
        // Statements without arguments go as simple queries, several to one.
        conn.execute("BEGIN").await?;
        let done = match work(&mut *conn).await {
            Ok((value, end)) => conn
                .execute(end.as_str())
                .await
                .map(|_| value)
                .map_err(Into::into),
            Err(e) => Err(e),
        };
        if done.is_err() && conn.execute("ROLLBACK").await.is_err() {
            pooled.close_on_drop();
        }
        done
    })
    .await
}

/// Tells every server on the database that `topic` changed. On the pool it
/// goes out at once; on a connection inside a transaction PostgreSQL sends
/// it when that transaction commits, and never if it does not.
pub(super) async fn notify<'e>(
    executor: impl sqlx::Executor<'e, Database = sqlx::Any>,
    topic: Topic,
    payload: &str,
) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(topic.channel())
        .bind(payload)
        .execute(executor)
        .await?;
    Ok(())
}

/// Hands what the servers on the database at `url` notify to `wakeups`,
/// until `stop`, reconnecting after a lost connection (waiters look on
/// their own tick meanwhile).
pub(super) fn listen(
    url: &str,
    wakeups: Arc<Wakeups>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let url = url.to_string();
    tokio::spawn(async move {
        let mut wait = Duration::from_millis(250);
        loop {
            let failure = tokio::select! {
                _ = stop.cancelled() => return,
                failure = listen_once(&url, &wakeups) => failure,
            };
            tracing::warn!(
                "listening for other berth servers' wake-ups: {failure}; connecting again in {}",
                crate::human::duration(wait)
            );
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    })
}

async fn listen_once(url: &str, wakeups: &Wakeups) -> sqlx::Error {
    let mut listener = match PgListener::connect(url).await {
        Ok(listener) => listener,
        Err(e) => return e,
    };
    let channels = TOPICS.map(Topic::channel);
    if let Err(e) = listener.listen_all(channels).await {
        return e;
    }
    // Whatever was missed while not listening: every waiter looks.
    wakeups.deliver_all();
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                if let Some(topic) = Topic::of(notification.channel()) {
                    wakeups.deliver(topic, notification.payload().to_string());
                }
            }
            // The connection was lost; the next call connects again.
            // What was sent meanwhile is gone: every waiter looks.
            Ok(None) => wakeups.deliver_all(),
            Err(e) => return e,
        }
    }
}

/// The connection holding an advisory lock (in a mutex only to be shared
/// by the fetch's threads, which never touch it). A lock lives as long as
/// the session that took it, so a guard owns a connection of its own and
/// closes it when dropped: the lock can never go back to the pool still
/// held, and a server that dies releases its locks with its connections.
struct Held(std::sync::Mutex<Option<AnyConnection>>);

impl Drop for Held {
    fn drop(&mut self) {
        let conn = self.0.get_mut().ok().and_then(Option::take);
        if let (Some(conn), Ok(runtime)) = (conn, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                let _ = conn.close().await;
            });
        }
    }
}

impl Db {
    /// Waits for the advisory lock named `key`, held until the guard is
    /// dropped. Only on PostgreSQL; SQLite serves one server.
    pub async fn advisory_lock(&self, key: &str) -> Result<Box<dyn Send + Sync>> {
        let mut conn = self.pool.acquire().await?.detach();
        let mut pause = Duration::from_millis(10);
        loop {
            let row = sqlx::query("SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS taken")
                .bind(key)
                .fetch_one(&mut conn)
                .await?;
            if row.try_get::<bool, _>("taken")? {
                return Ok(Box::new(Held(std::sync::Mutex::new(Some(conn)))));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_MAX);
        }
    }
}

/// Fetches on several machines sharing a models volume never fill one
/// model directory at once.
impl SharedLocks for Db {
    fn lock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, std::io::Result<Box<dyn Send + Sync>>> {
        Box::pin(async move {
            self.advisory_lock(&format!("berth:models:{key}"))
                .await
                .map_err(|e| {
                    std::io::Error::other(format!("taking the lock of {key} in the database: {e}"))
                })
        })
    }
}
