//! The `http-publish` deployer: puts every file of a model on an HTTP mirror
//! through a publishing target, at `{prefix}/{job_id}/deploy-{deploy_id}/{path}`
//! under the target's URL; with the option `notify`, it then tells the
//! mirror the deployment is whole with its own `POST …/done`.
//!
//! It holds no token. The host streams each file with the target's headers
//! (its credentials) and checks it at the mirror; the `POST` goes to a URL
//! under the target, so the host adds the same headers as it sends it.

use serde_json::{Map, Value, json};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};

use berth::deployer::host::{self, Level};
use berth::deployer::publish::Target;
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};

wit_bindgen::generate!({
    world: "deployer",
    path: "../../wit",
    // The world imports wasi:filesystem explicitly for languages without a file
    // API; this plugin reads no file itself, so those bindings go unused.
    generate_all,
});

const OPTIONS_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "target": {
      "type": "string",
      "minLength": 1,
      "description": "the http(s) publishing target to put the model on, by name; it may be left out when the deployer is granted exactly one"
    },
    "prefix": {
      "type": "string",
      "default": "",
      "description": "a key prefix under the target (a/b): files go to {prefix}/{job_id}/deploy-{deploy_id}/{path}"
    },
    "notify": {
      "type": "boolean",
      "default": false,
      "description": "after the files, POST the list of them as JSON to {prefix}/{job_id}/deploy-{deploy_id}/done under the target"
    }
  },
  "required": ["target"],
  "additionalProperties": false
}"#;

/// How much of a refusal's body goes into the error.
const ERROR_EXCERPT: usize = 300;

struct HttpPublish;

impl Guest for HttpPublish {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description: "Puts the model's files on an HTTP mirror through a publishing target, \
                          under {prefix}/{job_id}/deploy-{deploy_id}/"
                .to_string(),
            options_schema: Some(OPTIONS_SCHEMA.to_string()),
        }
    }

    fn check_options(options_json: String) -> Result<(), String> {
        Options::parse(&options_json).map(|_| ())
    }

    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        let options = Options::parse(&request.options_json)?;
        let model = &request.model;
        let deployment = format!("deploy-{}", request.deploy_id);
        let folder = [options.prefix.as_str(), &model.job_id, &deployment]
            .into_iter()
            .filter(|segment| !segment.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        let target = Target::open(&options.target)?;
        // Where `notify` will POST, known before anything is put: a target
        // that is no mirror fails now, not after the upload.
        let done_url = if options.notify {
            Some(Endpoint::parse(target.url(&format!("{folder}/done"))?)?)
        } else {
            None
        };

        // One call: the host puts a few files at once.
        let puts: Vec<(String, String)> = model
            .files
            .iter()
            .map(|file| (file.path.clone(), format!("{folder}/{}", file.path)))
            .collect();
        let receipts = target.put_model_files(&puts);
        let mut files = Vec::with_capacity(puts.len());
        let mut failed = Vec::new();
        let mut bytes = 0;
        for ((path, key), put) in puts.into_iter().zip(receipts) {
            match put {
                Ok(receipt) => {
                    host::log(
                        Level::Info,
                        &format!("{}: {} bytes", receipt.url, receipt.bytes),
                    );
                    bytes += receipt.bytes;
                    files.push(json!({
                        "path": path, "key": key, "url": receipt.url, "bytes": receipt.bytes,
                        "sha256": receipt.sha256, "etag": receipt.etag,
                    }));
                }
                Err(e) => failed.push(e),
            }
        }
        if !failed.is_empty() {
            return Err(failed.join("; "));
        }

        let notified = match done_url {
            Some(endpoint) => {
                let body = json!({
                    "model": model.name, "job_id": model.job_id, "deploy_id": request.deploy_id, "files": files,
                });
                let status = post_json(&endpoint, &body.to_string())?;
                host::log(Level::Info, &format!("POST {} → {status}", endpoint.url));
                Some(json!({ "url": endpoint.url, "status": status }))
            }
            None => None,
        };

        Ok(DeployResult {
            // A folder key's url: where the keys under it landed, ending in /.
            ref_: target.url(&format!("{folder}/"))?,
            details_json: json!({
                "target": options.target, "files": files, "bytes": bytes, "notified": notified,
            })
            .to_string(),
        })
    }
}

/// The deployment's options, checked.
struct Options {
    target: String,
    /// Without leading or trailing `/`; empty for none.
    prefix: String,
    notify: bool,
}

