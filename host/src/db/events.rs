//! The event log and the webhook's delivery state: appending events in id
//! order, reading them after a cursor, pruning the oldest, and the row
//! through which one server at a time delivers to a webhook. Knows nothing
//! of what an event means: a kind, JSON text, a time, a server.

use futures::future::BoxFuture;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::notify::Topic;
use super::{Backend, Db, Result, postgres};
use crate::model::{Deployment, TrainedModel};

/// Deployment events, the ones a webhook carries.
const DEPLOYMENT_KINDS: &str = "deployment.%";

/// An event to append.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub kind: String,
    /// JSON text.
    pub data: String,
    /// RFC 3339 UTC with milliseconds, when it was published.
    pub created_at: String,
}

/// The events a write of a deployment stores in its own transaction,
/// worded from the row it wrote (so the change and its report are one
/// commit), and the server they are recorded as.
pub struct Report {
    pub server_id: String,
    pub events: Wording,
    /// Told the written row's id at the same commit, on every server.
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

/// Words the events of a deployment's row.
pub type Wording = Box<dyn FnOnce(&Deployment) -> Vec<NewEvent> + Send>;

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
                insert(conn, backend, &server_id, events, None).await
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
        let backend = self.backend;
        let woken = report.wake;
        if backend.is_postgres() {
            return postgres::ending_with(
                &self.pool,
                statements!(|conn| {
                    let row = work(&mut *conn).await?;
                    let events = (report.events)(&row);
                    let wake = woken.map(|topic| (topic, row.id));
                    let end = appended_and_committed(&report.server_id, events, wake);
                    Ok((row, end))
                }),
            )
            .await;
        }
        let (row, last) = self
            .write(statements!(|conn| {
                let row = work(&mut *conn).await?;
                let events = (report.events)(&row);
                let wake = woken.map(|topic| (topic, row.id));
                let last = insert(conn, backend, &report.server_id, events, wake).await?;
                Ok((row, last))
            }))
            .await?;
        self.appended(last);
        if let Some(topic) = woken {
            self.wakeups.deliver(topic, row.id.to_string());
        }
        Ok(row)
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

/// Appends `events` on `conn`, in the transaction it is in, and returns the
/// last id (0: none). On PostgreSQL one statement (`appending`) takes the
/// append lock, held until that transaction ends (so ids commit in id
/// order: callers make this the transaction's last statement, to hold it
/// briefly), inserts the events in order and queues the `NOTIFY` of the
/// last id, and of `wake` if given, which PostgreSQL sends at the commit.
/// On SQLite the caller wakes after the commit (`Db::appended`).
pub(super) async fn insert(
    conn: &mut AnyConnection,
    backend: Backend,
    server_id: &str,
    events: Vec<NewEvent>,
    wake: Option<(Topic, i64)>,
) -> Result<i64> {
    if events.is_empty() {
        if let (Some((topic, id)), true) = (wake, backend.is_postgres()) {
            postgres::notify(&mut *conn, topic, &id.to_string()).await?;
        }
        return Ok(0);
    }
    let postgres = backend.is_postgres();
    // $1: the server; then kind, data and time of each event.
    let mut values = Vec::new();
    for i in 0..events.len() {
        let n = 2 + 3 * i;
        values.push([
            format!("${n}"),
            format!("${}", n + 1),
            format!("${}", n + 2),
        ]);
    }
    let next = 2 + 3 * events.len();
    let sql = match postgres {
        true => appending(
            "$1",
            &values,
            &format!("${next}"),
            &format!("${}", next + 1),
            wake.map(|_| [format!("${}", next + 2), format!("${}", next + 3)]),
        ),
        false => {
            let rows: Vec<String> = values
                .iter()
                .map(|[kind, data, at]| format!("({kind}, {data}, $1, {at})"))
                .collect();
            format!(
                "INSERT INTO events (kind, data, server_id, created_at) VALUES {} RETURNING id",
                rows.join(", ")
            )
        }
    };
    let mut query = sqlx::query(&sql).bind(server_id.to_string());
    for event in events {
        query = query
            .bind(event.kind)
            .bind(event.data)
            .bind(event.created_at);
    }
    if postgres {
        query = query
            .bind(postgres::APPEND_LOCK)
            .bind(Topic::Events.channel());
        if let Some((topic, id)) = wake {
            query = query.bind(topic.channel()).bind(id.to_string());
        }
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut last = 0;
    for row in &rows {
        last = last.max(row.try_get::<i64, _>(0)?);
    }
    Ok(last)
}

/// The PostgreSQL statement that appends events (each `[kind, data,
/// created_at]`, SQL expressions, as `server`, `lock` and `channel` are)
/// and notifies `channel` of the last id, and `wake` (`[channel,
/// payload]`) if given. The lock is a row the inserted rows are joined
/// with, so it is taken before any id is drawn; `woken` is read, so it
/// runs.
fn appending(
    server: &str,
    events: &[[String; 3]],
    lock: &str,
    channel: &str,
    wake: Option<[String; 2]>,
) -> String {
    let values: Vec<String> = events
        .iter()
        .enumerate()
        .map(|(i, [kind, data, at])| format!("({i}, {kind}, {data}, {at})"))
        .collect();
    format!(
        "WITH held AS (SELECT pg_advisory_xact_lock({lock})), \
         added AS (INSERT INTO events (kind, data, server_id, created_at) \
         SELECT v.kind, v.data, {server}, v.created_at FROM held, \
         (VALUES {}) AS v(n, kind, data, created_at) ORDER BY v.n RETURNING id), \
         last AS (SELECT max(id) AS id FROM added), \
         woken AS (SELECT pg_notify({channel}, (SELECT id FROM last)::text){}) \
         SELECT (SELECT id FROM last) AS last FROM woken",
        values.join(", "),
        match wake {
            Some([topic, payload]) => format!(", pg_notify({topic}, {payload})"),
            None => String::new(),
        }
    )
}

/// What ends a reported write on PostgreSQL, as one simple query with its
/// values written out: the append (or only the wake-up) and the `COMMIT`.
/// One round trip, and the append lock is held for PostgreSQL's commit
/// alone, not also for a round trip to this server and back: at 16
/// deployments in flight, 9 of 16 connections were waiting for that lock.
pub(super) fn appended_and_committed(
    server_id: &str,
    events: Vec<NewEvent>,
    wake: Option<(Topic, i64)>,
) -> String {
    let wake = wake.map(|(topic, id)| [literal(topic.channel()), literal(&id.to_string())]);
    let append = match (events.is_empty(), wake) {
        (true, None) => return "COMMIT".into(),
        (true, Some([topic, payload])) => format!("SELECT pg_notify({topic}, {payload})"),
        (false, wake) => {
            let values: Vec<[String; 3]> = events
                .iter()
                .map(|e| [literal(&e.kind), literal(&e.data), literal(&e.created_at)])
                .collect();
            appending(
                &literal(server_id),
                &values,
                &postgres::APPEND_LOCK.to_string(),
                &literal(Topic::Events.channel()),
                wake,
            )
        }
    };
    format!("{append}; COMMIT")
}

/// `text` as a PostgreSQL string constant: dollar-quoted, with a tag the
/// text does not contain, so nothing in it is read as SQL whatever the
/// server's escaping settings.
fn literal(text: &str) -> String {
    let tag = (0..)
        .map(|n| format!("$b{n}$"))
        .find(|tag| !text.contains(tag.as_str()))
        .expect("some tag is absent from any text");
    format!("{tag}{text}{tag}")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_is_quoted_with_a_tag_its_text_does_not_hold() {
        assert_eq!(literal("plain"), "$b0$plain$b0$");
        assert_eq!(literal(""), "$b0$$b0$");
        // Quotes and backslashes mean nothing inside dollar quotes.
        assert_eq!(literal(r"it's \' a"), r"$b0$it's \' a$b0$");
        let hostile = "x$b0$; DROP TABLE events; $b1$";
        assert_eq!(literal(hostile), format!("$b2${hostile}$b2$"));
    }

    #[test]
    fn a_reported_write_ends_with_its_append_and_the_commit_in_one_query() {
        assert_eq!(appended_and_committed("s", Vec::new(), None), "COMMIT");
        assert_eq!(
            appended_and_committed("s", Vec::new(), Some((Topic::Ended, 7))),
            "SELECT pg_notify($b0$berth_ended$b0$, $b0$7$b0$); COMMIT"
        );
        let event = NewEvent {
            kind: "deployment.failed".into(),
            data: r#"{"error":"it's $b0$"}"#.into(),
            created_at: "2026-12-04T06:00:00.000Z".into(),
        };
        let sql = appended_and_committed("server-1", vec![event], None);
        assert!(
            sql.starts_with("WITH held AS (SELECT pg_advisory_xact_lock("),
            "{sql}"
        );
        assert!(sql.ends_with("; COMMIT"), "{sql}");
        assert!(sql.contains(r#"$b1${"error":"it's $b0$"}$b1$"#), "{sql}");
        assert!(sql.contains("$b0$server-1$b0$"), "{sql}");
    }
}
