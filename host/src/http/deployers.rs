//! `/v1/deployers`: what can deploy, which plugins were refused, which
//! are still loading after a start; and the deployers stored over the API:
//! push a version (uploaded, or pulled from a registry), list the
//! versions, roll back, remove. The catalog does the work; this module
//! only translates HTTP.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::json::{self, ErrorBody};
use crate::auth::Caller;
use crate::catalog::{Pull, Upload};
use crate::db::{Pushed, StoredVersion};
use crate::deployers::Source;
use crate::oci;
use crate::runtime::Plugin;

/// The header carrying an upload's detached signature, base64 of the
/// signature file's text (`NAME.wasm.sig`).
pub const SIGNATURE_HEADER: &str = "x-berth-plugin-signature";
/// A manifest or a signature is a few lines; more is not one.
const MAX_PART_BYTES: u64 = 64 * 1024;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(push, remove))
        .routes(routes!(versions))
        .routes(routes!(rollback))
        .routes(routes!(approve))
}

/// The loaded deployers, from the plugins folder and stored over the API,
/// the plugins that were refused, and those still loading.
#[utoipa::path(get, path = "/v1/deployers", operation_id = "list_deployers", tag = "deployers",
    responses((status = OK, description = "The deployers, the refused files, the loading ones", body = json::Deployers)))]
async fn list(State(ctx): State<ApiContext>) -> Json<json::Deployers> {
    let view = ctx.deployers.view();
    Json(json::Deployers {
        deployers: view
            .deployers
            .iter()
            .map(|(plugin, source)| json::Deployer::new(plugin, source, &ctx.targets))
            .collect(),
        loading: ctx.deployers.still_loading(),
        rejected: view
            .rejected
            .iter()
            .map(|(rejection, source)| json::Rejected::new(rejection, source))
            .collect(),
    })
}

/// The parts of a multipart upload.
#[allow(dead_code)] // Describes the form for the OpenAPI document only.
#[derive(ToSchema)]
struct UploadForm {
    /// The component (`NAME.wasm`).
    #[schema(format = Binary, content_media_type = "application/wasm")]
    wasm: Vec<u8>,
    /// Its manifest (`NAME.toml`): limits, env, allowed hosts.
    manifest: Option<String>,
    /// Its detached signature (`NAME.wasm.sig`, minisign's format).
    signature: Option<String>,
}

/// Pushes a version of a deployer, stored for every server on this
/// database: the `.wasm` as the body, a multipart form with a manifest
/// and a signature, or a JSON body naming a component in a registry for
/// the server to pull.
///
/// The plugin is checked as a folder plugin is before anything is stored.
/// Each push keeps the versions before it. A pulled component is found in
/// the wasm OCI artifact layout (config `application/vnd.wasm.config.v0+json`,
/// one `application/wasm` layer), read with the login of the sources file's
/// `oci://` prefix covering its repository, verified against the layer's
/// sha256 as it is read (never past `--max-plugin-mib`), and its version
/// keeps the manifest's digest as its `source`. Its manifest and signature
/// come with the request, never from the registry.
#[utoipa::path(put, path = "/v1/deployers/{name}", operation_id = "push_deployer", tag = "deployers",
    params(
        ("name" = String, Path, description = "The deployer's name: letters, digits, `_`, `-`, `.`"),
        ("X-Berth-Plugin-Signature" = Option<String>, Header, description = "With a `.wasm` body: base64 of its detached signature file"),
    ),
    request_body(content(
        (Vec<u8> = "application/wasm"),
        (UploadForm = "multipart/form-data"),
        (json::PullBody = "application/json"),
    )),
    responses(
        (status = CREATED, description = "A new deployer, served", body = json::Deployer),
        (status = OK, description = "A new version, served (or the same one again: nothing changed)", body = json::Deployer),
        (status = ACCEPTED, description = "A new version that grants more than the one served (hosts, env vars, targets, memory, time, out quota): stored, not served, until an admin approves it (`POST /v1/deployers/{name}/approve`); the answer says what it adds", body = json::HeldVersion),
        (status = BAD_REQUEST, description = "The plugin would be refused (the reason a folder plugin would get), a malformed upload, a malformed `oci://` reference, or a manifest that is not a wasm component artifact; nothing is stored", body = ErrorBody),
        (status = CONFLICT, description = "The plugins folder declares this name, or the server has --max-deployers", body = ErrorBody),
        (status = PAYLOAD_TOO_LARGE, description = "Larger than the server takes (--max-plugin-mib); a pulled layer is refused by the size its manifest gives, before it is read", body = ErrorBody),
        (status = BAD_GATEWAY, description = "The registry did not give the component: unreachable, the login refused (the sources file's prefix is named, never the secret), no such tag or digest, or bytes whose sha256 is not the layer's digest. 502, not 400: the request was well formed, and only the registry can tell a missing tag from one it cannot serve; nothing is stored", body = ErrorBody),
    ))]
