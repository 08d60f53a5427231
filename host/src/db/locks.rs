//! PostgreSQL advisory locks, for work that servers on several machines
//! must not do twice at once (filling one model directory of a shared
//! volume). A lock lives as long as the session that took it, so a guard
//! owns a connection of its own and closes it when dropped: the lock can
//! never go back to the pool still held, and a server that dies releases
//! its locks with its connections.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::{Connection, Row};

use super::Db;
use crate::fetch::SharedLocks;

/// How often a waiter asks again, at most: locks are held for a fetch.
const RETRY_MAX: Duration = Duration::from_millis(200);

/// The connection holding a lock (in a mutex only to be shared by the
/// fetch's threads, which never touch it).
struct Held(std::sync::Mutex<Option<sqlx::AnyConnection>>);

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
    pub async fn advisory_lock(&self, key: &str) -> super::Result<Box<dyn Send + Sync>> {
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
