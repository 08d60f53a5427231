//! Room on the volumes berth writes to: how many bytes an unprivileged
//! process may still write there. Asked before a fetch (will the model
//! fit?) and before recording a deployment (is the reserve that lets every
//! started deployment record its end still there?). Reads no file.

use std::path::Path;

/// Bytes available to berth on the volume holding `path` (the nearest
/// existing ancestor, for a directory not made yet).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let stats = rustix::fs::statvfs(existing)?;
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_not_made_yet_is_on_its_ancestors_volume() {
        let dir = tempfile::tempdir().unwrap();
        let here = free_bytes(dir.path()).unwrap();
        let later = free_bytes(&dir.path().join("not/made/yet")).unwrap();
        assert!(here > 0);
        // The same volume; other processes may write meanwhile.
        assert!(later.abs_diff(here) < here / 2, "{here} vs {later}");
    }
}
