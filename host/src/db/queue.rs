//! The deployment queue that servers sharing a database take work from:
//! claims, leases, cancels asked on any server, and the sweeps that end
//! what nobody will finish. Every statement keeps its `WHERE status = …`
//! guard, so two servers racing for one row cannot both move it.

use std::collections::HashSet;

use sqlx::Row;

use super::deployments::{DEPLOYMENT_COLUMNS, deployment_row};
use super::events::Report;
use super::{Db, Error, Result, now, status_is};
use crate::model::{Deployment, Phase, Status};

/// What a server can run: `deployer@sha256` of each loaded deployer. A
/// queued deployment is claimed only by a server holding its key, so a
/// server mid-rollout never runs another version than the one asked for.
pub struct Runnable(pub Vec<String>);

impl Runnable {
    pub fn key(deployer: &str, sha256: &str) -> String {
        format!("{deployer}@{sha256}")
    }
}

/// A server's heartbeat: it is alive, can run these, and keeps the leases
/// of the deployments it runs (`live`) until `lease_until` (Unix
/// milliseconds). A row it owns but does not run (claimed, then lost to
/// an error) is not renewed: its lease runs out and a sweep fails it.
pub struct Beat {
    pub server_id: String,
    pub name: String,
    pub runnable: Runnable,
    pub now_ms: i64,
    pub lease_until: i64,
    pub live: Vec<i64>,
}

/// A deployment taken by the server that records it, when it has room
/// and nobody waits: no queue round trip.
pub struct Claim {
    pub server_id: String,
    pub lease_until: i64,
    /// `deploying` for a model already fetched and verified.
    pub phase: Phase,
    pub out_dir: Box<dyn Fn(i64) -> String + Send>,
}

/// What asking to cancel a deployment did.
#[derive(Debug)]
pub enum CancelAsked {
    Unknown,
    /// It had ended already.
    Ended(Status),
    /// It was still queued: it is failed now, nothing ran.
    Dequeued(Box<Deployment>),
    /// It runs on `server`, which was asked to stop it.
    Running {
        server: String,
    },
}

impl Db {
    /// Takes the oldest (at most `limit`) queued deployments this server
    /// can run: they become `running` here, fetching, leased until
    /// `lease_until`, writing into `out_dir(id)` on this server's disk.
    pub async fn claim(
        &self,
        server_id: &str,
        runnable: &Runnable,
        lease_until: i64,
        out_dir: impl Fn(i64) -> String + Send + 'static,
        limit: usize,
        report: Option<Report>,
    ) -> Result<Vec<Deployment>> {
        if runnable.0.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let keys = runnable.0.clone();
        let server_id = server_id.to_string();
        let skip_locked = self.backend.skip_locked();
        self.write_rows(
            report,
            statements!(|conn| {
                let placeholders = placeholders(2, keys.len());
                let sql = format!(
                    "SELECT id FROM deployments WHERE {queued} \
                 AND deployer || '@' || plugin_sha256 IN ({placeholders}) \
                 ORDER BY id LIMIT $1{skip_locked}",
                    queued = status_is(Status::Queued)
                );
                let mut query = sqlx::query(&sql).bind(limit);
                for key in keys {
                    query = query.bind(key);
                }
                let ids = query.fetch_all(&mut *conn).await?;
                let mut claimed = Vec::with_capacity(ids.len());
                let started_at = now();
                for row in &ids {
                    let id: i64 = row.try_get(0)?;
                    let row = sqlx::query(&format!(
                        "UPDATE deployments SET status = $1, server_id = $2, lease_until = $3, \
                     phase = $4, started_at = $5, out_dir = $6 WHERE id = $7 AND status = $8 \
                     RETURNING {DEPLOYMENT_COLUMNS}"
                    ))
                    .bind(Status::Running.as_str())
                    .bind(&server_id)
                    .bind(lease_until)
                    .bind(Phase::Fetching.as_str())
                    .bind(&started_at)
                    .bind(out_dir(id))
                    .bind(id)
                    .bind(Status::Queued.as_str())
                    .fetch_one(&mut *conn)
                    .await?;
                    claimed.push(deployment_row(&row)?);
                }
                Ok(claimed)
            }),
            |rows: &Vec<Deployment>| rows.iter().collect(),
        )
        .await
    }

