//! The example deployers written in Python (`model-card`, componentize-py)
//! and JavaScript (`safetensors-check`, componentize-js), end to end through
//! the real server: the same contract as the Rust examples, from other
//! languages' toolchains. Each runs on both tiers of compiled code: on
//! SQLite with baseline (Winch) code, on PostgreSQL with optimized
//! (Cranelift) code.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::files::FileServer;
use crate::support::server::{Backend, Berth};
use crate::support::{assert_error, bytes, model, on_both_backends, plugins, sha256_hex};

on_both_backends!(
    model_card_writes_a_card_with_and_without_an_adapter_config,
    safetensors_check_counts_good_files_and_names_bad_ones,
    safetensors_check_follows_a_sharded_models_index,
);

/// The tier of code (and `--compiler`) each backend's run uses.
fn tier(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "baseline",
        Backend::Postgres => "optimized",
    }
}

async fn model_card_writes_a_card_with_and_without_an_adapter_config(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::bare(backend)
        .plugin("model-card", plugins::example("model-card"))
        .arg(&format!("--compiler={}", tier(backend)))
        .start()
        .await;

    let (_, deployers) = berth.get("/v1/deployers").await;
    let card = &deployers["deployers"][0];
    assert_eq!(card["name"], "model-card", "{deployers}");
    assert_eq!(card["tier"], tier(backend), "{deployers}");
    assert!(
        card["description"].as_str().unwrap().contains("model card"),
        "{card}"
    );

    let id = berth
        .register(&model(
            &files,
            "job-card-options",
            &[("a.bin", b"a".to_vec())],
        ))
        .await;
    for (options, mentions) in [
        (json!({ "titel": "x" }), "unknown option \"titel\""),
        (
            json!({ "title": 5 }),
            "option \"title\" must be a non-empty string",
        ),
        (
            json!({ "title": " " }),
            "option \"title\" must be a non-empty string",
        ),
    ] {
        assert_error(
            &berth.deploy(id, "model-card", options).await,
            StatusCode::BAD_REQUEST,
            mentions,
        );
    }
    let (_, listing) = berth.get(&format!("/v1/models/{id}/deployments")).await;
    assert_eq!(
        listing["deployments"],
        json!([]),
        "refused options record nothing"
    );

    // A LoRA adapter: the card carries the adapter config's settings.
    let contents = vec![
        (
            "adapter_config.json",
            br#"{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}"#.to_vec(),
        ),
        ("adapter_model.safetensors", bytes(11, 300_000)),
        ("tokenizer/tokenizer.json", bytes(12, 5_000)),
    ];
    let id = berth
        .register(&model(&files, "job-card-lora", &contents))
        .await;
    let (status, deployment) = berth.deploy(id, "model-card", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed");
    assert_eq!(deployment["ref"], "/out/README.md");
    let text = read_card(&deployment);
    assert_eq!(deployment["details"]["bytes"], text.len());
    assert_eq!(
        deployment["details"]["sections"],
        json!(["Model", "Training", "Training parameters", "LoRA", "Files"])
    );
    assert_eq!(
        deployment["details"]["hashed"], 0,
        "every sha256 was recorded"
    );
    assert!(
        text.starts_with("# job-card-lora adapter\n"),
        "the model's name is the title:\n{text}"
    );
    for expected in [
        "| Base model | meta-llama/Llama-3.1-8B |",
        "| Dataset | support-tickets |",
        "| Examples | 1200 |",
        "| Steps | 300 |",
        "| Final loss | 0.42 |",
        "| lr | 0.0002 |",
        "| rank | 16 |",
        "| Rank (r) | 16 |",
        "| Alpha | 32 |",
        "| Target modules | q_proj, v_proj |",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} is on the card:\n{text}"
        );
    }
    for (path, bytes) in &contents {
        assert_file_row(&text, path, bytes);
    }

    // No adapter config, no loss, one file recorded without a sha256 (the
    // card hashes it itself), and a title from the options.
    let contents = vec![
        ("model.safetensors", bytes(13, 70_000)),
        ("config.json", br#"{"layers": 2}"#.to_vec()),
    ];
    let mut registration = model(&files, "job-card-plain", &contents);
    registration["final_loss"] = Value::Null;
    registration["files"][0]
        .as_object_mut()
        .unwrap()
        .remove("sha256");
    let id = berth.register(&registration).await;
    let (status, deployment) = berth
        .deploy(id, "model-card", json!({ "title": "Support bot v2" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    let text = read_card(&deployment);
    assert!(text.starts_with("# Support bot v2\n"), "{text}");
    assert_eq!(
        deployment["details"]["sections"],
        json!(["Model", "Training", "Training parameters", "Files"])
    );
    assert_eq!(deployment["details"]["hashed"], 1);
    assert!(!text.contains("LoRA"), "{text}");
    assert!(text.contains("| Final loss | unknown |"), "{text}");
    for (path, bytes) in &contents {
        assert_file_row(&text, path, bytes);
    }
}

async fn safetensors_check_counts_good_files_and_names_bad_ones(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::bare(backend)
        .plugin("safetensors-check", plugins::example("safetensors-check"))
        .arg(&format!("--compiler={}", tier(backend)))
        .start()
        .await;
    let (_, deployers) = berth.get("/v1/deployers").await;
    assert_eq!(
        deployers["deployers"][0]["tier"],
        tier(backend),
        "{deployers}"
    );

    // Two shards, one nested, and a file that is not safetensors at all.
    let adapter = safetensors(&[
        ("lora_A", "F32", &[16, 32]),
        ("lora_B", "BF16", &[32]),
        ("norm", "F16", &[8, 8]),
    ]);
    let shard = safetensors(&[
        ("ids", "I64", &[10]),
        ("cube", "F32", &[3, 3, 3]),
        ("scalar", "F64", &[]),
    ]);
    let good = vec![
        ("adapter_config.json", br#"{"r": 16}"#.to_vec()),
        ("adapter_model.safetensors", adapter.clone()),
        ("shards/model-00001-of-00001.safetensors", shard),
    ];
    let id = berth.register(&model(&files, "job-st-good", &good)).await;

    for (options, mentions) in [
        (json!({ "mode": "strict" }), "unknown option \"mode\""),
        (
            json!({ "allowed_dtypes": ["F33"] }),
            "unknown dtype \"F33\"",
        ),
        (
            json!({ "allowed_dtypes": "F32" }),
            "must be a non-empty list of dtypes",
        ),
    ] {
        assert_error(
            &berth.deploy(id, "safetensors-check", options).await,
            StatusCode::BAD_REQUEST,
            mentions,
        );
    }

    let (status, deployment) = berth.deploy(id, "safetensors-check", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    assert_eq!(deployment["status"], "completed");
    // 16*32 + 32 + 8*8 + 10 + 27 + 1
    assert_eq!(deployment["ref"], "ok: 6 tensors, 646 parameters");
    assert_eq!(
        deployment["details"],
        json!({
            "files": 2,
            "tensors": 6,
            "dtypes": { "BF16": 1, "F16": 1, "F32": 2, "F64": 1, "I64": 1 },
            "parameters": 646,
            "data_bytes": (16 * 32 * 4 + 32 * 2 + 64 * 2) + (10 * 8 + 27 * 4 + 8),
            "per_file": {
                "adapter_model.safetensors": { "tensors": 3, "parameters": 608 },
                "shards/model-00001-of-00001.safetensors": { "tensors": 3, "parameters": 38 },
            },
        })
    );
    let (status, deployment) = berth
        .deploy(
            id,
            "safetensors-check",
            json!({ "allowed_dtypes": ["F32", "F16"] }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{deployment}");
    assert_failed_naming(
        &deployment,
        "adapter_model.safetensors",
        "tensor \"lora_B\": dtype BF16 is not among the allowed F32, F16",
    );

    // Each case: a broken adapter_model.safetensors, and what the error
    // says about it. berth checks a safetensors header when it fetches the
    // file, so one that opens as safetensors fails the fetch with berth's
    // sentence before the deployer runs; a file too short to open as one
    // is left to the deployer, which names it too.
    let cut = |keep: usize| adapter[..keep].to_vec();
    let header_length = u64::from_le_bytes(adapter[..8].try_into().unwrap()) as usize;
    let fetch = "fetching model";
    let deployer = "deployer safetensors-check";
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "cut-in-data",
            cut(adapter.len() - 100),
            fetch,
            "tensor \"norm\": data_offsets [2112, 2240] run past the end of the data region's 2140 bytes",
        ),
        (
            "cut-in-header",
            cut(8 + header_length / 2),
            fetch,
            "runs past the end of the",
        ),
        (
            "cut-in-length",
            cut(5),
            deployer,
            "too few for the 8-byte header length",
        ),
        (
            "beyond",
            edited(&adapter, |h| {
                h["norm"]["data_offsets"][1] =
                    json!(h["norm"]["data_offsets"][1].as_u64().unwrap() + 64)
            }),
            fetch,
            "tensor \"norm\": data_offsets [2112, 2304] run past the end of the data region's 2240 bytes",
        ),
        (
            "overlap",
            edited(&adapter, |h| {
                h["lora_B"]["data_offsets"] = json!([2000, 2064])
            }),
            fetch,
            "tensors \"lora_A\" and \"lora_B\" overlap",
        ),
        (
            "gap",
            edited(&adapter, |h| {
                h["lora_A"]["shape"] = json!([16, 31]);
                h["lora_A"]["data_offsets"] = json!([0, 1984]);
            }),
            fetch,
            "bytes 1984..2048 of the data region belong to no tensor",
        ),
        (
            "wrong-span",
            edited(&adapter, |h| h["norm"]["shape"] = json!([8, 9])),
            fetch,
            "dtype F16 and shape [8, 9] make 144 bytes, but data_offsets [2112, 2240] hold 128",
        ),
        (
            "no-dtype",
            edited(&adapter, |h| {
                h["norm"].as_object_mut().unwrap().remove("dtype");
            }),
            fetch,
            "tensor \"norm\": has no dtype",
        ),
        (
            "not-json",
            with_header(b"{\"norm\": {", &[]),
            fetch,
            "its header is not JSON",
        ),
    ];
    for (job, broken, by, mentions) in cases {
        let job_id = format!("job-st-{job}");
        let contents = vec![
            ("adapter_model.safetensors", broken),
            ("config.json", b"{}".to_vec()),
        ];
        let id = berth.register(&model(&files, &job_id, &contents)).await;
        let (status, deployment) = berth.deploy(id, "safetensors-check", json!({})).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{job}: {deployment}");
        assert_failed_naming(&deployment, "adapter_model.safetensors", mentions);
        let error = deployment["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(by), "{job}: said by {by}: {error}");
        let (_, stored) = berth
            .get(&format!("/v1/deployments/{}", deployment["id"]))
            .await;
        assert_eq!(stored, deployment, "{job}: the failed row is stored");
    }
}

/// A sharded model: two shards and the index that says which tensor is in
/// which; then an index that names a missing shard, one that puts a tensor
/// in the wrong shard, and a stray shard beside them, each named. The same
/// adapter in two folders is counted once.
async fn safetensors_check_follows_a_sharded_models_index(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::bare(backend)
        .plugin("safetensors-check", plugins::example("safetensors-check"))
        .arg(&format!("--compiler={}", tier(backend)))
        .start()
        .await;
    let one = safetensors(&[("a", "F32", &[4, 4]), ("b", "F32", &[4])]);
    let two = safetensors(&[("c", "BF16", &[8])]);
    let index = |map: Value| {
        json!({ "metadata": {}, "weight_map": map })
            .to_string()
            .into_bytes()
    };
    let good_index = index(json!({
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors",
    }));
    let adapter = safetensors(&[("lora_A", "F32", &[2, 2])]);
    let shards = vec![
        ("model-00001-of-00002.safetensors", one.clone()),
        ("model-00002-of-00002.safetensors", two.clone()),
        ("model.safetensors.index.json", good_index.clone()),
        ("adapter_model.safetensors", adapter.clone()),
        ("checkpoint-10/adapter_model.safetensors", adapter),
    ];
    let id = berth
        .register(&model(&files, "job-st-sharded", &shards))
        .await;
    let (status, deployment) = berth.deploy(id, "safetensors-check", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{deployment}");
    // 16 + 4 + 8, and the adapter's 4 once.
    assert_eq!(
        deployment["ref"], "ok: 4 tensors, 32 parameters",
        "{deployment}"
    );
    assert_eq!(
        deployment["details"]["per_file"]["checkpoint-10/adapter_model.safetensors"],
        json!({ "tensors": 1, "parameters": 4 })
    );

    // Each case: its name, the model's files, what the error says.
    type Case<'a> = (&'a str, Vec<(&'a str, Vec<u8>)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "missing",
            vec![
                ("model-00001-of-00002.safetensors", one.clone()),
                ("model.safetensors.index.json", good_index.clone()),
            ],
            "shard model-00002-of-00002.safetensors is missing: the index puts 1 tensors in it",
        ),
        (
            "moved",
            vec![
                ("model-00001-of-00002.safetensors", one.clone()),
                ("model-00002-of-00002.safetensors", two.clone()),
                (
                    "model.safetensors.index.json",
                    index(json!({
                        "a": "model-00001-of-00002.safetensors",
                        "b": "model-00002-of-00002.safetensors",
                        "c": "model-00002-of-00002.safetensors",
                    })),
                ),
            ],
            "model-00001-of-00002.safetensors holds tensor \"b\", which the index does not list",
        ),
        (
            "unknown",
            vec![
                ("model-00001-of-00002.safetensors", one.clone()),
                ("model-00002-of-00002.safetensors", two.clone()),
                (
                    "model.safetensors.index.json",
                    index(json!({
                        "a": "model-00001-of-00002.safetensors",
                        "b": "model-00001-of-00002.safetensors",
                        "c": "model-00002-of-00002.safetensors",
                        "d": "model-00002-of-00002.safetensors",
                    })),
                ),
            ],
            "tensor \"d\" is in model-00002-of-00002.safetensors by the index, but not in that file's header",
        ),
        (
            "stray",
            vec![
                ("model-00001-of-00002.safetensors", one.clone()),
                ("model-00002-of-00002.safetensors", two.clone()),
                ("model-00003-of-00003.safetensors", two),
                ("model.safetensors.index.json", good_index),
            ],
            "model-00003-of-00003.safetensors looks like one of its shards, but the index does not name it",
        ),
    ];
    for (job, contents, mentions) in cases {
        let id = berth
            .register(&model(&files, &format!("job-st-index-{job}"), &contents))
            .await;
        let (status, deployment) = berth.deploy(id, "safetensors-check", json!({})).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{job}: {deployment}");
        assert_failed_naming(&deployment, "model.safetensors.index.json", mentions);
    }
}

/// A valid safetensors file: `(name, dtype, shape)` per tensor, laid out in
/// the order given, with pseudo-random tensor bytes and some metadata.
fn safetensors(tensors: &[(&str, &str, &[u64])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut offset = 0;
    for (name, dtype, shape) in tensors {
        let len = shape.iter().product::<u64>() * dtype_size(dtype);
        header.insert(
            name.to_string(),
            json!({ "dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len] }),
        );
        offset += len;
    }
    with_header(
        Value::Object(header).to_string().as_bytes(),
        &bytes(offset, offset as usize),
    )
}

/// `file` with its header JSON changed by `edit` (the data left as it was).
fn edited(file: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    edit(&mut header);
    with_header(header.to_string().as_bytes(), &file[8 + n..])
}

/// The 8-byte little-endian header length, the header padded with spaces to
/// a multiple of 8 (as the format's writers do), then the data.
fn with_header(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut header = header.to_vec();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(data);
    file
}

fn dtype_size(dtype: &str) -> u64 {
    match dtype {
        "F64" | "I64" => 8,
        "F32" | "I32" => 4,
        "F16" | "BF16" => 2,
        other => panic!("no size for {other} in the test's table"),
    }
}

#[track_caller]
fn read_card(deployment: &Value) -> String {
    let out_dir = Path::new(
        deployment["out_dir"]
            .as_str()
            .expect("the deployment has an out_dir"),
    );
    std::fs::read_to_string(out_dir.join("README.md"))
        .expect("the card is in the deployment's out_dir")
}

/// The card's files table has a row for `path` with its size and sha256.
#[track_caller]
fn assert_file_row(card: &str, path: &str, bytes: &[u8]) {
    let start = format!("| `{path}` | ");
    let row = card.lines().find(|line| line.starts_with(&start));
    let row = row.unwrap_or_else(|| panic!("no row for {path} on the card:\n{card}"));
    assert!(
        row.contains(&format!(" {} bytes", bytes.len())),
        "{path}'s size: {row}"
    );
    assert!(
        row.contains(&format!("`{}`", sha256_hex(bytes))),
        "{path}'s sha256: {row}"
    );
}

#[track_caller]
fn assert_failed_naming(deployment: &Value, file: &str, mentions: &str) {
    assert_eq!(deployment["status"], "failed", "{deployment}");
    let error = deployment["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("{file}: ")),
        "the error names {file}: {error}"
    );
    assert!(
        error.contains(mentions),
        "expected {mentions:?} in {error:?}"
    );
}