async fn push(
    State(ctx): State<ApiContext>,
    caller: Option<Extension<Caller>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Error> {
    let by = caller.map(|Extension(c)| c.name);
    if is_json(&headers) {
        return pull(&ctx, name, read_pull_body(body).await?, by).await;
    }
    let limit = ctx.catalog.max_plugin_bytes();
    let (wasm, manifest, signature) = match boundary(&headers)? {
        Some(boundary) => read_form(body, boundary, limit).await?,
        None => (
            read_body(body, limit).await?,
            None,
            header_signature(&headers)?,
        ),
    };
    let upload = Upload {
        name,
        wasm,
        manifest,
        signature,
        source: None,
        by,
    };
    Ok(pushed(&ctx, ctx.catalog.push(upload).await?))
}

/// A push's answer: 201 for a new deployer, 202 with what it adds for a
/// version held for approval, else 200.
fn pushed(
    ctx: &ApiContext,
    (plugin, version, pushed): (Arc<Plugin>, StoredVersion, Pushed),
) -> Response {
    let status = match pushed {
        Pushed::Added => StatusCode::CREATED,
        Pushed::Replaced | Pushed::Unchanged => StatusCode::OK,
        Pushed::Held => {
            let held = json::HeldVersion::new(&version);
            return (StatusCode::ACCEPTED, Json(held)).into_response();
        }
    };
    let answer = json::Deployer::new(&plugin, &Source::Api(Box::new(version)), &ctx.targets);
    (status, Json(answer)).into_response()
}

/// Serves the newest version of a stored deployer held because it grants
/// more than the version it replaces (hosts, env vars, targets, memory,
/// time, out quota), on every server. Needs the admin role.
#[utoipa::path(post, path = "/v1/deployers/{name}/approve", operation_id = "approve_deployer", tag = "deployers",
    params(("name" = String, Path, description = "The deployer's name")),
    responses(
        (status = OK, description = "The deployer, serving the approved version", body = json::Deployer),
        (status = BAD_REQUEST, description = "The version would be refused by this server now (the reason)", body = ErrorBody),
        (status = NOT_FOUND, description = "No such stored deployer", body = ErrorBody),
        (status = CONFLICT, description = "No version of it is held, or it comes from the plugins folder", body = ErrorBody),
    ))]
async fn approve(
    State(ctx): State<ApiContext>,
    Path(name): Path<String>,
) -> Result<Json<json::Deployer>, Error> {
    let (plugin, version) = ctx.catalog.approve(&name).await?;
    Ok(Json(json::Deployer::new(
        &plugin,
        &Source::Api(Box::new(version)),
        &ctx.targets,
    )))
}

/// A push of the component `body` names, pulled by the server with the
/// sources file's login for its repository.
async fn pull(
    ctx: &ApiContext,
    name: String,
    body: json::PullBody,
    by: Option<String>,
) -> Result<Response, Error> {
    let reference = oci::Reference::parse(&body.oci)
        .map_err(|e| Error::BadRequest(format!("deployer {name} was not pulled: {e}")))?;
    let registry = ctx.fetcher.registry(&reference);
    let pull = Pull {
        name,
        reference,
        manifest: body.manifest,
        signature: body.signature,
        by,
    };
    Ok(pushed(ctx, ctx.catalog.pull(&registry, pull).await?))
}

