//! Deployments a rule asks for: checked as a person's request is (the
//! deployer is served here and takes the options), then recorded with its
//! cause, queued or held for approval, in the transaction that records the
//! firing, so an event fires a rule once across the servers. A firing
//! that cannot make a deployment is recorded with its sentence instead.
//! Never runs one: the queue claims it.

use crate::db::{self, CausedDeployment, Topic};
use crate::events::Event;
use crate::model::{Cause, Status, TrainedModel};

use super::{Pipeline, StartError};

/// What a rule asks to deploy, for which event.
pub struct Firing<'a> {
    pub cause: Cause,
    pub model: &'a TrainedModel,
    pub deployer: &'a str,
    pub options_json: &'a str,
    /// Held `awaiting_approval` until an admin approves it.
    pub held: bool,
}

/// What came of a firing on this server.
#[derive(Debug, PartialEq, Eq)]
pub enum Fired {
    /// Recorded here: the deployment's id and status.
    Recorded(i64, Status),
    /// Recorded here with no deployment, for this reason.
    Failed(String),
    /// Another server (or an earlier try) recorded it.
    Already,
}

impl Pipeline {
    /// Records `firing`'s deployment (or why it has none), once. `Err`: it
    /// cannot be decided now (its deployer still loading here, the
    /// database refusing); nothing was recorded, so it is tried again.
    pub async fn fire(&self, firing: Firing<'_>) -> Result<Fired, String> {
        let Cause { rule, event_id, .. } = &firing.cause;
        let retry = |e: db::Error| format!("rule {rule}: {e}");
        if self.db.fired(rule, *event_id).await.map_err(retry)? {
            return Ok(Fired::Already);
        }
        if let Err(why) = self.trust_in_models().allows(firing.model) {
            return self.fire_failed(&firing.cause, firing.model.id, &why).await;
        }
        let (plugin, options_json) = match self
            .checked_step(firing.deployer, firing.options_json)
            .await
        {
            Ok(checked) => checked,
            Err(e @ (StartError::StillLoading(_) | StartError::Record(_))) => {
                return Err(format!("rule {rule}: {e}"));
            }
            Err(e) => {
                return self
                    .fire_failed(&firing.cause, firing.model.id, &e.to_string())
                    .await;
            }
        };
        // The same refusal as admission's, when an earlier fetch knows.
        let pickles = super::pickles::pickle_paths(&firing.model.files, None);
        if let Some(why) = super::pickles::refusal(self.pickles, firing.model, &plugin, &pickles) {
            return self.fire_failed(&firing.cause, firing.model.id, &why).await;
        }
        let new = CausedDeployment {
            model_id: firing.model.id,
            deployer: firing.deployer.to_string(),
            options_json,
            dir: self
                .fetcher
                .dir_of(&firing.model.job_id)
                .display()
                .to_string(),
            plugin_sha256: plugin.sha256.clone(),
            cause: firing.cause.clone(),
            held: firing.held,
        };
        let rule_name = rule.clone();
        let words = self.events.report(move |row| {
            vec![match row.status {
                Status::AwaitingApproval => Event::DeploymentAwaitingApproval {
                    deploy_id: row.id,
                    model_id: row.model_id,
                    deployer: row.deployer.clone(),
                    rule: rule_name.clone(),
                },
                _ => Event::DeploymentQueued {
                    deploy_id: row.id,
                    model_id: row.model_id,
                    deployer: row.deployer.clone(),
                    cause: row.cause.clone(),
                },
            }]
        });
        let recorded = self
            .db
            .fire(&self.server_id, *event_id, new, words.events)
            .await
            .map_err(retry)?;
        let Some(row) = recorded else {
            return Ok(Fired::Already);
        };
        crate::metrics::rule_fired(rule, row.status.as_str());
        if row.status == Status::Queued {
            self.wake(Topic::Queue, row.id).await;
        }
        Ok(Fired::Recorded(row.id, row.status))
    }

    /// Records that `cause`'s rule made no deployment of model `model_id`,
    /// for `error`, once, with a `rule.failed` event.
    pub async fn fire_failed(
        &self,
        cause: &Cause,
        model_id: i64,
        error: &str,
    ) -> Result<Fired, String> {
        let event = Event::RuleFailed {
            rule: cause.rule.clone(),
            event_id: cause.event_id,
            model_id,
            error: error.to_string(),
        };
        let recorded = self
            .db
            .fire_failed(
                &self.server_id,
                &cause.rule,
                cause.event_id,
                model_id,
                error,
                vec![self.events.stamp(&event)],
            )
            .await
            .map_err(|e| format!("rule {}: {e}", cause.rule))?;
        if !recorded {
            return Ok(Fired::Already);
        }
        crate::metrics::rule_fired(&cause.rule, "failed");
        Ok(Fired::Failed(error.to_string()))
    }
}
