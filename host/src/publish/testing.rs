//! What the publish tests of every kind of target share: keys, a source
//! file, the body of a put of it, and the refusal of a file whose bytes
//! are not the verified ones.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{Body, Key};

pub(super) fn key(text: &str) -> Key {
    Key::parse(text).unwrap()
}

/// A file of `len` varied bytes in `dir`, and its sha256.
pub(super) fn file(dir: &Path, len: usize) -> (PathBuf, Vec<u8>, String) {
    let contents: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let path = dir.join("model.bin");
    std::fs::write(&path, &contents).unwrap();
    let sha256 = hex::encode(Sha256::digest(&contents));
    (path, contents, sha256)
}

/// A put of the file at `path` holding `contents`, expected to have
/// `sha256` when one is given.
pub(super) fn file_body(path: &Path, contents: &[u8], sha256: Option<&str>) -> Body {
    Body::File {
        path: path.to_path_buf(),
        bytes: contents.len() as u64,
        sha256: sha256.map(str::to_string),
        vouched: None,
    }
}

/// `error` says `key` was not published to `target` because the bytes of
/// `path` are not the `wrong` digest given.
#[track_caller]
pub(super) fn assert_not_the_verified_one(
    error: &str,
    target: &str,
    key: &str,
    path: &Path,
    wrong: &str,
) {
    assert!(
        error.starts_with(&format!(
            "target \"{target}\": {key} was not published: {}: its bytes' sha256 is ",
            path.display()
        )) && error.contains(&format!("not the expected {wrong}")),
        "{error}"
    );
}
