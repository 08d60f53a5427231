//! The formats of a model's verified files (`crate::formats`), told before
//! its verification record is written: a file whose bytes do not hold as
//! their format (a safetensors header that lies) is left out of the record,
//! so the copy is never vouched for, and fails the fetch with its fault.
//! Runs on the blocking pool, under the directory's lock or on a directory
//! the record vouches for: real names hold only verified bytes.

use std::path::Path;

use super::Error;
use super::store::stamp::Stamps;
use crate::formats::{self, Format};
use crate::model::ModelFile;

/// Each file's format, in `files`' order; the first file that does not hold
/// is the error, and every such file is forgotten by `stamps` (when given).
pub(super) fn examine_all(
    dir: &Path,
    files: &[ModelFile],
    mut stamps: Option<&mut Stamps>,
) -> Result<Vec<Format>, Error> {
    let mut formats = Vec::with_capacity(files.len());
    let mut first = None;
    for file in files {
        match formats::examine(&dir.join(&file.path)) {
            Ok(format) => formats.push(format),
            Err(problem) => {
                if let Some(stamps) = stamps.as_deref_mut() {
                    stamps.remove(&file.path);
                }
                first.get_or_insert(Error::File {
                    path: file.path.clone(),
                    reason: problem.to_string(),
                });
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(formats),
    }
}
