//! The verification record: what berth knew about each file the last time
//! it checked every byte, so an unchanged file is trusted without re-reading
//! gigabytes. A record is trusted only if size, mtime, ctime, inode and
//! device all still match. An ordinary process can set mtime back but not
//! ctime: any write or rename since the check changes ctime, so rewriting a
//! file in place, truncating it, or replacing it is caught. What is not
//! caught: someone who can set the clock back or write the block device.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    size: u64,
    /// The hash the bytes had when checked; `None` when the model records
    /// no hash for the file (then only the size was ever checked).
    sha256: Option<String>,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    dev: u64,
}

impl Stamp {
    pub(crate) fn of(meta: &std::fs::Metadata, sha256: Option<&str>) -> Self {
        Self {
            size: meta.len(),
            sha256: sha256.map(str::to_string),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }

    /// Whether the file, as it is now, is the one that was checked.
    pub(crate) fn vouches_for(&self, meta: &std::fs::Metadata, sha256: Option<&str>) -> bool {
        *self == Stamp::of(meta, self.sha256.as_deref()) && self.sha256.as_deref() == sha256
    }
}

/// The records of one model directory, by file path. Saved as one JSON
/// file, replaced atomically.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Stamps {
    files: BTreeMap<String, Stamp>,
    /// Whether anything was recorded since loading: an unchanged record is
    /// not written again.
    #[serde(skip)]
    changed: bool,
}

impl Stamps {
    /// An unreadable record is no record: everything gets re-hashed.
    pub(crate) fn load(path: &Path) -> Self {
        std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    pub(crate) fn get(&self, file: &str) -> Option<&Stamp> {
        self.files.get(file)
    }

    pub(crate) fn insert(&mut self, file: &str, stamp: Stamp) {
        if self.files.get(file) != Some(&stamp) {
            self.files.insert(file.to_string(), stamp);
            self.changed = true;
        }
    }

    /// Forgets `file`: the record no longer vouches for it, nor for its
    /// directory.
    pub(crate) fn remove(&mut self, file: &str) {
        if self.files.remove(file).is_some() {
            self.changed = true;
        }
    }

    pub(crate) fn changed(&self) -> bool {
        self.changed
    }

    /// Each recorded path whose bytes were checked against a sha256, with
    /// that sha256.
    pub(crate) fn hashed(&self) -> impl Iterator<Item = (&str, &str)> {
        self.files
            .iter()
            .filter_map(|(path, stamp)| Some((path.as_str(), stamp.sha256.as_deref()?)))
    }

    /// Written without an fsync: a record lost in a crash only costs a
    /// re-hash, and the rename keeps a reader from seeing half of one.
    pub(crate) fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, path)
    }
}
