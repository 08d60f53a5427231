//! Whether the database answers, asked cheaply: one `SELECT 1`, its
//! answer kept for a moment so that a load balancer polling `/readyz` on
//! every server costs the database little. Never retries and never
//! decides anything from the answer.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Db, Error, Result};

/// How long an answer is kept before the database is asked again.
const KEPT_FOR: Duration = Duration::from_secs(1);

/// How long the ping may take before the database counts as unreachable:
/// `/readyz` answers within it.
const PING_LIMIT: Duration = Duration::from_secs(2);

/// The last ping: when, and the sentence of its failure if it failed.
#[derive(Default)]
pub(super) struct Reach {
    last: Mutex<Option<(Instant, Option<String>)>>,
}

impl Db {
    /// `Ok` if the database answered a ping within the last second (asked
    /// again when that answer is older); else why not, as a sentence.
    pub async fn reachable(&self) -> std::result::Result<(), String> {
        if let Some((at, answer)) = self.reach.last.lock().unwrap().clone()
            && at.elapsed() < KEPT_FOR
        {
            return answer.map_or(Ok(()), Err);
        }
        let answer = match tokio::time::timeout(PING_LIMIT, self.ping()).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!(
                "the database is unreachable: it did not answer within {}",
                crate::human::duration(PING_LIMIT)
            )),
        };
        *self.reach.last.lock().unwrap() = Some((Instant::now(), answer.clone()));
        answer.map_or(Ok(()), Err)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(Error::from)
    }
}
