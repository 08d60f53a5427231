//! `folder`'s tests: listing, what is skipped and said, hashing.

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
    std::os::unix::fs::symlink("final/model.safetensors", run.join("model.safetensors")).unwrap();
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
        error
            .ends_with("/weights.bin: is 1266 bytes long; a file's path may be at most 1024 bytes"),
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
