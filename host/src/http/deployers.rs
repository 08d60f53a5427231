//! `GET /v1/deployers`: what can deploy, which plugin files were refused,
//! and which are still loading after a start.

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::json;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(list))
}

/// The loaded deployers, the plugin files that were refused, and those
/// still loading.
#[utoipa::path(get, path = "/v1/deployers", operation_id = "list_deployers", tag = "deployers",
    responses((status = OK, description = "The deployers, the refused files, the loading ones", body = json::Deployers)))]
async fn list(State(ctx): State<ApiContext>) -> Json<json::Deployers> {
    let plugins = ctx.deployers.current();
    Json(json::Deployers {
        deployers: plugins
            .deployers
            .values()
            .map(|p| json::Deployer::from(&**p))
            .collect(),
        loading: ctx.deployers.still_loading(),
        rejected: plugins.rejected.iter().map(json::Rejected::from).collect(),
    })
}
