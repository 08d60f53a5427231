//! Running the `berth` binary as a command-line tool: what its runs said.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::plugins;

/// `berth COMMAND… PLUGIN ARGS…` (a `plugin` subcommand), logging warnings
/// and sharing the test servers' compiled-code cache.
pub fn berth_command(command: &[&str], plugin: &Path, args: &[&str]) -> Command {
    let mut berth = Command::new(env!("CARGO_BIN_EXE_berth"));
    berth
        .args(command)
        .arg(plugin)
        .args(args)
        .env("BERTH_LOG", "warn")
        .env("BERTH_CACHE_DIR", plugins::shared_cache());
    berth
}

/// `berth ARGS… --server SERVER` as a client, with nothing of the test
/// process's environment choosing another server or a token.
pub fn client(server: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .args(["--server", server])
        .env_remove("BERTH_SERVER")
        .env_remove("BERTH_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Stdout of a run that exited 0.
#[track_caller]
pub fn expect_success(output: &Output) -> String {
    let (stdout, stderr) = (lossy(&output.stdout), lossy(&output.stderr));
    assert!(
        output.status.success(),
        "exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout
}

pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A path as a command-line argument.
pub fn path(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}
