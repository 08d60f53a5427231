//! `Rules`: the rules a server fires, from two sources. Rules declared in
//! the rules file (`--rules-file`) are this server's and win over a stored
//! rule of the same name, as the plugins folder wins over the deployer
//! catalog; rules stored over the API are every server's. A rule is
//! checked on its own (`Spec::problems`), against the deployers served
//! here, and with the other rules for cycles and depth, before it is
//! stored; nothing half-checked is kept.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::Notify;

use super::{Spec, graph, template};
use crate::db::{self, Db, StoredRule};
use crate::deployers::Deployers;
use crate::validate::{Problem, Problems};

/// Why a change of the rules was refused. Nothing was stored.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("the rule has problems")]
    Invalid(Problems),
    #[error(
        "rule {0} is declared in this server's rules file, which wins over the API: change it there"
    )]
    Declared(String),
    #[error("a rule named {0} exists already: change it with PUT /v1/rules/{0}")]
    Exists(String),
    #[error("there is no rule named {0}")]
    Unknown(String),
    #[error("{0}")]
    Record(#[from] db::Error),
}

/// A rule and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub spec: Spec,
    /// Declared in the rules file (else stored over the API).
    pub declared: bool,
    /// The token that stored it; none for a declared one.
    pub created_by: Option<String>,
    pub updated_at: Option<String>,
}

pub struct Rules {
    db: Db,
    deployers: Arc<Deployers>,
    declared: Vec<Spec>,
    /// Told of each change stored here (the follower waits on it).
    changed: Notify,
}

/// The rules file: `[[rule]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    rule: Vec<Spec>,
}

impl Rules {
    pub fn new(db: Db, deployers: Arc<Deployers>, declared: Vec<Spec>) -> Self {
        Self {
            db,
            deployers,
            declared,
            changed: Notify::new(),
        }
    }

