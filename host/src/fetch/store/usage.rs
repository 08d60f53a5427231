//! What the models dir holds on disk: each model directory's bytes and how
//! many of them it shares with another model directory (one inode, hard
//! linked), the bytes on disk counted once per inode, what sharing saves,
//! the blobs no model links any more, and the pinned ones (uploaded: never
//! dropped for the budget); uploads still arriving count as bytes on disk. One `lstat` per entry, never a
//! byte read and never a symbolic link followed; berth's own bookkeeping
//! (`.berth`) is not model bytes and is left out. Only reads: what to drop
//! is decided elsewhere.

use std::collections::{BTreeMap, HashMap};
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::blobs::{PINS, UPLOADS};
use crate::fetch::disk::{blocking, disk_error};
use crate::fetch::{BLOBS_DIR, Error, Fetcher, META_DIR};

/// The models dir as one scan saw it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Each model directory, by its name (the model's job id).
    pub dirs: BTreeMap<String, DirUsage>,
    /// The bytes of the model directories and the blobs, each inode once.
    pub bytes_on_disk: u64,
    /// What the model directories' files would take as separate copies,
    /// less what their inodes take: what hard links save.
    pub bytes_saved: u64,
    /// The bytes of blobs that nothing else links (dropped on eviction).
    pub unreferenced_blob_bytes: u64,
    /// The blobs that came by upload, which no budget drops, and their
    /// bytes.
    pub pinned_blobs: u64,
    pub pinned_bytes: u64,
}

/// One model directory's regular files (partial downloads included).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DirUsage {
    pub bytes: u64,
    /// The bytes of its files whose inode another model directory links
    /// too.
    pub shared_bytes: u64,
}

impl Fetcher {
    /// The directory every model directory is in.
    pub fn models_dir(&self) -> &Path {
        &self.models_dir
    }

    /// Scans the models dir, off the runtime's threads, and records what it
    /// found in the metrics.
    pub async fn usage(&self) -> Result<Usage, Error> {
        let dir = self.models_dir.clone();
        let usage = blocking(move || scan(&dir).map_err(disk_error(&dir))).await?;
        crate::metrics::models_storage(usage.bytes_on_disk, usage.bytes_saved);
        Ok(usage)
    }
}

/// `Fetcher::usage` on the calling thread, which it blocks: for work that
/// already runs on the blocking pool. A models dir that does not exist yet
/// holds nothing.
pub fn scan(models_dir: &Path) -> std::io::Result<Usage> {
    let mut seen = Seen::default();
    let mut model_files: BTreeMap<String, Vec<Inode>> = BTreeMap::new();
    for entry in read_dir(models_dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(meta) = metadata(&entry)? else {
            continue;
        };
        if !meta.is_dir() || name == META_DIR {
            continue;
        }
        if name == BLOBS_DIR {
            for part in read_dir(&entry.path())? {
                let name = part.file_name();
                walk_entry(&part, &mut |meta| {
                    let linked = seen.entry(meta);
                    match name.to_str() {
                        Some(PINS) => linked.pinned = true,
                        Some(UPLOADS) => {}
                        _ => linked.in_blobs = true,
                    }
                })?;
            }
        } else if !name.starts_with('.') {
            // Job ids never start with a dot: other dot names are not model
            // directories (one being removed, renamed aside).
            let index = model_files.len();
            let files = model_files.entry(name).or_default();
            walk(&entry.path(), &mut |meta| {
                files.push(seen.in_model(meta, index))
            })?;
        }
    }
    Ok(seen.usage(model_files))
}

/// An inode: which device, which number.
type Inode = (u64, u64);

/// Every regular file's inode met so far.
#[derive(Default)]
struct Seen {
    inodes: HashMap<Inode, Linked>,
}

/// What one inode is and who links it.
struct Linked {
    bytes: u64,
    nlink: u64,
    in_blobs: bool,
    pinned: bool,
    /// The first model directory met that links it, and whether another
    /// one does too.
    first_dir: Option<usize>,
    several_dirs: bool,
}

impl Seen {
    fn entry(&mut self, meta: &Metadata) -> &mut Linked {
        self.inodes
            .entry((meta.dev(), meta.ino()))
            .or_insert_with(|| Linked {
                bytes: meta.len(),
                nlink: meta.nlink(),
                in_blobs: false,
                pinned: false,
                first_dir: None,
                several_dirs: false,
            })
    }

    /// Records a file of the model directory numbered `dir`.
    fn in_model(&mut self, meta: &Metadata, dir: usize) -> Inode {
        let linked = self.entry(meta);
        match linked.first_dir {
            None => linked.first_dir = Some(dir),
            Some(first) if first != dir => linked.several_dirs = true,
            Some(_) => {}
        }
        (meta.dev(), meta.ino())
    }

    fn usage(self, model_files: BTreeMap<String, Vec<Inode>>) -> Usage {
        let mut usage = Usage::default();
        let (mut listed, mut unique) = (0, 0);
        for linked in self.inodes.values() {
            usage.bytes_on_disk += linked.bytes;
            if linked.pinned {
                usage.pinned_blobs += 1;
                usage.pinned_bytes += linked.bytes;
            }
            if linked.first_dir.is_some() {
                unique += linked.bytes;
            } else if linked.in_blobs && linked.nlink == 1 {
                usage.unreferenced_blob_bytes += linked.bytes;
            }
        }
        for (name, files) in model_files {
            let mut dir = DirUsage::default();
            for inode in files {
                let linked = &self.inodes[&inode];
                dir.bytes += linked.bytes;
                if linked.several_dirs {
                    dir.shared_bytes += linked.bytes;
                }
            }
            listed += dir.bytes;
            usage.dirs.insert(name, dir);
        }
        usage.bytes_saved = listed - unique;
        usage
    }
}

