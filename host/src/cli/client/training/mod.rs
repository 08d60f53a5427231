//! What a training run's own files say about the model: PEFT's
//! `adapter_config.json` (the base model and the adapter's settings),
//! Hugging Face Trainer's `trainer_state.json` (the global step, the last
//! logged loss), `config.json` (the architecture and dtype) and the
//! safetensors headers (the parameter count, `weights`), and which files
//! are pickles (`pickles`). `read` is pure,
//! handed the files' text; `of_folder` reads them. A file that is not what
//! it should be is a note, never a failure.

mod pickles;
mod weights;

use std::path::Path;

use serde_json::{Map, Value};

use crate::cli::folder::Listed;

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

/// The PEFT settings kept as `params`, under their own names: what a
/// server loading the adapter (vLLM, TGI) decides by.
const ADAPTER_PARAMS: [&str; 11] = [
    "peft_type",
    "task_type",
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "use_dora",
    "use_rslora",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
];

/// A run's files, each as `(path shown in notes, text)`, or `None` when
/// the folder has none.
#[derive(Debug, Default, Clone, Copy)]
pub struct Texts<'a> {
    pub adapter: Option<(&'a str, &'a str)>,
    pub trainer: Option<(&'a str, &'a str)>,
    pub config: Option<(&'a str, &'a str)>,
}

/// Reads `adapter_config.json`, `trainer_state.json` and `config.json`.
pub fn read(texts: Texts) -> Found {
    let mut found = Found::default();
    if let Some((path, text)) = texts.adapter {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(config)) => {
                found.base_model = config
                    .get("base_model_name_or_path")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string);
                if let Some(base) = found.base_model.as_deref().filter(|b| is_local_path(b)) {
                    found
                        .params
                        .insert("base_model_is_local_path".into(), true.into());
                    found.notes.push(format!(
                        "{path} names its base model by a path on the training machine ({base}): \
                         a server cannot load it from there; give its hub name with --base-model"
                    ));
                }
                for key in ADAPTER_PARAMS {
                    // PEFT writes `{}` and `null` for settings not used.
                    if let Some(value) = config.get(key).filter(|v| !is_empty(v)) {
                        found.params.insert(key.to_string(), value.clone());
                    }
                }
            }
            _ => found.notes.push(format!(
                "{path} is not a JSON object: the base model and LoRA settings are not read from it"
            )),
        }
    }
    if let Some((path, text)) = texts.config {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(config)) => {
                let architectures: Vec<&str> = config
                    .get("architectures")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if !architectures.is_empty() {
                    found
                        .params
                        .insert("architecture".into(), architectures.join(", ").into());
                }
                // transformers wrote `torch_dtype` until 4.56, `dtype` since.
                let dtype = ["dtype", "torch_dtype"]
                    .iter()
                    .find_map(|key| config.get(*key).and_then(Value::as_str));
                if let Some(dtype) = dtype {
                    found.params.insert("dtype".into(), dtype.into());
                }
            }
            _ => found.notes.push(format!(
                "{path} is not a JSON object: the architecture and dtype are not read from it"
            )),
        }
    }
    if let Some((path, text)) = texts.trainer {
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

/// What the files of `dir` say: the run's records found among `every`
/// file listed (a Trainer run's last trainer_state.json is often in a
/// checkpoint left out), the model's own among the `chosen`.
pub fn of_folder(dir: &Path, every: &[Listed], chosen: &[Listed]) -> Found {
    let adapter = read_text(dir, every, "adapter_config.json");
    let trainer = read_text(dir, every, "trainer_state.json");
    let config = read_text(dir, chosen, "config.json");
    fn text(read: &Option<(String, String)>) -> Option<(&str, &str)> {
        read.as_ref().map(|(p, t)| (p.as_str(), t.as_str()))
    }
    let mut found = read(Texts {
        adapter: text(&adapter),
        trainer: text(&trainer),
        config: text(&config),
    });
    let counted = weights::parameters(dir, chosen);
    found.notes.extend(counted.notes);
    found.notes.extend(pickles::notes(dir, chosen));
    if let Some(count) = counted.parameters {
        found.params.insert("parameter_count".into(), count.into());
    }
    found
}

/// The text of the folder's `name` file (`pick`), if it has one and it
/// can be read; a small file, read whole.
fn read_text(dir: &Path, files: &[Listed], name: &str) -> Option<(String, String)> {
    let path = pick(files.iter().map(|f| f.path.as_str()), name)?;
    match std::fs::read_to_string(dir.join(path)) {
        Ok(text) => Some((path.to_string(), text)),
        Err(e) => {
            eprintln!("note: {path} cannot be read ({e}): its fields are not filled from it");
            None
        }
    }
}

/// A path on the training machine rather than a hub name (`org/name`).
fn is_local_path(name: &str) -> bool {
    name.starts_with(['/', '.', '~', '\\']) || name.contains('\\') || name.get(1..3) == Some(":/")
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
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
        "target_modules": ["q_proj", "v_proj"], "bias": "none",
        "use_dora": false, "use_rslora": true, "modules_to_save": ["lm_head"],
        "rank_pattern": {"q_proj": 8}, "alpha_pattern": {}, "layers_pattern": null
    }"#;
    const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}"#;
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
        let found = read(Texts {
            adapter: Some(("adapter_config.json", ADAPTER)),
            trainer: Some(("trainer_state.json", TRAINER)),
            config: Some(("config.json", CONFIG)),
        });
        assert_eq!(found.base_model.as_deref(), Some("meta-llama/Llama-3.2-1B"));
        assert_eq!(found.num_train_steps, Some(750));
        assert_eq!(found.final_loss, Some(0.875));
        assert_eq!(
            Value::Object(found.params),
            json!({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32,
                   "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"],
                   "use_dora": false, "use_rslora": true, "modules_to_save": ["lm_head"],
                   "rank_pattern": {"q_proj": 8},
                   "architecture": "LlamaForCausalLM", "dtype": "bfloat16"})
        );
        assert!(found.notes.is_empty());
    }

    #[test]
    fn files_that_are_not_what_they_claim_are_notes() {
        let check = |adapter: Option<&str>, trainer: Option<&str>, notes: usize| {
            let found = read(Texts {
                adapter: adapter.map(|t| ("a.json", t)),
                trainer: trainer.map(|t| ("t.json", t)),
                config: None,
            });
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
    fn a_base_model_on_the_training_machine_is_flagged_and_a_newer_dtype_read() {
        let found = read(Texts {
            adapter: Some((
                "adapter_config.json",
                r#"{"base_model_name_or_path": "/home/me/llama", "r": 8}"#,
            )),
            config: Some((
                "config.json",
                r#"{"dtype": "float32", "architectures": []}"#,
            )),
            ..Texts::default()
        });
        assert_eq!(found.base_model.as_deref(), Some("/home/me/llama"));
        assert_eq!(
            Value::Object(found.params),
            json!({"base_model_is_local_path": true, "r": 8, "dtype": "float32"})
        );
        assert_eq!(found.notes.len(), 1);
        assert!(
            found.notes[0].contains("--base-model"),
            "{}",
            found.notes[0]
        );
        for hub in ["meta-llama/Llama-3.2-1B", "gpt2"] {
            assert!(!is_local_path(hub), "{hub}");
        }
        for local in ["./out", "../base", "~/m", "C:/models/x", "C:\\m"] {
            assert!(is_local_path(local), "{local}");
        }
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
