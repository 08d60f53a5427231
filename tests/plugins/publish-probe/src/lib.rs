//! A 0.2.0 test plugin that does what its options say, one step after
//! another, and answers with each step's outcome in its details
//! (`{"steps": [{"ok": …} | {"err": "…"}]}`), so tests can try the
//! publish interface from inside the sandbox: well-behaved puts, and what
//! a hostile deployer would try (ungranted targets, escaping keys, huge
//! puts, reading credentials through the environment, the filesystem or
//! the network, setting its own credential header).
//!
//! Options: `{"steps": [STEP, …], "fail": bool}`, where a STEP is one of
//! `{"open": NAME}`, `{"put_model_file": PATH, "key": KEY}`,
//! `{"put_model_files": [[PATH, KEY], …]}` (its outcome: one `{"ok": …}`
//! or `{"err": "…"}` per pair),
//! `{"put_out_file": PATH, "key": KEY, "write": TEXT?}`,
//! `{"put_bytes": KEY, "size": N?, "text": TEXT?}`, `{"stat": KEY}`,
//! `{"url": KEY}`, `{"env": NAME}` (or `{"env": "*"}`: every variable),
//! `{"read": PATH}`, `{"http": URL, "method": M?, "headers": {…}?,
//! "body_size": N?}` (its outcome: the answer's status, headers and body),
//! `{"flood": N, "key": PREFIX}` (N zero-byte puts at `PREFIX-i`; its
//! outcome: how many landed and the first refusal).
//! The put, stat and url steps use the target opened last. With `fail`,
//! the deployment fails after its steps (what it put stays recorded).

use serde_json::{Map, Value, json};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

use berth::deployer::publish::Target;
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};

wit_bindgen::generate!({
    world: "deployer",
    path: "../../../wit",
    generate_all,
});

struct Probe;

impl Guest for Probe {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description: "Tries each step of its options and reports the outcomes".into(),
            options_schema: Some(
                r#"{"type":"object","properties":{"target":{"type":"string"},"steps":{"type":"array"},"fail":{"type":"boolean"}}}"#
                    .into(),
            ),
        }
    }

    fn check_options(options_json: String) -> Result<(), String> {
        let options: Value = serde_json::from_str(&options_json).map_err(|e| e.to_string())?;
        match options.get("steps") {
            None | Some(Value::Array(_)) => Ok(()),
            Some(_) => Err("steps must be a list".into()),
        }
    }

    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        let options: Value =
            serde_json::from_str(&request.options_json).map_err(|e| e.to_string())?;
        let mut target: Option<Target> = match options.get("target").and_then(Value::as_str) {
            Some(name) => Some(Target::open(name)?),
            None => None,
        };
        let mut steps = Vec::new();
        for step in options["steps"].as_array().cloned().unwrap_or_default() {
            let outcome = run(&step, &mut target);
            steps.push(match outcome {
                Ok(value) => json!({ "ok": value }),
                Err(e) => json!({ "err": e }),
            });
        }
        if options["fail"].as_bool() == Some(true) {
            return Err(format!("failing as asked after {} steps", steps.len()));
        }
        let mut details = Map::new();
        details.insert("steps".into(), Value::Array(steps));
        Ok(DeployResult {
            ref_: "probe".into(),
            details_json: Value::Object(details).to_string(),
        })
    }
}

fn text(step: &Value, field: &str) -> String {
    step[field].as_str().unwrap_or_default().to_string()
}