/// Calls `file` with each regular file under `dir`, at any depth; links
/// are not followed, and what vanishes meanwhile (a removal, a rename) is
/// skipped.
fn walk(dir: &Path, file: &mut dyn FnMut(&Metadata)) -> std::io::Result<()> {
    for entry in read_dir(dir)? {
        walk_entry(&entry, file)?;
    }
    Ok(())
}

/// `walk` from one entry: itself if a regular file, its files if a folder.
fn walk_entry(entry: &std::fs::DirEntry, file: &mut dyn FnMut(&Metadata)) -> std::io::Result<()> {
    match metadata(entry)? {
        Some(meta) if meta.is_file() => file(&meta),
        Some(meta) if meta.is_dir() => walk(&entry.path(), file)?,
        _ => {}
    }
    Ok(())
}

/// `dir`'s entries; none if it is gone.
fn read_dir(dir: &Path) -> std::io::Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The entry's own metadata (`DirEntry::metadata` does not follow a
/// link); none if it is gone.
fn metadata(entry: &std::fs::DirEntry) -> std::io::Result<Option<Metadata>> {
    match entry.metadata() {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn write(path: &Path, len: usize) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, vec![7u8; len]).unwrap();
    }

    #[test]
    fn shared_inodes_count_once_and_links_are_not_followed() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        // A blob linked from two models, one only in `a`, one in no model.
        let shared = root.join(".blobs/sha256/ab/ab01");
        write(&shared, 1000);
        fs::create_dir_all(root.join("a/sub")).unwrap();
        fs::create_dir_all(root.join("b")).unwrap();
        fs::hard_link(&shared, root.join("a/sub/weights.bin")).unwrap();
        fs::hard_link(&shared, root.join("b/model.bin")).unwrap();
        write(&root.join("a/config.json"), 10);
        write(&root.join("b/.fetch-tokenizer.json"), 5);
        write(&root.join(".blobs/sha256/cd/cd02"), 300);
        // A link to a large file outside: not followed, not counted.
        let outside = tempfile::tempdir().unwrap();
        write(&outside.path().join("big"), 4000);
        std::os::unix::fs::symlink(outside.path().join("big"), root.join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("c")).unwrap();
        // berth's bookkeeping is not model bytes.
        write(&root.join(".berth/a.stamps.json"), 50);

        let usage = scan(root).unwrap();
        assert_eq!(
            usage.dirs,
            BTreeMap::from([
                (
                    "a".to_string(),
                    DirUsage {
                        bytes: 1010,
                        shared_bytes: 1000
                    }
                ),
                (
                    "b".to_string(),
                    DirUsage {
                        bytes: 1005,
                        shared_bytes: 1000
                    }
                ),
            ])
        );
        assert_eq!(usage.bytes_on_disk, 1000 + 10 + 5 + 300);
        assert_eq!(usage.bytes_saved, 1000);
        assert_eq!(usage.unreferenced_blob_bytes, 300);
    }

    #[test]
    fn a_blob_linked_from_one_model_is_neither_shared_nor_unreferenced() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        let blob = root.join(".blobs/sha256/ef/ef03");
        write(&blob, 64);
        fs::create_dir_all(root.join("a")).unwrap();
        fs::hard_link(&blob, root.join("a/x")).unwrap();
        fs::hard_link(&blob, root.join("a/y")).unwrap();
        let usage = scan(root).unwrap();
        let a = usage.dirs["a"];
        assert_eq!((a.bytes, a.shared_bytes), (128, 0), "one model, two paths");
        assert_eq!(usage.bytes_on_disk, 64);
        assert_eq!(usage.bytes_saved, 64);
        assert_eq!(usage.unreferenced_blob_bytes, 0);
    }

    #[test]
    fn pinned_blobs_are_counted_and_uploads_arriving_are_on_disk_but_no_blob() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        let blob = root.join(".blobs/sha256/ab/ab01");
        write(&blob, 1000);
        fs::create_dir_all(root.join(".blobs/pins")).unwrap();
        fs::hard_link(&blob, root.join(".blobs/pins/ab01")).unwrap();
        write(&root.join(".blobs/uploads/cd02"), 300);
        let usage = scan(root).unwrap();
        assert_eq!((usage.pinned_blobs, usage.pinned_bytes), (1, 1000));
        assert_eq!(usage.bytes_on_disk, 1300);
        assert_eq!(usage.unreferenced_blob_bytes, 0);
    }

    #[test]
    fn a_models_dir_not_made_yet_holds_nothing() {
        let temp = tempfile::tempdir().unwrap();
        assert_eq!(scan(&temp.path().join("models")).unwrap(), Usage::default());
    }

    /// One `lstat` per file and no byte read: 10,000 files take
    /// milliseconds, not the seconds a read would.
    #[test]
    fn ten_thousand_files_scan_quickly() {
        let temp = tempfile::tempdir().unwrap();
        for dir in 0..100 {
            let dir = temp.path().join(format!("job-{dir}"));
            fs::create_dir_all(&dir).unwrap();
            for file in 0..100 {
                fs::write(dir.join(format!("{file}.bin")), b"x").unwrap();
            }
        }
        let started = std::time::Instant::now();
        let usage = scan(temp.path()).unwrap();
        let took = started.elapsed();
        assert_eq!(usage.bytes_on_disk, 10_000);
        assert!(took < std::time::Duration::from_secs(2), "took {took:?}");
    }
}
