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
mod tests {
    use super::*;

    #[test]
    fn a_folder_lists_its_files_and_names_what_it_skips() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(root.join(".git/objects")).unwrap();
        std::fs::create_dir_all(root.join(".cache")).unwrap();
        std::fs::write(root.join("a.bin"), b"abc").unwrap();
        std::fs::write(root.join("sub/deeper/b.json"), b"{}").unwrap();
        std::fs::write(root.join(".env"), b"X=1").unwrap();
        std::fs::write(root.join(".fetch-a.bin"), b"ab").unwrap();
        std::fs::write(root.join(".git/HEAD"), b"ref").unwrap();
        std::os::unix::fs::symlink(root.join("a.bin"), root.join("link.bin")).unwrap();
        let paths = |l: &Listing| l.files.iter().map(|f| f.path.clone()).collect::<Vec<_>>();
        let skipped = |l: &Listing| l.skipped.iter().map(|s| s.path.clone()).collect::<Vec<_>>();

        let plain = list(root, Reach::default()).unwrap();
        assert_eq!(paths(&plain), ["a.bin", "link.bin", "sub/deeper/b.json"]);
        assert_eq!(plain.files[0].size, 3);
        assert_eq!(
            skipped(&plain),
            [".cache/", ".env", ".fetch-a.bin", ".git/"]
        );

        let all = list(root, DOTFILES).unwrap();
        assert_eq!(
            paths(&all),
            [".env", "a.bin", "link.bin", "sub/deeper/b.json"]
        );
        assert_eq!(skipped(&all), [".fetch-a.bin", ".git/"]);

