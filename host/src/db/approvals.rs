//! Decisions on deployments awaiting an admin's approval: approving one
//! queues it, rejecting or expiring one fails it. Each statement keeps its
//! `WHERE status = 'awaiting_approval'`, so a decision is made once, by
//! whichever server or admin comes first.

use sqlx::Row;

use super::deployments::{DEPLOYMENT_COLUMNS, deployment_row};
use super::events::Report;
use super::{Db, Error, Result, now, status_is};
use crate::model::{Approval, Decision, Deployment, Status};

impl Db {
    /// Records `approval` on deployment `id` if it still awaits one:
    /// approved, it is queued; rejected, it fails with `rejected`. The
    /// events `report` words are stored in the same transaction. A
    /// deployment that does not await approval is `NotAwaiting`.
    pub async fn decide(
        &self,
        id: i64,
        approval: &Approval,
        rejected: &str,
        report: Report,
    ) -> Result<Deployment> {
        let text = serde_json::to_string(approval).map_err(|e| Error::Corrupt(e.to_string()))?;
        let (status, error, completed_at) = match approval.decision {
            Decision::Approved => (Status::Queued, None, None),
            Decision::Rejected => (Status::Failed, Some(rejected.to_string()), Some(now())),
        };
        self.write_reported(
            statements!(|conn| {
                let row = sqlx::query(&format!(
                    "UPDATE deployments SET status = $1, approval = $2, error = $3, \
                     completed_at = $4 WHERE id = $5 AND status = $6 \
                     RETURNING {DEPLOYMENT_COLUMNS}"
                ))
                .bind(status.as_str())
                .bind(text)
                .bind(error)
                .bind(completed_at)
                .bind(id)
                .bind(Status::AwaitingApproval.as_str())
                .fetch_optional(conn)
                .await?;
                match row {
                    Some(row) => deployment_row(&row),
                    None => Err(Error::NotAwaiting(id)),
                }
            }),
            report,
        )
        .await
    }

    /// The status of deployment `id`, if it exists.
    pub async fn deployment_status(&self, id: i64) -> Result<Option<Status>> {
        let row = sqlx::query("SELECT status FROM deployments WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let status: String = row.try_get("status")?;
        Status::parse(&status)
            .map(Some)
            .ok_or_else(|| Error::Corrupt(format!("status = {status:?}")))
    }

    /// Fails the deployments that awaited approval since before
    /// `recorded_before` (RFC 3339) with `error`; returns their rows, and
    /// stores `report`'s events of each in the same transaction.
    pub async fn expire_approvals(
        &self,
        recorded_before: String,
        error: String,
        report: Option<Report>,
    ) -> Result<Vec<Deployment>> {
        self.write_rows(
            report,
            statements!(|conn| {
                let rows = sqlx::query(&format!(
                    "UPDATE deployments SET status = $1, error = $2, completed_at = $3 \
                 WHERE {awaiting} AND created_at < $4 RETURNING {DEPLOYMENT_COLUMNS}",
                    awaiting = status_is(Status::AwaitingApproval)
                ))
                .bind(Status::Failed.as_str())
                .bind(error)
                .bind(now())
                .bind(recorded_before)
                .fetch_all(conn)
                .await?;
                rows.iter().map(deployment_row).collect()
            }),
            |rows: &Vec<Deployment>| rows.iter().collect(),
        )
        .await
    }

    /// The deployments awaiting approval, oldest first.
    pub async fn awaiting_approval(&self, limit: u32) -> Result<Vec<Deployment>> {
        let rows = sqlx::query(&format!(
            "SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE {} ORDER BY id LIMIT $1",
            status_is(Status::AwaitingApproval)
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(deployment_row).collect()
    }
}
