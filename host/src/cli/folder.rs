//! A folder on this machine as a model's files: which entries are files a
//! registration can name (and why each other one is skipped), and their
//! sha256, hashed on a few threads with one fixed buffer each, so memory
//! stays flat whatever the files' sizes. Reads only; never follows a
//! symbolic link; never prints.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
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

/// What a folder holds, sorted by path.
#[derive(Debug, Default)]
pub struct Listing {
    pub files: Vec<Listed>,
    pub skipped: Vec<Skipped>,
}

/// Lists `dir`. `.git/` and berth's own `.fetch-*` partials are always
/// left out; other names starting with `.` only unless `dotfiles`.
pub fn list(dir: &Path, dotfiles: bool) -> anyhow::Result<Listing> {
    let meta = std::fs::metadata(dir).with_context(|| format!("{}", dir.display()))?;
    anyhow::ensure!(meta.is_dir(), "{}: not a directory", dir.display());
    let mut listing = Listing::default();
    walk(dir, dir, dotfiles, &mut listing)?;
    listing.files.sort_by(|a, b| a.path.cmp(&b.path));
    listing.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listing)
}

fn walk(root: &Path, dir: &Path, dotfiles: bool, listing: &mut Listing) -> anyhow::Result<()> {
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
        let refuse = |why: String| anyhow::anyhow!("{relative}: {why}");
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
        } else if name.starts_with('.') && !dotfiles {
            listing
                .skipped
                .push(skip("its name starts with a dot (--all registers it)"));
        } else if entry.file_name().to_str().is_none() && (kind.is_dir() || kind.is_file()) {
            return Err(refuse(format!(
                "the name is not UTF-8 ({} stands for what is not), and berth records a \
                 path as UTF-8 text: rename it, or move it out of {}",
                char::REPLACEMENT_CHARACTER,
                root.display()
            )));
        } else if kind.is_dir() {
            walk(root, &path, dotfiles, listing)?;
        } else if kind.is_file() {
            crate::validate::path_rule(&relative).map_err(refuse)?;
            let size = entry
                .metadata()
                .with_context(|| format!("cannot read {}", path.display()))?
                .len();
            listing.files.push(Listed {
                path: relative,
                size,
            });
        } else {
            listing.skipped.push(skip(what_else(kind)));
        }
    }
    Ok(())
}

/// What an entry that is neither a regular file nor a directory is.
fn what_else(kind: std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link; a model's files are regular files"
    } else if kind.is_fifo() {
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
                    let path = dir.join(&files[i].path);
                    let hashed = hash_one(&path, &mut buffer, done)
                        .with_context(|| format!("cannot read {}", path.display()));
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

fn hash_one(path: &Path, buffer: &mut [u8], done: &AtomicU64) -> std::io::Result<Hashed> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut size = 0;
    loop {
        match std::io::Read::read(&mut file, buffer) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buffer[..n]);
                size += n as u64;
                done.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
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

        let plain = list(root, false).unwrap();
        assert_eq!(paths(&plain), ["a.bin", "sub/deeper/b.json"]);
        assert_eq!(plain.files[0].size, 3);
        assert_eq!(
            skipped(&plain),
            [".cache/", ".env", ".fetch-a.bin", ".git/", "link.bin"]
        );
        assert!(plain.skipped[4].why.contains("symbolic link"));

        let all = list(root, true).unwrap();
        assert_eq!(paths(&all), [".env", "a.bin", "sub/deeper/b.json"]);
        assert_eq!(skipped(&all), [".fetch-a.bin", ".git/", "link.bin"]);

        assert!(list(&root.join("a.bin"), false).is_err());
        assert!(list(&root.join("missing"), false).is_err());
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
        let error = format!("{:#}", list(root, false).unwrap_err());
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
        assert_eq!(list(root, false).unwrap().files[0].path.len(), 255);
        let deep: std::path::PathBuf = std::iter::repeat_n("d".repeat(250), 5).collect();
        std::fs::create_dir_all(root.join(&deep)).unwrap();
        std::fs::write(root.join(&deep).join("weights.bin"), b"x").unwrap();
        let error = format!("{:#}", list(root, false).unwrap_err());
        assert!(
            error.ends_with(
                "/weights.bin: is 1266 bytes long; a file's path may be at most 1024 bytes"
            ),
            "{error}"
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
