//! `berth models register` on what real libraries wrote: the folders of
//! `tests/data/training/` (`scripts/make-training-data`: a tiny Llama
//! trained by transformers' Trainer with a peft LoRA, its merge, the base
//! in bf16 shards, a Hugging Face cache of the merge). What the default
//! keeps, what the files say (PEFT, Trainer, config.json, the safetensors
//! headers), unknown left unknown through the record, the CLI and the
//! card, and the source checked before the model is stored.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::cli::{expect_success, lossy, path};
use crate::support::server::{Backend, Berth};
use crate::support::{on_both_backends, plugins};

on_both_backends!(a_real_lora_run_registers_its_adapter_and_says_what_it_does_not_know);

fn data(folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/training")
        .join(folder)
}

/// `folder` of the test data copied (links as links) into a temp dir.
fn copied(folder: &str) -> (TempDir, PathBuf) {
    let parent = TempDir::new().unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(data(folder))
        .arg(parent.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let name = Path::new(folder).file_name().unwrap();
    let dir = parent.path().join(name);
    (parent, dir)
}

use crate::support::cli::client as berth;

/// The registration body `register --dry-run` prints for `dir`.
fn dry_run(dir: &Path, extra: &[&str]) -> (Value, String) {
    let mut args = vec!["models", "register", path(dir), "--dry-run"];
    args.extend_from_slice(extra);
    let output = berth("http://127.0.0.1:9", &args);
    let body = serde_json::from_str(&expect_success(&output)).unwrap();
    (body, lossy(&output.stderr))
}

fn paths(body: &Value) -> Vec<&str> {
    body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect()
}

/// The elements of every tensor in a safetensors file, read the plain way:
/// the test's own reading, not berth's.
fn tensor_elements(file: &Path) -> u64 {
    let bytes = std::fs::read(file).unwrap();
    let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(&bytes[8..8 + length]).unwrap();
    header
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(_, t)| {
            t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product::<u64>()
        })
        .sum()
}

