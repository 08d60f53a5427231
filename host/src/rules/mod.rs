//! Deploy rules: `when` an event happens to a model that matches, `deploy`
//! it with a deployer and options. A rule's written form (`Spec`: the rules
//! file's `[[rule]]`, the API's body, the stored body; serde is that
//! format) and its checks that need nothing but the rule itself live here;
//! `matching` says whether an event's model (and previous deployment)
//! match, `template` fills `${…}` in options, `graph` refuses cycles and
//! chains too deep, `set` keeps the declared and stored rules (and checks
//! a rule against the served deployers), `fire` turns stored events into
//! deployments, each once. Never runs a deployment: the pipeline records
//! what a firing asks for and the queue runs it.

pub mod fire;
mod graph;
mod matching;
pub mod set;
mod template;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::events::EventKind;
use crate::validate::Problem;

pub use matching::glob;
pub use set::{RuleError, Rules};

/// The longest chain of rules one registration may set off.
pub const MAX_DEPTH: usize = 8;

/// A rule as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Lowercase letters, digits, `.`, `_` and `-`: the name deployments
    /// it causes are created by (`rule:NAME`).
    pub name: String,
    pub when: When,
    #[serde(default, rename = "match", skip_serializing_if = "Match::is_empty")]
    pub matches: Match,
    pub deploy: Deploy,
    #[serde(default)]
    pub require_approval: bool,
    /// A disabled rule is kept but fires nothing.
    #[serde(default)]
    pub disabled: bool,
}

/// What fires a rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    /// `model.registered` or `deployment.completed`, as the event stream
    /// names them (`model_registered`, `deployment_completed`: the
    /// spellings rules took before, kept).
    pub event: String,
    /// For `deployment.completed`: the deployer whose completion fires it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployer: Option<String>,
}

/// What the model (and, for a completed deployment, its details) must be.
/// Strings are globs (`*` any run, `?` one character); absent: anything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// The signer of the model's verified signature (a glob over `key
    /// sha256:HEX` or `certificate "SUBJECT" (NAMES) issued by "ISSUER"`):
    /// an unsigned model, or one whose signature failed, matches none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// Each key's value in the model's `params` (a string value is a glob).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_loss: Option<Bounds>,
    /// Each key's value in the completed deployment's details.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, Value>,
}

impl Match {
    fn is_empty(&self) -> bool {
        *self == Match::default()
    }
}

/// Inclusive bounds; a model without a final loss matches none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

/// What a firing deploys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deploy {
    pub deployer: String,
    /// As `POST /v1/models/{id}/deployments` takes them; string values may
    /// hold `${model.FIELD}`, `${previous.ref}`, `${previous.details.KEY}`.
    #[serde(default)]
    pub options: serde_json::Map<String, Value>,
}

/// What fires a rule, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Registered,
    Completed { deployer: String },
}

/// A stored event a rule may fire from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Happened {
    Registered { model_id: i64 },
    Completed { deploy_id: i64 },
}

impl Spec {
    pub fn trigger(&self) -> Option<Trigger> {
        match (self.event(), &self.when.deployer) {
            (Some(EventKind::ModelRegistered), None) => Some(Trigger::Registered),
            (Some(EventKind::DeploymentCompleted), Some(deployer)) => Some(Trigger::Completed {
                deployer: deployer.clone(),
            }),
            _ => None,
        }
    }

    /// The kind of event `when` names.
    fn event(&self) -> Option<EventKind> {
        EventKind::parse(&self.when.event)
    }

    /// Every problem the rule has on its own (the deployers and the other
    /// rules are `set`'s to check), each with its field.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, message: String| {
            problems.push(Problem {
                field: field.to_string(),
                message,
            })
        };
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !name_ok {
            problem(
                "name",
                format!(
                    "{:?} is not a rule name: use 1 to 64 lowercase letters, digits, '.', '_' or '-'",
                    self.name
                ),
            );
        }
        match (self.event(), &self.when.deployer) {
            (Some(EventKind::ModelRegistered), None) => {}
            (Some(EventKind::ModelRegistered), Some(_)) => problem(
                "when.deployer",
                "a rule fired by model.registered names no deployer; \
                 use event = \"deployment.completed\" to follow a deployer's completion"
                    .into(),
            ),
            (Some(EventKind::DeploymentCompleted), Some(d)) if !d.is_empty() => {}
            (Some(EventKind::DeploymentCompleted), _) => problem(
                "when.deployer",
                "deployment.completed needs the deployer whose completion fires the rule".into(),
            ),
            _ => problem(
                "when.event",
                format!(
                    "{:?} is not an event rules fire on: use model.registered or deployment.completed",
                    self.when.event
                ),
            ),
        }
        if self.deploy.deployer.is_empty() {
            problem(
                "deploy.deployer",
                "the deployer to deploy with is required".into(),
            );
        }
        if let Some(Bounds {
            min: Some(min),
            max: Some(max),
        }) = self.matches.final_loss
            && min > max
        {
            problem(
                "match.final_loss",
                format!("min {min} is above max {max}: no model would match"),
            );
        }
        let registered = self.event() == Some(EventKind::ModelRegistered);
        if registered && !self.matches.details.is_empty() {
            problem(
                "match.details",
                "only a rule fired by deployment.completed has a previous deployment's details to match".into(),
            );
        }
        for message in template::problems(&self.deploy.options, registered) {
            problem("deploy.options", message);
        }
        problems
    }
}
