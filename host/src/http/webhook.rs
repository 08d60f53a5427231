//! Deployment events out: each `deployment.*` event is POSTed as JSON to the
//! configured URL, in order, with retries and backoff. Delivery runs in its
//! own task fed by the event stream, so a slow or dead receiver never slows
//! a deployment; if it falls too far behind, the oldest events are dropped
//! (and logged). With a secret, each body is signed:
//! `X-Berth-Signature: sha256=<hex HMAC-SHA256 of the body>`.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::sync::broadcast::error::RecvError;

use crate::events::{Event, Events};
use crate::trust::Trust;

const ATTEMPTS: u32 = 5;
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

pub struct Webhook {
    pub url: String,
    pub secret: Option<String>,
}

impl Webhook {
    /// Starts delivering; runs until the event stream closes. HTTPS
    /// receivers are trusted by the public roots and `trust`'s.
    pub fn spawn(
        self,
        events: &Events,
        trust: &Trust,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let client = trust
            .reqwest(reqwest::Client::builder().timeout(Duration::from_secs(10)))?
            .build()?;
        let mut receiver = events.subscribe();
        Ok(tokio::spawn(async move {
            loop {
                let event = match receiver.recv().await {
                    Ok(event) => event,
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, url = %self.url, "webhook fell behind; dropped the oldest events");
                        continue;
                    }
                    Err(RecvError::Closed) => return,
                };
                if event.kind().starts_with("deployment.") {
                    self.deliver(&client, &event).await;
                }
            }
        }))
    }

    async fn deliver(&self, client: &reqwest::Client, event: &Event) {
        let body = serde_json::json!({ "type": event.kind(), "data": super::json::event(event) })
            .to_string();
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1..=ATTEMPTS {
            let mut request = client
                .post(&self.url)
                .header("content-type", "application/json")
                .header("x-berth-event", event.kind())
                .body(body.clone());
            if let Some(secret) = &self.secret {
                request = request.header("x-berth-signature", signature(secret, body.as_bytes()));
            }
            let failure = match request.send().await {
                Ok(response) if response.status().is_success() => return,
                Ok(response) => format!("the receiver answered {}", response.status()),
                Err(e) => e.to_string(),
            };
            tracing::warn!(url = %self.url, event = event.kind(), attempt, "webhook delivery failed: {failure}");
            if attempt < ATTEMPTS {
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
        }
        tracing::error!(url = %self.url, event = event.kind(), "webhook gave up on an event after {ATTEMPTS} attempts");
    }
}

/// `sha256=<hex>` of the HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn signatures_match_the_rfc_4231_test_vector() {
        // RFC 4231, test case 2.
        let sig = super::signature("Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
