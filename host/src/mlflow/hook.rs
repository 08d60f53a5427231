//! The webhook MLflow sends (`POST /v1/hooks/mlflow`): its signature and
//! what its payload asks for. MLflow signs `{delivery id}.{timestamp}.{body}`
//! with HMAC-SHA256 under the webhook's secret and sends `v1,` and the
//! base64 of it in `X-MLflow-Signature`; no other header can be added, so
//! the signature is the only proof of who sent it, and a timestamp older
//! (or newer) than `MAX_AGE` is refused so a copy cannot be replayed later.
//! Pure.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sha2::Sha256;

/// How far a delivery's timestamp may be from the receiver's clock.
pub const MAX_AGE_S: i64 = 300;

/// A delivery's headers, as sent.
pub struct Delivery<'a> {
    pub id: &'a str,
    pub timestamp: &'a str,
    pub signature: &'a str,
}

/// Whether `delivery` of `body` was signed with `secret` (a constant-time
/// comparison).
pub fn signed_with(secret: &str, delivery: &Delivery, body: &[u8]) -> bool {
    let Some(sent) = delivery.signature.strip_prefix("v1,") else {
        return false;
    };
    let Ok(sent) = base64::engine::general_purpose::STANDARD.decode(sent.trim()) else {
        return false;
    };
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(delivery.id.as_bytes());
    mac.update(b".");
    mac.update(delivery.timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&sent).is_ok()
}

/// `v1,` and the base64 of the HMAC-SHA256 of `{id}.{timestamp}.{body}`, as
/// MLflow signs: for tests that send a delivery of their own.
pub fn sign(secret: &str, id: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// Why a delivery's timestamp is refused, if it is: `now` is the
/// receiver's Unix time in seconds.
pub fn stale(timestamp: &str, now: i64) -> Option<String> {
    match timestamp.trim().parse::<i64>() {
        Err(_) => Some(format!(
            "X-MLflow-Timestamp {timestamp:?} is not a Unix time in seconds"
        )),
        Ok(at) if (now - at).abs() > MAX_AGE_S => Some(format!(
            "the delivery's timestamp is {}s from this server's clock, more than the {MAX_AGE_S}s \
             allowed: an old delivery replayed, or a clock to set right",
            (now - at).abs()
        )),
        Ok(_) => None,
    }
}

/// What a delivery asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hooked {
    /// `model_version.created`: a new version of `name`.
    Version { name: String, version: String },
    /// `model_version_alias.created` (also sent when an alias moves).
    Alias {
        name: String,
        alias: String,
        version: String,
    },
    /// Another event (`entity.action`), which berth does not act on.
    Other(String),
}

#[derive(Deserialize)]
struct Payload {
    entity: String,
    action: String,
    #[serde(default)]
    data: serde_json::Value,
}

#[derive(Deserialize)]
struct VersionData {
    name: String,
    version: String,
}

#[derive(Deserialize)]
struct AliasData {
    name: String,
    alias: String,
    version: String,
}

impl Hooked {
    /// Reads a signed delivery's body; the error says what is missing.
    pub fn read(body: &[u8]) -> Result<Self, String> {
        let payload: Payload = serde_json::from_slice(body).map_err(|e| {
            format!("the body is not an MLflow webhook payload (entity, action, data): {e}")
        })?;
        let event = format!("{}.{}", payload.entity, payload.action);
        let data = payload.data;
        let read_error = |e: serde_json::Error| {
            format!("the data of a {event} payload is not as MLflow sends it: {e}")
        };
        match event.as_str() {
            "model_version.created" => {
                let d: VersionData = serde_json::from_value(data).map_err(read_error)?;
                Ok(Hooked::Version {
                    name: d.name,
                    version: d.version,
                })
            }
            "model_version_alias.created" => {
                let d: AliasData = serde_json::from_value(data).map_err(read_error)?;
                Ok(Hooked::Alias {
                    name: d.name,
                    alias: d.alias,
                    version: d.version,
                })
            }
            _ => Ok(Hooked::Other(event)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_checked_over_the_id_the_timestamp_and_the_body() {
        // Made with MLflow 3.17's own `_generate_hmac_signature("s3cret",
        // "d-1", "1700000000", '{"a": 1}')`.
        let body = br#"{"a": 1}"#;
        let signature = sign("s3cret", "d-1", "1700000000", body);
        assert_eq!(signature, "v1,cXba7k2h2S9JgnqN7BcpWvnFMfMoFMqAonfzn9WFZBg=");
        let delivery = Delivery {
            id: "d-1",
            timestamp: "1700000000",
            signature: &signature,
        };
        assert!(signed_with("s3cret", &delivery, body));
        assert!(!signed_with("other", &delivery, body));
        assert!(!signed_with("s3cret", &delivery, br#"{"a": 2}"#));
        let moved = Delivery {
            timestamp: "1700000001",
            ..delivery
        };
        assert!(!signed_with("s3cret", &moved, body));
        for bad in [
            "",
            "v1,",
            "v2,IJzc",
            "v1,not base64!",
            "IJzcGzOe1Oq1v4g5Pq/DMsjW5+BXF+iZ8/rM97jTi9I=",
        ] {
            let delivery = Delivery {
                id: "d-1",
                timestamp: "1700000000",
                signature: bad,
            };
            assert!(!signed_with("s3cret", &delivery, body), "{bad}");
        }
    }

    #[test]
    fn a_timestamp_far_from_the_clock_is_refused() {
        assert_eq!(stale("1000", 1000 + MAX_AGE_S), None);
        assert_eq!(stale("1000", 1000 - MAX_AGE_S), None);
        assert!(
            stale("1000", 1001 + MAX_AGE_S)
                .unwrap()
                .contains("replayed")
        );
        assert!(stale("soon", 1000).unwrap().contains("not a Unix time"));
    }

    #[test]
    fn payloads_are_read_as_mlflow_sends_them() {
        let cases = [
            (
                r#"{"entity": "model_version", "action": "created", "timestamp": "t", "data": {"name": "iris", "version": "2", "source": "models:/m-1", "run_id": null, "tags": {}, "description": null}}"#,
                Ok(Hooked::Version {
                    name: "iris".into(),
                    version: "2".into(),
                }),
            ),
            (
                r#"{"entity": "model_version_alias", "action": "created", "data": {"name": "iris", "alias": "champion", "version": "1"}}"#,
                Ok(Hooked::Alias {
                    name: "iris".into(),
                    alias: "champion".into(),
                    version: "1".into(),
                }),
            ),
            (
                r#"{"entity": "registered_model", "action": "created", "data": {"name": "iris"}}"#,
                Ok(Hooked::Other("registered_model.created".into())),
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(Hooked::read(body.as_bytes()), expected, "{body}");
        }
        let error =
            Hooked::read(br#"{"entity": "model_version", "action": "created", "data": {}}"#)
                .unwrap_err();
        assert!(error.contains("model_version.created payload"), "{error}");
        assert!(
            Hooked::read(b"[]")
                .unwrap_err()
                .contains("not an MLflow webhook payload")
        );
    }
}