impl Options {
    fn parse(options_json: &str) -> Result<Self, String> {
        let options: Map<String, Value> = serde_json::from_str(options_json)
            .map_err(|e| format!("options must be a JSON object: {e}"))?;
        if let Some(key) = options
            .keys()
            .find(|k| !matches!(k.as_str(), "target" | "prefix" | "notify"))
        {
            return Err(format!(
                "unknown option {key:?}: the http-publish deployer accepts only \"target\", \"prefix\" and \"notify\""
            ));
        }
        let target = match options.get("target") {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            None => {
                return Err(
                    "option \"target\" is missing: name the publishing target to put the model on \
                            (it may be left out only when the deployer is granted exactly one)"
                        .to_string(),
                );
            }
            Some(other) => {
                return Err(format!(
                    "option \"target\" must be a target's name, not {other}"
                ));
            }
        };
        let prefix = match options.get("prefix") {
            None => String::new(),
            Some(Value::String(prefix)) => {
                let trimmed = prefix.trim_matches('/');
                if !trimmed.is_empty() && trimmed.split('/').any(|s| matches!(s, "" | "." | "..")) {
                    return Err(format!(
                        "option \"prefix\" {prefix:?} has an empty, . or .. segment; write it as a/b"
                    ));
                }
                trimmed.to_string()
            }
            Some(other) => return Err(format!("option \"prefix\" must be a string, not {other}")),
        };
        let notify = match options.get("notify") {
            None => false,
            Some(Value::Bool(notify)) => *notify,
            Some(other) => {
                return Err(format!(
                    "option \"notify\" must be true or false, not {other}"
                ));
            }
        };
        Ok(Self {
            target,
            prefix,
            notify,
        })
    }
}

/// A URL under an http(s) target, split the way `wasi:http` wants it.
struct Endpoint {
    url: String,
    scheme: Scheme,
    /// `host[:port]`.
    authority: String,
    path: String,
}

impl Endpoint {
    fn parse(url: String) -> Result<Self, String> {
        let (scheme, rest) = match url.split_once("://") {
            Some(("https", rest)) => (Scheme::Https, rest),
            Some(("http", rest)) => (Scheme::Http, rest),
            _ => {
                return Err(format!(
                    "option \"notify\" needs an http:// or https:// target; this one puts to {url}"
                ));
            }
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        Ok(Self {
            scheme,
            authority: authority.to_string(),
            path: path.to_string(),
            url,
        })
    }
}

/// POSTs `body` as JSON to `endpoint` (under a target, so the host adds the
/// target's headers); returns the mirror's 2xx status. Redirects are not
/// followed: the host would not send the credentials on anyway.
fn post_json(endpoint: &Endpoint, body: &str) -> Result<u16, String> {
    let url = &endpoint.url;
    let headers = [
        ("content-type".to_string(), b"application/json".to_vec()),
        (
            "content-length".to_string(),
            body.len().to_string().into_bytes(),
        ),
    ];
    let fields = Fields::from_list(&headers)
        .map_err(|e| format!("POST {url}: its headers were refused: {e:?}"))?;
    let request = OutgoingRequest::new(fields);
    let refused = |what: &str| format!("POST {url}: wasi:http refused its {what}");
    request
        .set_method(&Method::Post)
        .map_err(|()| refused("method"))?;
    request
        .set_scheme(Some(&endpoint.scheme))
        .map_err(|()| refused("scheme"))?;
    request
        .set_authority(Some(&endpoint.authority))
        .map_err(|()| refused("host"))?;
    request
        .set_path_with_query(Some(&endpoint.path))
        .map_err(|()| refused("path"))?;

    let outgoing = request.body().map_err(|()| refused("body"))?;
    let future = outgoing_handler::handle(request, None).map_err(|code| explain(url, &code))?;
    {
        let stream = outgoing.write().map_err(|()| refused("body"))?;
        // At most 4096 bytes per blocking write (wasi:io's rule).
        for chunk in body.as_bytes().chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("POST {url}: sending the body failed: {e:?}"))?;
        }
    }
    OutgoingBody::finish(outgoing, None).map_err(|code| explain(url, &code))?;

    let response = loop {
        match future.get() {
            Some(Ok(response)) => break response.map_err(|code| explain(url, &code))?,
            Some(Err(())) => unreachable!("the response is taken only once"),
            None => future.subscribe().block(),
        }
    };
    let status = response.status();
    if !(200..300).contains(&status) {
        return Err(format!(
            "the mirror answered {status} to POST {url}: {}",
            excerpt(&response)
        ));
    }
    Ok(status)
}

/// A sentence for a request that got no answer.
fn explain(url: &str, code: &ErrorCode) -> String {
    match code {
        ErrorCode::HttpRequestDenied => format!(
            "POST {url}: the host refused the request (is the URL under a target granted to this deployer?)"
        ),
        ErrorCode::ConnectionRefused => {
            format!("POST {url}: the mirror refused the connection (is it running?)")
        }
        other => format!("POST {url} failed: {other:?}"),
    }
}

/// The start of a response's body, as one printable line.
fn excerpt(response: &IncomingResponse) -> String {
    let mut bytes = Vec::new();
    // The stream, bound last, is dropped first: it is the body's child.
    if let Ok(body) = response.consume()
        && let Ok(stream) = body.stream()
    {
        while bytes.len() < ERROR_EXCERPT {
            match stream.blocking_read((ERROR_EXCERPT - bytes.len()) as u64) {
                Ok(chunk) => bytes.extend(chunk),
                Err(_) => break,
            }
        }
    }
    let text: String = String::from_utf8_lossy(&bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    text.trim().to_string()
}

export!(HttpPublish);
