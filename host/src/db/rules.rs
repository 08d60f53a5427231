//! Deploy rules stored over the API, their firings and the firing cursor.
//! A firing is a row of `rule_firings`, unique by (rule, event), written in
//! the transaction that records its deployment (or why it made none): an
//! event fires a rule once, whichever servers try and however often. The
//! rule's body is text the caller wrote (JSON); nothing here reads it.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::append::{self, NewEvent};
use super::deployments::{DEPLOYMENT_COLUMNS, deployment_row};
use super::events::Wording;
use super::{Db, Error, Result, now};
use crate::model::{Cause, Deployment, Status};

/// A rule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRule {
    pub name: String,
    /// The rule as JSON text.
    pub body: String,
    pub created_by: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// One firing, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct FiringRow {
    pub rule: String,
    pub event_id: i64,
    pub model_id: i64,
    pub deployment_id: Option<i64>,
    pub error: Option<String>,
    pub created_at: String,
}

/// A deployment a rule asks for.
pub struct CausedDeployment {
    pub model_id: i64,
    pub deployer: String,
    pub options_json: String,
    pub dir: String,
    pub plugin_sha256: String,
    pub cause: Cause,
    /// Recorded `awaiting_approval` rather than `queued`.
    pub held: bool,
}

impl Db {
    /// Stores a new rule; false if one of that name is stored already.
    pub async fn insert_rule(&self, rule: StoredRule) -> Result<bool> {
        self.write(statements!(|conn| {
            let inserted = sqlx::query(
                "INSERT INTO rules (name, body, created_by, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
            )
            .bind(rule.name)
            .bind(rule.body)
            .bind(rule.created_by)
            .bind(rule.created_at)
            .bind(rule.updated_at)
            .execute(conn)
            .await?;
            Ok(inserted.rows_affected() == 1)
        }))
        .await
    }

    /// Replaces a stored rule's body; false if there is none of that name.
    pub async fn update_rule(&self, name: &str, body: &str) -> Result<bool> {
        let (name, body) = (name.to_string(), body.to_string());
        self.write(statements!(|conn| {
            let updated =
                sqlx::query("UPDATE rules SET body = $1, updated_at = $2 WHERE name = $3")
                    .bind(body)
                    .bind(now())
                    .bind(name)
                    .execute(conn)
                    .await?;
            Ok(updated.rows_affected() == 1)
        }))
        .await
    }

    /// Deletes a stored rule (its firings stay, as the deployments' causes
    /// do); false if there was none.
    pub async fn delete_rule(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.write(statements!(|conn| {
            let deleted = sqlx::query("DELETE FROM rules WHERE name = $1")
                .bind(name)
                .execute(conn)
                .await?;
            Ok(deleted.rows_affected() == 1)
        }))
        .await
    }

