//! The API's OpenAPI 3.1 document: generated from the handlers' own
//! `#[utoipa::path]` docs and `json`'s schemas, never written beside
//! them, and served at `GET /openapi.json`. Adds to each operation what the
//! layers around the handlers do, by their own rules: the auth
//! middleware's bearer token with its 401 and 403, and `observe`'s request
//! id.

use std::sync::LazyLock;

use axum::Json;
use axum::http::Method;
use utoipa::openapi::content::Content;
use utoipa::openapi::header::{Header, HeaderBuilder};
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Components, Object, Ref, RefOr, Required, Type};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::auth;
use super::json::{self, ErrorBody};
use super::observe::REQUEST_ID;
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
        json::PluginRejected,
        json::ModelRegistered,
        json::DeploymentAwaitingApproval,
        json::DeploymentApproved,
        json::RuleFailed,
    )),
    tags(
        (name = "models", description = "Trained models: their files and where they come from"),
        (name = "deployments", description = "Deployments of a model by a deployer"),
        (name = "deployers", description = "The WebAssembly deployers of the plugins folder"),
        (name = "rules", description = "Deploy rules: what to deploy when a model is registered or a deployment completes; approvals"),
        (name = "events", description = "What happens, as it happens: the event log and the webhook"),
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

/// What the layers add to every operation. When the server has tokens,
/// every operation outside `auth::OPEN` needs one: 401 without a valid one,
/// 403 for a token whose role is below `auth::needed_role` (the document
/// says so whether or not this server has tokens). Every answer carries
/// the request's id.
pub fn with_layers(mut document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    document
        .components
        .get_or_insert_with(Components::new)
        .add_security_scheme(
            BEARER,
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    for (path, item) in &mut document.paths.paths {
        let open = auth::OPEN.contains(&path.as_str());
        for (operation, method) in operations(item) {
            if !open {
                require_token(operation, auth::needed_role(&method, path));
            }
            carry_request_id(operation);
        }
    }
    document
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = (&mut Operation, Method)> {
    [
        (&mut item.get, Method::GET),
        (&mut item.head, Method::HEAD),
        (&mut item.post, Method::POST),
        (&mut item.put, Method::PUT),
        (&mut item.patch, Method::PATCH),
        (&mut item.delete, Method::DELETE),
    ]
    .into_iter()
    .filter_map(|(operation, method)| Some((operation.as_mut()?, method)))
}

fn carry_request_id(operation: &mut Operation) {
    let string = || Object::with_type(Type::String);
    operation.parameters.get_or_insert_with(Vec::new).push(
        ParameterBuilder::new()
            .name(REQUEST_ID.as_str())
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "The request's id in the logs: 1 to 128 visible ASCII characters \
                 (another is replaced)",
            ))
            .schema(Some(string()))
            .build(),
    );
    for response in operation.responses.responses.values_mut() {
        if let RefOr::T(response) = response {
            response.headers.insert(
                REQUEST_ID.as_str().into(),
                HeaderBuilder::new()
                    .schema(string())
                    .description(Some("The request's id: the one it gave, or a fresh one"))
                    .build(),
            );
        }
    }
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
