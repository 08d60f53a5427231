//! What a training run's own files say about the model: PEFT's
//! `adapter_config.json` (the base model, the LoRA rank, alpha, dropout
//! and target modules) and Hugging Face Trainer's `trainer_state.json`
//! (the global step, the last logged loss). Pure: it is handed the files'
//! text; a file that is not what it should be is a note, never a failure.

use serde_json::{Map, Value};

/// The registration fields the files fill.
#[derive(Debug, Default, PartialEq)]
pub struct Found {
    pub base_model: Option<String>,
    pub num_train_steps: Option<u64>,
    pub final_loss: Option<f64>,
    pub params: Map<String, Value>,
    /// One sentence per file that could not be read as expected.
    pub notes: Vec<String>,
}

/// The PEFT settings kept as `params`, under their own names.
const ADAPTER_PARAMS: [&str; 5] = [
    "peft_type",
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
];

/// Reads `adapter_config.json` and `trainer_state.json` as given (each
/// `(path shown in notes, text)`, or `None` when the folder has none).
pub fn read(adapter: Option<(&str, &str)>, trainer: Option<(&str, &str)>) -> Found {
    let mut found = Found::default();
    if let Some((path, text)) = adapter {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(config)) => {
                found.base_model = config
                    .get("base_model_name_or_path")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string);
                for key in ADAPTER_PARAMS {
                    if let Some(value) = config.get(key).filter(|v| !v.is_null()) {
                        found.params.insert(key.to_string(), value.clone());
                    }
                }
            }
            _ => found.notes.push(format!(
                "{path} is not a JSON object: the base model and LoRA settings are not read from it"
            )),
        }
    }
    if let Some((path, text)) = trainer {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(state)) => {
                found.num_train_steps = state.get("global_step").and_then(Value::as_u64);
                // Trainer logs `loss` every logging step; the summary entry
                // at the end has `train_loss` (an average) instead.
                found.final_loss = state
                    .get("log_history")
                    .and_then(Value::as_array)
                    .and_then(|history| {
                        history
                            .iter()
                            .rev()
                            .find_map(|entry| entry.get("loss").and_then(Value::as_f64))
                    })
                    .filter(|loss| loss.is_finite());
            }
            _ => found.notes.push(format!(
                "{path} is not a JSON object: the steps and the loss are not read from it"
            )),
        }
    }
    found
}

/// Of the folder's files, the one a run's `name` is read from: at the top,
/// or else in the latest `checkpoint-N/` (where Trainer writes it).
pub fn pick<'a>(paths: impl IntoIterator<Item = &'a str>, name: &str) -> Option<&'a str> {
    let mut latest: Option<(u64, &str)> = None;
    for path in paths {
        if path == name {
            return Some(path);
        }
        let step = path
            .strip_suffix(name)
            .and_then(|dir| dir.strip_suffix('/'))
            .and_then(|dir| dir.strip_prefix("checkpoint-"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(step) = step
            && latest.is_none_or(|(best, _)| step > best)
        {
            latest = Some((step, path));
        }
    }
    latest.map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const ADAPTER: &str = r#"{
        "base_model_name_or_path": "meta-llama/Llama-3.2-1B",
        "peft_type": "LORA", "task_type": "CAUSAL_LM",
        "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
        "target_modules": ["q_proj", "v_proj"], "bias": "none"
    }"#;
    const TRAINER: &str = r#"{
        "global_step": 750, "epoch": 3.0,
        "log_history": [
            {"loss": 2.1, "step": 250}, {"loss": 1.25, "step": 500},
            {"eval_loss": 1.4, "step": 500}, {"loss": 0.875, "step": 750},
            {"train_loss": 1.3, "step": 750}
        ]
    }"#;

    #[test]
    fn peft_and_trainer_files_fill_the_training_fields() {
        let found = read(
            Some(("adapter_config.json", ADAPTER)),
            Some(("trainer_state.json", TRAINER)),
        );
        assert_eq!(found.base_model.as_deref(), Some("meta-llama/Llama-3.2-1B"));
        assert_eq!(found.num_train_steps, Some(750));
        assert_eq!(found.final_loss, Some(0.875));
        assert_eq!(
            Value::Object(found.params),
            json!({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                   "target_modules": ["q_proj", "v_proj"]})
        );
        assert!(found.notes.is_empty());
    }

    #[test]
    fn files_that_are_not_what_they_claim_are_notes() {
        let check = |adapter: Option<&str>, trainer: Option<&str>, notes: usize| {
            let found = read(
                adapter.map(|t| ("a.json", t)),
                trainer.map(|t| ("t.json", t)),
            );
            assert_eq!(found.notes.len(), notes, "{adapter:?} {trainer:?}");
            found
        };
        assert_eq!(check(None, None, 0), Found::default());
        check(Some("[1]"), Some("{"), 2);
        let empty = check(
            Some("{}"),
            Some(r#"{"log_history": [{"eval_loss": 1}]}"#),
            0,
        );
        assert_eq!(empty, Found::default());
    }

    #[test]
    fn the_top_file_or_the_latest_checkpoint_is_read() {
        let paths = [
            "checkpoint-500/trainer_state.json",
            "checkpoint-1000/trainer_state.json",
            "checkpoint-x/trainer_state.json",
            "other/trainer_state.json",
        ];
        assert_eq!(
            pick(paths, "trainer_state.json"),
            Some("checkpoint-1000/trainer_state.json")
        );
        let with_top = ["checkpoint-9/trainer_state.json", "trainer_state.json"];
        assert_eq!(
            pick(with_top, "trainer_state.json"),
            Some("trainer_state.json")
        );
        assert_eq!(pick(["a/b.json"], "trainer_state.json"), None);
    }
}
