//! The `http-publish` deployer: uploads every file of a model to an HTTP
//! mirror with `PUT {base_url}/{deploy_id}/{path}`, streaming each file from
//! the read-only model directory through `wasi:http` — never a whole file in
//! memory. It reaches only the hosts its manifest's `allowed_hosts` grants;
//! it never follows redirects and never logs the token.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value, json};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingResponse, Method, OutgoingBody,
    OutgoingRequest, Scheme,
};
use wasip2::io::streams::{OutputStream, StreamError};

use berth::deployer::host::{self, Level};
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};

wit_bindgen::generate!({
    world: "deployer",
    path: "../../../wit/0.1.0",
    // The world imports wasi:filesystem explicitly for languages without a file
    // API; Rust reaches it through std, so generated bindings just go unused.
    generate_all,
});

const DEFAULT_TOKEN_ENV: &str = "MIRROR_TOKEN";

/// Read from the model in pieces this big; wasmtime accepts at most 1 MiB per
/// `write` on an outgoing body anyway.
const CHUNK: usize = 1 << 20;

/// How much of an error answer's body goes into the error text.
const ERROR_EXCERPT: usize = 300;

const OPTIONS_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "base_url": {
      "type": "string",
      "pattern": "^[hH][tT][tT][pP][sS]?://",
      "description": "http:// or https:// URL of the mirror; each file goes to {base_url}/{deploy_id}/{path}. Its host:port must be in allowed_hosts of the plugin's manifest"
    },
    "token_env": {
      "type": "string",
      "default": "MIRROR_TOKEN",
      "description": "environment variable (granted by the manifest's env) holding a bearer token; no Authorization header when it is unset"
    }
  },
  "required": ["base_url"],
  "additionalProperties": false
}"#;

struct HttpPublish;

impl Guest for HttpPublish {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description:
                "Uploads the model's files to an HTTP mirror with PUT {base_url}/{deploy_id}/{path}"
                    .to_string(),
            options_schema: Some(OPTIONS_SCHEMA.to_string()),
        }
    }

    fn check_options(options_json: String) -> Result<(), String> {
        Options::parse(&options_json).map(|_| ())
    }

    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        let options = Options::parse(&request.options_json)?;
        let target = options.base_url.for_deployment(request.deploy_id);
        let token = std::env::var(&options.token_env)
            .ok()
            .filter(|t| !t.is_empty());
        match &token {
            Some(_) if matches!(target.scheme, Scheme::Http) => host::log(
                Level::Warn,
                &format!(
                    "sending the token from {} over plain http to {}",
                    options.token_env, target.authority
                ),
            ),
            Some(_) => {}
            None => host::log(
                Level::Info,
                &format!(
                    "{} is not in this plugin's environment (the manifest's env grants it): \
                     uploading without an Authorization header",
                    options.token_env
                ),
            ),
        }

        let files = &request.model.files;
        let total: u64 = files.iter().map(|f| f.size_bytes).sum();
        let mut done = 0;
        let mut uploaded = Vec::with_capacity(files.len());
        for file in files {
            let source = Path::new(&request.dir).join(&file.path);
            let url = target.url(&file.path)?;
            let (bytes, status) = put_file(&source, &target, &url, token.as_deref())
                .map_err(|e| format!("{}: {e}", file.path))?;
            done += bytes;
            host::log(
                Level::Info,
                &format!("PUT {} → {status} ({bytes} bytes)", url.display),
            );
            host::progress(done, total, &file.path);
            uploaded.push(json!({ "path": file.path, "bytes": bytes, "status": status }));
        }

        Ok(DeployResult {
            ref_: target.display,
            details_json: json!({ "files": uploaded, "bytes": done }).to_string(),
        })
    }
}

/// The deployment's options, checked.
struct Options {
    base_url: BaseUrl,
    token_env: String,
}