    /// Every stored rule, by name.
    pub async fn rules(&self) -> Result<Vec<StoredRule>> {
        let rows = sqlx::query(
            "SELECT name, body, created_by, created_at, updated_at FROM rules ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(rule_row).collect()
    }

    /// The last `limit` firings of `rule`, newest first.
    pub async fn firings_of(&self, rule: &str, limit: u32) -> Result<Vec<FiringRow>> {
        let rows = sqlx::query(
            "SELECT rule, event_id, model_id, deployment_id, error, created_at FROM rule_firings \
             WHERE rule = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(rule)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(firing_row).collect()
    }

    /// Records that `rule` fired for event `event_id` and the deployment
    /// it asked for, with `words`' events, in one transaction: `None` (and
    /// nothing written) when that firing is recorded already.
    pub async fn fire(
        &self,
        server_id: &str,
        event_id: i64,
        new: CausedDeployment,
        words: Wording,
    ) -> Result<Option<Deployment>> {
        let backend = self.backend;
        let server_id = server_id.to_string();
        let fired = self
            .write(statements!(|conn| {
                let Some(firing) = claim_firing(
                    &mut *conn,
                    &new.cause.rule,
                    event_id,
                    new.model_id,
                    None,
                    &server_id,
                )
                .await?
                else {
                    return Ok(None);
                };
                let status = match new.held {
                    true => Status::AwaitingApproval,
                    false => Status::Queued,
                };
                let row = sqlx::query(&format!(
                    "INSERT INTO deployments (model_id, deployer, options, status, dir, out_dir, \
                     details, server_id, created_at, created_by, plugin_sha256, cause_rule, \
                     cause_event, cause_previous) \
                     VALUES ($1, $2, $3, $4, $5, '', '{{}}', '', $6, $7, $8, $9, $10, $11) \
                     RETURNING {DEPLOYMENT_COLUMNS}"
                ))
                .bind(new.model_id)
                .bind(new.deployer)
                .bind(new.options_json)
                .bind(status.as_str())
                .bind(new.dir)
                .bind(now())
                .bind(format!("rule:{}", new.cause.rule))
                .bind(new.plugin_sha256)
                .bind(new.cause.rule.clone())
                .bind(new.cause.event_id)
                .bind(new.cause.previous)
                .fetch_one(&mut *conn)
                .await?;
                let deployment = deployment_row(&row)?;
                sqlx::query("UPDATE rule_firings SET deployment_id = $1 WHERE id = $2")
                    .bind(deployment.id)
                    .bind(firing)
                    .execute(&mut *conn)
                    .await?;
                let last = append::insert(conn, backend, &server_id, words(&deployment)).await?;
                Ok(Some((deployment, last)))
            }))
            .await?;
        Ok(fired.map(|(deployment, last)| {
            self.appended(last);
            deployment
        }))
    }

    /// Records that `rule` matched event `event_id` but made no deployment,
    /// for `error`, with `events`, in one transaction; false (and nothing
    /// written) when that firing is recorded already.
    pub async fn fire_failed(
        &self,
        server_id: &str,
        rule: &str,
        event_id: i64,
        model_id: i64,
        error: &str,
        events: Vec<NewEvent>,
    ) -> Result<bool> {
        let backend = self.backend;
        let (server_id, rule, error) = (server_id.to_string(), rule.to_string(), error.to_string());
        let last = self
            .write(statements!(|conn| {
                let firing = claim_firing(
                    &mut *conn,
                    &rule,
                    event_id,
                    model_id,
                    Some(&error),
                    &server_id,
                )
                .await?;
                match firing {
                    Some(_) => Ok(Some(
                        append::insert(conn, backend, &server_id, events).await?,
                    )),
                    None => Ok(None),
                }
            }))
            .await?;
        if let Some(last) = last {
            self.appended(last);
        }
        Ok(last.is_some())
    }

    /// Whether `rule` fired for event `event_id` already.
    pub async fn fired(&self, rule: &str, event_id: i64) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM rule_firings WHERE rule = $1 AND event_id = $2")
            .bind(rule)
            .bind(event_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Every event up to this id was looked at by the rules of some server.
    pub async fn rule_cursor(&self) -> Result<i64> {
        let row = sqlx::query("SELECT handled_id FROM rule_cursor")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Moves the cursor up to `handled` (never back).
    pub async fn advance_rule_cursor(&self, handled: i64) -> Result<()> {
        self.write(statements!(|conn| {
            sqlx::query("UPDATE rule_cursor SET handled_id = $1 WHERE handled_id < $1")
                .bind(handled)
                .execute(conn)
                .await?;
            Ok(())
        }))
        .await
    }
}

/// Inserts the firing of `rule` for `event_id`, unless it is there
/// already: its id, or `None`. On PostgreSQL a second server inserting the
/// same pair waits for the first one's transaction, then finds it.
async fn claim_firing(
    conn: &mut AnyConnection,
    rule: &str,
    event_id: i64,
    model_id: i64,
    error: Option<&str>,
    server_id: &str,
) -> Result<Option<i64>> {
    let row = sqlx::query(
        "INSERT INTO rule_firings (rule, event_id, model_id, error, server_id, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (rule, event_id) DO NOTHING RETURNING id",
    )
    .bind(rule)
    .bind(event_id)
    .bind(model_id)
    .bind(error)
    .bind(server_id)
    .bind(now())
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| row.try_get::<i64, _>(0).map_err(Error::from))
        .transpose()
}

fn rule_row(row: &AnyRow) -> Result<StoredRule> {
    Ok(StoredRule {
        name: row.try_get("name")?,
        body: row.try_get("body")?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn firing_row(row: &AnyRow) -> Result<FiringRow> {
    Ok(FiringRow {
        rule: row.try_get("rule")?,
        event_id: row.try_get("event_id")?,
        model_id: row.try_get("model_id")?,
        deployment_id: row.try_get("deployment_id")?,
        error: row.try_get("error")?,
        created_at: row.try_get("created_at")?,
    })
}
