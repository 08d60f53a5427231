//! MLflow's registry as a way in: `POST /v1/hooks/mlflow`, the webhook an
//! MLflow tracking server sends when a version is created or an alias set,
//! and the registration of such a version (`register_version`), shared
//! with the catch-up that reads the registries the sources file follows
//! (`mlflow_catch_up`). The delivery's HMAC signature is its
//! authentication (MLflow cannot send berth's API token); the secret that
//! verifies it says which server sent it.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::json::{self, ErrorBody};
use super::models::{fill, record};
use crate::mlflow::hook::{self, Delivery, Hooked};
use crate::mlflow::{Pin, Reference, Server};
use crate::validate::ModelDraft;

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(delivered))
}

/// The webhook of an MLflow tracking server (MLflow 3's model registry
/// webhooks, created with the events `model_version.created` and
/// `model_version_alias.created` and the `webhook_secret` of the server's
/// `[[mlflow]]` entry in the sources file).
///
/// Needs no API token: the `X-MLflow-Signature` (HMAC-SHA256 of
/// `{X-MLflow-Delivery-Id}.{X-MLflow-Timestamp}.{body}` under the secret)
/// is its authentication, and a timestamp more than 5 minutes from the
/// server's clock is refused. A version the entry follows (`follow`:
/// `NAME` for every new version, `NAME@ALIAS` for each version given the
/// alias) is registered once, pinned, its files listed through the tracking
/// server: a repeated delivery registers nothing new.
#[utoipa::path(post, path = "/v1/hooks/mlflow", operation_id = "mlflow_hook", tag = "models",
    request_body(content = Object, description = "MLflow's webhook payload: `entity`, `action`, `timestamp`, `data`"),
    responses(
        (status = OK, description = "What the delivery did", body = json::MlflowDelivery),
        (status = BAD_REQUEST, description = "A signed body that is no MLflow payload, or a version berth cannot register (`error` says why)", body = ErrorBody),
        (status = UNAUTHORIZED, description = "No signature, one no configured secret made, or a timestamp too old: nothing is recorded", body = ErrorBody),
        (status = NOT_FOUND, description = "No `[[mlflow]]` entry of the sources file has a `webhook_secret`", body = ErrorBody),
        (status = BAD_GATEWAY, description = "The tracking server could not be read (MLflow retries a 5xx)", body = ErrorBody),
    ))]
async fn delivered(
    State(ctx): State<ApiContext>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<json::MlflowDelivery>, Error> {
    if !ctx.mlflow.hooked() {
        return Err(Error::NotFound(
            "this server takes no MLflow webhook: give an [[mlflow]] entry of the sources file \
             (--sources-file) a webhook_secret"
                .into(),
        ));
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Error::Unauthorized(format!(
                    "an MLflow webhook delivery carries the header {name}; this request has none \
                     (create the webhook with a secret)"
                ))
            })
    };
    let delivery = Delivery {
        id: header("X-MLflow-Delivery-Id")?,
        timestamp: header("X-MLflow-Timestamp")?,
        signature: header("X-MLflow-Signature")?,
    };
    let Some(server) = ctx
        .mlflow
        .signed(|secret| hook::signed_with(secret, &delivery, &body))
    else {
        tracing::warn!(
            delivery = delivery.id,
            "MLflow webhook delivery refused: its signature matches no webhook_secret"
        );
        return Err(Error::Unauthorized(
            "the X-MLflow-Signature matches no webhook_secret of the sources file's [[mlflow]] \
             entries: give the webhook in MLflow the same secret"
                .into(),
        ));
    };
    if let Some(why) = hook::stale(delivery.timestamp, crate::db::now_ms() / 1000) {
        return Err(Error::Unauthorized(why));
    }
    let hooked = Hooked::read(&body).map_err(Error::BadRequest)?;
    let (name, version, alias) = match hooked {
        Hooked::Version { name, version } => (name, version, None),
        Hooked::Alias {
            name,
            alias,
            version,
        } => (name, version, Some(alias)),
        Hooked::Other(event) => {
            tracing::debug!(delivery = delivery.id, event, "MLflow webhook: ignored");
            return Ok(Json(nothing("ignored")));
        }
    };
    if !server.follows(&name, alias.as_deref()) {
        return Ok(Json(nothing("not followed")));
    }
    let registered = register_version(
        &ctx,
        server,
        &name,
        &version,
        alias.as_deref(),
        "MLflow webhook",
    )
    .await?;
    Ok(Json(registered))
}

fn nothing(outcome: &str) -> json::MlflowDelivery {
    json::MlflowDelivery {
        job_id: None,
        model_id: None,
        outcome: outcome.into(),
    }
}

/// Registers `version` of `name` on `server` (with the alias it was
/// given, if any) under the job id berth gives it, unless it is
/// registered already: then nothing is asked of the tracking server.
/// `by` is recorded as who registered it.
pub(super) async fn register_version(
    ctx: &ApiContext,
    server: &Server,
    name: &str,
    version: &str,
    alias: Option<&str>,
    by: &str,
) -> Result<json::MlflowDelivery, Error> {
    let job_id = crate::mlflow::job_id(name, version, alias);
    if let Some(existing) = ctx.db.model_by_job_id(&job_id).await? {
        return Ok(json::MlflowDelivery {
            job_id: Some(job_id),
            model_id: Some(existing.id),
            outcome: "registered already".into(),
        });
    }
    let reference = Reference {
        server: server.url.clone(),
        name: name.to_string(),
        pin: Pin::Version(version.to_string()),
    };
    let found = ctx
        .fetcher
        .sources()
        .mlflow(&reference, alias)
        .await
        .map_err(|e| Error::BadGateway(format!("{reference}: {e}")))?;
    let draft = ModelDraft {
        name: Some(name.to_string()),
        job_id: Some(job_id.clone()),
        ..ModelDraft::default()
    };
    let (status, Json(model)) =
        record(ctx, fill(draft, found), Some(by.to_string()), None, false).await?;
    let outcome = if status == StatusCode::CREATED {
        tracing::info!(
            model_id = model.id,
            job_id,
            by,
            alias,
            "registered {reference} from MLflow"
        );
        "registered"
    } else {
        "registered already"
    };
    Ok(json::MlflowDelivery {
        job_id: Some(job_id),
        model_id: Some(model.id),
        outcome: outcome.into(),
    })
}