impl Options {
    fn parse(options_json: &str) -> Result<Self, String> {
        let options: Value = serde_json::from_str(options_json)
            .map_err(|e| format!("options are not valid JSON: {e}"))?;
        let Value::Object(options) = options else {
            return Err("options must be a JSON object".to_string());
        };
        let mut problems = Vec::new();
        for key in options
            .keys()
            .filter(|k| !matches!(k.as_str(), "base_url" | "token_env"))
        {
            problems.push(format!(
                "unknown option {key:?}: http-publish accepts base_url and token_env"
            ));
        }
        let base_url = match options.get("base_url") {
            None => Err("option \"base_url\" is required: the mirror's URL, e.g. \"https://mirror.internal/models\"".to_string()),
            Some(Value::String(url)) => BaseUrl::parse(url),
            Some(other) => Err(format!("option \"base_url\" must be a string, not {other}")),
        };
        let token_env = token_env(&options);
        let (base_url, token_env) = match (base_url, token_env) {
            (Ok(base_url), Ok(token_env)) if problems.is_empty() => (base_url, token_env),
            (base_url, token_env) => {
                problems.extend(base_url.err());
                problems.extend(token_env.err());
                return Err(problems.join("; "));
            }
        };
        Ok(Self {
            base_url,
            token_env,
        })
    }
}

fn token_env(options: &Map<String, Value>) -> Result<String, String> {
    match options.get("token_env") {
        None => Ok(DEFAULT_TOKEN_ENV.to_string()),
        Some(Value::String(name)) if is_env_name(name) => Ok(name.clone()),
        Some(other) => Err(format!(
            "option \"token_env\" must name an environment variable (letters, digits and _, not starting with a digit), not {other}"
        )),
    }
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `base_url`, split the way `wasi:http` wants it.
struct BaseUrl {
    scheme: Scheme,
    /// `host[:port]`, as given.
    authority: String,
    /// The path without a trailing `/`: empty or starting with `/`.
    prefix: String,
}

impl BaseUrl {
    fn parse(url: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("option \"base_url\" {url:?}: {why}");
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected an http:// or https:// URL"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(bad("the scheme must be http or https")),
        };
        if rest.contains(['?', '#']) {
            return Err(bad("must not have a query or fragment"));
        }
        if let Some(c) = rest
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || "\"<>\\^`{|}".contains(*c))
        {
            return Err(bad(&format!("contains {c:?}; percent-encode it")));
        }
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad("has no host"));
        }
        if authority.contains('@') {
            // Not echoed: the URL holds a password.
            return Err(
                "option \"base_url\" must not contain credentials (user:password@); \
                        put a token in the variable named by token_env"
                    .to_string(),
            );
        }
        check_port(authority).map_err(|e| bad(&e))?;
        Ok(Self {
            scheme,
            authority: authority.to_string(),
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    /// Where one deployment's files go.
    fn for_deployment(&self, deploy_id: i64) -> Target {
        let prefix = format!("{}/{deploy_id}", self.prefix);
        let scheme = match self.scheme {
            Scheme::Http => "http",
            _ => "https",
        };
        Target {
            display: format!("{scheme}://{}{prefix}/", self.authority),
            scheme: self.scheme.clone(),
            authority: self.authority.clone(),
            prefix,
        }
    }
}

fn check_port(authority: &str) -> Result<(), String> {
    let port = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, "")) => None,
            Some((_, after)) => Some(after.strip_prefix(':').ok_or("expected :port after ]")?),
            None => return Err("has an unclosed [".to_string()),
        },
        None => authority.split_once(':').map(|(_, port)| port),
    };
    match port {
        Some(port) if !port.parse::<u16>().is_ok_and(|p| p > 0) => Err(format!(
            "the port {port:?} must be a number from 1 to 65535"
        )),
        _ => Ok(()),
    }
}

/// One deployment's folder on the mirror.
struct Target {
    scheme: Scheme,
    authority: String,
    /// `{base path}/{deploy_id}`.
    prefix: String,
    /// `{base_url}/{deploy_id}/`: the deployment's ref.
    display: String,
}

/// The address of one file.
struct FileUrl {
    path_with_query: String,
    display: String,
}

