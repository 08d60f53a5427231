//! A deployment's artifacts: the regular files its deployer wrote to its
//! output directory, listed and opened for reading. The directory is written
//! by an untrusted plugin, so this is **the one place of the artifact path
//! rules**: a path is relative, `/`-separated, without `.`, `..` or empty
//! segments; every component is opened with `O_NOFOLLOW` relative to the
//! one before it (never by a whole path, which a symlink swapped in between
//! a check and an open could redirect), and only a regular file with a
//! single link is served. Never writes, never follows a symbolic link, never
//! reads a file's contents (callers stream them); knows nothing of HTTP.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// A listing stops here: a plugin could write millions of files.
pub const MAX_LISTED: usize = 10_000;
/// Deeper directories are not listed (nor can a path this deep be opened).
const MAX_DEPTH: usize = 32;

/// One file of an output directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    /// Relative to the output directory, `/`-separated.
    pub path: String,
    pub size_bytes: u64,
    pub modified: SystemTime,
}

/// What is in an output directory, as far as it may be served.
#[derive(Debug, Default)]
pub struct Listing {
    /// Sorted by path.
    pub files: Vec<Artifact>,
    /// More than `MAX_LISTED` files: the rest are not listed.
    pub truncated: bool,
}

/// An artifact opened for reading, with what was checked about it.
pub struct Opened {
    pub file: File,
    pub size_bytes: u64,
    pub modified: SystemTime,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path breaks the rules before anything is opened (a 400).
    #[error("artifact path {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    /// Nothing there (a 404).
    #[error("{path}: no such file in the deployment's output directory")]
    Missing { path: String },
    /// Something there that is never served (a 404 saying why).
    #[error("{path}: {reason}; only regular files the deployer wrote are served")]
    Refused { path: String, reason: &'static str },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The segments of a requested path, or why it is refused.
pub fn segments(path: &str) -> Result<Vec<&str>, Error> {
    let bad = |reason| Error::BadPath {
        path: path.to_string(),
        reason,
    };
    if path.is_empty() {
        return Err(bad("empty: name a file of the output directory"));
    }
    if path.starts_with('/') {
        return Err(bad(
            "absolute paths are refused: paths are relative to the output directory",
        ));
    }
    if path.contains('\\') || path.contains('\0') {
        return Err(bad("backslashes and NUL bytes are refused"));
    }
    let segments: Vec<&str> = path.split('/').collect();
    if segments.len() > MAX_DEPTH {
        return Err(bad("too deep: at most 32 segments"));
    }
    for segment in &segments {
        match *segment {
            ".." => {
                return Err(bad(
                    "`..` is refused: paths stay inside the output directory",
                ));
            }
            "." => return Err(bad("`.` segments are refused: name each file by one path")),
            "" => return Err(bad("empty segments (`//`, a trailing `/`) are refused")),
            _ => {}
        }
    }
    Ok(segments)
}

/// Opens `path` under `out_dir` by the rules above.
pub fn open(out_dir: &Path, path: &str) -> Result<Opened, Error> {
    let segments = segments(path)?;
    let (last, parents) = segments.split_last().expect("segments are never empty");
    let missing = || Error::Missing {
        path: path.to_string(),
    };
    let mut dir = match open_dir(CWD, out_dir) {
        Ok(dir) => dir,
        // A deployment that never reached its deployer has no directory.
        Err(Errno::NOENT) => return Err(missing()),
        Err(e) => return Err(io(path, e)),
    };
    for parent in parents {
        dir = match open_dir(&dir, *parent) {
            Ok(child) => child,
            Err(Errno::NOENT) => return Err(missing()),
            // O_DIRECTORY wins over O_NOFOLLOW: a symlink answers ENOTDIR
            // too, so look at what is there to say which it was.
            Err(Errno::NOTDIR | Errno::LOOP) => {
                let symlink = rustix::fs::statat(&dir, *parent, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink);
                return Err(if symlink {
                    refused(path, "a directory on its path is a symbolic link")
                } else {
                    refused(path, "a component of its path is not a directory")
                });
            }
            Err(e) => return Err(io(path, e)),
        };
    }
    // NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&dir, *last, flags, Mode::empty()).map_err(|e| match e {
        Errno::NOENT => missing(),
        Errno::LOOP => refused(path, "it is a symbolic link"),
        // A socket cannot be opened at all.
        Errno::NXIO => refused(path, "it is not a regular file"),
        e => io(path, e),
    })?;
    let file = File::from(fd);
    let metadata = file.metadata().map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })?;
    if metadata.is_dir() {
        return Err(refused(path, "it is a directory"));
    }
    if !metadata.is_file() {
        return Err(refused(path, "it is not a regular file"));
    }
    if metadata.nlink() > 1 {
        return Err(refused(
            path,
            "it is a hard link (it has other names, maybe outside the output directory)",
        ));
    }
    Ok(Opened {
        file,
        size_bytes: metadata.len(),
        modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
    })
}

