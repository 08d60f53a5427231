//! Where a model's files come from: the model's `source` template filled in
//! for one file, and a byte stream of it. Knows nothing of verification.

use std::path::PathBuf;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use tokio::io::AsyncSeekExt;
use tokio_util::io::ReaderStream;

/// Characters escaped in a filled-in `{path}` or `{job_id}`: everything but
/// unreserved characters and `/`, so nested paths stay nested.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'+')
    .add(b',')
    .add(b';')
    .add(b'<')
    .add(b'=')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}')
    .add(b':')
    .add(b'\'');

/// The location of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    Http(url::Url),
    File(PathBuf),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Http(url) => write!(f, "{url}"),
            Location::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Fills the template. The template was validated at registration, so a
/// failure here means the filled-in URL is broken, which is reported.
pub(crate) fn locate(template: &str, job_id: &str, path: &str) -> Result<Location, String> {
    let filled = template
        .replace(
            "{job_id}",
            &utf8_percent_encode(job_id, SEGMENT).to_string(),
        )
        .replace("{path}", &utf8_percent_encode(path, SEGMENT).to_string());
    let url = url::Url::parse(&filled)
        .map_err(|e| format!("the source URL {filled} is not valid: {e}"))?;
    match url.scheme() {
        "http" | "https" => Ok(Location::Http(url)),
        "file" => url
            .to_file_path()
            .map(Location::File)
            .map_err(|()| format!("the source URL {filled} is not a local file path")),
        other => Err(format!(
            "the source scheme {other}: is not supported (http, https, file)"
        )),
    }
}

pub(crate) type ByteStream = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

/// An open file at the source: its bytes from `start` on.
pub(crate) struct Body {
    pub(crate) stream: ByteStream,
    /// Where the stream begins: the offset that was asked for when the
    /// source honours ranges, 0 when it sends the whole file instead.
    pub(crate) start: u64,
}

/// Opens the file at `location` from byte `offset` on (an HTTP `Range`
/// request when `offset > 0`); the error says what the source answered. A
/// source that ignores the range, or finds it unsatisfiable, is read from
/// the start.
pub(crate) async fn open(
    client: &reqwest::Client,
    location: &Location,
    offset: u64,
) -> Result<Body, String> {
    match location {
        Location::Http(url) => {
            let get = |range: Option<u64>| {
                let mut request = client.get(url.clone());
                if let Some(from) = range {
                    request = request.header(reqwest::header::RANGE, format!("bytes={from}-"));
                }
                async move {
                    request.send().await.map_err(|e| {
                        format!("cannot reach the source ({url}): {}", describe_reqwest(&e))
                    })
                }
            };
            let mut response = get((offset > 0).then_some(offset)).await?;
            if offset > 0 && response.status() == reqwest::StatusCode::RANGE_NOT_SATISFIABLE {
                // What we hold is longer than the source's file: start over.
                response = get(None).await?;
            }
            let status = response.status();
            if !status.is_success() {
                return Err(format!("the source answered {status} ({url})"));
            }
            let start = if status == reqwest::StatusCode::PARTIAL_CONTENT {
                range_start(response.headers())
                    .filter(|start| *start == offset)
                    .ok_or_else(|| {
                        format!("the source answered a range other than bytes={offset}- ({url})")
                    })?
            } else {
                0
            };
            let stream = response
                .bytes_stream()
                .map_err(|e| format!("the download broke off: {}", describe_reqwest(&e)))
                .boxed();
            Ok(Body { stream, start })
        }
        Location::File(path) => {
            let mut file = tokio::fs::File::open(path)
                .await
                .map_err(|e| format!("cannot open the source file {}: {e}", path.display()))?;
            let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
            let start = if offset <= len { offset } else { 0 };
            file.seek(std::io::SeekFrom::Start(start))
                .await
                .map_err(|e| format!("cannot read the source file {}: {e}", path.display()))?;
            let stream = ReaderStream::with_capacity(file, 1 << 20)
                .map_err(|e| format!("reading the source file broke off: {e}"))
                .boxed();
            Ok(Body { stream, start })
        }
    }
}

/// The first byte of a `Content-Range: bytes FIRST-LAST/TOTAL` answer.
fn range_start(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let value = headers.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    let range = value.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

/// reqwest's own words ("error sending request for url …") hide the
/// reason; the innermost cause ("Connection refused") is what people need.
fn describe_reqwest(e: &reqwest::Error) -> String {
    let mut innermost: &dyn std::error::Error = e;
    while let Some(cause) = innermost.source() {
        innermost = cause;
    }
    innermost.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled_with_escaped_values() {
        let http = |u: &str| Location::Http(url::Url::parse(u).unwrap());
        let cases = [
            (
                "http://files.local/{job_id}/{path}",
                "job-1",
                "a/b.bin",
                http("http://files.local/job-1/a/b.bin"),
            ),
            (
                "http://sidecar:8787/models/file?model_path=trained/{job_id}&file={path}",
                "j",
                "w x&y.bin",
                http("http://sidecar:8787/models/file?model_path=trained/j&file=w%20x%26y.bin"),
            ),
            (
                "file:///srv/models/{job_id}/{path}",
                "j",
                "sub/w x.bin",
                Location::File("/srv/models/j/sub/w x.bin".into()),
            ),
        ];
        for (template, job, path, expected) in cases {
            assert_eq!(locate(template, job, path).unwrap(), expected, "{template}");
        }
    }
}
