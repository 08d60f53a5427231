//! Deployment events out, from the event log: each `deployment.*` event is
//! POSTed as JSON to the configured URL, in id order, by one server at a
//! time — the one holding the receiver's lease in `webhook_state`, renewed
//! while it delivers, taken over by another once it expires, handed back
//! at a stop. A failed POST is tried again, backing off to every 30 s,
//! until the receiver answers 2xx or the event is older than the give-up
//! time; the cursor (the last id done) is stored after each event, so a
//! restart or another server goes on where delivery stopped. Each POST
//! carries `X-Berth-Event` (its kind) and `X-Berth-Event-Id` (its id, for
//! de-duplication: an event may arrive twice, never out of order); with a
//! secret, `X-Berth-Signature: sha256=<hex HMAC-SHA256 of the body>`.
//! Delivery never slows a deployment. `GET /v1/webhook` shows its state.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::State;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiContext;
use super::error::Error;
use super::json::{self, ErrorBody};
use crate::backoff::Backoff;
use crate::db::events::{Kinds, StoredEvent, WebhookFailure};
use crate::db::{self, Db, Topic};
use crate::trust::Trust;

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two attempts at one event.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a lease runs unless renewed: longer than one POST may take
/// (`TIMEOUT`), so a delivering server renews it between two.
const LEASE: Duration = Duration::from_secs(20);
/// How often the holder renews the lease, and the others look whether it
/// expired (or the holder found new events without a wake-up).
const RENEW: Duration = Duration::from_secs(5);
/// One POST's limit.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Events read from the log at a time.
const PAGE: u32 = 100;

pub struct Webhook {
    pub url: String,
    pub secret: Option<String>,
    /// How long after an event was created it is still tried.
    pub give_up: Duration,
}

impl Webhook {
    /// The receiver's row: the sha256 of its URL, which may hold a secret.
    fn key(&self) -> String {
        hex::encode(Sha256::digest(self.url.as_bytes()))
    }

    /// The URL as shown and stored: without user, password and query.
    fn shown_url(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(mut url) => {
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.set_query(None);
                url.to_string()
            }
            Err(_) => "(not a URL)".to_string(),
        }
    }

    /// Records the receiver (its cursor at the end of the log if it is
    /// new: it gets the events from now on) and starts delivering as
    /// `server_id` until `stop`, a loop of `loops`; the task hands the
    /// lease back as it ends. HTTPS receivers are trusted by the public
    /// roots and `trust`'s.
    pub async fn start(
        self: Arc<Self>,
        db: Db,
        server_id: String,
        trust: &Trust,
        stop: CancellationToken,
        loops: &crate::loops::Loops,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let client = trust
            .reqwest(reqwest::Client::builder().timeout(TIMEOUT))?
            .build()?;
        let joined = match db.webhook_join(&self.key(), &self.shown_url()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(url = %self.shown_url(), "could not record the webhook ({e}); trying again in the background");
                false
            }
        };
        let delivery = Delivery {
            key: self.key(),
            hook: self,
            db: db.clone(),
            server_id,
            client,
            stop,
            wakeups: db.wakeups(Topic::Events),
        };
        Ok(loops.spawn("webhook deliverer", delivery.run(joined)))
    }
}

/// One server's side of delivering to one receiver.
struct Delivery {
    hook: Arc<Webhook>,
    key: String,
    db: Db,
    server_id: String,
    client: reqwest::Client,
    stop: CancellationToken,
    wakeups: broadcast::Receiver<String>,
}

/// Why delivering stopped.
enum Ended {
    /// Nothing more to deliver now.
    CaughtUp,
    /// Another server holds the lease now (or it could not be renewed).
    Lost,
    Stopping,
}

