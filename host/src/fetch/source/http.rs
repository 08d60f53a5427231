//! HTTP and HTTPS sources: a GET with a `Range` header, redirects followed
//! here hop by hop so that each request carries only the credentials of the
//! prefix covering its own URL (a redirect to another host never takes them
//! along), and the answer's status and `Content-Range` read into a `Body`.
//! Knows nothing of verification.

use futures::{StreamExt, TryStreamExt};

use super::{Body, Sources, Span, innermost};
use crate::redirects::{self, MAX_REDIRECTS, Stopped};

/// A source's answer to an HTTP request, after the redirects.
struct Answer {
    response: reqwest::Response,
    /// The request, as messages name it.
    named: String,
    /// The prefix whose credentials the answering request carried.
    credentials: Option<String>,
}

impl Sources {
    /// Opens the file at `url`: see `Sources::open`.
    pub(super) async fn open_http(&self, url: &url::Url, span: Span) -> Result<Body, String> {
        let mut answer = self.send(url, span.is_partial().then_some(span)).await?;
        if span.is_partial()
            && answer.response.status() == reqwest::StatusCode::RANGE_NOT_SATISFIABLE
        {
            // What we hold is longer than the source's file: start over.
            answer = self.send(url, None).await?;
        }
        let Answer {
            response,
            named: url,
            credentials,
        } = answer;
        let status = response.status();
        if matches!(
            status,
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN
        ) {
            return Err(match credentials {
                Some(prefix) => format!(
                    "the source answered {status} ({url}) to the credentials of the prefix \
                     {prefix} in the sources file: check them"
                ),
                None => format!(
                    "the source answered {status} ({url}) and no prefix in the sources file \
                     (--sources-file) covers it, so no credentials were sent"
                ),
            });
        }
        if !status.is_success() {
            return Err(format!("the source answered {status} ({url})"));
        }
        body_of(response, span, &url)
    }

    /// GETs `url`, following redirects: each hop carries the credentials
    /// of the prefix covering that hop's URL, and no others.
    async fn send(&self, url: &url::Url, range: Option<Span>) -> Result<Answer, String> {
        let followed = redirects::follow(url.clone(), |at, _| async move {
            let credentials = self.access.covering(&at);
            let mut request = self.client.get(at.clone());
            if let Some(credentials) = credentials {
                request = request.headers(credentials.headers().clone());
            }
            if let Some(span) = range {
                request = request.header(reqwest::header::RANGE, span.header());
            }
            request.send().await.map_err(|e| {
                format!(
                    "cannot reach the source ({}): {}{}",
                    named(url, &at),
                    innermost(&e),
                    crate::trust::hint(&e)
                )
            })
        })
        .await;
        match followed {
            Ok((response, at)) => Ok(Answer {
                response,
                named: named(url, &at),
                credentials: self.access.covering(&at).map(|c| c.prefix().to_string()),
            }),
            Err(Stopped::Send(e)) => Err(e),
            Err(Stopped::Invalid { at }) => Err(format!(
                "the source ({}) redirected to an invalid location",
                named(url, &at)
            )),
            Err(Stopped::TooMany) => Err(format!(
                "the source redirected more than {MAX_REDIRECTS} times ({url})"
            )),
        }
    }
}

/// A successful answer to a request for `span` as a `Body`: ranged when
/// the source answered 206 with the range asked for. `url` names the
/// request in messages.
pub(super) fn body_of(response: reqwest::Response, span: Span, url: &str) -> Result<Body, String> {
    let ranged = response.status() == reqwest::StatusCode::PARTIAL_CONTENT;
    let (start, total) = if ranged {
        content_range(response.headers())
            .filter(|(start, _)| *start == span.start)
            .ok_or_else(|| {
                format!(
                    "the source answered a range other than {} ({url})",
                    span.header()
                )
            })?
    } else {
        (0, response.content_length())
    };
    let stream = response
        .bytes_stream()
        .map_err(|e| format!("the download broke off: {}", innermost(&e)))
        .boxed();
    Ok(Body {
        stream,
        start,
        ranged,
        total,
    })
}

/// A request as messages name it: the model's URL and, after a redirect,
/// where it led, without its query, which may be a signature (messages
/// reach rows).
fn named(url: &url::Url, at: &url::Url) -> String {
    if at == url {
        return url.to_string();
    }
    let mut to = at.clone();
    to.set_query(None);
    format!("{url}, redirected to {to}")
}

/// The first byte and the total size (unless `*`) of a `Content-Range:
/// bytes FIRST-LAST/TOTAL` answer.
fn content_range(headers: &reqwest::header::HeaderMap) -> Option<(u64, Option<u64>)> {
    let value = headers.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    let range = value.strip_prefix("bytes ")?;
    let (span, total) = range.split_once('/')?;
    let start = span.split('-').next()?.trim().parse().ok()?;
    Some((start, total.trim().parse().ok()))
}
