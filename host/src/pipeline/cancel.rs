//! Cancelling a deployment, whichever server holds it: a queued one is
//! ended at once, a running one is stopped by its owner (here, or woken
//! over the database). Never ends a running deployment's row itself: its
//! owner records how it ended.

use std::time::Duration;

use crate::db::{self, CancelAsked, Topic};
use crate::model::{Deployment, Status};

use super::Pipeline;
use super::sentences::{CANCELLED, before_start};

/// How long a cancel waits for the deployment's row to end before it
/// answers that the cancel was accepted.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// Why a cancel request was refused.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("deployment {0} does not exist")]
    Unknown(i64),
    #[error(
        "deployment {id} already ended ({}); only a running deployment can be cancelled",
        .status.as_str()
    )]
    Ended { id: i64, status: Status },
    #[error("{0}")]
    Record(#[from] db::Error),
}

impl Pipeline {
    /// Cancels a deployment, whichever server runs it: a queued one ends
    /// at once; a running one is stopped by its owner, and the answer is
    /// its row once it ended (or, after `CANCEL_WAIT`, still running: the
    /// cancel is recorded and will be carried out).
    pub async fn cancel(&self, deploy_id: i64) -> Result<Deployment, CancelError> {
        let mut ended = self.db.wakeups(Topic::Ended);
        match self.ask_cancel(deploy_id, CANCELLED).await? {
            CancelAsked::Unknown => Err(CancelError::Unknown(deploy_id)),
            CancelAsked::Ended(status) => Err(CancelError::Ended {
                id: deploy_id,
                status,
            }),
            CancelAsked::Dequeued(row) => Ok(*row),
            CancelAsked::Running { .. } => {
                let row = self
                    .db
                    .deployment(deploy_id)
                    .await?
                    .ok_or(CancelError::Unknown(deploy_id))?;
                Ok(self.wait_ended(row, &mut ended, Some(CANCEL_WAIT)).await?)
            }
        }
    }

    /// Records a cancel and makes it reach the deployment: ended here if
    /// it was queued, stopped here if it runs here, else its owner is
    /// woken.
    pub(super) async fn ask_cancel(
        &self,
        deploy_id: i64,
        reason: &str,
    ) -> Result<CancelAsked, db::Error> {
        let asked = self
            .db
            .request_cancel(
                deploy_id,
                reason,
                &before_start(reason),
                Some(self.ended_report()),
            )
            .await?;
        match &asked {
            // Its end was stored with it, and its waiters woken.
            CancelAsked::Dequeued(_) => crate::failpoint::abort_after("cancel"),
            CancelAsked::Running { .. } => match self.live.get(deploy_id) {
                Some(running) => running.cancel(reason),
                None => self.wake(Topic::Cancel, deploy_id).await,
            },
            CancelAsked::Unknown | CancelAsked::Ended(_) => {}
        }
        Ok(asked)
    }
}
