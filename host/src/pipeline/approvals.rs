//! Approvals: an admin approves a deployment a rule held (it is queued,
//! for whichever server has room) or rejects it (it fails, saying who and
//! why); one nobody decided within `QueueSettings::approval_expiry` fails
//! saying so. Never runs a deployment: the queue takes an approved one.

use std::time::SystemTime;

use crate::db::{self, Topic};
use crate::events::Event;
use crate::model::{Approval, Decision, Deployment, Status};

use super::Pipeline;
use super::sentences::{expired, rejected};

/// Why a decision was refused. Nothing was recorded.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("deployment {0} does not exist")]
    Unknown(i64),
    #[error(
        "deployment {id} is {}, not awaiting approval: only a deployment a rule held for approval can be approved or rejected",
        .status.as_str()
    )]
    NotAwaiting { id: i64, status: Status },
    #[error("{0}")]
    Record(#[from] db::Error),
}

impl Pipeline {
    /// Records `decision` by `by` on deployment `id`, which must await
    /// approval: approved, it is queued and the servers are woken to claim
    /// it; rejected, it fails with a sentence naming who and why.
    pub async fn decide(
        &self,
        id: i64,
        decision: Decision,
        by: Option<&str>,
        comment: Option<&str>,
    ) -> Result<Deployment, DecideError> {
        let approval = Approval {
            decision,
            by: by.map(str::to_string),
            at: db::now(),
            comment: comment.map(str::to_string),
        };
        let error = rejected(by, comment);
        let report = self.events.report(move |row| match row.status {
            Status::Queued => vec![
                Event::DeploymentApproved {
                    deploy_id: row.id,
                    model_id: row.model_id,
                    deployer: row.deployer.clone(),
                    by: row.approval.as_ref().and_then(|a| a.by.clone()),
                    cause: row.cause.clone(),
                },
                Event::DeploymentQueued {
                    deploy_id: row.id,
                    model_id: row.model_id,
                    deployer: row.deployer.clone(),
                    cause: row.cause.clone(),
                },
            ],
            _ => vec![super::ended(row)],
        });
        match self.db.decide(id, &approval, &error, report).await {
            Ok(row) if row.status == Status::Queued => {
                self.wake(Topic::Queue, id).await;
                Ok(row)
            }
            Ok(row) => {
                self.wake(Topic::Ended, id).await;
                Ok(row)
            }
            Err(db::Error::NotAwaiting(_)) => match self.db.deployment_status(id).await? {
                Some(status) => Err(DecideError::NotAwaiting { id, status }),
                None => Err(DecideError::Unknown(id)),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Fails the deployments that awaited approval longer than the
    /// expiry; publishes how each ended.
    pub(super) async fn expire_approvals(&self) -> Result<(), db::Error> {
        let wait = self.queue.approval_expiry;
        let before = humantime::format_rfc3339_millis(SystemTime::now() - wait).to_string();
        let report = Some(self.ended_report());
        let expired = self
            .db
            .expire_approvals(before, expired(wait), report)
            .await?;
        if !expired.is_empty() {
            crate::failpoint::abort_after("expire");
        }
        for row in expired {
            tracing::warn!(deploy_id = row.id, "{}", row.error.as_deref().unwrap_or(""));
        }
        Ok(())
    }
}