/// Every file `open` would serve under `out_dir`; none if it does not exist.
pub fn list(out_dir: &Path) -> Result<Listing, Error> {
    let mut listing = Listing::default();
    let root = match open_dir(CWD, out_dir) {
        Ok(dir) => dir,
        Err(Errno::NOENT) => return Ok(listing),
        Err(e) => return Err(io(&out_dir.display().to_string(), e)),
    };
    walk(&root, "", 1, &mut listing)?;
    listing.files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listing)
}

fn walk(dir: &OwnedFd, prefix: &str, depth: usize, listing: &mut Listing) -> Result<(), Error> {
    let entries = Dir::read_from(dir).map_err(|e| io(prefix, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io(prefix, e))?;
        let Ok(name) = entry.file_name().to_str() else {
            // Not UTF-8: no path in a URL could name it.
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let path = format!("{prefix}{name}");
        let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Removed while listing (the deployer may still be running).
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(io(&path, e)),
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory if depth < MAX_DEPTH => {
                let child = match open_dir(dir, name) {
                    Ok(child) => child,
                    // Replaced by a symlink or removed since `statat`.
                    Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => continue,
                    Err(e) => return Err(io(&path, e)),
                };
                walk(&child, &format!("{path}/"), depth + 1, listing)?;
            }
            FileType::RegularFile if stat.st_nlink == 1 => {
                if listing.files.len() == MAX_LISTED {
                    listing.truncated = true;
                    return Ok(());
                }
                let modified = SystemTime::UNIX_EPOCH
                    + std::time::Duration::new(
                        u64::try_from(stat.st_mtime).unwrap_or(0),
                        u32::try_from(stat.st_mtime_nsec).unwrap_or(0),
                    );
                listing.files.push(Artifact {
                    path,
                    size_bytes: u64::try_from(stat.st_size).unwrap_or(0),
                    modified,
                });
            }
            // Symlinks, hard links, devices, FIFOs, sockets: never served,
            // so never listed.
            _ => {}
        }
        if listing.truncated {
            return Ok(());
        }
    }
    Ok(())
}

fn open_dir<Fd: AsFd, P: rustix::path::Arg>(at: Fd, path: P) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(at, path, flags, Mode::empty())
}

fn refused(path: &str, reason: &'static str) -> Error {
    Error::Refused {
        path: path.to_string(),
        reason,
    }
}

