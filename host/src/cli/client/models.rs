//! `berth models register | push | show | rm | du`: one model on a running
//! server — registered from a folder (`register`) or uploaded from one
//! (`push`), shown with its files,
//! or its record deleted — and the disk the models' copies take (`du`).

use clap::Subcommand;

use super::api::{Api, Error};
use super::push::{self, PushArgs};
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
    /// Uploads a training run's folder through the server and registers it:
    /// the same choice of files and fields as register, each file the
    /// server's blob store lacks sent once (by sha256, verified as it
    /// arrives), resumed at its offset after a cut (also by running the
    /// command again), with progress on stderr. The model's source is
    /// upload:, and its files are pinned: no disk budget drops them.
    Push(Box<PushArgs>),
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
    /// Shows the disk the server's copies of the models take, like `du`:
    /// each model's bytes, the part it shares with other models, whether
    /// its copy is whole (LOCAL) and when it was last deployed, least
    /// recently deployed first; then the bytes on disk and what sharing
    /// saves.
    Du {
        #[command(flatten)]
        common: Common,
    },
}

pub async fn run(command: ModelsCommand) -> Result<(), Error> {
    match command {
        ModelsCommand::Register(args) => register::run(*args).await,
        ModelsCommand::Push(args) => push::run(*args).await,
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
        ModelsCommand::Du { common } => {
            let api = Api::new(&common.server, common.token.as_deref())?;
            let answer = api.get::<json::Storage>("/v1/storage").await?;
            if common.json {
                print_json(&answer.raw);
            } else {
                print!("{}", usage(&answer.body));
            }
            Ok(())
        }
    }
}

/// The models' copies as a table, then a total line.
fn usage(storage: &json::Storage) -> String {
    let size = crate::human::size;
    let mut table = Table::new(&[
        "SIZE",
        "SHARED",
        "LOCAL",
        "LAST DEPLOYED (UTC)",
        "JOB ID",
        "NAME",
    ])
    .right_align(&[0, 1]);
    for model in &storage.models {
        table.row(vec![
            size(model.bytes),
            size(model.shared_bytes),
            if model.local { "yes" } else { "no" }.to_string(),
            model
                .last_deployed
                .as_deref()
                .map_or_else(|| "never".to_string(), timestamp),
            model.job_id.clone(),
            model.name.clone(),
        ]);
    }
    let budget = storage
        .budget_bytes
        .map(|b| format!(" of a {} budget", size(b)))
        .unwrap_or_default();
    let unreferenced = match storage.unreferenced_blob_bytes {
        0 => String::new(),
        bytes => format!(", {} in blobs no model links", size(bytes)),
    };
    let pinned = match storage.pinned_blobs {
        0 => String::new(),
        blobs => format!(
            ", {} in {blobs} uploaded blob(s), pinned",
            size(storage.pinned_bytes)
        ),
    };
    format!(
        "{}{} on disk{budget} in {}, {} saved by sharing{pinned}{unreferenced}\n",
        table.render(),
        size(storage.bytes_on_disk),
        storage.models_dir,
        size(storage.bytes_saved),
    )
}

/// What a model's signature says, in a line.
fn signature(signature: Option<&json::Signature>) -> String {
    match signature {
        None => "none".to_string(),
        Some(json::Signature {
            verified: true,
            signer,
            verified_at,
            ..
        }) => format!(
            "verified: {} ({})",
            signer.as_deref().unwrap_or_default(),
            timestamp(verified_at.as_deref().unwrap_or_default())
        ),
        Some(s) => format!("not verified: {}", s.error.as_deref().unwrap_or_default()),
    }
}

