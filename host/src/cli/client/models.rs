//! `berth models register | show | rm`: one model on a running server —
//! registered from a folder (`register`), shown with its files, or its
//! record deleted.

use clap::Subcommand;

use super::api::{Api, Error};
use super::register::{self, RegisterArgs};
use super::text::{Table, timestamp};
use super::{Common, find_model, print_json};
use crate::http::json;

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Registers a training run's folder: every regular file with its size
    /// and sha256; the base model, LoRA settings, steps and last loss from
    /// adapter_config.json and trainer_state.json (at the top or in the
    /// latest checkpoint-N/), the flags winning. Symbolic links, FIFOs,
    /// sockets, .git/ and (without --all) dotfiles are skipped and named.
    Register(Box<RegisterArgs>),
    /// Shows a model and its files.
    Show {
        /// The model: its id or its job id.
        model: String,
        #[command(flatten)]
        common: Common,
    },
    /// Deletes a model: its record, its deployments' records and the
    /// server's copy of its files (refused while a deployment of it is
    /// queued or running).
    Rm {
        /// The model: its id or its job id.
        model: String,
        /// Drop only the server's copy of the files; the model stays
        /// registered and its next deployment fetches them again.
        #[arg(long)]
        files: bool,
        #[command(flatten)]
        common: Common,
    },
}

pub async fn run(command: ModelsCommand) -> Result<(), Error> {
    match command {
        ModelsCommand::Register(args) => register::run(*args).await,
        ModelsCommand::Show { model, common } => {
            let api = Api::new(&common.server, common.token.as_deref())?;
            let id = find_model(&api, &model).await?.id;
            let answer = api.get::<json::Model>(&format!("/v1/models/{id}")).await?;
            if common.json {
                print_json(&answer.raw);
            } else {
                print!("{}", shown(&answer.body));
            }
            Ok(())
        }
        ModelsCommand::Rm {
            model,
            files,
            common,
        } => {
            let api = Api::new(&common.server, common.token.as_deref())?;
            let model = find_model(&api, &model).await?;
            if files {
                api.delete(&format!("/v1/models/{}/files", model.id))
                    .await?;
                println!(
                    "dropped the copy of model {} (job {})'s files on {}; its next deployment fetches them again",
                    model.id,
                    model.job_id,
                    api.server()
                );
            } else {
                api.delete(&format!("/v1/models/{}", model.id)).await?;
                println!(
                    "deleted model {} (job {}), its deployments' records and its files from {}",
                    model.id,
                    model.job_id,
                    api.server()
                );
            }
            Ok(())
        }
    }
}

/// The model's fields, one per line, then its files as a table.
fn shown(model: &json::Model) -> String {
    let mut fields = Table::new(&["FIELD", "VALUE"]);
    let optional = |value: &str| {
        if value.is_empty() {
            "-".to_string()
        } else {
            value.to_string()
        }
    };
    for (field, value) in [
        ("id", model.id.to_string()),
        ("name", model.name.clone()),
        ("job id", model.job_id.clone()),
        ("base model", optional(&model.base_model)),
        ("model size", optional(&model.model_size)),
        ("dataset", optional(&model.dataset)),
        ("examples", model.num_examples.to_string()),
        ("train steps", model.num_train_steps.to_string()),
        (
            "final loss",
            model
                .final_loss
                .map_or_else(|| "-".to_string(), |l| l.to_string()),
        ),
        ("params", model.params.to_string()),
        ("source", model.source.clone()),
        ("created (UTC)", timestamp(&model.created_at)),
        (
            "by",
            optional(model.created_by.as_deref().unwrap_or_default()),
        ),
    ] {
        fields.row(vec![field.to_string(), value]);
    }
    let mut files = Table::new(&["PATH", "SIZE", "SHA256"]).right_align(&[1]);
    for file in &model.files {
        files.row(vec![
            file.path.clone(),
            crate::human::size(file.size_bytes),
            file.sha256.clone().unwrap_or_else(|| "-".to_string()),
        ]);
    }
    // The fields' header says nothing a reader needs.
    let fields = fields.render();
    let fields = fields.split_once('\n').map_or("", |(_, rest)| rest);
    let total: u64 = model.files.iter().map(|f| f.size_bytes).sum();
    format!(
        "{fields}\n{} files, {}:\n{}",
        model.files.len(),
        crate::human::size(total),
        files.render()
    )
}
