//! Where a model's files come from: the model's `source` template filled in
//! for one file, and a byte stream of it. Knows nothing of verification.

use std::path::PathBuf;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use tokio_util::io::ReaderStream;

/// Characters escaped in a filled-in `{path}` or `{job_id}`: everything but
/// unreserved characters and `/`, so nested paths stay nested.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ').add(b'"').add(b'#').add(b'%').add(b'&').add(b'+').add(b',').add(b';')
    .add(b'<').add(b'=').add(b'>').add(b'?').add(b'@').add(b'[').add(b'\\').add(b']')
    .add(b'^').add(b'`').add(b'{').add(b'|').add(b'}').add(b':').add(b'\'');

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
        .replace("{job_id}", &utf8_percent_encode(job_id, SEGMENT).to_string())
        .replace("{path}", &utf8_percent_encode(path, SEGMENT).to_string());
    let url = url::Url::parse(&filled).map_err(|e| format!("the source URL {filled} is not valid: {e}"))?;
    match url.scheme() {
        "http" | "https" => Ok(Location::Http(url)),
        "file" => url
            .to_file_path()
            .map(Location::File)
            .map_err(|()| format!("the source URL {filled} is not a local file path")),
        other => Err(format!("the source scheme {other}: is not supported (http, https, file)")),
    }
}

pub(crate) type ByteStream = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

/// Opens the file at `location`; the error says what the source answered.
pub(crate) async fn open(client: &reqwest::Client, location: &Location) -> Result<ByteStream, String> {
    match location {
        Location::Http(url) => {
            let response = client
                .get(url.clone())
                .send()
                .await
                .map_err(|e| format!("cannot reach the source ({url}): {}", describe_reqwest(&e)))?;
            let status = response.status();
            if !status.is_success() {
                return Err(format!("the source answered {status} ({url})"));
            }
            Ok(response
                .bytes_stream()
                .map_err(|e| format!("the download broke off: {}", describe_reqwest(&e)))
                .boxed())
        }
        Location::File(path) => {
            let file = tokio::fs::File::open(path)
                .await
                .map_err(|e| format!("cannot open the source file {}: {e}", path.display()))?;
            Ok(ReaderStream::with_capacity(file, 1 << 20)
                .map_err(|e| format!("reading the source file broke off: {e}"))
                .boxed())
        }
    }
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
            ("http://files.local/{job_id}/{path}", "job-1", "a/b.bin", http("http://files.local/job-1/a/b.bin")),
            (
                "http://sidecar:8787/models/file?model_path=trained/{job_id}&file={path}",
                "j",
                "w x&y.bin",
                http("http://sidecar:8787/models/file?model_path=trained/j&file=w%20x%26y.bin"),
            ),
            ("file:///srv/models/{job_id}/{path}", "j", "sub/w x.bin", Location::File("/srv/models/j/sub/w x.bin".into())),
        ];
        for (template, job, path, expected) in cases {
            assert_eq!(locate(template, job, path).unwrap(), expected, "{template}");
        }
    }
}
