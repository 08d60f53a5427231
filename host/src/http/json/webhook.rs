//! The webhook's shapes: a delivery's body, and `GET /v1/webhook`'s state.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

/// A webhook POST's body: `{"data": DATA, "type": KIND}`, the data as
/// the event log holds it.
pub fn webhook_body(kind: &str, data: &str) -> String {
    let data = serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_string()));
    json!({ "type": kind, "data": data }).to_string()
}

/// `GET /v1/webhook`: where delivery to the webhook stands, on every
/// server.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct WebhookState {
    /// Every deployment event up to this id was delivered or given up.
    pub delivered_through: i64,
    /// The id of the server delivering (`DATA_DIR/server-id`); null while
    /// none holds the lease.
    pub delivering_server: Option<String>,
    /// The event being retried, while deliveries fail; null otherwise.
    pub failing: Option<WebhookFailing>,
    /// Events given up after the give-up time, since the webhook was
    /// first configured.
    pub given_up: i64,
    /// Deployment events after `delivered_through`, still to deliver.
    pub pending: i64,
    /// The receiver, without user, password and query.
    pub url: String,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct WebhookFailing {
    pub event_id: i64,
    pub last_error: String,
    /// When the next attempt is due.
    pub next_attempt: String,
    /// The first failed attempt at this event.
    pub since: String,
}

impl From<crate::db::events::WebhookState> for WebhookState {
    fn from(s: crate::db::events::WebhookState) -> Self {
        WebhookState {
            delivered_through: s.delivered_id,
            delivering_server: s.holder,
            failing: s.failure.map(|f| WebhookFailing {
                event_id: f.event_id,
                last_error: f.last_error,
                next_attempt: f.next_attempt,
                since: f.since,
            }),
            given_up: s.given_up,
            pending: s.pending,
            url: s.url,
        }
    }
}

/// `POST /v1/hooks/mlflow`'s answer: what a delivery from MLflow did.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct MlflowDelivery {
    /// The job id of the model it names (registered now or before); null
    /// when it named none berth registers.
    pub job_id: Option<String>,
    /// That model's id.
    pub model_id: Option<i64>,
    /// `registered` (a new model: the rules fire), `registered already`
    /// (nothing new), `not followed` (no `follow` of its server's
    /// `[[mlflow]]` entry names it) or `ignored` (an event berth does not
    /// act on).
    pub outcome: String,
}
