//! The event log and the webhook's delivery state: writes that store a
//! change and its events in one transaction (the append itself is
//! `append`'s), reading events after a cursor, pruning the oldest, and the row
//! through which one server at a time delivers to a webhook. Knows nothing
//! of what an event means: a kind, JSON text, a time, a server.

use futures::future::BoxFuture;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::append::{appended_and_committed, insert};
use super::notify::Topic;
use super::{Db, Result, postgres};
use crate::model::{Deployment, TrainedModel};

/// Deployment events, the ones a webhook carries.
const DEPLOYMENT_KINDS: &str = "deployment.%";

pub use super::append::NewEvent;

/// The events a write of deployments stores in its own transaction,
/// worded from each row it wrote (so the change and its report are one
/// commit), and the server they are recorded as.
pub struct Report {
    pub server_id: String,
    pub events: Wording,
    /// Told each written row's id at the same commit, on every server.
    pub wake: Option<Topic>,
}

impl Report {
    /// Wakes `topic` with the written row's id when the write commits.
    pub fn waking(self, topic: Topic) -> Self {
        Self {
            wake: Some(topic),
            ..self
        }
    }
}

/// Words the events of a deployment's row (of each, for a write of
/// several).
pub type Wording = Box<dyn Fn(&Deployment) -> Vec<NewEvent> + Send>;

/// The events a model's registration stores in its own transaction,
/// worded from the row it wrote.
pub struct ModelReport {
    pub server_id: String,
    pub events: ModelWording,
}

/// Words the events of a model's row.
pub type ModelWording = Box<dyn FnOnce(&TrainedModel) -> Vec<NewEvent> + Send>;

/// An event of the log.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub id: i64,
    pub kind: String,
    pub data: String,
    pub created_at: String,
    pub server_id: String,
}

/// Which events a reader follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kinds {
    All,
    /// `deployment.*`, for the webhook.
    Deployments,
}

/// The ids the log spans: every id up to `pruned_through` was pruned (or
/// never existed); `last` is the highest id handed out so far (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub pruned_through: i64,
    pub last: i64,
}

/// A webhook's delivery as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookState {
    pub url: String,
    /// Every deployment event up to this id was delivered or given up.
    pub delivered_id: i64,
    /// Deployment events after `delivered_id`.
    pub pending: i64,
    pub given_up: i64,
    /// The server delivering, while its lease runs.
    pub holder: Option<String>,
    pub failure: Option<WebhookFailure>,
}

/// The event a webhook is retrying, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookFailure {
    pub event_id: i64,
    /// RFC 3339, the first failed attempt at this event.
    pub since: String,
    pub last_error: String,
    /// RFC 3339.
    pub next_attempt: String,
}

impl Db {
    /// Appends `events` in their order, in one transaction; returns the
    /// last id, and wakes the log's readers on every server. On PostgreSQL
    /// the append holds an advisory lock until it commits, so appends of
    /// several servers commit in id order.
    pub async fn append_events(&self, server_id: &str, events: &[NewEvent]) -> Result<i64> {
        if events.is_empty() {
            return Ok(self.event_bounds().await?.last);
        }
        let backend = self.backend;
        let events = events.to_vec();
        let server_id = server_id.to_string();
        let last = self
            .write(statements!(|conn| {
                insert(conn, backend, &server_id, events).await
            }))
            .await?;
        self.appended(last);
        Ok(last)
    }

    /// Makes `work`, a write of one deployment, and appends the events
    /// `report` words from the row it wrote in the same transaction; wakes
    /// the log's readers, and the report's topic, once that committed.
    pub(super) async fn write_reported<F>(&self, work: F, report: Report) -> Result<Deployment>
    where
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<Deployment>>
            + Send
            + 'static,
    {
        self.write_rows_reported(work, report, |row| vec![row])
            .await
    }

