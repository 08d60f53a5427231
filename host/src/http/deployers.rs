//! `GET /v1/deployers`: what can deploy, and which plugin files were refused.

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::json;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(list))
}

/// The loaded deployers, and the plugin files that were refused.
#[utoipa::path(get, path = "/v1/deployers", operation_id = "list_deployers", tag = "deployers",
    responses((status = OK, description = "The deployers and the refused files", body = json::Deployers)))]
async fn list(State(ctx): State<ApiContext>) -> Json<json::Deployers> {
    let plugins = ctx.deployers.current();
    Json(json::Deployers {
        deployers: plugins
            .deployers
            .values()
            .map(|p| json::Deployer::from(&**p))
            .collect(),
        rejected: plugins.rejected.iter().map(json::Rejected::from).collect(),
    })
}
