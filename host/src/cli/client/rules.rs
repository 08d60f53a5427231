//! `berth rules [add | rm | enable | disable]`, `berth approvals`,
//! `berth approve ID`, `berth reject ID`: a server's deploy rules and the
//! deployments they hold for an admin's approval.

use std::path::PathBuf;

use clap::Subcommand;
use serde::Deserialize;

use super::api::{Api, Error};
use super::text::{Table, timestamp};
use super::{Common, OUTCOME_WIDTH, print_json, word};
use crate::http::json::{DecisionBody, Deployment, Deployments, Rule, RuleBody, Rules};

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Stores each `[[rule]]` of a rules file (the format of
    /// `--rules-file`) on the server, for every server on its database.
    Add {
        file: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Deletes a stored rule; the deployments it caused keep their cause.
    Rm {
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Makes a stored rule fire again.
    Enable {
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Keeps a stored rule without firing it.
    Disable {
        name: String,
        #[command(flatten)]
        common: Common,
    },
}

/// A rules file, as the CLI sends it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    rule: Vec<RuleBody>,
}

pub async fn run(change: RulesCommand) -> Result<(), Error> {
    match change {
        RulesCommand::Add { file, common } => {
            let api = Api::new(&common.server, common.token.as_deref())?;
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", file.display())))?;
            let rules: File = toml::from_str(&text)
                .map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
            for rule in rules.rule {
                let stored = api.post::<Rule>("/v1/rules", &rule).await?;
                println!("stored rule {}", stored.body.name);
            }
            Ok(())
        }
        RulesCommand::Rm { name, common } => {
            let api = Api::new(&common.server, common.token.as_deref())?;
            api.delete(&format!("/v1/rules/{name}")).await?;
            println!("deleted rule {name}");
            Ok(())
        }
        RulesCommand::Enable { name, common } => switch(&common, &name, false).await,
        RulesCommand::Disable { name, common } => switch(&common, &name, true).await,
    }
}

async fn switch(common: &Common, name: &str, disabled: bool) -> Result<(), Error> {
    let api = Api::new(&common.server, common.token.as_deref())?;
    let rule = api.get::<Rule>(&format!("/v1/rules/{name}")).await?.body;
    let body = RuleBody {
        name: rule.name,
        when: rule.when,
        matches: Some(rule.matches),
        deploy: rule.deploy,
        require_approval: rule.require_approval,
        disabled,
    };
    let changed = api.put::<Rule>(&format!("/v1/rules/{name}"), &body).await?;
    println!(
        "rule {name} is {}",
        if changed.body.disabled {
            "disabled"
        } else {
            "enabled"
        }
    );
    Ok(())
}

pub async fn list(api: Api, json: bool) -> Result<(), Error> {
    let answer = api.get::<Rules>("/v1/rules").await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    if answer.body.rules.is_empty() {
        println!("no rules on {}", api.server());
        return Ok(());
    }
    let mut table = Table::new(&[
        "NAME",
        "ORIGIN",
        "WHEN",
        "DEPLOY",
        "APPROVAL",
        "LAST FIRING",
    ]);
    for rule in answer.body.rules {
        let when = match rule.when["deployer"].as_str() {
            Some(deployer) => format!("{deployer} completed"),
            None => "model registered".to_string(),
        };
        let last = rule
            .firings
            .first()
            .map(|f| match (&f.deployment_id, &f.error) {
                (Some(id), _) => format!("{} deployment {id}", timestamp(&f.created_at)),
                (None, error) => super::text::truncate(
                    &format!(
                        "{} {}",
                        timestamp(&f.created_at),
                        error.as_deref().unwrap_or("")
                    ),
                    OUTCOME_WIDTH,
                ),
            });
        table.row(vec![
            format!(
                "{}{}",
                rule.name,
                if rule.disabled { " (disabled)" } else { "" }
            ),
            rule.origin,
            when,
            rule.deploy["deployer"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            if rule.require_approval {
                "required"
            } else {
                ""
            }
            .to_string(),
            last.unwrap_or_default(),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}

pub async fn approvals(api: Api, json: bool) -> Result<(), Error> {
    let answer = api.get::<Deployments>("/v1/approvals").await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    if answer.body.deployments.is_empty() {
        println!("nothing awaits approval on {}", api.server());
        return Ok(());
    }
    let mut table = Table::new(&["ID", "MODEL", "DEPLOYER", "RULE", "OPTIONS", "SINCE (UTC)"])
        .right_align(&[0, 1]);
    for d in answer.body.deployments {
        table.row(vec![
            d.id.to_string(),
            d.model_id.to_string(),
            d.deployer,
            d.cause.map(|c| c.rule).unwrap_or_default(),
            super::text::truncate(&d.options.to_string(), OUTCOME_WIDTH),
            timestamp(&d.created_at),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}

/// `approve` or `reject` deployment `id`.
pub async fn decide(
    api: Api,
    id: i64,
    verb: &str,
    comment: Option<String>,
    json: bool,
) -> Result<(), Error> {
    let answer = api
        .post::<Deployment>(
            &format!("/v1/deployments/{id}/{verb}"),
            &DecisionBody { comment },
        )
        .await?;
    if json {
        print_json(&answer.raw);
    } else {
        println!("deployment {id} is {}", word(answer.body.status));
    }
    Ok(())
}
