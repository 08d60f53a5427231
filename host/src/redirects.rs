//! Following redirects by hand, hop by hop, so that the caller decides what
//! each hop carries: a source's credentials only to the URL its prefix
//! covers, a registry's none past its own host. reqwest's own follower is
//! off in every client that sends credentials (it would carry them along).

use std::future::Future;

use reqwest::header::{HeaderValue, LOCATION};
use reqwest::{Response, StatusCode};

/// Redirects followed for one request, as many as curl's and reqwest's
/// defaults.
pub const MAX_REDIRECTS: usize = 10;

/// Why following stopped without an answer.
#[derive(Debug)]
pub enum Stopped<E> {
    /// A hop's request failed: the sender's error.
    Send(E),
    /// `at` redirected to something that is no http(s) URL.
    Invalid { at: url::Url },
    /// More than `MAX_REDIRECTS` redirects.
    TooMany,
}

/// Sends `first`, then follows each redirect answer to its `Location`
/// (resolved against the URL that answered; http and https only) with
/// `send(url, hop)` (`hop` 0 is the first request), up to `MAX_REDIRECTS`
/// times. Answers the first answer that is no redirect and the URL that
/// gave it.
pub async fn follow<E, Fut>(
    first: url::Url,
    mut send: impl FnMut(url::Url, usize) -> Fut,
) -> Result<(Response, url::Url), Stopped<E>>
where
    Fut: Future<Output = Result<Response, E>>,
{
    let mut at = first;
    for hop in 0..=MAX_REDIRECTS {
        let response = send(at.clone(), hop).await.map_err(Stopped::Send)?;
        let Some(location) = target(&response) else {
            return Ok((response, at));
        };
        at = location
            .to_str()
            .ok()
            .and_then(|location| at.join(location).ok())
            .filter(|next| matches!(next.scheme(), "http" | "https"))
            .ok_or_else(|| Stopped::Invalid { at: at.clone() })?;
    }
    Err(Stopped::TooMany)
}

/// Where a redirect answer sends the request next (its `Location`), if it
/// is one.
fn target(response: &Response) -> Option<&HeaderValue> {
    matches!(
        response.status(),
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    )
    .then(|| response.headers().get(LOCATION))
    .flatten()
}
