//! Where the project's build put the plugins, and where test servers keep
//! their compiled code.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[track_caller]
fn existing(path: PathBuf) -> PathBuf {
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-plugins first (make test does)",
        path.display()
    );
    path
}

/// An example deployer from `plugins/`.
#[track_caller]
pub fn example(name: &str) -> PathBuf {
    existing(root().join("plugins").join(format!("{name}.wasm")))
}

/// A test plugin from `target/test-plugins/`.
#[track_caller]
pub fn test_plugin(name: &str) -> PathBuf {
    existing(
        root()
            .join("target/test-plugins")
            .join(format!("{name}.wasm")),
    )
}

/// What a test server serves unless told otherwise: the `archive` example
/// and the `misbehave` test plugin.
pub fn defaults() -> [(&'static str, PathBuf); 2] {
    [
        ("archive", example("archive")),
        ("misbehave", test_plugin("misbehave")),
    ]
}

/// The compiled-code cache test servers share, so that each does not compile
/// the same plugins again.
pub fn shared_cache() -> PathBuf {
    root().join("target/test-cache")
}
