//! What every request leaves behind: an id (`X-Request-Id`: the client's
//! when it is well-formed, a fresh one otherwise), returned in the response
//! and carried by the span over the request's log lines and those of the
//! deployment it starts; and its count by route template and status.
//! Never reads a body nor changes an answer but for that header.

use std::hash::{BuildHasher, RandomState};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longer ids are replaced: they end up in every log line of the request.
const MAX_ID_BYTES: usize = 128;

/// The route label of a request that matched no route: never a template,
/// which all start with `/`.
const UNMATCHED: &str = "unmatched";

pub async fn observe(request: Request, next: Next) -> Response {
    let given = request.headers().get(&REQUEST_ID);
    let (id, replaced) = match given.and_then(well_formed) {
        Some(id) => (id.to_string(), false),
        None => (fresh_id(), given.is_some()),
    };
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let span = tracing::info_span!("request", request_id = %id);
    if replaced {
        span.in_scope(|| {
            tracing::debug!(
                "replaced the request's X-Request-Id: an id is 1 to {MAX_ID_BYTES} visible ASCII characters"
            )
        });
    }
    let mut response = next.run(request).instrument(span).await;
    crate::metrics::http_request(
        method.as_str(),
        route.as_ref().map_or(UNMATCHED, MatchedPath::as_str),
        response.status().as_u16(),
    );
    let value = HeaderValue::from_str(&id).expect("a request id is visible ASCII");
    response.headers_mut().insert(REQUEST_ID, value);
    response
}

/// The client's id, if it is one berth can log and send back as it is.
fn well_formed(value: &HeaderValue) -> Option<&str> {
    let bytes = value.as_bytes();
    let fits = (1..=MAX_ID_BYTES).contains(&bytes.len()) && bytes.iter().all(u8::is_ascii_graphic);
    fits.then(|| value.to_str().ok()).flatten()
}

/// Unique within the process (a keyed hash of a counter), and not
/// predictable across restarts (the key is random).
fn fresh_id() -> String {
    static KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{:016x}",
        KEY.hash_one(NEXT.fetch_add(1, Ordering::Relaxed))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_visible_ascii_ids_are_kept() {
        #[rustfmt::skip]
        let cases: &[(&[u8], bool)] = &[
            (b"3f2a-77", true),
            (b"req_01HZX9{trace}=a/b", true),
            (&[b'a'; MAX_ID_BYTES], true),
            (&[b'a'; MAX_ID_BYTES + 1], false),
            (b"", false),
            (b"two words", false),
            (b"tab\there", false),
            ("caf\u{e9}".as_bytes(), false),
        ];
        for (raw, kept) in cases {
            let value = HeaderValue::from_bytes(raw).unwrap();
            assert_eq!(well_formed(&value).is_some(), *kept, "{raw:?}");
        }
    }

    #[test]
    fn fresh_ids_are_distinct_and_well_formed() {
        let (a, b) = (fresh_id(), fresh_id());
        assert_ne!(a, b);
        assert!(well_formed(&HeaderValue::from_str(&a).unwrap()).is_some());
    }
}
