//! The API's OpenAPI 3.1 document: generated from the handlers' own
//! `#[utoipa::path]` docs and `json.rs`'s schemas, never written beside
//! them, and served at `GET /openapi.json`. Adds what holds for every `/v1`
//! operation at once: the bearer token, and its 401 and 403.

use std::sync::LazyLock;

use axum::Json;
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
use super::json::{self, ErrorBody};

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

/// Every `/v1` operation needs a bearer token when the server has tokens:
/// 401 without a valid one, and 403 for a `read` token on anything but a
/// GET. The document says so on each operation (and on none outside
/// `/v1`), whether or not this server has tokens.
pub fn guard(mut document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    document
        .components
        .get_or_insert_with(Components::new)
        .add_security_scheme(
            BEARER,
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    for (path, item) in &mut document.paths.paths {
        if !path.starts_with("/v1/") {
            continue;
        }
        for (operation, mutates) in [
            (&mut item.get, false),
            (&mut item.head, false),
            (&mut item.post, true),
            (&mut item.put, true),
            (&mut item.patch, true),
            (&mut item.delete, true),
        ] {
            if let Some(operation) = operation {
                require_token(operation, mutates);
            }
        }
    }
    document
}

fn require_token(operation: &mut Operation, mutates: bool) {
    operation.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    let responses = &mut operation.responses.responses;
    responses.insert(
        "401".into(),
        refusal("No token, or not one of this server's (only when it has tokens)")
            .header("WWW-Authenticate", Header::default())
            .build()
            .into(),
    );
    if mutates {
        responses.insert(
            "403".into(),
            refusal("A read token: this needs a deploy token")
                .build()
                .into(),
        );
    }
}

fn refusal(description: &str) -> ResponseBuilder {
    Response::builder().description(description).content(
        "application/json",
        Content::new(Some(Ref::from_schema_name(ErrorBody::name()))),
    )
}
