//! How events are appended to the log: the statement that takes the
//! append lock (PostgreSQL) and inserts them in order with their `NOTIFY`,
//! inside the transaction of the change they report. `events` owns the
//! log's reading, pruning and webhook state.

use sqlx::{AnyConnection, Row};

use super::notify::Topic;
use super::{Backend, Result, postgres};

/// An event to append.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub kind: String,
    /// JSON text.
    pub data: String,
    /// RFC 3339 UTC with milliseconds, when it was published.
    pub created_at: String,
}

/// Appends `events` on `conn`, in the transaction it is in, and returns the
/// last id (0: none). On PostgreSQL one statement (`appending`) takes the
/// append lock, held until that transaction ends (so ids commit in id
/// order: callers make this the transaction's last statement, to hold it
/// briefly), inserts the events in order and queues the `NOTIFY` of the
/// last id, which PostgreSQL sends at the commit. On SQLite the caller
/// wakes after the commit (`Db::appended`). A reported write on
/// PostgreSQL ends with `appended_and_committed` instead.
pub(super) async fn insert(
    conn: &mut AnyConnection,
    backend: Backend,
    server_id: &str,
    events: Vec<NewEvent>,
) -> Result<i64> {
    if events.is_empty() {
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
            &[],
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
    wakes: &[[String; 2]],
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
        wakes
            .iter()
            .map(|[topic, payload]| format!(", pg_notify({topic}, {payload})"))
            .collect::<String>()
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
    wakes: &[(Topic, i64)],
) -> String {
    let wakes: Vec<[String; 2]> = wakes
        .iter()
        .map(|(topic, id)| [literal(topic.channel()), literal(&id.to_string())])
        .collect();
    let append = match (events.is_empty(), wakes.is_empty()) {
        (true, true) => return "COMMIT".into(),
        (true, false) => {
            let each: Vec<String> = wakes
                .iter()
                .map(|[topic, payload]| format!("pg_notify({topic}, {payload})"))
                .collect();
            format!("SELECT {}", each.join(", "))
        }
        (false, _) => {
            let values: Vec<[String; 3]> = events
                .iter()
                .map(|e| [literal(&e.kind), literal(&e.data), literal(&e.created_at)])
                .collect();
            appending(
                &literal(server_id),
                &values,
                &postgres::APPEND_LOCK.to_string(),
                &literal(Topic::Events.channel()),
                &wakes,
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
        assert_eq!(appended_and_committed("s", Vec::new(), &[]), "COMMIT");
        assert_eq!(
            appended_and_committed("s", Vec::new(), &[(Topic::Ended, 7)]),
            "SELECT pg_notify($b0$berth_ended$b0$, $b0$7$b0$); COMMIT"
        );
        assert_eq!(
            appended_and_committed("s", Vec::new(), &[(Topic::Ended, 7), (Topic::Ended, 8)]),
            "SELECT pg_notify($b0$berth_ended$b0$, $b0$7$b0$), \
             pg_notify($b0$berth_ended$b0$, $b0$8$b0$); COMMIT"
        );
        let event = NewEvent {
            kind: "deployment.failed".into(),
            data: r#"{"error":"it's $b0$"}"#.into(),
            created_at: "2026-12-04T06:00:00.000Z".into(),
        };
        let sql = appended_and_committed("server-1", vec![event], &[]);
        assert!(
            sql.starts_with("WITH held AS (SELECT pg_advisory_xact_lock("),
            "{sql}"
        );
        assert!(sql.ends_with("; COMMIT"), "{sql}");
        assert!(sql.contains(r#"$b1${"error":"it's $b0$"}$b1$"#), "{sql}");
        assert!(sql.contains("$b0$server-1$b0$"), "{sql}");
    }
}