fn io(path: &str, errno: Errno) -> Error {
    Error::Io {
        path: path.to_string(),
        source: errno.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One path rule a line: the path, and a fragment of the refusal (or
    /// `None`: accepted).
    #[rustfmt::skip]
    const RULES: &[(&str, Option<&str>)] = &[
        ("model.tar.gz", None),
        ("nested/dir/file.bin", None),
        ("..", Some("`..` is refused")),
        ("a/../../etc/passwd", Some("`..` is refused")),
        ("/etc/passwd", Some("absolute paths are refused")),
        ("", Some("empty: name a file")),
        ("a//b", Some("empty segments")),
        ("a/", Some("empty segments")),
        ("./a", Some("`.` segments are refused")),
        ("a\\b", Some("backslashes")),
    ];

    /// Found by `props::only_the_files_of_the_directory_are_listed_and_served`:
    /// a socket answered ENXIO, which became an internal error (a 500).
    #[test]
    fn a_socket_is_refused_like_any_file_that_is_not_regular() {
        let dir = tempfile::tempdir().unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let err = open(dir.path(), "s").err().unwrap();
        assert!(
            matches!(
                err,
                Error::Refused {
                    reason: "it is not a regular file",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(list(dir.path()).unwrap().files.is_empty());
    }

    #[test]
    fn path_rules() {
        for (path, expected) in RULES {
            match (segments(path), expected) {
                (Ok(_), None) => {}
                (Err(e), Some(fragment)) => assert!(
                    e.to_string().contains(fragment),
                    "{path:?}: expected {fragment:?}, got {e}"
                ),
                (got, _) => panic!("{path:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }
}

/// The rules over generated paths, and over real directories a hostile
/// deployer could leave: random trees of files, directories, symbolic and
/// hard links (into the tree and out of it), FIFOs and sockets.
#[cfg(test)]
mod props {
    use std::collections::{BTreeSet, HashSet};
    use std::path::PathBuf;

    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;
    use crate::strategies;

    /// What a deployer may leave at one name.
    #[derive(Debug, Clone)]
    enum Kind {
        File(usize),
        Dir,
        /// A symbolic link to one of `link_targets`.
        Symlink(Index),
        /// A hard link to the secret outside, or to a file of the tree.
        HardLink(Option<Index>),
        Fifo,
        Socket,
    }

    /// One entry: its parent among the directories made so far, its name
    /// and kind.
    type Step = (Index, String, Kind);

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            4 => (0..64usize).prop_map(Kind::File),
            3 => Just(Kind::Dir),
            2 => any::<Index>().prop_map(Kind::Symlink),
            2 => any::<Option<Index>>().prop_map(Kind::HardLink),
            1 => Just(Kind::Fifo),
            1 => Just(Kind::Socket),
        ]
    }

    fn tree() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec((any::<Index>(), "[a-c]{1,2}", kind()), 0..16)
    }

    /// A temporary directory holding `out/` (the tree) and, beside it,
    /// `outside/secret`, which nothing under `out/` may lead to.
    struct Built {
        _dir: tempfile::TempDir,
        out: PathBuf,
        secret: PathBuf,
        /// Every path made in the tree, and paths through its links.
        names: BTreeSet<String>,
    }

    fn build(steps: &[Step]) -> Built {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let secret = outside.join("secret");
        std::fs::write(&secret, "secret").unwrap();
        let (mut dirs, mut files) = (vec![String::new()], Vec::new());
        let mut names = BTreeSet::new();
        for (parent, name, kind) in steps {
            let parent = parent.get(&dirs).clone();
            let relative = format!("{parent}{name}");
            let path = out.join(&relative);
            if path.symlink_metadata().is_ok() {
                continue;
            }
            // Links point up and out, at the secret, at its directory, at
            // something in the tree, or nowhere.
            let depth = relative.matches('/').count();
            let link_targets = [
                format!("{}../outside/secret", "../".repeat(depth)),
                format!("{}../outside", "../".repeat(depth)),
                secret.display().to_string(),
                outside.display().to_string(),
                "missing".to_string(),
            ];
            match kind {
                Kind::File(size) => {
                    std::fs::write(&path, "x".repeat(*size)).unwrap();
                    files.push(relative.clone());
                }
                Kind::Dir => {
                    std::fs::create_dir(&path).unwrap();
                    dirs.push(format!("{relative}/"));
                }
                Kind::Symlink(to) => {
                    let up = "../".repeat(depth);
                    let inside = dirs
                        .iter()
                        .chain(&files)
                        .map(|p| match p.trim_end_matches('/') {
                            "" if up.is_empty() => ".".to_string(),
                            p => format!("{up}{p}"),
                        });
                    let targets: Vec<String> = link_targets.into_iter().chain(inside).collect();
                    std::os::unix::fs::symlink(to.get(&targets), &path).unwrap();
                    // What a path through a linked directory would name.
                    names.insert(format!("{relative}/secret"));
                    for file in &files {
                        let name = file.rsplit('/').next().unwrap();
                        names.insert(format!("{relative}/{name}"));
                    }
                }
                Kind::HardLink(to) => {
                    let target = match to {
                        Some(i) if !files.is_empty() => out.join(i.get(&files)),
                        _ => secret.clone(),
                    };
                    std::fs::hard_link(target, &path).unwrap();
                }
                Kind::Fifo => {
                    rustix::fs::mkfifoat(CWD, &path, Mode::from_raw_mode(0o600)).unwrap();
                }
                Kind::Socket => {
                    // Bound, then closed: the socket file stays.
                    std::os::unix::net::UnixListener::bind(&path).unwrap();
                }
            }
            names.insert(relative);
        }
        Built {
            _dir: dir,
            out,
            secret,
            names,
        }
    }

    fn inode(metadata: &std::fs::Metadata) -> (u64, u64) {
        (metadata.dev(), metadata.ino())
    }

    proptest! {
        #![proptest_config(strategies::cases(256))]

        #[test]
        fn an_accepted_path_is_relative_and_plain(
            path in prop_oneof![strategies::path(), strategies::text()],
        ) {
            if let Ok(segments) = segments(&path) {
                prop_assert!(!path.starts_with('/') && !path.contains(['\\', '\0']));
                prop_assert!(segments.len() <= MAX_DEPTH);
                prop_assert!(segments.iter().all(|s| !matches!(*s, "" | "." | "..")));
                prop_assert_eq!(segments.join("/"), path);
            }
        }

        /// Every listed file opens, as the file listed; every path that
        /// opens is listed; and nothing opened is the secret outside, or
        /// any file with another name.
        #[test]
        fn only_the_files_of_the_directory_are_listed_and_served(steps in tree()) {
            let built = build(&steps);
            let secret = inode(&std::fs::metadata(&built.secret).unwrap());
            let listing = list(&built.out).unwrap();
            prop_assert!(!listing.truncated);
            let listed: HashSet<&str> = listing.files.iter().map(|a| a.path.as_str()).collect();
            let mut served = HashSet::new();
            for artifact in &listing.files {
                let opened = open(&built.out, &artifact.path)
                    .map_err(|e| TestCaseError::fail(format!("listed but not served: {e}")))?;
                prop_assert_eq!(opened.size_bytes, artifact.size_bytes);
                let metadata = opened.file.metadata().unwrap();
                let at = std::fs::symlink_metadata(built.out.join(&artifact.path)).unwrap();
                prop_assert!(at.is_file() && inode(&at) == inode(&metadata));
                prop_assert_eq!(metadata.nlink(), 1);
                prop_assert!(served.insert(inode(&metadata)));
            }
            for name in &built.names {
                match open(&built.out, name) {
                    Ok(opened) => {
                        let metadata = opened.file.metadata().unwrap();
                        prop_assert_ne!(inode(&metadata), secret, "{} is the secret", name);
                        prop_assert!(listed.contains(name.as_str()), "{} served, not listed", name);
                    }
                    Err(e) => {
                        prop_assert!(!listed.contains(name.as_str()), "{name} listed: {e}");
                        prop_assert!(
                            matches!(e, Error::Missing { .. } | Error::Refused { .. }),
                            "{name}: {e:?}"
                        );
                    }
                }
            }
        }
    }
}