impl Delivery {
    async fn run(mut self, mut joined: bool) {
        let url = self.hook.shown_url();
        let mut holding = false;
        while !self.stop.is_cancelled() {
            if !joined {
                joined = self
                    .db
                    .webhook_join(&self.key, &url)
                    .await
                    .inspect_err(|e| tracing::debug!("recording the webhook: {e}"))
                    .is_ok();
            }
            let now = db::now_ms();
            let lease = self
                .db
                .webhook_lease(&self.key, &self.server_id, now, now + db::millis(LEASE))
                .await;
            let cursor = match lease {
                Ok(Some(cursor)) => cursor,
                Ok(None) => {
                    if holding {
                        tracing::warn!(%url, "another server took over delivering webhook events");
                    }
                    holding = false;
                    crate::metrics::webhook_delivering(false);
                    crate::metrics::webhook_failing(false);
                    self.pause(RENEW, false).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(%url, "could not take or renew the webhook's delivery lease ({e}); trying again in {}", crate::human::duration(RENEW));
                    self.pause(RENEW, false).await;
                    continue;
                }
            };
            if !holding {
                tracing::info!(%url, after = cursor, "this server delivers webhook events");
                holding = true;
                crate::metrics::webhook_delivering(true);
            }
            match self.deliver_after(cursor).await {
                Ended::CaughtUp => self.pause(RENEW, true).await,
                Ended::Lost => {}
                Ended::Stopping => break,
            }
        }
        crate::metrics::webhook_delivering(false);
        crate::metrics::webhook_failing(false);
        if let Err(e) = self.db.webhook_release(&self.key, &self.server_id).await {
            tracing::warn!(%url, "could not hand the webhook's delivery back ({e}); another server takes over when the lease expires");
        }
    }

    /// Waits `wait`, or less: until the stop, or a wake-up if `woken`.
    async fn pause(&mut self, wait: Duration, woken: bool) {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.stop.cancelled() => {}
            _ = self.wakeups.recv(), if woken => {}
        }
    }

    /// Delivers the deployment events after `cursor`, one by one.
    async fn deliver_after(&mut self, mut cursor: i64) -> Ended {
        loop {
            let events = match self.db.events_after(cursor, Kinds::Deployments, PAGE).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!("the webhook could not read the event log: {e}");
                    return Ended::CaughtUp;
                }
            };
            if events.is_empty() {
                return Ended::CaughtUp;
            }
            for event in events {
                match self.deliver(&event).await {
                    Ended::CaughtUp => cursor = event.id,
                    other => return other,
                }
            }
        }
    }

    /// Delivers one event, trying again until a 2xx or its give-up time;
    /// `CaughtUp` once the cursor passed it.
    async fn deliver(&mut self, event: &StoredEvent) -> Ended {
        let url = self.hook.shown_url();
        let body = json::webhook_body(&event.kind, &event.data);
        let created =
            humantime::parse_rfc3339(&event.created_at).unwrap_or_else(|_| SystemTime::now());
        let mut backoff = Backoff::between(FIRST_BACKOFF, MAX_BACKOFF);
        let mut since = None;
        for attempt in 1.. {
            let failure = tokio::select! {
                failure = self.post(event, &body) => failure,
                _ = self.stop.cancelled() => return Ended::Stopping,
            };
            let Some(failure) = failure else {
                crate::metrics::webhook_delivered();
                if since.is_some() {
                    tracing::info!(%url, event_id = event.id, attempt, "webhook delivered after failing");
                    crate::metrics::webhook_failing(false);
                }
                return self.done(event.id, false).await;
            };
            crate::metrics::webhook_failed();
            crate::metrics::webhook_failing(true);
            let age = created.elapsed().unwrap_or_default();
            if age >= self.hook.give_up {
                tracing::error!(
                    %url, event_id = event.id, event = %event.kind, attempt,
                    "webhook gave up on an event {} after it happened (the give-up time): {failure}",
                    crate::human::duration(age)
                );
                crate::metrics::webhook_given_up();
                crate::metrics::webhook_failing(false);
                return self.done(event.id, true).await;
            }
            let wait = backoff.next_wait().min(self.hook.give_up - age);
            tracing::warn!(
                %url, event_id = event.id, event = %event.kind, attempt,
                "webhook delivery failed: {failure}; trying again in {}",
                crate::human::duration(wait)
            );
            let since = since.get_or_insert_with(db::now).clone();
            let next_attempt =
                humantime::format_rfc3339_millis(SystemTime::now() + wait).to_string();
            let recorded = self
                .db
                .webhook_failed(
                    &self.key,
                    &self.server_id,
                    &WebhookFailure {
                        event_id: event.id,
                        since,
                        last_error: failure,
                        next_attempt,
                    },
                    db::now_ms() + db::millis(LEASE),
                )
                .await;
            match recorded {
                Ok(true) => {}
                Ok(false) => return Ended::Lost,
                Err(e) => tracing::warn!("could not record the webhook's failure: {e}"),
            }
            if let Some(ended) = self.hold(wait).await {
                return ended;
            }
        }
        unreachable!("the attempts go on until one returns")
    }

    /// One POST; `None` if the receiver took it, else why not.
    async fn post(&self, event: &StoredEvent, body: &str) -> Option<String> {
        let mut request = self
            .client
            .post(&self.hook.url)
            .header("content-type", "application/json")
            .header("x-berth-event", &event.kind)
            .header("x-berth-event-id", event.id.to_string())
            .body(body.to_string());
        if let Some(secret) = &self.hook.secret {
            request = request.header("x-berth-signature", signature(secret, body.as_bytes()));
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!("the receiver answered {}", response.status())),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Moves the cursor past event `id`.
    async fn done(&self, id: i64, gave_up: bool) -> Ended {
        let until = db::now_ms() + db::millis(LEASE);
        match self
            .db
            .webhook_done(&self.key, &self.server_id, id, gave_up, until)
            .await
        {
            Ok(true) => Ended::CaughtUp,
            Ok(false) => Ended::Lost,
            Err(e) => {
                // Delivered, but not recorded: the event may go out again.
                tracing::warn!(
                    event_id = id,
                    "could not record the webhook's progress: {e}"
                );
                Ended::Lost
            }
        }
    }

    /// Sleeps `wait`, renewing the lease meanwhile; `Some` if delivering
    /// must end.
    async fn hold(&mut self, wait: Duration) -> Option<Ended> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let now = tokio::time::Instant::now();
            if now >= until {
                return None;
            }
            tokio::select! {
                _ = tokio::time::sleep((until - now).min(RENEW)) => {}
                _ = self.stop.cancelled() => return Some(Ended::Stopping),
            }
            let now = db::now_ms();
            match self
                .db
                .webhook_lease(&self.key, &self.server_id, now, now + db::millis(LEASE))
                .await
            {
                Ok(Some(_)) => {}
                Ok(None) => return Some(Ended::Lost),
                Err(e) => tracing::warn!("could not renew the webhook's delivery lease: {e}"),
            }
        }
    }
}

