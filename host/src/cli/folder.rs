//! A folder on this machine as a model's files: which entries are files a
//! registration can name (and why each other one is skipped or refused),
//! and their sha256, hashed on a few threads with one fixed buffer each, so
//! memory stays flat whatever the files' sizes. A link to a file inside the
//! folder or into a Hugging Face cache's `blobs/` is followed (registered
//! under the link's path, hashed from its target); another only when told.
//! Reads only; never prints.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// A regular file under the folder: its `/`-separated relative path and
/// its size when it was listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub path: String,
    pub size: u64,
}

/// An entry left out, and why, for a line a person reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Relative, `/`-separated; a directory ends in `/`.
    pub path: String,
    pub why: &'static str,
}

/// A link to a file outside the folder, not followed: its path and where
/// it leads. The command decides whether that is a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkOut {
    pub path: String,
    pub target: PathBuf,
}

/// What a folder holds, sorted by path.
#[derive(Debug, Default)]
pub struct Listing {
    pub files: Vec<Listed>,
    pub skipped: Vec<Skipped>,
    pub links_out: Vec<LinkOut>,
}

/// What a listing takes in besides the folder's regular files.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reach {
    /// Names starting with `.` (`.git/` never).
    pub dotfiles: bool,
    /// Links to files anywhere, not only inside the folder or a Hugging
    /// Face cache's `blobs/`.
    pub follow_links: bool,
}

/// Lists `dir`. `.git/` and berth's own `.fetch-*` partials are always
/// left out; other names starting with `.` unless `reach.dotfiles`. An
/// entry that cannot be registered as it is (a name berth cannot record, a
/// link that leads nowhere) fails the listing, every one named at once.
pub fn list(dir: &Path, reach: Reach) -> anyhow::Result<Listing> {
    let meta = std::fs::metadata(dir).with_context(|| format!("{}", dir.display()))?;
    anyhow::ensure!(meta.is_dir(), "{}: not a directory", dir.display());
    let walk = Walk {
        root: dir,
        real_root: &std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?,
        reach,
    };
    let mut listing = Listing::default();
    let mut refused = Vec::new();
    walk.dir(dir, &mut listing, &mut refused)?;
    anyhow::ensure!(refused.is_empty(), "{}", refused.join("\n"));
    listing.files.sort_by(|a, b| a.path.cmp(&b.path));
    listing.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listing)
}

/// One listing's folder, as given and as the filesystem resolves it.
struct Walk<'a> {
    root: &'a Path,
    real_root: &'a Path,
    reach: Reach,
}

impl Walk<'_> {
    /// Lists `dir`'s entries into `listing`; each that cannot be registered
    /// as it is adds its sentence to `refused`.
    fn dir(
        &self,
        dir: &Path,
        listing: &mut Listing,
        refused: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        let root = self.root;
        let entries =
            std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
            let path = entry.path();
            // `file_type` does not follow a symbolic link.
            let kind = entry
                .file_type()
                .with_context(|| format!("cannot read {}", path.display()))?;
            let relative = path
                .strip_prefix(root)?
                .to_string_lossy()
                .replace('\\', "/");
            let name = entry.file_name().to_string_lossy().into_owned();
            let skip = |why| Skipped {
                path: if kind.is_dir() {
                    format!("{relative}/")
                } else {
                    relative.clone()
                },
                why,
            };
            if kind.is_dir() && name == ".git" {
                listing.skipped.push(skip("a git repository's own files"));
            } else if name.starts_with(".fetch-") {
                listing
                    .skipped
                    .push(skip("a download berth has not finished"));
            } else if name.starts_with('.') && !self.reach.dotfiles {
                listing
                    .skipped
                    .push(skip("its name starts with a dot (--all registers it)"));
            } else if entry.file_name().to_str().is_none()
                && (kind.is_dir() || kind.is_file() || kind.is_symlink())
            {
                refused.push(format!(
                    "{relative}: the name is not UTF-8 ({} stands for what is not), and berth \
                 records a path as UTF-8 text: rename it, or move it out of {}",
                    char::REPLACEMENT_CHARACTER,
                    root.display()
                ));
            } else if kind.is_dir() {
                self.dir(&path, listing, refused)?;
            } else if kind.is_file() || kind.is_symlink() {
                let size = if kind.is_file() {
                    entry
                        .metadata()
                        .with_context(|| format!("cannot read {}", path.display()))?
                        .len()
                } else {
                    match self.link(&path) {
                        Link::File(size) => size,
                        Link::Skipped(why) => {
                            listing.skipped.push(skip(why));
                            continue;
                        }
                        Link::Broken(why) => {
                            refused.push(format!("{relative}: {why}"));
                            continue;
                        }
                        Link::Out(target) => {
                            listing.links_out.push(LinkOut {
                                path: relative,
                                target,
                            });
                            continue;
                        }
                    }
                };
                match crate::validate::path_rule(&relative) {
                    Ok(()) => listing.files.push(Listed {
                        path: relative,
                        size,
                    }),
                    Err(why) => refused.push(format!("{relative}: {why}")),
                }
            } else {
                listing.skipped.push(skip(what_else(kind)));
            }
        }
        Ok(())
    }

    /// What the symbolic link at `path` registers as: the size of the file it
    /// leads to, if it is followed.
    fn link(&self, path: &Path) -> Link {
        let shown =
            std::fs::read_link(path).map_or_else(|_| "?".into(), |t| t.display().to_string());
        let (target, meta) = match std::fs::canonicalize(path)
            .and_then(|target| std::fs::metadata(&target).map(|meta| (target, meta)))
        {
            Ok(found) => found,
            Err(e) => {
                return Link::Broken(format!(
                    "a link to {shown}, which cannot be followed ({e}): fix the link or remove it"
                ));
            }
        };
        if meta.is_dir() {
            return Link::Skipped(
                "a link to a folder; berth follows links to files only (name the folder itself)",
            );
        }
        if !meta.is_file() {
            return Link::Skipped("a link to something that is not a regular file");
        }
        if target.starts_with(self.real_root)
            || self.in_hf_blobs(&target)
            || self.reach.follow_links
        {
            Link::File(meta.len())
        } else {
            Link::Out(target)
        }
    }

    /// Whether `target` is a blob of the Hugging Face cache repository whose
    /// `snapshots/` hold the folder (`<repo>/snapshots/<rev>/…` links to
    /// `<repo>/blobs/<hash>`).
    fn in_hf_blobs(&self, target: &Path) -> bool {
        target.parent().is_some_and(|blobs| {
            blobs.file_name() == Some("blobs".as_ref())
                && blobs
                    .parent()
                    .is_some_and(|repo| self.real_root.starts_with(repo.join("snapshots")))
        })
    }
}

