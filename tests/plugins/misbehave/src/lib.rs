//! `misbehave`: a deployer for berth's sandbox tests that does whatever bad
//! thing its `mode` option asks for.

use std::fs::{self, File, OpenOptions};
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value, json};

use berth::deployer::host::{self, Level};
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};

wit_bindgen::generate!({
    world: "deployer",
    path: "../../../wit/0.1.0",
    generate_all,
});

const MODES: &[&str] = &[
    "ok",
    "write-model",
    "read-outside",
    "loop",
    "memory-bomb",
    "panic",
    "bad-details",
    "invalid-json-details",
    "sleep",
    "env",
    "stdio",
    "error",
    "read",
    "read-later",
    "huge-ref",
    "huge-error",
    "huge-details",
    "deep-details",
    "long-log-line",
    "long-note",
    "log-flood",
    "forged-log",
    "stack-overflow",
    "call-stack-overflow",
    "exit",
    "lone-surrogate",
    "fill-out",
];

const DEFAULT_SLEEP_MS: u64 = 1000;
/// What the `huge-*` and `long-*` modes return or write by default.
const DEFAULT_BYTES: usize = 10 << 20;
const DEFAULT_LINES: u64 = 100_000;
const DEFAULT_DEPTH: usize = 10_000;
const DEFAULT_STATUS: u8 = 3;

struct Misbehave;

impl Guest for Misbehave {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description: "Misbehaves on request (berth's sandbox tests)".to_string(),
            options_schema: None,
        }
    }

    fn check_options(options_json: String) -> Result<(), String> {
        Options::parse(&options_json).map(|_| ())
    }

    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        let options = Options::parse(&request.options_json)?;
        match options.mode.as_str() {
            "write-model" => write_model(&request),
            "read-outside" => Ok(details("read-outside", &read_outside())),
            "loop" => spin(),
            "memory-bomb" => hoard_memory(),
            "panic" => panic!("deliberate panic from the misbehave plugin"),
            "bad-details" => Ok(DeployResult {
                ref_: "bad-details".to_string(),
                details_json: "[1, 2, 3]".to_string(),
            }),
            "invalid-json-details" => Ok(DeployResult {
                ref_: "invalid-json-details".to_string(),
                details_json: "{not json".to_string(),
            }),
            "sleep" => {
                std::thread::sleep(Duration::from_millis(options.sleep_ms));
                ok(&request)
            }
            "env" => {
                let env: Map<String, Value> = std::env::vars()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                Ok(details("env", &json!({ "env": env })))
            }
            "stdio" => {
                println!("hello from stdout");
                eprintln!("hello from stderr");
                for level in [Level::Debug, Level::Info, Level::Warn, Level::Error] {
                    host::log(level, &format!("hello from host::log at {level:?}"));
                }
                host::progress(1, 2, "half");
                ok(&request)
            }
            "error" => Err("the deployer said no".to_string()),
            "read" => read_everything(&request),
            "read-later" => {
                std::thread::sleep(Duration::from_millis(options.sleep_ms));
                read_and_sum(&request)
            }
            "huge-ref" => Ok(DeployResult {
                ref_: "r".repeat(options.bytes),
                details_json: String::new(),
            }),
            "huge-error" => Err("e".repeat(options.bytes)),
            "huge-details" => Ok(details(
                "huge-details",
                &json!({ "blob": "d".repeat(options.bytes) }),
            )),
            "deep-details" => Ok(DeployResult {
                ref_: "deep-details".to_string(),
                details_json: format!(
                    "{{\"deep\": {}{}}}",
                    "[".repeat(options.depth),
                    "]".repeat(options.depth)
                ),
            }),
            "long-log-line" => {
                host::log(Level::Info, &"l".repeat(options.bytes));
                println!("{}", "o".repeat(options.bytes));
                ok(&request)
            }
            "long-note" => {
                host::progress(1, 2, &"n".repeat(options.bytes));
                ok(&request)
            }
            "log-flood" => {
                for line in 0..options.lines {
                    match line % 3 {
                        0 => println!("flood line {line} on stdout"),
                        1 => eprintln!("flood line {line} on stderr"),
                        _ => host::log(Level::Info, &format!("flood line {line} through log")),
                    }
                }
                ok(&request)
            }
            "forged-log" => {
                host::log(
                    Level::Info,
                    "innocent\n2026-12-01T00:00:00.000000Z ERROR berth: forged line\r\x1b[2Kalso forged",
                );
                ok(&request)
            }
            "stack-overflow" => Ok(details(
                "stack-overflow",
                &json!({ "sum": recurse_on_shadow_stack(u64::MAX) }),
            )),
            "call-stack-overflow" => Ok(details(
                "call-stack-overflow",
                &json!({ "sum": recurse_on_call_stack(u64::MAX) }),
            )),
            "exit" => std::process::exit(i32::from(options.status)),
            // JSON text may hold a lone surrogate escape (JavaScript's
            // JSON.stringify writes one for a lone surrogate in a string);
            // it encodes no character.
            "lone-surrogate" => Ok(DeployResult {
                ref_: "lone-surrogate".to_string(),
                details_json: r#"{"name": "half \ud83d of an emoji"}"#.to_string(),
            }),
            "fill-out" => fill_out(&request, options.bytes as u64),
            _ => ok(&request),
        }
    }
}