/// Whether the body is JSON (a pull), not a plugin.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// A pull's JSON body: a reference and two texts of a few lines.
async fn read_pull_body(body: Body) -> Result<json::PullBody, Error> {
    let limit = 3 * MAX_PART_BYTES as usize;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(e) if exceeded(&e) => {
            return Err(Error::TooLarge(format!(
                "the request body is larger than a pull's ({} KiB)",
                limit >> 10
            )));
        }
        Err(e) => return Err(Error::BadRequest(format!("the request broke off: {e}"))),
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::BadRequest(format!(
            "the request body is not acceptable: give {{\"oci\": \"oci://REGISTRY/REPOSITORY:TAG\"}}, \
             with \"manifest\" and \"signature\" texts if it has them: {e}"
        ))
    })
}

/// Removes a deployer stored over the API, with all its versions, from
/// every server. Deployments it already ran keep their records.
#[utoipa::path(delete, path = "/v1/deployers/{name}", operation_id = "remove_deployer", tag = "deployers",
    params(("name" = String, Path, description = "The deployer's name")),
    responses(
        (status = NO_CONTENT, description = "Removed"),
        (status = NOT_FOUND, description = "No deployer of that name is stored over the API", body = ErrorBody),
        (status = CONFLICT, description = "It comes from the plugins folder: remove its file there", body = ErrorBody),
    ))]
async fn remove(
    State(ctx): State<ApiContext>,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    ctx.catalog.remove(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The versions of a deployer stored over the API, oldest first.
#[utoipa::path(get, path = "/v1/deployers/{name}/versions", operation_id = "deployer_versions", tag = "deployers",
    params(("name" = String, Path, description = "The deployer's name")),
    responses(
        (status = OK, description = "Its versions, and which one it serves", body = json::DeployerVersions),
        (status = NOT_FOUND, description = "No deployer of that name is stored over the API", body = ErrorBody),
        (status = CONFLICT, description = "It comes from the plugins folder, whose versions are not kept here", body = ErrorBody),
    ))]
async fn versions(
    State(ctx): State<ApiContext>,
    Path(name): Path<String>,
) -> Result<Json<json::DeployerVersions>, Error> {
    let (versions, current) = ctx.catalog.versions(&name).await?;
    Ok(Json(json::DeployerVersions {
        name,
        versions: versions
            .iter()
            .map(|v| json::DeployerVersion::new(v, &current))
            .collect(),
    }))
}

/// Serves an earlier version of a deployer stored over the API again, on
/// every server: the one before the version it serves, or the one with
/// the given sha256. No body (or `{}`) means the one before.
#[utoipa::path(post, path = "/v1/deployers/{name}/rollback", operation_id = "rollback_deployer", tag = "deployers",
    params(("name" = String, Path, description = "The deployer's name")),
    request_body(content = Option<json::RollbackBody>, content_type = "application/json"),
    responses(
        (status = OK, description = "The deployer, serving that version", body = json::Deployer),
        (status = BAD_REQUEST, description = "A malformed body, or the version would be refused by this server now (the reason)", body = ErrorBody),
        (status = NOT_FOUND, description = "No such stored deployer, or no version with that sha256", body = ErrorBody),
        (status = CONFLICT, description = "No version before the one it serves, or it comes from the plugins folder", body = ErrorBody),
    ))]
