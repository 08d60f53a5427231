//! The API's OpenAPI 3.1 document: generated from the handlers' own
//! `#[utoipa::path]` docs and `json.rs`'s schemas, never written beside
//! them, and served at `GET /openapi.json`. Adds to each operation what the
//! auth middleware asks of it, by the middleware's own rules: the bearer
//! token, and its 401 and 403.

use std::sync::LazyLock;

use axum::Json;
use axum::http::Method;
use utoipa::openapi::content::Content;
use utoipa::openapi::header::Header;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Components, Ref};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::auth;
use super::json::{self, ErrorBody};
use crate::auth::Role;

/// The security scheme's name in the document.
const BEARER: &str = "bearer";

/// Title, version and licence come from the crate; the events' schemas
/// are listed here because no answer body refers to them.
#[derive(OpenApi)]
#[openapi(
    components(schemas(
        json::DeploymentStarted,
        json::DeploymentProgress,
        json::DeploymentCompleted,
        json::DeploymentFailed,
        json::PluginNamed,
        json::Rejected,
    )),
    tags(
        (name = "models", description = "Trained models: their files and where they come from"),
        (name = "deployments", description = "Deployments of a model by a deployer"),
        (name = "deployers", description = "The WebAssembly deployers of the plugins folder"),
        (name = "events", description = "What happens, as it happens"),
        (name = "server", description = "The server itself; no token needed"),
    )
)]
struct Base;

pub fn base() -> utoipa::openapi::OpenApi {
    Base::openapi()
}

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(serve))
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "server",
    responses((status = OK, description = "The OpenAPI 3.1 document of this API", body = Value)))]
async fn serve() -> Json<&'static utoipa::openapi::OpenApi> {
    static DOCUMENT: LazyLock<utoipa::openapi::OpenApi> = LazyLock::new(super::document);
    Json(&DOCUMENT)
}

/// When the server has tokens, every operation outside `auth::OPEN` needs
/// one: 401 without a valid one, 403 for a token whose role is below
/// `auth::needed_role`. The document says so whether or not this server
/// has tokens.
pub fn guard(mut document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    document
        .components
        .get_or_insert_with(Components::new)
        .add_security_scheme(
            BEARER,
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    for (path, item) in &mut document.paths.paths {
        if auth::OPEN.contains(&path.as_str()) {
            continue;
        }
        for (operation, method) in [
            (&mut item.get, Method::GET),
            (&mut item.head, Method::HEAD),
            (&mut item.post, Method::POST),
            (&mut item.put, Method::PUT),
            (&mut item.patch, Method::PATCH),
            (&mut item.delete, Method::DELETE),
        ] {
            if let Some(operation) = operation {
                require_token(operation, auth::needed_role(&method));
            }
        }
    }
    document
}

fn require_token(operation: &mut Operation, needed: Role) {
    operation.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    let responses = &mut operation.responses.responses;
    responses.insert(
        "401".into(),
        refusal("No token, or not one of this server's (only when it has tokens)")
            .header("WWW-Authenticate", Header::default())
            .build()
            .into(),
    );
    if needed > Role::Read {
        let description = format!(
            "A token of a lower role: this needs a {} token",
            needed.as_str()
        );
        responses.insert("403".into(), refusal(&description).build().into());
    }
}

fn refusal(description: &str) -> ResponseBuilder {
    Response::builder().description(description).content(
        "application/json",
        Content::new(Some(Ref::from_schema_name(ErrorBody::name()))),
    )
}