/// Writes `bytes` of zeros into `/out/fill`, a MiB at a time, as fast as it
/// can: the out-dir quota's test and its overshoot's measurement.
fn fill_out(request: &DeployRequest, bytes: u64) -> Result<DeployResult, String> {
    use std::io::Write;
    let path = Path::new(&request.out_dir).join("fill");
    let mut file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    while written < bytes {
        let n = chunk
            .len()
            .min(usize::try_from(bytes - written).unwrap_or(usize::MAX));
        file.write_all(&chunk[..n])
            .map_err(|e| format!("writing {} after {written} bytes: {e}", path.display()))?;
        written += n as u64;
    }
    Ok(details("fill-out", &json!({ "written": written })))
}

/// Reads every model file through the preopen and says how fast: the
/// guest-side half of the read-throughput measurement.
fn read_everything(request: &DeployRequest) -> Result<DeployResult, String> {
    use std::io::Read;
    let started = std::time::Instant::now();
    let mut buffer = vec![0u8; 1 << 20];
    let mut total: u64 = 0;
    for file in &request.model.files {
        let path = Path::new(&request.dir).join(&file.path);
        let mut reader = File::open(&path).map_err(|e| format!("{}: {e}", file.path))?;
        loop {
            let n = reader
                .read(&mut buffer)
                .map_err(|e| format!("{}: {e}", file.path))?;
            if n == 0 {
                break;
            }
            total += black_box(n) as u64;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(details(
        "read",
        &json!({ "bytes": total, "seconds": seconds, "mb_per_s": total as f64 / seconds / 1e6 }),
    ))
}

/// Every byte of the model read, in the order of its files, and their
/// 64-bit FNV-1a: what a test compares with the bytes it registered.
fn read_and_sum(request: &DeployRequest) -> Result<DeployResult, String> {
    let mut sum: u64 = 0xcbf2_9ce4_8422_2325;
    let mut total: u64 = 0;
    for file in &request.model.files {
        let path = Path::new(&request.dir).join(&file.path);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", file.path))?;
        for byte in &bytes {
            sum = (sum ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        total += bytes.len() as u64;
    }
    Ok(details(
        "read-later",
        &json!({ "bytes": total, "fnv1a": format!("{sum:016x}") }),
    ))
}

struct Options {
    mode: String,
    sleep_ms: u64,
    bytes: usize,
    lines: u64,
    depth: usize,
    status: u8,
}

impl Options {
    fn parse(options_json: &str) -> Result<Self, String> {
        let options: Value = serde_json::from_str(options_json)
            .map_err(|e| format!("options are not valid JSON: {e}"))?;
        let Value::Object(options) = options else {
            return Err("options must be a JSON object".to_string());
        };
        let mode = match options.get("mode") {
            None => "ok",
            Some(Value::String(mode)) if MODES.contains(&mode.as_str()) => mode,
            Some(other) => {
                return Err(format!(
                    "unknown mode {other}: expected one of {}",
                    MODES.join(", ")
                ));
            }
        };
        let number = |name: &str, default: u64| match options.get(name) {
            None => Ok(default),
            Some(n) => n.as_u64().ok_or_else(|| {
                format!("option \"{name}\" must be a non-negative integer, not {n}")
            }),
        };
        let small = |name: &str, n: u64| {
            usize::try_from(n).map_err(|_| format!("option \"{name}\" is too large: {n}"))
        };
        let status = number("status", DEFAULT_STATUS.into())?;
        Ok(Self {
            mode: mode.to_string(),
            sleep_ms: number("ms", DEFAULT_SLEEP_MS)?,
            bytes: small("bytes", number("bytes", DEFAULT_BYTES as u64)?)?,
            lines: number("lines", DEFAULT_LINES)?,
            depth: small("depth", number("depth", DEFAULT_DEPTH as u64)?)?,
            status: u8::try_from(status)
                .map_err(|_| format!("option \"status\" must be at most 255, not {status}"))?,
        })
    }
}

fn details(reference: &str, details: &Value) -> DeployResult {
    DeployResult {
        ref_: reference.to_string(),
        details_json: details.to_string(),
    }
}

/// The well-behaved deployment the other modes fall back to.
fn ok(request: &DeployRequest) -> Result<DeployResult, String> {
    let path = Path::new(&request.out_dir).join("ok.txt");
    fs::write(&path, "ok").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(details(
        "ok",
        &json!({ "files": request.model.files.len(), "deploy_id": request.deploy_id }),
    ))
}

/// Succeeds only if the read-only model directory refused both writes.
fn write_model(request: &DeployRequest) -> Result<DeployResult, String> {
    let dir = Path::new(&request.dir);
    let create = File::create(dir.join("intruder.txt"));
    let append = match request.model.files.first() {
        Some(file) => OpenOptions::new()
            .append(true)
            .open(dir.join(&file.path))
            .map(|_| ()),
        None => return Err("write-model needs a model with at least one file".to_string()),
    };
    match (create, append) {
        (Err(create), Err(append)) => Ok(details(
            "write-model",
            &json!({ "create_error": create.to_string(), "append_error": append.to_string() }),
        )),
        _ => Err("sandbox breach: wrote into the model directory".to_string()),
    }
}

/// Reports what each escape attempt got; the host test judges the result.
fn read_outside() -> Value {
    let paths = [
        "/etc/passwd",
        "/model/../etc/passwd",
        "/out/../etc/passwd",
        "../../etc/hostname",
    ];
    let results: Map<String, Value> = paths
        .iter()
        .map(|path| {
            let outcome = match fs::read(path) {
                Ok(bytes) => format!("OK:{}", bytes.len()),
                Err(e) => e.to_string(),
            };
            (path.to_string(), Value::String(outcome))
        })
        .collect();
    let root_entries: Vec<Value> = match fs::read_dir("/") {
        Ok(entries) => entries
            .map(|entry| match entry {
                Ok(entry) => entry.file_name().to_string_lossy().into_owned(),
                Err(e) => format!("error: {e}"),
            })
            .map(Value::String)
            .collect(),
        Err(e) => vec![Value::String(format!("error: {e}"))],
    };
    json!({ "results": results, "root_entries": root_entries })
}

/// Burns CPU without ever calling the host, so only an epoch deadline stops it.
fn spin() -> ! {
    let mut counter = 0u64;
    loop {
        // black_box keeps the optimiser from proving the loop side-effect free.
        counter = black_box(counter.wrapping_add(1));
    }
}

/// Recursion whose frames hold an array the optimiser cannot drop: they
/// live on the shadow stack in linear memory, which runs out (below address
/// 0, as Rust lays it out) long before the engine's call stack does.
fn recurse_on_shadow_stack(depth: u64) -> u64 {
    let frame = black_box([depth as u8; 4096]);
    if depth == 0 {
        return 0;
    }
    let below = recurse_on_shadow_stack(black_box(depth - 1));
    below.wrapping_add(u64::from(black_box(&frame)[usize::from(frame[0])]))
}

/// Recursion with nothing in linear memory: only the engine's call stack
/// grows, until wasmtime's own limit stops it.
fn recurse_on_call_stack(depth: u64) -> u64 {
    if depth == 0 {
        return 0;
    }
    black_box(recurse_on_call_stack(black_box(depth - 1))).wrapping_add(1)
}

/// Grows memory until the host's limit ends the guest.
fn hoard_memory() -> ! {
    const CHUNK: usize = 1 << 20;
    const PAGE: usize = 4096;
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; CHUNK];
        // Touch every page so the memory is really committed, not just reserved.
        for offset in (0..CHUNK).step_by(PAGE) {
            chunk[offset] = 1;
        }
        hoard.push(black_box(chunk));
    }
}

export!(Misbehave);
