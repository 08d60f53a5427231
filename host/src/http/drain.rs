//! Answering a request whose body the answer did not need (a refusal, a
//! blob stored already). A server that answers and closes with the
//! client's bytes still unread resets the connection, and the client loses
//! the answer it was sent (hyper: "connection closed before message
//! completed"). So what is left of the body is read and dropped first, up
//! to `LIMIT`; past it the answer goes at once and says `Connection:
//! close`, so that no client reuses a connection the server is closing
//! (`berth models push` then asks again with an empty body to hear why).

use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt};

/// The most of an unneeded body read before answering.
const LIMIT: usize = 8 << 20;

/// `answer`, once what is left of `body` is read (up to `LIMIT`).
pub async fn answer<E>(
    body: &mut (impl Stream<Item = Result<Bytes, E>> + Unpin),
    mut answer: Response,
) -> Response {
    let mut read = 0;
    while read < LIMIT {
        match body.next().await {
            Some(Ok(chunk)) => read += chunk.len(),
            _ => return answer,
        }
    }
    answer
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    answer
}