    /// Returns once a rule was stored, changed or deleted on this server
    /// since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Reads and checks a rules file: every rule's problems, its names
    /// unique, no cycle or chain too deep among them. The deployers are
    /// checked when a rule fires (they load after the start).
    pub fn read_file(path: &Path) -> Result<Vec<Spec>, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the rules file {shown}: {e}"))?;
        let file: File =
            toml::from_str(&text).map_err(|e| format!("the rules file {shown}: {e}"))?;
        for (i, spec) in file.rule.iter().enumerate() {
            if let Some(p) = spec.problems().first() {
                return Err(format!(
                    "the rules file {shown}: rule {:?}: {}: {}",
                    spec.name, p.field, p.message
                ));
            }
            if file.rule[..i].iter().any(|other| other.name == spec.name) {
                return Err(format!(
                    "the rules file {shown}: rule {:?} is declared twice",
                    spec.name
                ));
            }
        }
        let enabled: Vec<&Spec> = file.rule.iter().filter(|r| !r.disabled).collect();
        if let Some(p) = graph::problem(&enabled) {
            return Err(format!(
                "the rules file {shown}: {}: {}",
                p.field, p.message
            ));
        }
        Ok(file.rule)
    }

    /// Every rule: the declared ones, then the stored ones whose names
    /// the file does not declare, by name.
    pub async fn all(&self) -> Result<Vec<Listed>, db::Error> {
        let mut listed: Vec<Listed> = self
            .declared
            .iter()
            .map(|spec| Listed {
                spec: spec.clone(),
                declared: true,
                created_by: None,
                updated_at: None,
            })
            .collect();
        for stored in self.db.rules().await? {
            if self.is_declared(&stored.name) {
                continue;
            }
            let spec: Spec = serde_json::from_str(&stored.body)
                .map_err(|e| db::Error::Corrupt(format!("rule {}: {e}", stored.name)))?;
            listed.push(Listed {
                spec,
                declared: false,
                created_by: stored.created_by,
                updated_at: Some(stored.updated_at),
            });
        }
        listed.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(listed)
    }

    pub async fn get(&self, name: &str) -> Result<Listed, RuleError> {
        self.all()
            .await?
            .into_iter()
            .find(|l| l.spec.name == name)
            .ok_or_else(|| RuleError::Unknown(name.to_string()))
    }

    /// The rules that fire: every enabled one.
    pub async fn enabled(&self) -> Result<Vec<Spec>, db::Error> {
        Ok(self
            .all()
            .await?
            .into_iter()
            .map(|l| l.spec)
            .filter(|s| !s.disabled)
            .collect())
    }

    /// Stores a new rule, once checked.
    pub async fn create(&self, spec: Spec, by: Option<String>) -> Result<Listed, RuleError> {
        if self.is_declared(&spec.name) {
            return Err(RuleError::Declared(spec.name));
        }
        self.check(&spec).await?;
        let now = db::now();
        let stored = self
            .db
            .insert_rule(StoredRule {
                name: spec.name.clone(),
                body: body(&spec)?,
                created_by: by,
                created_at: now.clone(),
                updated_at: now,
            })
            .await?;
        if !stored {
            return Err(RuleError::Exists(spec.name));
        }
        self.changed.notify_one();
        self.get(&spec.name).await
    }

    /// Replaces stored rule `name` with `spec` (whose name must be the
    /// same), once checked.
    pub async fn change(&self, name: &str, spec: Spec) -> Result<Listed, RuleError> {
        if self.is_declared(name) {
            return Err(RuleError::Declared(name.to_string()));
        }
        if spec.name != name {
            return Err(RuleError::Invalid(Problems(vec![Problem {
                field: "name".into(),
                message: format!(
                    "the body names rule {:?} but the path {name:?}; a rule cannot be renamed: create the new name and delete the old",
                    spec.name
                ),
            }])));
        }
        self.check(&spec).await?;
        if !self.db.update_rule(name, &body(&spec)?).await? {
            return Err(RuleError::Unknown(name.to_string()));
        }
        self.changed.notify_one();
        self.get(name).await
    }

    pub async fn delete(&self, name: &str) -> Result<(), RuleError> {
        if self.is_declared(name) {
            return Err(RuleError::Declared(name.to_string()));
        }
        match self.db.delete_rule(name).await? {
            true => {
                self.changed.notify_one();
                Ok(())
            }
            false => Err(RuleError::Unknown(name.to_string())),
        }
    }

    fn is_declared(&self, name: &str) -> bool {
        self.declared.iter().any(|s| s.name == name)
    }

    /// Every problem of `spec`: its own, its deployer's (served here, and
    /// taking its options when they hold no `${…}` to fill), and the
    /// chains it would make with the other enabled rules.
    async fn check(&self, spec: &Spec) -> Result<(), RuleError> {
        let mut problems = spec.problems();
        let deployer = spec.deploy.deployer.as_str();
        let served = self.deployers.current();
        match served.deployers.get(deployer) {
            _ if deployer.is_empty() => {}
            None if self.deployers.is_loading(deployer) => problems.push(Problem {
                field: "deploy.deployer".into(),
                message: format!(
                    "deployer {deployer} is still loading; try again in a few seconds"
                ),
            }),
            None => problems.push(Problem {
                field: "deploy.deployer".into(),
                message: format!(
                    "unknown deployer {deployer:?}; the loaded deployers are: {}",
                    served
                        .deployers
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
            Some(plugin) if !template::has_references(&spec.deploy.options) => {
                let options = serde_json::Value::Object(spec.deploy.options.clone()).to_string();
                let options = crate::runtime::default_target(plugin, &options).unwrap_or(options);
                if let Err(e) = self
                    .deployers
                    .runtime()
                    .check_options(plugin, &options)
                    .await
                {
                    problems.push(Problem {
                        field: "deploy.options".into(),
                        message: format!("deployer {deployer} refused the options: {e}"),
                    });
                }
            }
            Some(_) => {}
        }
        if problems.is_empty() && !spec.disabled {
            let others: Vec<Spec> = self
                .enabled()
                .await?
                .into_iter()
                .filter(|s| s.name != spec.name)
                .collect();
            let mut all: Vec<&Spec> = others.iter().collect();
            all.push(spec);
            problems.extend(graph::problem(&all));
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(RuleError::Invalid(Problems(problems))),
        }
    }
}

fn body(spec: &Spec) -> Result<String, RuleError> {
    serde_json::to_string(spec).map_err(|e| RuleError::Record(db::Error::Corrupt(e.to_string())))
}
