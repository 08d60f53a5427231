//! The commands that talk to a running server over its HTTP API: `deploy`,
//! `models`, `deployments`, `deployers`, `rules`, `approvals`, `approve`,
//! `reject`. They know the server only from the
//! outside — URLs, and its answers read into the server's own wire types
//! (`http::json`) — and never touch its database or files.
//!
//! Exit status: 0 done, 1 refused or failed (the reason is printed), 2 the
//! server cannot be reached, 130 interrupted (`deploy` then cancels).

mod api;
mod catalog;
mod deploy;
mod models;
pub(super) mod progress;
mod push;
mod register;
mod rules;
mod run_folder;
mod text;
mod training;

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::http::json::{self, Deployers, Deployments, Models, Status};
use api::{Api, Error};
use text::Table;

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Deploys a model on a running server, shows its progress and prints
    /// the outcome; exits 1 if the deployment failed.
    ///
    /// Ctrl-C cancels the deployment on the server (and exits 130).
    Deploy {
        /// The model: its id or its job id (see `berth models`).
        model: String,
        /// The deployer (see `berth deployers`).
        deployer: String,
        /// One option: VALUE is JSON if it parses (9, true, {"a": 1}),
        /// otherwise a string. Repeat for more; wins over --options.
        #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_option)]
        option: Vec<(String, Value)>,
        /// The options as one JSON object, like '{"level": 9}'.
        #[arg(long, value_name = "JSON")]
        options: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Lists the models registered on a running server; with a
    /// subcommand, registers, shows or deletes one.
    #[command(args_conflicts_with_subcommands = true)]
    Models {
        #[command(subcommand)]
        change: Option<models::ModelsCommand>,
        #[command(flatten)]
        common: Common,
    },
    /// Lists a model's deployments, newest first.
    Deployments {
        /// The model: its id or its job id.
        model: String,
        /// At most this many (the server's default is 100, its maximum 500).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        #[command(flatten)]
        common: Common,
    },
    /// Lists a running server's deployers and the plugins it refused; with
    /// a subcommand, changes the deployers stored over the API (an admin
    /// token, when the server has tokens).
    #[command(args_conflicts_with_subcommands = true)]
    Deployers {
        #[command(subcommand)]
        change: Option<catalog::CatalogCommand>,
        #[command(flatten)]
        common: Common,
    },
    /// Lists a running server's deploy rules with their last firing; with
    /// a subcommand, stores, deletes, enables or disables one (an admin
    /// token, when the server has tokens).
    #[command(args_conflicts_with_subcommands = true)]
    Rules {
        #[command(subcommand)]
        change: Option<rules::RulesCommand>,
        #[command(flatten)]
        common: Common,
    },
    /// Lists the deployments rules hold for an admin's approval.
    Approvals {
        #[command(flatten)]
        common: Common,
    },
    /// Approves a deployment a rule held: it is queued and runs.
    Approve {
        id: i64,
        /// Kept with the decision.
        #[arg(long)]
        comment: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Rejects a deployment a rule held: it fails without running.
    Reject {
        id: i64,
        /// Kept with the decision, and in the deployment's error.
        #[arg(long)]
        comment: Option<String>,
        #[command(flatten)]
        common: Common,
    },
}

/// What every client command takes.
#[derive(Debug, Args)]
pub struct Common {
    /// The berth server to talk to.
    #[arg(
        long,
        env = "BERTH_SERVER",
        value_name = "URL",
        default_value = "http://127.0.0.1:7878"
    )]
    server: String,
    /// The API token, for a server that requires one.
    #[arg(
        long,
        env = "BERTH_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    /// Prints the server's JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(command: ClientCommand) -> anyhow::Result<ExitCode> {
    let outcome = match command {
        ClientCommand::Deploy {
            model,
            deployer,
            option,
            options,
            common,
        } => {
            let request = options_of(options, option).map(|options| deploy::DeployRequest {
                model,
                deployer,
                options,
                json: common.json,
            });
            match (request, Api::new(&common.server, common.token.as_deref())) {
                (Ok(request), Ok(api)) => deploy::run(&api, request).await,
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        ClientCommand::Models {
            change: None,
            common,
        } => with_api(&common, |api| models(api, common.json)).await,
        ClientCommand::Models {
            change: Some(change),
            ..
        } => models::run(change).await.map(|()| ExitCode::SUCCESS),
        ClientCommand::Deployments {
            model,
            limit,
            common,
        } => with_api(&common, |api| deployments(api, &model, limit, common.json)).await,
        ClientCommand::Deployers {
            change: None,
            common,
        } => with_api(&common, |api| deployers(api, common.json)).await,
        ClientCommand::Deployers {
            change: Some(change),
            ..
        } => catalog::run(change).await,
        ClientCommand::Rules {
            change: None,
            common,
        } => with_api(&common, |api| rules::list(api, common.json)).await,
        ClientCommand::Rules {
            change: Some(change),
            ..
        } => rules::run(change).await.map(|()| ExitCode::SUCCESS),
        ClientCommand::Approvals { common } => {
            with_api(&common, |api| rules::approvals(api, common.json)).await
        }
        ClientCommand::Approve {
            id,
            comment,
            common,
        } => {
            with_api(&common, |api| {
                rules::decide(api, id, "approve", comment, common.json)
            })
            .await
        }
        ClientCommand::Reject {
            id,
            comment,
            common,
        } => {
            with_api(&common, |api| {
                rules::decide(api, id, "reject", comment, common.json)
            })
            .await
        }
    };
    Ok(outcome.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::from(e.exit_status())
    }))
}

