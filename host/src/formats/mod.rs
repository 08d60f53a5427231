//! What a model file's bytes are — safetensors, a pickle, a zip-pickle as
//! `torch.save` writes it, GGUF, JSON, other — told from its bytes, never
//! its name (`sniff`), and whether a safetensors file's header holds
//! (`safetensors`). Reads, never writes, and never unpickles: a pickle is
//! known by its opening opcodes alone.
//!
//! Where it runs: the fetch examines each file (`examine`) once its bytes
//! are verified and before the model's verification record vouches for
//! it, by reading the head of the file on disk rather than by watching the
//! download stream. Every way a file arrives meets there: one linked from
//! the blob store or found right in place is never streamed, a large one
//! arrives in pieces out of order over several connections, a resumed one
//! never streams its start again. Only verified bytes are judged, and the
//! cost is one short read per file (a safetensors header, at most 100 MB,
//! is read whole; a zip whose first entry is not `*/data.pkl` has its
//! central directory read from the end), next to the whole file's hash.

mod safetensors;
mod zip;

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

pub use crate::model::Format;
pub use safetensors::{Fault, MAX_HEADER_BYTES};

/// Enough of a file's start to tell its format: the pickle and GGUF magic,
/// a safetensors header's length and first byte, a zip's first entry name.
pub const HEAD_BYTES: usize = 1024;

/// The format `head` (a file's first bytes, `HEAD_BYTES` or all of a
/// shorter file) opens as. A zip whose first entry is not a `data.pkl` is
/// `Other` here; `examine` also reads its directory.
pub fn sniff(head: &[u8]) -> Format {
    if head.len() >= 3 && head[0] == 0x80 && (2..=5).contains(&head[1]) {
        return Format::Pickle;
    }
    if head.starts_with(b"GGUF") {
        return Format::Gguf;
    }
    if zip::is_zip(head) {
        return match zip::first_entry(head) {
            Some(name) if zip::is_data_pkl(name) => Format::ZipPickle,
            _ => Format::Other,
        };
    }
    // Before safetensors: JSON that opens with 8 bytes of blanks and a `{`
    // would read as a header length made of spaces.
    if looks_like_json(head) {
        return Format::Json;
    }
    if safetensors::opens(head) {
        return Format::Safetensors;
    }
    Format::Other
}

/// A JSON text's start: blanks (and a byte-order mark), then `{` or `[`,
/// all of the head UTF-8 (but a character cut at its end). The rest of
/// the file is not read: JSON is a label here, not a promise.
fn looks_like_json(head: &[u8]) -> bool {
    let text = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    let Some(first) = text.iter().find(|b| !b" \t\r\n".contains(b)) else {
        return false;
    };
    if !matches!(first, b'{' | b'[') {
        return false;
    }
    match std::str::from_utf8(text) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    }
}

/// Why a file could not be examined.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Problem {
    #[error("cannot be read to tell its format: {0}")]
    Unreadable(String),
    #[error(
        "is not a valid safetensors file: {0}; export it again (safetensors' save_file), or leave it out of the registration"
    )]
    Safetensors(Fault),
}

/// The format of the file at `file`, with a safetensors file's header
/// checked; reads its head, and the rest of a safetensors header or a
/// zip's directory. Bytes decide, not the name: a `.safetensors` file
/// that does not open as one is `other`, and left to the deployer.
pub fn examine(file: &Path) -> Result<Format, Problem> {
    let unreadable = |e: std::io::Error| Problem::Unreadable(e.to_string());
    let mut opened = std::fs::File::open(file).map_err(unreadable)?;
    let len = opened.metadata().map_err(unreadable)?.len();
    let mut head = Vec::with_capacity(HEAD_BYTES);
    (&mut opened)
        .take(HEAD_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(unreadable)?;
    let mut format = sniff(&head);
    if format == Format::Other && zip::is_zip(&head) && zip_holds_data_pkl(&mut opened, len)? {
        format = Format::ZipPickle;
    }
    if format == Format::Safetensors {
        let header = safetensors::read_header(&mut opened, &head, len).map_err(|e| match e {
            safetensors::Unread::Io(e) => unreadable(e),
            safetensors::Unread::Fault(fault) => Problem::Safetensors(fault),
        })?;
        safetensors::check(&header, len).map_err(Problem::Safetensors)?;
    }
    Ok(format)
}

/// Whether the zip `file` (`len` bytes) lists a `*/data.pkl`: its end
/// record, then its central directory, read if it is at most
/// `zip::MAX_DIRECTORY` bytes (a torch archive's is a few KiB).
fn zip_holds_data_pkl(file: &mut std::fs::File, len: u64) -> Result<bool, Problem> {
    let unreadable = |e: std::io::Error| Problem::Unreadable(e.to_string());
    let tail_len = len.min(zip::MAX_TAIL);
    let mut tail = vec![0; tail_len as usize];
    file.seek(SeekFrom::Start(len - tail_len))
        .map_err(unreadable)?;
    file.read_exact(&mut tail).map_err(unreadable)?;
    let Some((offset, size)) = zip::directory(&tail) else {
        return Ok(false);
    };
    if size > zip::MAX_DIRECTORY || offset.saturating_add(size) > len {
        return Ok(false);
    }
    let mut directory = vec![0; size as usize];
    file.seek(SeekFrom::Start(offset)).map_err(unreadable)?;
    file.read_exact(&mut directory).map_err(unreadable)?;
    Ok(zip::names(&directory).any(zip::is_data_pkl))
}

#[cfg(test)]
mod tests;