/// Where a model registered from MLflow came from, in a line: its name,
/// version, the alias it was found by and its run's page (its params'
/// `mlflow_*`, written by the server).
fn mlflow_origin(params: &serde_json::Value) -> Option<String> {
    let text = |key: &str| params.get(key).and_then(|v| v.as_str());
    let mut line = format!(
        "{} version {}",
        text("mlflow_name")?,
        text("mlflow_version")?
    );
    if let Some(alias) = text("mlflow_alias") {
        line.push_str(&format!(" (alias {alias})"));
    }
    match (text("mlflow_run_url"), text("mlflow_run_id")) {
        (Some(url), _) => line.push_str(&format!(", run {url}")),
        (None, Some(run)) => line.push_str(&format!(", run {run}")),
        (None, None) => {}
    }
    Some(line)
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
    // A training value nobody gave is said to be unknown, not shown as 0.
    fn known<T: ToString>(value: &Option<T>) -> String {
        value
            .as_ref()
            .map_or_else(|| "unknown".to_string(), T::to_string)
    }
    for (field, value) in [
        ("id", model.id.to_string()),
        ("name", model.name.clone()),
        ("job id", model.job_id.clone()),
        ("base model", known(&model.base_model)),
        ("model size", known(&model.model_size)),
        ("dataset", known(&model.dataset)),
        ("examples", known(&model.num_examples)),
        ("train steps", known(&model.num_train_steps)),
        ("final loss", known(&model.final_loss)),
        ("params", model.params.to_string()),
        ("signature", signature(model.signature.as_ref())),
        ("source", model.source.clone()),
        ("created (UTC)", timestamp(&model.created_at)),
        (
            "by",
            optional(model.created_by.as_deref().unwrap_or_default()),
        ),
    ] {
        fields.row(vec![field.to_string(), value]);
    }
    if let Some(origin) = mlflow_origin(&model.params) {
        fields.row(vec!["from MLflow".to_string(), origin]);
    }
    // FORMAT: as the server's first fetch told it from the bytes; "-"
    // until then.
    let mut files = Table::new(&["PATH", "SIZE", "FORMAT", "SHA256"]).right_align(&[1]);
    for file in &model.files {
        files.row(vec![
            file.path.clone(),
            crate::human::size(file.size_bytes),
            file.format.clone().unwrap_or_else(|| "-".to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_reads_like_du() {
        let model =
            |id, job: &str, bytes, shared_bytes, local, last: Option<&str>| json::ModelStorage {
                bytes,
                id,
                job_id: job.into(),
                last_deployed: last.map(str::to_string),
                local,
                name: format!("{job} model"),
                shared_bytes,
            };
        let storage = json::Storage {
            budget_bytes: Some(2 << 30),
            bytes_on_disk: 3 << 20,
            bytes_saved: 1 << 20,
            models: vec![
                model(2, "ft-2", 0, 0, false, None),
                model(
                    1,
                    "ft-1",
                    2 << 20,
                    1 << 20,
                    true,
                    Some("2026-12-03T17:00:00.000Z"),
                ),
                model(
                    3,
                    "ft-3",
                    2 << 20,
                    1 << 20,
                    true,
                    Some("2026-12-03T18:00:00.000Z"),
                ),
            ],
            models_dir: "/data/models".into(),
            pinned_blobs: 1,
            pinned_bytes: 1 << 20,
            unreferenced_blob_bytes: 0,
        };
        let expected = [
            "   SIZE   SHARED  LOCAL  LAST DEPLOYED (UTC)  JOB ID  NAME",
            "0 bytes  0 bytes  no     never                ft-2    ft-2 model",
            "  2 MiB    1 MiB  yes    2026-12-03 17:00:00  ft-1    ft-1 model",
            "  2 MiB    1 MiB  yes    2026-12-03 18:00:00  ft-3    ft-3 model",
            "3 MiB on disk of a 2 GiB budget in /data/models, 1 MiB saved by sharing, 1 MiB in 1 uploaded blob(s), pinned",
        ];
        assert_eq!(usage(&storage), expected.map(|l| format!("{l}\n")).concat());
    }

    #[test]
    fn an_mlflow_origin_reads_in_a_line() {
        let cases = [
            (serde_json::json!({"lr": 1}), None),
            (
                serde_json::json!({"mlflow_name": "iris", "mlflow_version": "3"}),
                Some("iris version 3"),
            ),
            (
                serde_json::json!({"mlflow_name": "iris", "mlflow_version": "3",
                    "mlflow_alias": "champion", "mlflow_run_id": "abc",
                    "mlflow_run_url": "http://m/#/experiments/0/runs/abc"}),
                Some("iris version 3 (alias champion), run http://m/#/experiments/0/runs/abc"),
            ),
            (
                serde_json::json!({"mlflow_name": "iris", "mlflow_version": "3", "mlflow_run_id": "abc"}),
                Some("iris version 3, run abc"),
            ),
        ];
        for (params, expected) in cases {
            assert_eq!(mlflow_origin(&params).as_deref(), expected, "{params}");
        }
    }
}