    /// Makes `work`, a write of deployments whose rows `rows` finds in its
    /// answer, and appends the events `report` words from each row in the
    /// same transaction; wakes the log's readers, and the report's topic
    /// for each row, once that committed. With no report, a plain write.
    pub(super) async fn write_rows<T, F>(
        &self,
        report: Option<Report>,
        work: F,
        rows: fn(&T) -> Vec<&Deployment>,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<T>> + Send + 'static,
    {
        match report {
            Some(report) => self.write_rows_reported(work, report, rows).await,
            None => self.write(work).await,
        }
    }

    async fn write_rows_reported<T, F>(
        &self,
        work: F,
        report: Report,
        rows: fn(&T) -> Vec<&Deployment>,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<T>> + Send + 'static,
    {
        let backend = self.backend;
        let woken = report.wake;
        let worded = move |written: &T| {
            let rows = rows(written);
            let events: Vec<NewEvent> = rows.iter().flat_map(|row| (report.events)(row)).collect();
            let wakes: Vec<(super::notify::Topic, i64)> = match woken {
                Some(topic) => rows.iter().map(|row| (topic, row.id)).collect(),
                None => Vec::new(),
            };
            (events, wakes)
        };
        if backend.is_postgres() {
            let server_id = report.server_id;
            return postgres::ending_with(
                &self.pool,
                statements!(|conn| {
                    let written = work(&mut *conn).await?;
                    let (events, wakes) = worded(&written);
                    let end = appended_and_committed(&server_id, events, &wakes);
                    Ok((written, end))
                }),
            )
            .await;
        }
        let server_id = report.server_id;
        let (written, last, wakes) = self
            .write(statements!(|conn| {
                let written = work(&mut *conn).await?;
                let (events, wakes) = worded(&written);
                let last = insert(conn, backend, &server_id, events).await?;
                Ok((written, last, wakes))
            }))
            .await?;
        self.appended(last);
        for (topic, id) in wakes {
            self.wakeups.deliver(topic, id.to_string());
        }
        Ok(written)
    }

    /// Wakes the readers of the log on this server once events up to `last`
    /// committed; PostgreSQL's `NOTIFY` went out at the commit.
    pub(super) fn appended(&self, last: i64) {
        if last > 0 && !self.backend.is_postgres() {
            self.wakeups.deliver(Topic::Events, last.to_string());
        }
    }

    /// At most `limit` events after `after`, in id order.
    pub async fn events_after(
        &self,
        after: i64,
        kinds: Kinds,
        limit: u32,
    ) -> Result<Vec<StoredEvent>> {
        let filter = match kinds {
            Kinds::All => "",
            Kinds::Deployments => " AND kind LIKE $3",
        };
        let sql = format!(
            "SELECT id, kind, data, created_at, server_id FROM events \
             WHERE id > $1{filter} ORDER BY id LIMIT $2"
        );
        let mut query = sqlx::query(&sql).bind(after).bind(i64::from(limit));
        if kinds == Kinds::Deployments {
            query = query.bind(DEPLOYMENT_KINDS);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(event_row).collect()
    }

    pub async fn event_bounds(&self) -> Result<Bounds> {
        let row = sqlx::query(
            "SELECT (SELECT pruned_through FROM event_log) AS pruned, \
             (SELECT COALESCE(MAX(id), 0) FROM events) AS last",
        )
        .fetch_one(&self.pool)
        .await?;
        let pruned_through: i64 = row.try_get("pruned")?;
        let last: i64 = row.try_get("last")?;
        Ok(Bounds {
            pruned_through,
            last: last.max(pruned_through),
        })
    }

    /// Deletes the oldest events created before `before` (RFC 3339), at
    /// most `chunk` ids' worth, always a prefix of the log; returns how
    /// many rows went and whether older ones are left for another call.
    pub async fn prune_events(&self, before: &str, chunk: i64) -> Result<(u64, bool)> {
        let before = before.to_string();
        self.write(statements!(|conn| {
            let row = sqlx::query(
                "SELECT (SELECT MAX(id) FROM events WHERE created_at < $1) AS target, \
                 (SELECT MIN(id) FROM events) AS oldest",
            )
            .bind(before)
            .fetch_one(&mut *conn)
            .await?;
            let target: Option<i64> = row.try_get("target")?;
            let oldest: Option<i64> = row.try_get("oldest")?;
            let (Some(target), Some(oldest)) = (target, oldest) else {
                return Ok((0, false));
            };
            let through = target.min(oldest.saturating_add(chunk - 1));
            let deleted = sqlx::query("DELETE FROM events WHERE id <= $1")
                .bind(through)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            sqlx::query(
                "UPDATE event_log SET pruned_through = \
                 CASE WHEN pruned_through < $1 THEN $1 ELSE pruned_through END",
            )
            .bind(through)
            .execute(&mut *conn)
            .await?;
            Ok((deleted, through < target))
        }))
        .await
    }

    /// Records a webhook receiver, if new, with its cursor at the end of
    /// the log: it gets the events from now on.
    pub async fn webhook_join(&self, key: &str, url: &str) -> Result<()> {
        let (key, url) = (key.to_string(), url.to_string());
        self.write(statements!(|conn| {
            sqlx::query(
                "INSERT INTO webhook_state (key, url, delivered_id) \
                 SELECT $1, $2, CASE WHEN l.pruned_through > e.last THEN l.pruned_through \
                 ELSE e.last END \
                 FROM event_log l, (SELECT COALESCE(MAX(id), 0) AS last FROM events) e \
                 WHERE true ON CONFLICT (key) DO NOTHING",
            )
            .bind(key)
            .bind(url)
            .execute(conn)
            .await?;
            Ok(())
        }))
        .await
    }

    /// Takes or renews the delivery lease of webhook `key` for `server_id`
    /// until `until_ms` (Unix ms), if nobody else holds one that runs past
    /// `now_ms`; returns the cursor when held.
    pub async fn webhook_lease(
        &self,
        key: &str,
        server_id: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<i64>> {
        let (key, server_id) = (key.to_string(), server_id.to_string());
        self.write(statements!(|conn| {
            let row = sqlx::query(
                "UPDATE webhook_state SET holder = $1, lease_until = $2 \
                 WHERE key = $3 AND (holder = $1 OR holder IS NULL OR lease_until < $4) \
                 RETURNING delivered_id",
            )
            .bind(server_id)
            .bind(until_ms)
            .bind(key)
            .bind(now_ms)
            .fetch_optional(conn)
            .await?;
            Ok(row.map(|r| r.try_get(0)).transpose()?)
        }))
        .await
    }

    /// Moves webhook `key`'s cursor to `id` (delivered, or given up when
    /// `gave_up`), clears the failure and renews the lease; false if
    /// `server_id` no longer holds it (nothing is changed then).
    pub async fn webhook_done(
        &self,
        key: &str,
        server_id: &str,
        id: i64,
        gave_up: bool,
        until_ms: i64,
    ) -> Result<bool> {
        let (key, server_id) = (key.to_string(), server_id.to_string());
        self.write(statements!(|conn| {
            let updated = sqlx::query(
                "UPDATE webhook_state SET \
                 delivered_id = CASE WHEN delivered_id < $1 THEN $1 ELSE delivered_id END, \
                 given_up = given_up + $2, lease_until = $3, failing_id = NULL, \
                 failing_since = NULL, last_error = NULL, next_attempt = NULL \
                 WHERE key = $4 AND holder = $5",
            )
            .bind(id)
            .bind(i64::from(gave_up))
            .bind(until_ms)
            .bind(key)
            .bind(server_id)
            .execute(conn)
            .await?;
            Ok(updated.rows_affected() > 0)
        }))
        .await
    }

    /// Records a failed attempt of webhook `key` and renews the lease;
    /// false if `server_id` no longer holds it.
    pub async fn webhook_failed(
        &self,
        key: &str,
        server_id: &str,
        failure: &WebhookFailure,
        until_ms: i64,
    ) -> Result<bool> {
        let (key, server_id, failure) = (key.to_string(), server_id.to_string(), failure.clone());
        self.write(statements!(|conn| {
            let updated = sqlx::query(
                "UPDATE webhook_state SET failing_id = $1, failing_since = $2, \
                 last_error = $3, next_attempt = $4, lease_until = $5 \
                 WHERE key = $6 AND holder = $7",
            )
            .bind(failure.event_id)
            .bind(failure.since)
            .bind(failure.last_error)
            .bind(failure.next_attempt)
            .bind(until_ms)
            .bind(key)
            .bind(server_id)
            .execute(conn)
            .await?;
            Ok(updated.rows_affected() > 0)
        }))
        .await
    }

    /// Hands webhook `key`'s lease back, if `server_id` holds it, so
    /// another server takes over at once.
    pub async fn webhook_release(&self, key: &str, server_id: &str) -> Result<()> {
        let (key, server_id) = (key.to_string(), server_id.to_string());
        self.write(statements!(|conn| {
            sqlx::query(
                "UPDATE webhook_state SET holder = NULL, lease_until = 0 \
                 WHERE key = $1 AND holder = $2",
            )
            .bind(key)
            .bind(server_id)
            .execute(conn)
            .await?;
            Ok(())
        }))
        .await
    }

    /// Webhook `key`'s delivery; the holder only while its lease runs
    /// past `now_ms`.
    pub async fn webhook_state(&self, key: &str, now_ms: i64) -> Result<Option<WebhookState>> {
        let Some(row) = sqlx::query(
            "SELECT url, delivered_id, given_up, holder, lease_until, failing_id, \
             failing_since, last_error, next_attempt FROM webhook_state WHERE key = $1",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let delivered_id: i64 = row.try_get("delivered_id")?;
        let pending: i64 =
            sqlx::query("SELECT COUNT(*) FROM events WHERE id > $1 AND kind LIKE $2")
                .bind(delivered_id)
                .bind(DEPLOYMENT_KINDS)
                .fetch_one(&self.pool)
                .await?
                .try_get(0)?;
        let lease_until: i64 = row.try_get("lease_until")?;
        let holder: Option<String> = row.try_get("holder")?;
        let failing_id: Option<i64> = row.try_get("failing_id")?;
        let failure = match failing_id {
            Some(event_id) => Some(WebhookFailure {
                event_id,
                since: row
                    .try_get::<Option<String>, _>("failing_since")?
                    .unwrap_or_default(),
                last_error: row
                    .try_get::<Option<String>, _>("last_error")?
                    .unwrap_or_default(),
                next_attempt: row
                    .try_get::<Option<String>, _>("next_attempt")?
                    .unwrap_or_default(),
            }),
            None => None,
        };
        Ok(Some(WebhookState {
            url: row.try_get("url")?,
            delivered_id,
            pending,
            given_up: row.try_get("given_up")?,
            holder: holder.filter(|_| lease_until >= now_ms),
            failure,
        }))
    }
}

fn event_row(row: &AnyRow) -> Result<StoredEvent> {
    Ok(StoredEvent {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        data: row.try_get("data")?,
        created_at: row.try_get("created_at")?,
        server_id: row.try_get("server_id")?,
    })
}