/// What a symbolic link in the folder registers as.
enum Link {
    /// Followed: the file it leads to, of this size.
    File(u64),
    Skipped(&'static str),
    /// To a file outside the folder, not followed.
    Out(PathBuf),
    /// Leads nowhere: why, and what to do.
    Broken(String),
}

/// What an entry that is neither a regular file, a directory nor a link is.
fn what_else(kind: std::fs::FileType) -> &'static str {
    if kind.is_fifo() {
        "a FIFO; a model's files are regular files"
    } else if kind.is_socket() {
        "a socket; a model's files are regular files"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device; a model's files are regular files"
    } else {
        "not a regular file"
    }
}

/// A file as hashed: the bytes read, and their sha256 in lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashed {
    pub size: u64,
    pub sha256: String,
}

/// Each read of a file takes at most this much memory, per thread.
const BUFFER: usize = 1 << 20;
/// Hashing is bound by the disk soon after a few threads.
const MAX_THREADS: usize = 4;

/// Hashes `files` under `dir`, in their order, on up to `MAX_THREADS`
/// threads; `done` counts the bytes hashed so far, for a progress line.
/// Largest files start first, so one big file does not finish last alone.
pub fn hash(dir: &Path, files: &[Listed], done: &AtomicU64) -> anyhow::Result<Vec<Hashed>> {
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(files[i].size));
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<anyhow::Result<Hashed>>>> =
        files.iter().map(|_| Mutex::new(None)).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_THREADS)
        .min(files.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut buffer = vec![0; BUFFER];
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let hashed = hash_one(dir, &files[i], &mut buffer, done);
                    let failed = hashed.is_err();
                    *results[i].lock().unwrap() = Some(hashed);
                    if failed {
                        // The others stop at their next file.
                        next.store(order.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let mut hashed = Vec::with_capacity(files.len());
    for (file, result) in files.iter().zip(results) {
        match result.into_inner().unwrap() {
            Some(result) => hashed.push(result?),
            None => anyhow::bail!("{}: not hashed (another file failed)", file.path),
        }
    }
    Ok(hashed)
}

/// A file that changed while it was hashed: the folder is still being
/// written.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Changed(String);

impl Changed {
    /// Refuses `file` if what was `read` of it is not its listed size, or
    /// it looks changed between `before` and `after` the read.
    pub fn check(
        file: &Listed,
        before: &std::fs::Metadata,
        read: u64,
        after: &std::fs::Metadata,
    ) -> Result<(), Changed> {
        let still = read == file.size
            && after.len() == read
            && before.modified().ok() == after.modified().ok();
        if still {
            return Ok(());
        }
        Err(Changed(format!(
            "{}: it changed while it was read ({} when listed, {} read, {} now): it is still \
             being written; register the folder once the run has finished writing it",
            file.path,
            crate::human::size(file.size),
            crate::human::size(read),
            crate::human::size(after.len())
        )))
    }
}

/// `file`'s size and sha256, refused if it is not what was listed or
/// changes while it is read: a file still being written (a training run
/// saving a checkpoint) would register bytes that are not its last.
fn hash_one(
    dir: &Path,
    file: &Listed,
    buffer: &mut [u8],
    done: &AtomicU64,
) -> anyhow::Result<Hashed> {
    let path = dir.join(&file.path);
    let cannot = || format!("cannot read {}", path.display());
    let mut reader = std::fs::File::open(&path).with_context(cannot)?;
    let before = reader.metadata().with_context(cannot)?;
    let mut hasher = Sha256::new();
    let mut size = 0;
    loop {
        match std::io::Read::read(&mut reader, buffer) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buffer[..n]);
                size += n as u64;
                done.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(cannot),
        }
    }
    let after = std::fs::metadata(&path).with_context(cannot)?;
    Changed::check(file, &before, size, &after)?;
    Ok(Hashed {
        size,
        sha256: hex::encode(hasher.finalize()),
    })
}

#[cfg(test)]
#[path = "folder_tests.rs"]
mod tests;