        assert!(list(&root.join("a.bin"), Reach::default()).is_err());
        assert!(list(&root.join("missing"), Reach::default()).is_err());
    }

    const DOTFILES: Reach = Reach {
        dotfiles: true,
        follow_links: false,
    };

    #[test]
    fn links_inside_the_folder_or_into_a_hugging_face_cache_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // A run folder linking its weights from inside itself, with a
        // folder link (skipped), a dangling link and a link outside.
        let run = root.join("run");
        std::fs::create_dir_all(run.join("final")).unwrap();
        std::fs::write(run.join("final/model.safetensors"), b"weights").unwrap();
        std::fs::write(root.join("notes.txt"), b"elsewhere").unwrap();
        std::os::unix::fs::symlink("final/model.safetensors", run.join("model.safetensors"))
            .unwrap();
        std::os::unix::fs::symlink("final", run.join("latest")).unwrap();
        let inside = list(&run, Reach::default()).unwrap();
        let paths: Vec<_> = inside
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.size))
            .collect();
        assert_eq!(
            paths,
            [("final/model.safetensors", 7), ("model.safetensors", 7)]
        );
        assert_eq!(inside.skipped[0].path, "latest");
        assert!(inside.skipped[0].why.contains("a link to a folder"));

        std::os::unix::fs::symlink("../notes.txt", run.join("notes.txt")).unwrap();
        std::os::unix::fs::symlink("gone.bin", run.join("gone.bin")).unwrap();
        std::os::unix::fs::symlink("/nowhere/x", run.join("x.bin")).unwrap();
        let error = format!("{:#}", list(&run, Reach::default()).unwrap_err());
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 2, "every refusal at once: {error}");
        assert!(
            lines[0].starts_with("gone.bin: a link to gone.bin, which cannot be followed"),
            "{error}"
        );
        assert!(
            lines[1].starts_with("x.bin: a link to /nowhere/x"),
            "{error}"
        );
        std::fs::remove_file(run.join("gone.bin")).unwrap();
        std::fs::remove_file(run.join("x.bin")).unwrap();
        let out = list(&run, Reach::default()).unwrap();
        assert_eq!(
            out.links_out,
            [LinkOut {
                path: "notes.txt".into(),
                target: std::fs::canonicalize(root.join("notes.txt")).unwrap(),
            }]
        );
        assert!(!out.files.iter().any(|f| f.path == "notes.txt"));

        let follow = Reach {
            dotfiles: false,
            follow_links: true,
        };
        let followed = list(&run, follow).unwrap();
        assert!(
            followed
                .files
                .iter()
                .any(|f| f.path == "notes.txt" && f.size == 9)
        );

        // A Hugging Face cache: every entry of a snapshot is a link into
        // the repository's blobs/, a sub-folder's too.
        let repo = root.join("hub/models--org--tiny");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/abc123/onnx")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        let snapshot = repo.join("snapshots/abc123");
        for (path, blob, bytes) in [
            ("config.json", "1111", &b"{}"[..]),
            ("model.safetensors", "2222", &b"tensor bytes"[..]),
            ("onnx/model.onnx", "3333", &b"onnx"[..]),
        ] {
            std::fs::write(repo.join("blobs").join(blob), bytes).unwrap();
            let up = "../".repeat(path.matches('/').count() + 2);
            std::os::unix::fs::symlink(format!("{up}blobs/{blob}"), snapshot.join(path)).unwrap();
        }
        let cached = list(&snapshot, Reach::default()).unwrap();
        let paths: Vec<_> = cached
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.size))
            .collect();
        assert_eq!(
            paths,
            [
                ("config.json", 2),
                ("model.safetensors", 12),
                ("onnx/model.onnx", 4)
            ]
        );
        let hashed = hash(&snapshot, &cached.files, &AtomicU64::new(0)).unwrap();
        assert_eq!(
            hashed[1].sha256,
            hex::encode(Sha256::digest(b"tensor bytes"))
        );

        // Another repository's blobs are outside.
        std::fs::create_dir_all(root.join("hub/models--org--other/blobs")).unwrap();
        std::fs::write(root.join("hub/models--org--other/blobs/4444"), b"x").unwrap();
        std::os::unix::fs::symlink(
            root.join("hub/models--org--other/blobs/4444"),
            snapshot.join("stray.bin"),
        )
        .unwrap();
        let stray = list(&snapshot, Reach::default()).unwrap();
        assert_eq!(stray.links_out[0].path, "stray.bin");
        assert_eq!(stray.files.len(), 3);
    }

    #[test]
    fn a_name_that_cannot_be_recorded_is_refused_naming_it() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.bin"), b"abc").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9.bin");
        std::fs::write(root.join("sub").join(latin1), b"x").unwrap();
        let error = format!("{:#}", list(root, Reach::default()).unwrap_err());
        assert!(
            error.starts_with("sub/caf\u{fffd}.bin: the name is not UTF-8"),
            "{error}"
        );
        assert!(error.contains("rename it"), "{error}");

        // The longest name the filesystem allows lists; a path past the
        // longest berth records is refused with the limit.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("n".repeat(255)), b"x").unwrap();
        assert_eq!(
            list(root, Reach::default()).unwrap().files[0].path.len(),
            255
        );
        let deep: std::path::PathBuf = std::iter::repeat_n("d".repeat(250), 5).collect();
        std::fs::create_dir_all(root.join(&deep)).unwrap();
        std::fs::write(root.join(&deep).join("weights.bin"), b"x").unwrap();
        let error = format!("{:#}", list(root, Reach::default()).unwrap_err());
        assert!(
            error.ends_with(
                "/weights.bin: is 1266 bytes long; a file's path may be at most 1024 bytes"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_file_that_changed_since_it_was_listed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("optimizer.pt"), [1u8; 7]).unwrap();
        let listing = list(dir.path(), Reach::default()).unwrap();
        // The run is still writing it.
        std::fs::write(dir.path().join("optimizer.pt"), [1u8; 36]).unwrap();
        let e = hash(dir.path(), &listing.files, &AtomicU64::new(0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "optimizer.pt: it changed while it was read (7 bytes when listed, 36 bytes read, \
             36 bytes now): it is still being written; register the folder once the run has \
             finished writing it"
        );
    }

    #[test]
    fn files_are_hashed_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [0usize, 5, 3 * BUFFER + 7, 2];
        let mut files = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..*size).map(|b| (b * 31 + i) as u8).collect();
            std::fs::write(dir.path().join(format!("f{i}")), &bytes).unwrap();
            files.push((
                Listed {
                    path: format!("f{i}"),
                    size: *size as u64,
                },
                hex::encode(Sha256::digest(&bytes)),
            ));
        }
        let listed: Vec<Listed> = files.iter().map(|(l, _)| l.clone()).collect();
        let done = AtomicU64::new(0);
        let hashed = hash(dir.path(), &listed, &done).unwrap();
        for ((listed, sha256), hashed) in files.iter().zip(&hashed) {
            assert_eq!(hashed.size, listed.size, "{}", listed.path);
            assert_eq!(&hashed.sha256, sha256, "{}", listed.path);
        }
        assert_eq!(done.into_inner(), sizes.iter().sum::<usize>() as u64);

        let missing = [Listed {
            path: "gone".into(),
            size: 1,
        }];
        let error = hash(dir.path(), &missing, &AtomicU64::new(0)).unwrap_err();
        assert!(format!("{error:#}").contains("cannot read"), "{error:#}");
    }
}