/// `sha256=<hex>` of the HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

pub fn router() -> OpenApiRouter<ApiContext> {
    OpenApiRouter::new().routes(routes!(state))
}

/// The webhook's delivery: which events it has delivered, how many wait,
/// whether it is failing (since when, why, the next attempt), how many it
/// gave up, and which server delivers. The same on every server
/// configured with the same URL; 404 on a server without a webhook.
#[utoipa::path(get, path = "/v1/webhook", operation_id = "webhook", tag = "events",
    responses(
        (status = OK, description = "The webhook's delivery state", body = json::WebhookState),
        (status = NOT_FOUND, description = "This server has no webhook", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The webhook is not recorded yet", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait before asking again"))),
    ))]
async fn state(State(ctx): State<ApiContext>) -> Result<Json<json::WebhookState>, Error> {
    let Some(hook) = &ctx.webhook else {
        return Err(Error::NotFound(
            "this server has no webhook: start it with --webhook-url (BERTH_WEBHOOK_URL)".into(),
        ));
    };
    match ctx.db.webhook_state(&hook.key(), db::now_ms()).await? {
        Some(state) => Ok(Json(state.into())),
        None => Err(Error::Unavailable(format!(
            "webhook {}: not recorded in the database yet (is it refusing writes?)",
            hook.shown_url()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_rfc_4231_test_vector() {
        // RFC 4231, test case 2.
        let sig = signature("Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn urls_are_shown_without_their_secrets() {
        let hook = |url: &str| Webhook {
            url: url.into(),
            secret: None,
            give_up: Duration::from_secs(1),
        };
        let cases = [
            (
                "https://hooks.example/in?token=s3cret",
                "https://hooks.example/in",
            ),
            ("http://user:pw@127.0.0.1:9/hook", "http://127.0.0.1:9/hook"),
            ("http://127.0.0.1:9/hook", "http://127.0.0.1:9/hook"),
        ];
        for (url, shown) in cases {
            assert_eq!(hook(url).shown_url(), shown, "{url}");
        }
        assert_ne!(hook("http://a/?t=1").key(), hook("http://a/?t=2").key());
    }
}