async fn rollback(
    State(ctx): State<ApiContext>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<json::Deployer>, Error> {
    let body: json::RollbackBody = match body.iter().all(u8::is_ascii_whitespace) {
        true => json::RollbackBody::default(),
        false => serde_json::from_slice(&body).map_err(|e| {
            Error::BadRequest(format!(
                "the request body is not acceptable: give {{\"sha256\": \"…\"}} or nothing: {e}"
            ))
        })?,
    };
    let (plugin, version) = ctx.catalog.rollback(&name, body.sha256.as_deref()).await?;
    Ok(Json(json::Deployer::new(
        &plugin,
        &Source::Api(Box::new(version)),
        &ctx.targets,
    )))
}

/// The multipart boundary, when the upload is a form.
fn boundary(headers: &HeaderMap) -> Result<Option<String>, Error> {
    let Some(content_type) = headers.get(header::CONTENT_TYPE) else {
        return Ok(None);
    };
    let content_type = content_type.to_str().unwrap_or_default();
    if !content_type.starts_with("multipart/") {
        return Ok(None);
    }
    multer::parse_boundary(content_type)
        .map(Some)
        .map_err(|e| Error::BadRequest(format!("the multipart Content-Type has no boundary: {e}")))
}

fn too_large(limit: usize) -> Error {
    Error::TooLarge(format!(
        "the plugin is larger than this server takes ({} MiB, --max-plugin-mib)",
        limit >> 20
    ))
}

/// The whole body, up to `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, Error> {
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(bytes.into()),
        Err(e) if exceeded(&e) => Err(too_large(limit)),
        Err(e) => Err(Error::BadRequest(format!("the upload broke off: {e}"))),
    }
}

/// Whether reading a body failed for its length.
fn exceeded(e: &axum::Error) -> bool {
    crate::causes::causes(e).any(|e| e.is::<http_body_util::LengthLimitError>())
}

/// The `wasm`, `manifest` and `signature` parts of a form.
async fn read_form(
    body: Body,
    boundary: String,
    limit: usize,
) -> Result<(Vec<u8>, Option<String>, Option<String>), Error> {
    let limits = multer::SizeLimit::new()
        .for_field("wasm", limit as u64)
        .for_field("manifest", MAX_PART_BYTES)
        .for_field("signature", MAX_PART_BYTES);
    let constraints = multer::Constraints::new()
        .allowed_fields(vec!["wasm", "manifest", "signature"])
        .size_limit(limits);
    let mut form =
        multer::Multipart::with_constraints(body.into_data_stream(), boundary, constraints);
    let (mut wasm, mut manifest, mut signature) = (None, None, None);
    let malformed = |e: multer::Error| match e {
        multer::Error::FieldSizeExceeded { field_name, .. }
            if field_name.as_deref() == Some("wasm") =>
        {
            too_large(limit)
        }
        multer::Error::UnknownField { field_name } => Error::BadRequest(format!(
            "the form has a part {:?}; its parts are wasm, manifest and signature",
            field_name.unwrap_or_default()
        )),
        e => Error::BadRequest(format!("the multipart form cannot be read: {e}")),
    };
    while let Some(field) = form.next_field().await.map_err(malformed)? {
        let part = field.name().unwrap_or_default().to_string();
        let bytes: Vec<u8> = field.bytes().await.map_err(malformed)?.into();
        let text = |bytes| {
            String::from_utf8(bytes)
                .map_err(|_| Error::BadRequest(format!("the {part} part is not UTF-8 text")))
        };
        let twice = match part.as_str() {
            "wasm" => wasm.replace(bytes).is_some(),
            "manifest" => manifest.replace(text(bytes)?).is_some(),
            _ => signature.replace(text(bytes)?).is_some(),
        };
        if twice {
            return Err(Error::BadRequest(format!("the form has two {part} parts")));
        }
    }
    let wasm = wasm.ok_or_else(|| {
        Error::BadRequest("the form has no wasm part: send the plugin's .wasm as it".into())
    })?;
    Ok((wasm, manifest, signature))
}

/// The signature of a `.wasm` body, from its header.
fn header_signature(headers: &HeaderMap) -> Result<Option<String>, Error> {
    let Some(value) = headers.get(SIGNATURE_HEADER) else {
        return Ok(None);
    };
    let bad = || {
        Error::BadRequest(format!(
            "{SIGNATURE_HEADER} must be the base64 of the signature file's text (`base64 -w0 NAME.wasm.sig`)"
        ))
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(value.as_bytes())
        .map_err(|_| bad())?;
    String::from_utf8(decoded).map(Some).map_err(|_| bad())
}
