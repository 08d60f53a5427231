//! The deployments' records: recording one (queued, or running at once),
//! where it stands, how it ended, reading them back, and failing those a
//! previous run of this server left running. Which server takes a queued
//! one is `queue`'s; nothing here knows of files or plugins.

use futures::future::BoxFuture;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::events::Report;
use super::{Claim, Db, Error, Result, now, status_is};
use crate::model::Receipt;
use crate::model::{Approval, Cause, Deployment, Outcome, Phase, Progress, Status};

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
    /// What it put into publishing targets.
    pub published: &'a [Receipt],
}

pub(super) const DEPLOYMENT_COLUMNS: &str = "id, model_id, deployer, options, status, phase, progress, dir, \
     out_dir, ref, details, error, duration_ms, created_at, completed_at, created_by, plugin_sha256, \
     server_id, started_at, published, cause_rule, cause_event, cause_previous, approval";

impl Db {
    /// Records a deployment as queued, for a server that has its deployer
    /// at `new.plugin_sha256` to claim (and to give it an out-dir). With
    /// `claim`, and no deployment queued before it, it is recorded running
    /// on that server at once. `report`'s events are stored in the same
    /// transaction.
    pub async fn insert_deployment(
        &self,
        new: NewDeployment<'_>,
        claim: Option<Claim>,
        report: Option<Report>,
    ) -> Result<Deployment> {
        let model_id = new.model_id;
        let [deployer, options, dir, plugin_sha256] =
            [new.deployer, new.options_json, new.dir, new.plugin_sha256].map(str::to_string);
        let created_by = new.created_by.map(str::to_string);
        self.write_deployment(
            report,
            statements!(|conn| {
                let now = now();
                let (status, server_id, lease_until, phase, started_at) = match &claim {
                    Some(c) => (
                        Status::Running,
                        c.server_id.as_str(),
                        Some(c.lease_until),
                        Some(c.phase.as_str()),
                        Some(now.as_str()),
                    ),
                    None => (Status::Queued, "", None, None, None),
                };
                // The claim holds only if nothing is queued before it; asked
                // in the same statement, a round trip fewer than asking first.
                let row = sqlx::query(&format!(
                    "INSERT INTO deployments (model_id, deployer, options, status, dir, \
                 out_dir, details, server_id, created_at, created_by, plugin_sha256, \
                 lease_until, phase, started_at) \
                 SELECT $1, $2, $3, CASE WHEN behind THEN $13 ELSE $4 END, $5, '', '{{}}', \
                 CASE WHEN behind THEN '' ELSE $6 END, $7, $8, $9, \
                 CASE WHEN behind THEN NULL ELSE $10 END, CASE WHEN behind THEN NULL ELSE $11 END, \
                 CASE WHEN behind THEN NULL ELSE $12 END \
                 FROM (SELECT (SELECT min(id) FROM deployments WHERE {queued}) IS NOT NULL AS behind) ahead \
                 RETURNING {DEPLOYMENT_COLUMNS}",
                    queued = status_is(Status::Queued)
                ))
                .bind(model_id)
                .bind(deployer)
                .bind(options)
                .bind(status.as_str())
                .bind(dir)
                .bind(server_id)
                .bind(&now)
                .bind(created_by)
                .bind(plugin_sha256)
                .bind(lease_until)
                .bind(phase)
                .bind(started_at)
                .bind(Status::Queued.as_str())
                .fetch_one(&mut *conn)
                .await?;
                let deployment = deployment_row(&row)?;
                let (Some(claim), Status::Running) = (claim, deployment.status) else {
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
            }),
        )
        .await
    }

    /// Ends a running deployment. A deployment that already ended (or whose
    /// model was deleted meanwhile) is left as it is: `NotRunning`, and
    /// `report`'s events are not stored; otherwise they are, in the same
    /// transaction.
    pub async fn finish_deployment(
        &self,
        id: i64,
        ending: &Ending<'_>,
        report: Option<Report>,
    ) -> Result<Deployment> {
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
        let published = receipts(ending.published)?;
        self.write_deployment(
            report,
            statements!(|conn| {
                let updated = sqlx::query(&format!(
                    "UPDATE deployments SET status = $1, ref = $2, details = $3, error = $4, \
                 duration_ms = $5, completed_at = $6, phase = NULL, logs = $7, progress = $8, \
                 published = $11 WHERE id = $9 AND status = $10 RETURNING {DEPLOYMENT_COLUMNS}"
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
                .bind(Status::Running.as_str())
                .bind(published)
                .fetch_all(conn)
                .await?;
                match updated.first() {
                    Some(row) => deployment_row(row),
                    None => Err(Error::NotRunning(id)),
                }
            }),
        )
        .await
    }

    /// Records where a running deployment stands; a no-op once it ended.
    /// The phase never goes back from `deploying`, so an update taken
    /// before the deployer started and written late cannot hide that it
    /// did from the next start's `fail_leftovers`.
    /// `published`, when given, is every put so far (it only grows, and
    /// is given only when it grew), so a deployment that ends without a
    /// recorded end (a killed server) still lists them.
    pub async fn update_progress(
        &self,
        id: i64,
        phase: Phase,
        progress: &Progress,
        published: Option<&[Receipt]>,
    ) -> Result<()> {
        let progress =
            serde_json::to_string(progress).map_err(|e| Error::Corrupt(e.to_string()))?;
        let published = published.map(receipts).transpose()?;
        self.write(statements!(|conn| {
            sqlx::query(
                "UPDATE deployments SET phase = CASE phase WHEN $1 THEN phase ELSE $2 END, \
                 progress = $3, published = COALESCE($6, published) WHERE id = $4 AND status = $5",
            )
            .bind(Phase::Deploying.as_str())
            .bind(phase.as_str())
            .bind(progress)
            .bind(id)
            .bind(Status::Running.as_str())
            .bind(published)
            .execute(conn)
            .await?;
            Ok(())
        }))
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

    /// The ids of `model_id`'s deployments that are queued or running,
    /// on any server: those that use, or will use, its local copy.
    pub async fn unfinished_of(&self, model_id: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT id FROM deployments WHERE model_id = $1 AND status IN ($2, $3) ORDER BY id",
        )
        .bind(model_id)
        .bind(Status::Queued.as_str())
        .bind(Status::Running.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok(row.try_get::<i64, _>(0)?))
            .collect()
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
        report: Option<Report>,
    ) -> Result<Vec<Deployment>> {
        let errors = [
            error(Some(Phase::Fetching)),
            error(Some(Phase::Deploying)),
            error(None),
        ];
        let server_id = server_id.to_string();
        self.write_rows(
            report,
            statements!(|conn| {
                let [fetching, deploying, unknown] = errors;
                let rows = sqlx::query(&format!(
                    "UPDATE deployments SET status = $1, \
                 error = CASE phase WHEN $2 THEN $3 WHEN $4 THEN $5 ELSE $6 END, \
                 completed_at = $7, phase = NULL \
                 WHERE server_id = $8 AND {running} RETURNING {DEPLOYMENT_COLUMNS}",
                    running = status_is(Status::Running)
                ))
                .bind(Status::Failed.as_str())
                .bind(Phase::Fetching.as_str())
                .bind(fetching)
                .bind(Phase::Deploying.as_str())
                .bind(deploying)
                .bind(unknown)
                .bind(now())
                .bind(server_id)
                .bind(Status::Running.as_str())
                .fetch_all(conn)
                .await?;
                rows.iter().map(deployment_row).collect()
            }),
            |rows: &Vec<Deployment>| rows.iter().collect(),
        )
        .await
    }
}

impl Db {
    /// Makes `work`, with `report`'s events in its transaction if any.
    async fn write_deployment<F>(&self, report: Option<Report>, work: F) -> Result<Deployment>
    where
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<Deployment>>
            + Send
            + 'static,
    {
        self.write_rows(report, work, |row| vec![row]).await
    }
}

pub(super) fn deployment_row(row: &AnyRow) -> Result<Deployment> {
    let status: String = row.try_get("status")?;
    let phase: Option<String> = row.try_get("phase")?;
    let progress: String = row.try_get("progress")?;
    let published: String = row.try_get("published")?;
    let cause_rule: Option<String> = row.try_get("cause_rule")?;
    let approval: Option<String> = row.try_get("approval")?;
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
        published: serde_json::from_str(&published)
            .map_err(|e| Error::Corrupt(format!("published = {published:?}: {e}")))?,
        cause: match cause_rule {
            Some(rule) => Some(Cause {
                rule,
                event_id: row.try_get("cause_event")?,
                previous: row.try_get("cause_previous")?,
            }),
            None => None,
        },
        approval: approval
            .map(|text| {
                serde_json::from_str::<Approval>(&text)
                    .map_err(|e| Error::Corrupt(format!("approval = {text:?}: {e}")))
            })
            .transpose()?,
    })
}

/// Receipts as stored: a JSON array.
fn receipts(published: &[Receipt]) -> Result<String> {
    serde_json::to_string(published).map_err(|e| Error::Corrupt(e.to_string()))
}