async fn with_api<F, Fut>(common: &Common, command: F) -> Result<ExitCode, Error>
where
    F: FnOnce(Api) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    command(Api::new(&common.server, common.token.as_deref())?)
        .await
        .map(|()| ExitCode::SUCCESS)
}

/// `KEY=VALUE`, VALUE as JSON when it is JSON: `level=9` is a number,
/// `mode=error` a string.
fn parse_option(raw: &str) -> Result<(String, Value), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => {
            let value =
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
            Ok((key.to_string(), value))
        }
        _ => Err(format!(
            "{raw:?} is not KEY=VALUE, like level=9 or mode=fast"
        )),
    }
}

/// `--options` first, then each `--option` on top of it.
fn options_of(
    json: Option<String>,
    pairs: Vec<(String, Value)>,
) -> Result<Map<String, Value>, Error> {
    let mut options = match json.as_deref().map(serde_json::from_str::<Value>) {
        None => Map::new(),
        Some(Ok(Value::Object(options))) => options,
        Some(Ok(_)) => {
            return Err(Error::Invalid(
                "--options must be a JSON object, like '{\"level\": 9}'".into(),
            ));
        }
        Some(Err(e)) => return Err(Error::Invalid(format!("--options is not valid JSON: {e}"))),
    };
    options.extend(pairs);
    Ok(options)
}

/// A model named by its id or its job id. A job id that is also another
/// model's id is refused rather than guessed.
async fn find_model(api: &Api, given: &str) -> Result<json::Model, Error> {
    let mut models = api.get::<Models>("/v1/models").await?.body.models;
    let by_id = given
        .parse::<i64>()
        .ok()
        .and_then(|id| models.iter().position(|m| m.id == id));
    let by_job = models.iter().position(|m| m.job_id == given);
    match (by_id, by_job) {
        (Some(a), Some(b)) if a != b => Err(Error::Invalid(format!(
            "{given:?} is both the id of model {} and the job id of model {}: give the id of the one you mean",
            models[a].id, models[b].id
        ))),
        (Some(at), _) | (None, Some(at)) => Ok(models.swap_remove(at)),
        (None, None) => Err(Error::Invalid(format!(
            "no model has the id or job id {given:?} on {}: `berth models` lists the registered ones",
            api.server()
        ))),
    }
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// An enum of the wire (a status, an origin) as the server spells it.
fn word(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(word)) => word,
        other => unreachable!("a wire enum serializes to a string, not {other:?}"),
    }
}