fn json_file(file: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

async fn a_real_lora_run_registers_its_adapter_and_says_what_it_does_not_know(backend: Backend) {
    let (_parent, dir) = copied("lora-run");
    let server = Berth::options(backend)
        .plugin("model-card", plugins::example("model-card"))
        .start()
        .await;
    let registered = berth(&server.url, &["models", "register", path(&dir)]);
    let said = lossy(&registered.stderr);
    let out = expect_success(&registered);
    assert!(out.starts_with("registered model "), "{out}");
    // The run's state is left out and said so; serving needs none of it.
    let line = said
        .lines()
        .find(|l| l.starts_with("left out a training run's state, 31 file(s), "))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        line.contains(
            ": checkpoint-2/, checkpoint-4/, checkpoint-6/, training_args.bin; serving needs none of it."
        ),
        "{line}"
    );
    let (_, listed) = server.get("/v1/models").await;
    let model = &listed["models"][0];
    let mut kept = paths(model);
    kept.sort_unstable();
    assert_eq!(
        kept,
        [
            "README.md",
            "adapter_config.json",
            "adapter_model.safetensors",
            "all_results.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "train_results.json",
            "trainer_state.json",
        ]
    );
    let adapter = json_file(&dir.join("adapter_config.json"));
    let state = json_file(&dir.join("trainer_state.json"));
    let last_loss = state["log_history"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find_map(|entry| entry["loss"].as_f64())
        .unwrap();
    assert_eq!(model["base_model"], "tiny/llama-base");
    assert_eq!(model["num_train_steps"], state["global_step"]);
    assert_eq!(model["final_loss"], last_loss);
    // Nobody said these: unknown, not 0 or "".
    for unknown in ["dataset", "num_examples", "model_size"] {
        assert_eq!(model[unknown], Value::Null, "{unknown}: {model}");
    }
    let params = &model["params"];
    for kept in [
        "peft_type",
        "task_type",
        "r",
        "lora_alpha",
        "target_modules",
        "use_dora",
        "use_rslora",
        "modules_to_save",
    ] {
        assert_eq!(params[kept], adapter[kept], "{kept}: {params}");
    }
    assert_eq!(params["task_type"], "CAUSAL_LM");
    assert_eq!(params["modules_to_save"], json!(["lm_head"]));
    assert_eq!(
        params["parameter_count"],
        tensor_elements(&dir.join("adapter_model.safetensors"))
    );
    let id = model["id"].as_i64().unwrap();

    // The CLI and the card say unknown where nothing was said.
    let shown = expect_success(&berth(&server.url, &["models", "show", &id.to_string()]));
    for line in ["dataset", "examples", "model size"] {
        assert!(
            shown
                .lines()
                .any(|l| l.starts_with(line) && l.trim_end().ends_with("unknown")),
            "{line}: {shown}"
        );
    }
    let (status, deployment) = server.deploy(id, "model-card", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let card = std::fs::read_to_string(
        Path::new(deployment["out_dir"].as_str().unwrap()).join("README.md"),
    )
    .unwrap();
    for row in [
        "| Dataset | unknown |",
        "| Examples | unknown |",
        "| Steps | 6 |",
        "| Task type | CAUSAL_LM |",
        "| Modules saved whole | lm_head |",
    ] {
        assert!(card.contains(row), "{row}: {card}");
    }

    // Again, unchanged: the model there already.
    let again = berth(&server.url, &["models", "register", path(&dir)]);
    assert_eq!(
        expect_success(&again).trim(),
        format!(
            "already registered as model {id} (job lora-run): the same files from the same source"
        )
    );

    // A source that does not hold the files is refused before anything
    // is stored, naming the first file; --no-check-source stores it.
    let nowhere = "file:///nonexistent/run/{path}";
    let refused = berth(
        &server.url,
        &[
            "models",
            "register",
            path(&dir),
            "--job-id",
            "typo",
            "--source",
            nowhere,
        ],
    );
    assert!(!refused.status.success());
    let why = lossy(&refused.stderr);
    assert!(
        why.contains("the source does not hold the files: files[0] README.md: the source does not answer for it: cannot open the source file /nonexistent/run/README.md"),
        "{why}"
    );
    let (_, after) = server.get("/v1/models").await;
    assert_eq!(after["models"].as_array().unwrap().len(), 1, "{after}");
    let unchecked = berth(
        &server.url,
        &[
            "models",
            "register",
            path(&dir),
            "--job-id",
            "later",
            "--source",
            nowhere,
            "--no-check-source",
        ],
    );
    expect_success(&unchecked);

    // A file of another size at the source is named with both sizes.
    let (_other, elsewhere) = copied("lora-run");
    let short = elsewhere.join("tokenizer.json");
    let size = std::fs::metadata(&short).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&short)
        .unwrap()
        .set_len(size - 1)
        .unwrap();
    let source = format!("file://{}/{{path}}", path(&elsewhere));
    let refused = berth(
        &server.url,
        &[
            "models",
            "register",
            path(&dir),
            "--job-id",
            "short",
            "--source",
            &source,
        ],
    );
    assert!(!refused.status.success());
    let why = lossy(&refused.stderr);
    assert!(
        why.contains(&format!(
            "tokenizer.json: the source has {} bytes at {}, and the registration says {size}",
            size - 1,
            path(&short)
        )),
        "{why}"
    );
}

#[test]
fn merged_and_sharded_models_say_their_architecture_dtype_and_parameters() {
    let (merged, said) = dry_run(&data("merged"), &[]);
    assert!(!said.contains("parameters are not counted"), "{said}");
    let index = json_file(&data("sharded-bf16/model.safetensors.index.json"));
    let total = index["metadata"]["total_parameters"].as_u64().unwrap();
    // The merge has the base's tensors: its headers count what
    // transformers wrote as the shards' total.
    assert_eq!(merged["params"]["parameter_count"], total, "{merged}");
    assert_eq!(merged["params"]["architecture"], "LlamaForCausalLM");
    assert_eq!(merged["params"]["dtype"], "float32");
    assert_eq!(
        merged.get("base_model"),
        None,
        "no adapter says one: {merged}"
    );

    let (sharded, _) = dry_run(&data("sharded-bf16"), &[]);
    assert_eq!(sharded["params"]["parameter_count"], total);
    assert_eq!(sharded["params"]["dtype"], "bfloat16");
    assert_eq!(
        sharded["files"].as_array().unwrap().len(),
        index["weight_map"]
            .as_object()
            .unwrap()
            .values()
            .map(|shard| shard.as_str().unwrap())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            + 5,
        "the shards, the index, the configs and the tokenizer: {sharded}"
    );
}

#[test]
fn a_checkpoint_and_a_hugging_face_snapshot_register() {
    let (checkpoint, said) = dry_run(&data("lora-run"), &["--checkpoint", "last"]);
    assert_eq!(checkpoint["job_id"], "lora-run-checkpoint-6");
    let mut kept = paths(&checkpoint);
    kept.sort_unstable();
    assert_eq!(
        kept,
        [
            "README.md",
            "adapter_config.json",
            "adapter_model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "trainer_state.json",
        ],
        "{said}"
    );
    assert_eq!(checkpoint["num_train_steps"], 6);

    let snapshots = data("hf-cache/models--tiny--llama/snapshots");
    let snapshot = std::fs::read_dir(&snapshots)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let (body, said) = dry_run(&snapshot, &["--job-id", "tiny-llama"]);
    assert!(!said.contains("skipped"), "{said}");
    let files = body["files"].as_array().unwrap();
    assert_eq!(files.len(), 5, "{body}");
    for file in files {
        let bytes = std::fs::read(snapshot.join(file["path"].as_str().unwrap())).unwrap();
        assert_eq!(file["sha256"], crate::support::sha256_hex(&bytes));
    }
    assert_eq!(body["params"]["architecture"], "LlamaForCausalLM");
}

#[test]
fn a_folder_whose_name_cannot_be_a_job_id_is_refused_before_hashing() {
    let parent = TempDir::new().unwrap();
    let dir = parent.path().join("run 1 (final)");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"x").unwrap();
    let output = berth(
        "http://127.0.0.1:9",
        &["models", "register", path(&dir), "--dry-run"],
    );
    assert!(!output.status.success());
    let said = lossy(&output.stderr);
    assert!(
        said.contains("job_id \"run 1 (final)\" cannot be used as a directory name")
            && said.contains("the folder's name is the default job id: give one with --job-id"),
        "{said}"
    );
    assert!(!said.contains("hashing"), "{said}");
}
