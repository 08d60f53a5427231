//! Local files as sources (`file://`): a regular file read from the asked
//! offset, refused if it is anything else. Also reads a model's files where
//! they are for `check_local`. Knows nothing of verification.

use futures::{StreamExt, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use super::{Body, Span};

/// Opens the local file at `path` for the bytes of `span`; an offset past
/// its end reads it whole, as an HTTP source would answer.
pub(crate) async fn open_file(path: &std::path::Path, span: Span) -> Result<Body, String> {
    // Only a regular file can be a model's file: a FIFO would hold the
    // deployment (and the model directory's lock) until a writer came, a
    // device would never end. O_NONBLOCK lets a FIFO be opened, and so
    // refused, at once; a regular file reads the same with it.
    let mut file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .await
        .map_err(|e| format!("cannot open the source file {}: {e}", path.display()))?;
    let metadata = file
        .metadata()
        .await
        .map_err(|e| format!("cannot read the source file {}: {e}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!(
            "the source file {} is not a regular file",
            path.display()
        ));
    }
    let len = metadata.len();
    let start = if span.start <= len { span.start } else { 0 };
    file.seek(std::io::SeekFrom::Start(start))
        .await
        .map_err(|e| format!("cannot read the source file {}: {e}", path.display()))?;
    let ranged = start == span.start;
    let end = span.end.filter(|_| ranged).unwrap_or(len).min(len);
    let stream = ReaderStream::with_capacity(file.take(end.saturating_sub(start)), 1 << 20)
        .map_err(|e| format!("reading the source file broke off: {e}"))
        .boxed();
    Ok(Body {
        stream,
        start,
        ranged,
        total: Some(len),
    })
}