    /// Records that these running deployments skip their fetch: their
    /// models were verified when they were claimed.
    pub async fn mark_deploying(&self, ids: Vec<i64>) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.write(statements!(|conn| {
            let placeholders = placeholders(3, ids.len());
            let sql = format!(
                "UPDATE deployments SET phase = $1 \
                 WHERE status = $2 AND id IN ({placeholders})"
            );
            let mut query = sqlx::query(&sql)
                .bind(Phase::Deploying.as_str())
                .bind(Status::Running.as_str());
            for id in ids {
                query = query.bind(id);
            }
            query.execute(conn).await?;
            Ok(())
        }))
        .await
    }

    /// Records that the server is alive and what it can run, and renews
    /// the leases of the deployments it runs. Returns those it still owns,
    /// each with the cancel asked for it, if any.
    pub async fn beat(&self, beat: Beat) -> Result<Vec<(i64, Option<String>)>> {
        let deployers =
            serde_json::to_string(&beat.runnable.0).map_err(|e| Error::Corrupt(e.to_string()))?;
        self.write(statements!(|conn| {
            sqlx::query(
                "INSERT INTO servers (id, name, seen_ms, deployers) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id) DO UPDATE SET name = excluded.name, \
                 seen_ms = excluded.seen_ms, deployers = excluded.deployers",
            )
            .bind(&beat.server_id)
            .bind(&beat.name)
            .bind(beat.now_ms)
            .bind(deployers)
            .execute(&mut *conn)
            .await?;
            if beat.live.is_empty() {
                return Ok(Vec::new());
            }
            let placeholders = placeholders(4, beat.live.len());
            let sql = format!(
                "UPDATE deployments SET lease_until = $1 WHERE server_id = $2 \
                 AND status = $3 AND id IN ({placeholders}) RETURNING id, cancel"
            );
            let mut query = sqlx::query(&sql)
                .bind(beat.lease_until)
                .bind(&beat.server_id)
                .bind(Status::Running.as_str());
            for id in &beat.live {
                query = query.bind(*id);
            }
            let rows = query.fetch_all(&mut *conn).await?;
            rows.iter()
                .map(|row| Ok((row.try_get("id")?, row.try_get("cancel")?)))
                .collect()
        }))
        .await
    }

    /// Says the server left: it stops counting as one that can run what
    /// is queued.
    pub async fn leave(&self, server_id: &str) -> Result<()> {
        let server_id = server_id.to_string();
        self.write(statements!(|conn| {
            sqlx::query("DELETE FROM servers WHERE id = $1")
                .bind(server_id)
                .execute(conn)
                .await?;
            Ok(())
        }))
        .await
    }

    /// Fails the running deployments whose owner stopped renewing their
    /// lease before `now_ms`, each with `error(owner, phase)`; `owner`
    /// is the server's name and id.
    pub async fn fail_expired(
        &self,
        now_ms: i64,
        error: impl Fn(&str, Option<Phase>) -> String + Send + 'static,
        report: Option<Report>,
    ) -> Result<Vec<Deployment>> {
        let skip_locked = self.backend.skip_locked();
        self.write_rows(
            report,
            statements!(|conn| {
                // The owner's name in a subquery, not a join: PostgreSQL
                // locks no row of the nullable side of an outer join.
                let expired = sqlx::query(&format!(
                    "SELECT d.id, d.phase, d.server_id, \
                 (SELECT s.name FROM servers s WHERE s.id = d.server_id) AS name \
                 FROM deployments d WHERE d.{running} AND d.lease_until < $1{skip_locked}",
                    running = status_is(Status::Running)
                ))
                .bind(now_ms)
                .fetch_all(&mut *conn)
                .await?;
                let mut failed = Vec::new();
                for row in &expired {
                    let id: i64 = row.try_get("id")?;
                    let phase: Option<String> = row.try_get("phase")?;
                    let server: String = row.try_get("server_id")?;
                    let owner = match row.try_get::<Option<String>, _>("name")? {
                        Some(name) => format!("{name} ({server})"),
                        None => server,
                    };
                    let message = error(&owner, phase.as_deref().and_then(Phase::parse));
                    failed.extend(end_with(conn, id, Status::Running, &message).await?);
                }
                Ok(failed)
            }),
            |rows: &Vec<Deployment>| rows.iter().collect(),
        )
        .await
    }

    /// Fails the deployments queued before `queued_before` (RFC 3339)
    /// that no server seen since `alive_since_ms` can run, each with
    /// `error(deployer, sha256)`.
    pub async fn fail_unrunnable(
        &self,
        queued_before: String,
        alive_since_ms: i64,
        error: impl Fn(&str, &str) -> String + Send + 'static,
        report: Option<Report>,
    ) -> Result<Vec<Deployment>> {
        let skip_locked = self.backend.skip_locked();
        self.write_rows(
            report,
            statements!(|conn| {
                let servers = sqlx::query("SELECT deployers FROM servers WHERE seen_ms >= $1")
                    .bind(alive_since_ms)
                    .fetch_all(&mut *conn)
                    .await?;
                let mut runnable = HashSet::new();
                for row in &servers {
                    let keys: String = row.try_get("deployers")?;
                    let keys: Vec<String> = serde_json::from_str(&keys)
                        .map_err(|e| Error::Corrupt(format!("servers.deployers: {e}")))?;
                    runnable.extend(keys);
                }
                let waiting = sqlx::query(&format!(
                    "SELECT id, deployer, plugin_sha256 FROM deployments \
                 WHERE {queued} AND created_at < $1 ORDER BY id{skip_locked}",
                    queued = status_is(Status::Queued)
                ))
                .bind(queued_before)
                .fetch_all(&mut *conn)
                .await?;
                let mut failed = Vec::new();
                for row in &waiting {
                    let id: i64 = row.try_get("id")?;
                    let deployer: String = row.try_get("deployer")?;
                    let sha256: String = row
                        .try_get::<Option<String>, _>("plugin_sha256")?
                        .unwrap_or_default();
                    if runnable.contains(&Runnable::key(&deployer, &sha256)) {
                        continue;
                    }
                    let message = error(&deployer, &sha256);
                    failed.extend(end_with(conn, id, Status::Queued, &message).await?);
                }
                Ok(failed)
            }),
            |rows: &Vec<Deployment>| rows.iter().collect(),
        )
        .await
    }

    /// Asks for a deployment to stop, whichever server runs it: a queued
    /// one (or one awaiting approval) is failed with `dequeued` at once; a
    /// running one gets `reason` recorded (the first asked wins) for its
    /// owner to act on.
    pub async fn request_cancel(
        &self,
        id: i64,
        reason: &str,
        dequeued: &str,
        report: Option<Report>,
    ) -> Result<CancelAsked> {
        let (reason, dequeued) = (reason.to_string(), dequeued.to_string());
        self.write_rows(
            report,
            statements!(|conn| {
                for waiting in [Status::Queued, Status::AwaitingApproval] {
                    if let Some(row) = end_with(conn, id, waiting, &dequeued).await? {
                        return Ok(CancelAsked::Dequeued(Box::new(row)));
                    }
                }
                let running = sqlx::query(
                    "UPDATE deployments SET cancel = COALESCE(cancel, $1) \
                 WHERE id = $2 AND status = $3 RETURNING server_id",
                )
                .bind(reason)
                .bind(id)
                .bind(Status::Running.as_str())
                .fetch_optional(&mut *conn)
                .await?;
                if let Some(row) = running {
                    return Ok(CancelAsked::Running {
                        server: row.try_get("server_id")?,
                    });
                }
                let row = sqlx::query("SELECT status FROM deployments WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *conn)
                    .await?;
                let Some(row) = row else {
                    return Ok(CancelAsked::Unknown);
                };
                let status: String = row.try_get("status")?;
                Status::parse(&status)
                    .map(CancelAsked::Ended)
                    .ok_or_else(|| Error::Corrupt(format!("status = {status:?}")))
            }),
            |asked: &CancelAsked| match asked {
                CancelAsked::Dequeued(row) => vec![&**row],
                _ => Vec::new(),
            },
        )
        .await
    }

    /// How many deployments wait in the queue, for any server.
    pub async fn queued_count(&self) -> Result<u64> {
        let sql = format!(
            "SELECT COUNT(*) FROM deployments WHERE {}",
            status_is(Status::Queued)
        );
        let row = sqlx::query(&sql).fetch_one(&self.pool).await?;
        let count: i64 = row.try_get(0)?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    /// The `deployer@sha256` keys of the queued deployments.
    pub async fn queued_keys(&self) -> Result<std::collections::HashSet<String>> {
        let sql = format!(
            "SELECT DISTINCT deployer, plugin_sha256 FROM deployments WHERE {}",
            status_is(Status::Queued)
        );
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let sha256: Option<String> = row.try_get("plugin_sha256")?;
                let deployer: String = row.try_get("deployer")?;
                Ok(Runnable::key(
                    &deployer,
                    sha256.as_deref().unwrap_or_default(),
                ))
            })
            .collect()
    }

    /// The cancel asked for a deployment, if any.
    pub async fn cancel_reason(&self, id: i64) -> Result<Option<String>> {
        let row = sqlx::query("SELECT cancel FROM deployments WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get("cancel")).transpose()?.flatten())
    }
}

/// `$first, $first+1, …`: `count` numbered parameters, for an `IN` list.
fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fails deployment `id` with `error` if it is still `status`.
async fn end_with(
    conn: &mut sqlx::AnyConnection,
    id: i64,
    status: Status,
    error: &str,
) -> Result<Option<Deployment>> {
    let row = sqlx::query(&format!(
        "UPDATE deployments SET status = $1, error = $2, completed_at = $3, phase = NULL \
         WHERE id = $4 AND status = $5 RETURNING {DEPLOYMENT_COLUMNS}"
    ))
    .bind(Status::Failed.as_str())
    .bind(error)
    .bind(now())
    .bind(id)
    .bind(status.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(deployment_row).transpose()
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