fn run(step: &Value, target: &mut Option<Target>) -> Result<Value, String> {
    let opened = |target: &Option<Target>| -> Result<(), String> {
        target
            .as_ref()
            .map(|_| ())
            .ok_or_else(|| "no target opened".to_string())
    };
    if let Some(name) = step["open"].as_str() {
        let opened = Target::open(name)?;
        let name = opened.name();
        *target = Some(opened);
        return Ok(json!(name));
    }
    if let Some(path) = step["put_model_file"].as_str() {
        opened(target)?;
        let receipt = target
            .as_ref()
            .unwrap()
            .put_model_file(path, &text(step, "key"))?;
        return Ok(receipt_json(&receipt));
    }
    if let Some(pairs) = step["put_model_files"].as_array() {
        opened(target)?;
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|pair| {
                let part = |i: usize| pair[i].as_str().unwrap_or_default().to_string();
                (part(0), part(1))
            })
            .collect();
        let puts = target.as_ref().unwrap().put_model_files(&pairs);
        return Ok(Value::Array(
            puts.iter()
                .map(|put| match put {
                    Ok(receipt) => json!({ "ok": receipt_json(receipt) }),
                    Err(e) => json!({ "err": e }),
                })
                .collect(),
        ));
    }
    if let Some(path) = step["put_out_file"].as_str() {
        opened(target)?;
        if let Some(write) = step["write"].as_str() {
            let file = format!("/out/{}", path.trim_start_matches("/out/"));
            if let Some(parent) = std::path::Path::new(&file).parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            std::fs::write(&file, write).map_err(|e| e.to_string())?;
        }
        let receipt = target
            .as_ref()
            .unwrap()
            .put_out_file(path, &text(step, "key"))?;
        return Ok(receipt_json(&receipt));
    }
    if let Some(key) = step["put_bytes"].as_str() {
        opened(target)?;
        let bytes = match step["size"].as_u64() {
            Some(size) => vec![b'x'; size as usize],
            None => text(step, "text").into_bytes(),
        };
        let receipt =
            target
                .as_ref()
                .unwrap()
                .put_bytes(key, &bytes, &text(step, "content_type"))?;
        return Ok(receipt_json(&receipt));
    }
    if let Some(key) = step["stat"].as_str() {
        opened(target)?;
        let info = target.as_ref().unwrap().stat(key)?;
        return Ok(info.map_or(Value::Null, |i| json!({ "bytes": i.bytes, "etag": i.etag })));
    }
    if let Some(key) = step["url"].as_str() {
        opened(target)?;
        return Ok(json!(target.as_ref().unwrap().url(key)?));
    }
    if let Some(name) = step["env"].as_str() {
        if name == "*" {
            let all: Map<String, Value> = std::env::vars().map(|(k, v)| (k, json!(v))).collect();
            return Ok(Value::Object(all));
        }
        return std::env::var(name)
            .map(|v| json!(v))
            .map_err(|e| e.to_string());
    }
    if let Some(path) = step["read"].as_str() {
        return std::fs::read_to_string(path)
            .map(|t| json!(t))
            .map_err(|e| e.to_string());
    }
    if let Some(url) = step["http"].as_str() {
        let size = step["body_size"].as_u64().unwrap_or(0);
        return http(
            url,
            &text(step, "method"),
            step["headers"].as_object(),
            size,
        );
    }
    if let Some(count) = step["flood"].as_u64() {
        opened(target)?;
        let target = target.as_ref().unwrap();
        let prefix = text(step, "key");
        let mut landed = 0;
        for i in 0..count {
            match target.put_bytes(&format!("{prefix}-{i}"), &[], "") {
                Ok(_) => landed += 1,
                Err(e) => return Ok(json!({ "landed": landed, "refused": e })),
            }
        }
        return Ok(json!({ "landed": landed }));
    }
    Err(format!("unknown step {step}"))
}

fn receipt_json(r: &berth::deployer::publish::Receipt) -> Value {
    json!({ "url": r.url, "bytes": r.bytes, "sha256": r.sha256, "etag": r.etag })
}

/// One request with a body of `size` bytes; the answer's status,
/// headers and body.
fn http(
    url: &str,
    method: &str,
    headers: Option<&Map<String, Value>>,
    size: u64,
) -> Result<Value, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url}: no scheme"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let fields = Fields::new();
    for (name, value) in headers.into_iter().flatten() {
        fields
            .append(name, value.as_str().unwrap_or_default().as_bytes())
            .map_err(|e| format!("header {name}: {e:?}"))?;
    }
    let request = OutgoingRequest::new(fields);
    let method = match method {
        "" | "GET" => Method::Get,
        "PUT" => Method::Put,
        "POST" => Method::Post,
        "DELETE" => Method::Delete,
        "HEAD" => Method::Head,
        other => Method::Other(other.into()),
    };
    request.set_method(&method).map_err(|_| "method")?;
    request
        .set_scheme(Some(&match scheme {
            "http" => Scheme::Http,
            _ => Scheme::Https,
        }))
        .map_err(|_| "scheme")?;
    request
        .set_authority(Some(authority))
        .map_err(|_| "authority")?;
    request
        .set_path_with_query(Some(path))
        .map_err(|_| "path")?;
    let body = request.body().map_err(|_| "body")?;
    let response = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    {
        let stream = body.write().map_err(|_| "body stream")?;
        // blocking-write-and-flush takes at most 4096 bytes a call.
        let chunk = vec![b'x'; 4096];
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if let Err(e) = stream.blocking_write_and_flush(&chunk[..n]) {
                return Err(format!("writing the body: {e:?}"));
            }
            left -= n as u64;
        }
    }
    OutgoingBody::finish(body, None).map_err(|e| format!("{e:?}"))?;
    response.subscribe().block();
    let response = response
        .get()
        .ok_or("no response")?
        .map_err(|_| "response taken")?
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    let mut answered = Map::new();
    for (name, value) in response.headers().entries() {
        answered.insert(name, json!(String::from_utf8_lossy(&value)));
    }
    let incoming = response.consume().map_err(|_| "consume")?;
    let stream = incoming.stream().map_err(|_| "stream")?;
    let mut text = Vec::new();
    while let Ok(chunk) = stream.blocking_read(64 * 1024) {
        text.extend_from_slice(&chunk);
    }
    Ok(json!({
        "status": status,
        "headers": answered,
        "body": String::from_utf8_lossy(&text),
    }))
}

export!(Probe);