impl Target {
    fn url(&self, path: &str) -> Result<FileUrl, String> {
        let mut encoded = String::with_capacity(self.prefix.len() + path.len() + 1);
        encoded.push_str(&self.prefix);
        for segment in path.split('/') {
            // berth refuses such paths at registration; a mirror must never
            // see a request that climbs out of the deployment's folder.
            if matches!(segment, "" | "." | "..") {
                return Err(format!(
                    "{path}: refusing a path with an empty, . or .. segment"
                ));
            }
            encoded.push('/');
            percent_encode(segment, &mut encoded);
        }
        Ok(FileUrl {
            display: format!(
                "{}{}",
                self.display.trim_end_matches('/'),
                &encoded[self.prefix.len()..]
            ),
            path_with_query: encoded,
        })
    }
}

/// Keeps RFC 3986's unreserved characters, escapes every other byte.
fn percent_encode(segment: &str, out: &mut String) {
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// Uploads one file; returns its size and the mirror's status code.
fn put_file(
    source: &Path,
    target: &Target,
    url: &FileUrl,
    token: Option<&str>,
) -> Result<(u64, u16), String> {
    let mut file =
        File::open(source).map_err(|e| format!("cannot open {}: {e}", source.display()))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot read the size of {}: {e}", source.display()))?
        .len();

    let request = new_request(target, url, len, token)?;
    let body = request
        .body()
        .map_err(|()| "the outgoing request has no body (wasi:http refused it)".to_string())?;
    let future = outgoing_handler::handle(request, None).map_err(|code| explain(&code, target))?;

    let streamed = match body.write() {
        Ok(stream) => stream_file(&mut file, &stream, len),
        Err(()) => Err("the outgoing body has no stream (wasi:http refused it)".to_string()),
    };
    let finished = match streamed {
        Ok(()) => OutgoingBody::finish(body, None).map_err(|code| explain(&code, target)),
        Err(e) => {
            // Dropped unfinished, the body counts as aborted: the mirror never
            // sees a short file as complete.
            drop(body);
            Err(e)
        }
    };

    // When the upload broke off, the answer (or the reason there is none)
    // usually says why better than the broken stream does.
    let response = wait(&future).map_err(|code| explain(&code, target))?;
    let status = response.status();
    if !(200..300).contains(&status) {
        return Err(refusal(&response, status, url));
    }
    finished.map_err(|e| format!("the upload to {} broke off: {e}", url.display))?;
    Ok((len, status))
}

fn new_request(
    target: &Target,
    url: &FileUrl,
    len: u64,
    token: Option<&str>,
) -> Result<OutgoingRequest, String> {
    let mut headers: Vec<(String, Vec<u8>)> = vec![
        (
            "content-type".to_string(),
            b"application/octet-stream".to_vec(),
        ),
        ("content-length".to_string(), len.to_string().into_bytes()),
    ];
    if let Some(token) = token {
        headers.push((
            "authorization".to_string(),
            format!("Bearer {token}").into_bytes(),
        ));
    }
    // HeaderError names no value, so the token cannot leak through it.
    let fields = Fields::from_list(&headers).map_err(|e| {
        format!("the request headers were refused ({e:?}); is the token a single line of text?")
    })?;
    let request = OutgoingRequest::new(fields);
    let refused = |what: &str| format!("wasi:http refused the {what} of {}", url.display);
    request
        .set_method(&Method::Put)
        .map_err(|()| refused("method"))?;
    request
        .set_scheme(Some(&target.scheme))
        .map_err(|()| refused("scheme"))?;
    request
        .set_authority(Some(&target.authority))
        .map_err(|()| refused("host"))?;
    request
        .set_path_with_query(Some(&url.path_with_query))
        .map_err(|()| refused("path"))?;
    Ok(request)
}

/// Copies exactly `len` bytes of `file` into the body, a chunk at a time,
/// never more than the stream says it can take.
fn stream_file(file: &mut File, stream: &OutputStream, len: u64) -> Result<(), String> {
    let mut buffer = vec![0; CHUNK];
    let mut sent = 0u64;
    loop {
        let read = file
            .read(&mut buffer)
            .map_err(|e| format!("reading the model file: {e}"))?;
        if read == 0 {
            break;
        }
        let mut chunk = &buffer[..read];
        while !chunk.is_empty() {
            let permitted = match stream.check_write() {
                Ok(0) => {
                    stream.subscribe().block();
                    continue;
                }
                Ok(n) => usize::try_from(n).unwrap_or(usize::MAX),
                Err(e) => return Err(stream_error(e)),
            };
            let n = permitted.min(chunk.len());
            stream.write(&chunk[..n]).map_err(stream_error)?;
            chunk = &chunk[n..];
        }
        sent += read as u64;
    }
    if sent != len {
        return Err(format!(
            "the file changed while it was read: {sent} bytes instead of {len}"
        ));
    }
    match stream.blocking_flush() {
        // Every byte was accepted: the client may already have taken the whole
        // body (Content-Length reached) and let go of the stream.
        Ok(()) | Err(StreamError::Closed) => Ok(()),
        Err(e) => Err(stream_error(e)),
    }
}

fn stream_error(e: StreamError) -> String {
    match e {
        StreamError::Closed => "the connection closed before the whole file was sent".to_string(),
        StreamError::LastOperationFailed(e) => match wasip2::http::types::http_error_code(&e) {
            Some(code) => format!("sending failed: {code:?}"),
            None => format!("sending failed: {}", e.to_debug_string()),
        },
    }
}

fn wait(future: &FutureIncomingResponse) -> Result<IncomingResponse, ErrorCode> {
    loop {
        match future.get() {
            Some(Ok(response)) => return response,
            Some(Err(())) => unreachable!("the response is taken only once"),
            None => future.subscribe().block(),
        }
    }
}

/// A person-readable sentence for a request that got no answer.
fn explain(code: &ErrorCode, target: &Target) -> String {
    let host = &target.authority;
    match code {
        ErrorCode::HttpRequestDenied => format!(
            "the host refused the request to {host}: not in allowed_hosts of the plugin's manifest"
        ),
        ErrorCode::DnsError(e) => format!(
            "cannot resolve {host}: {}",
            e.rcode.as_deref().unwrap_or("DNS error")
        ),
        ErrorCode::DnsTimeout => format!("cannot resolve {host}: DNS timed out"),
        ErrorCode::ConnectionRefused => {
            format!("{host} refused the connection (is the mirror running?)")
        }
        ErrorCode::ConnectionTimeout => format!("connecting to {host} timed out"),
        ErrorCode::TlsCertificateError => format!("{host}: its TLS certificate is not trusted"),
        ErrorCode::InternalError(Some(message)) => {
            format!("the request to {host} failed: {message}")
        }
        other => format!("the request to {host} failed: {other:?}"),
    }
}

/// The error for a non-2xx answer: the status, where a redirect pointed,
/// and the start of the answer's body.
fn refusal(response: &IncomingResponse, status: u16, url: &FileUrl) -> String {
    let mut message = format!("the mirror answered {status} to PUT {}", url.display);
    if (300..400).contains(&status) {
        let headers = response.headers();
        if let Some(location) = headers.get("location").first() {
            message.push_str(&format!(
                " (a redirect to {}; http-publish does not follow redirects: point base_url at the final address)",
                printable(location)
            ));
        }
    }
    let excerpt = body_excerpt(response);
    if !excerpt.is_empty() {
        message.push_str(": ");
        message.push_str(&excerpt);
    }
    message
}

fn body_excerpt(response: &IncomingResponse) -> String {
    let Ok(body) = response.consume() else {
        return String::new();
    };
    let mut bytes = Vec::new();
    if let Ok(stream) = body.stream() {
        while bytes.len() < ERROR_EXCERPT {
            match stream.blocking_read((ERROR_EXCERPT - bytes.len()) as u64) {
                Ok(chunk) => bytes.extend(chunk),
                Err(_) => break,
            }
        }
        // The stream is the body's child: it must go first.
        drop(stream);
    }
    drop(body);
    printable(&bytes)
}

fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

export!(HttpPublish);