async fn models(api: Api, json: bool) -> Result<(), Error> {
    let answer = api.get::<Models>("/v1/models").await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    let models = answer.body.models;
    if models.is_empty() {
        println!("no models are registered on {}", api.server());
        return Ok(());
    }
    let mut table = Table::new(&[
        "ID",
        "JOB ID",
        "NAME",
        "BASE MODEL",
        "FILES",
        "SIZE",
        "CREATED (UTC)",
        "BY",
    ])
    .right_align(&[0, 4, 5]);
    for model in models {
        let size: u64 = model.files.iter().map(|f| f.size_bytes).sum();
        table.row(vec![
            model.id.to_string(),
            model.job_id,
            model.name,
            model.base_model.unwrap_or_default(),
            model.files.len().to_string(),
            crate::human::size(size),
            text::timestamp(&model.created_at),
            model.created_by.unwrap_or_default(),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}

/// How much of a ref or an error fits in a table row.
const OUTCOME_WIDTH: usize = 60;

async fn deployments(api: Api, given: &str, limit: Option<u32>, json: bool) -> Result<(), Error> {
    let model = find_model(&api, given).await?;
    let mut path = format!("/v1/models/{}/deployments", model.id);
    if let Some(limit) = limit {
        path.push_str(&format!("?limit={limit}"));
    }
    let answer = api.get::<Deployments>(&path).await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    let deployments = answer.body.deployments;
    if deployments.is_empty() {
        println!(
            "model {} ({}) has no deployments yet",
            model.id, model.job_id
        );
        return Ok(());
    }
    let mut table = Table::new(&[
        "ID",
        "DEPLOYER",
        "STATUS",
        "DURATION",
        "REF / ERROR",
        "CREATED (UTC)",
        "BY",
    ])
    .right_align(&[0, 3]);
    for deployment in deployments {
        let status = match deployment.phase {
            Some(phase) if deployment.status == Status::Running => {
                format!("running ({})", word(phase))
            }
            _ => word(deployment.status),
        };
        let outcome = match deployment.status {
            Status::Failed => deployment.error,
            _ => deployment.reference,
        };
        table.row(vec![
            deployment.id.to_string(),
            deployment.deployer,
            status,
            deployment
                .duration_ms
                .map(text::duration_ms)
                .unwrap_or_default(),
            text::truncate(&outcome.unwrap_or_default(), OUTCOME_WIDTH),
            text::timestamp(&deployment.created_at),
            deployment.created_by.unwrap_or_default(),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}

async fn deployers(api: Api, json: bool) -> Result<(), Error> {
    let answer = api.get::<Deployers>("/v1/deployers").await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    let Deployers {
        deployers,
        rejected,
        ..
    } = answer.body;
    if deployers.is_empty() {
        println!(
            "no deployers are loaded on {}: the server loads NAME.wasm from its plugins folder",
            api.server()
        );
    } else {
        let mut table = Table::new(&[
            "NAME",
            "ORIGIN",
            "VERSION",
            "DESCRIPTION",
            "NETWORK",
            "TARGETS",
        ]);
        for deployer in deployers {
            let targets: Vec<String> = deployer
                .targets
                .iter()
                .map(|t| match &t.url {
                    Some(url) => format!("{} {url}", t.name),
                    None => format!("{} (not configured here)", t.name),
                })
                .collect();
            table.row(vec![
                deployer.name,
                word(deployer.origin),
                catalog::version(deployer.version),
                deployer.description,
                if deployer.allowed_hosts.is_empty() {
                    "none".to_string()
                } else {
                    deployer.allowed_hosts.join(", ")
                },
                if targets.is_empty() {
                    "none".to_string()
                } else {
                    targets.join(", ")
                },
            ]);
        }
        print!("{}", table.render());
    }
    if !rejected.is_empty() {
        let mut table = Table::new(&["FILE", "ORIGIN", "REASON"]);
        for refusal in rejected {
            table.row(vec![refusal.file, word(refusal.origin), refusal.reason]);
        }
        println!("\nplugins the server refused:");
        print!("{}", table.render());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn option_values_are_json_when_they_parse() {
        let check = |raw: &str, expected: Result<(&str, Value), ()>| {
            let parsed = parse_option(raw).map_err(|_| ());
            assert_eq!(parsed, expected.map(|(k, v)| (k.to_string(), v)), "{raw:?}");
        };
        check("level=9", Ok(("level", json!(9))));
        check("mode=error", Ok(("mode", json!("error"))));
        check("fast=true", Ok(("fast", json!(true))));
        check("tag=007", Ok(("tag", json!("007"))));
        check("name=\"a b\"", Ok(("name", json!("a b"))));
        check("empty=", Ok(("empty", json!(""))));
        check("nested={\"a\": [1]}", Ok(("nested", json!({"a": [1]}))));
        check("url=http://x/?a=b", Ok(("url", json!("http://x/?a=b"))));
        check("level", Err(()));
        check("=9", Err(()));
    }

    #[test]
    fn single_options_win_over_the_object() {
        let options = options_of(
            Some(r#"{"level": 1, "keep": true}"#.into()),
            vec![("level".into(), json!(9))],
        )
        .unwrap();
        assert_eq!(Value::Object(options), json!({"level": 9, "keep": true}));
        assert!(
            options_of(Some("[1]".into()), vec![])
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        assert!(
            options_of(Some("{".into()), vec![])
                .unwrap_err()
                .to_string()
                .contains("not valid JSON")
        );
    }
}
