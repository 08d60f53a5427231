//! The soak's short run, as `make test` has it: `scripts/soak 3` against
//! this build, one server on SQLite and three on PostgreSQL under mixed
//! load (deployments, cancels, event streams, pushes and rollbacks, plugin
//! folder changes). The script checks that memory, open files, threads and
//! event rows stay flat after the warm-up and that the servers logged
//! nothing to act on; its summary is printed on failure. The long run is
//! `scripts/soak 30` (docs/src/development/tests.md, "Soak").

use std::path::Path;
use std::process::Command;

#[test]
fn three_minutes_of_mixed_load_leave_memory_files_threads_and_events_flat() {
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/soak");
    let run = Command::new(script)
        .args([
            "3",
            "--no-plot",
            "--rate",
            "3",
            "--berth",
            env!("CARGO_BIN_EXE_berth"),
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let summary = std::fs::read_to_string(out.path().join("summary.txt")).unwrap_or_default();
    assert!(
        run.status.success(),
        "the soak failed ({}):\n{summary}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(summary.contains("result: PASS"), "{summary}");
    let samples = std::fs::read_to_string(out.path().join("samples.csv")).unwrap();
    assert!(samples.lines().count() > 50, "the soak sampled: {samples}");
}
