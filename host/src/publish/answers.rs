//! What a publish tells its caller and how it reads a destination's
//! answers: the `Error` of a put or stat (each sentence names the target,
//! never a credential, and is scrubbed of the target's), a refusal's body
//! quoted once scrubbed, and the one retry decision of the backends that
//! speak HTTP themselves.

/// Why a put or stat did not happen; each sentence names the target (and
/// the key), never a credential.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("target {name:?} is not configured on this server")]
    NotConfigured { name: String },
    /// The key is not one this kind of target takes (an oci target's are
    /// `REPO:TAG/PATH`).
    #[error("target {target:?}: {reason}")]
    Key { target: String, reason: String },
    /// Its client could not be built from its settings.
    #[error("target {target:?} ({url}) cannot be set up: {reason}")]
    Setup {
        target: String,
        url: String,
        reason: String,
    },
    /// The bytes to put are not what they should be (a file changed, is
    /// missing, or does not hash to its expected digest): nothing was put.
    #[error("target {target:?}: {key} was not published: {reason}")]
    Source {
        target: String,
        key: String,
        reason: String,
    },
    /// The destination answered, and not with a yes.
    #[error("target {target:?} ({url}) refused {what}: {reason}")]
    Refused {
        target: String,
        url: String,
        what: String,
        reason: String,
    },
    /// No answer, after the retries.
    #[error("cannot reach target {target:?} ({url}) for {what}: {reason}")]
    Unreachable {
        target: String,
        url: String,
        what: String,
        reason: String,
    },
    #[error("the put was cancelled")]
    Cancelled,
}

impl Error {
    /// The same error with `scrubber`'s credentials cut out of its words.
    pub(super) fn scrubbed(self, scrubber: &crate::scrub::Scrubber) -> Self {
        let clean = |text: String| scrubber.text(&text).into_owned();
        match self {
            Error::Key { target, reason } => Error::Key {
                target,
                reason: clean(reason),
            },
            Error::Setup {
                target,
                url,
                reason,
            } => Error::Setup {
                target,
                url,
                reason: clean(reason),
            },
            Error::Source {
                target,
                key,
                reason,
            } => Error::Source {
                target,
                key,
                reason: clean(reason),
            },
            Error::Refused {
                target,
                url,
                what,
                reason,
            } => Error::Refused {
                target,
                url,
                what,
                reason: clean(reason),
            },
            Error::Unreachable {
                target,
                url,
                what,
                reason,
            } => Error::Unreachable {
                target,
                url,
                what,
                reason: clean(reason),
            },
            e @ (Error::NotConfigured { .. } | Error::Cancelled) => e,
        }
    }
}

/// How much of a destination's refusal a sentence quotes.
const QUOTED: usize = 300;

/// The start of `response`'s body, for a sentence: read a credential's
/// length beyond what is quoted, scrubbed, then cut, so that no part of
/// a credential is left at the cut.
pub(super) async fn quote(
    response: reqwest::Response,
    scrubber: &crate::scrub::Scrubber,
) -> String {
    let said = start_of(response, QUOTED + scrubber.longest()).await;
    scrubber.quote(&said, QUOTED)
}

/// At most the first `wanted` bytes of `response`'s body; what came
/// before an error, if one broke it off.
pub(super) async fn start_of(mut response: reqwest::Response, wanted: usize) -> Vec<u8> {
    let mut said = Vec::new();
    while said.len() < wanted {
        match response.chunk().await {
            Ok(Some(chunk)) => said.extend_from_slice(&chunk),
            _ => break,
        }
    }
    said.truncate(wanted);
    said
}

/// Whether a destination's answer may be different next time: the one
/// retry decision of every backend that speaks HTTP itself.
pub(super) fn worth_retrying(status: ::http::StatusCode) -> bool {
    status.is_server_error()
        || status == ::http::StatusCode::REQUEST_TIMEOUT
        || status == ::http::StatusCode::TOO_MANY_REQUESTS
}

/// Tries of one request, the first included.
pub(super) const TRIES: u32 = 4;

/// The answer to what `attempt` sends, tried again after a broken
/// connection or a 5xx, 408 or 429 answer, up to `TRIES` times with a
/// growing wait; the last answer, whatever it is. `attempt` returns an
/// error that must not be retried (cancelled, a file not as it should
/// be) as its outer `Err`. A broken request's words never hold its URL,
/// which may carry a credential (an Azure SAS token).
pub(super) async fn retrying<F, Fut>(
    subject: &super::Subject,
    what: &str,
    cancel: &tokio_util::sync::CancellationToken,
    mut attempt: F,
) -> Result<reqwest::Response, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<reqwest::Result<reqwest::Response>, Error>>,
{
    let mut backoff = crate::backoff::Backoff::new();
    let mut tries = 0;
    loop {
        tries += 1;
        let last = tries == TRIES;
        let why = match attempt().await? {
            Ok(response) if last || !worth_retrying(response.status()) => return Ok(response),
            Ok(response) => format!("it answered {}", response.status()),
            // A request that cannot be made, or a server whose
            // certificate is not trusted, will be the same next time.
            Err(e) if last || e.is_builder() || !crate::trust::hint(&e).is_empty() => {
                let hint = crate::trust::hint(&e);
                return Err(subject.unreachable(
                    what,
                    format!("{}{hint}", crate::causes::innermost(&e.without_url())),
                ));
            }
            Err(e) => crate::causes::innermost(&e.without_url()),
        };
        super::wait_to_try_again(subject, what, &why, &mut backoff, cancel).await?;
    }
}
