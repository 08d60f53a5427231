//! `wasi:filesystem`: a deployment sees its verified model directory
//! read-only at `/model` and its own out-dir at `/out`; `describe` and
//! `check-options` see no files at all. Never mounts anything else.

use std::path::Path;

use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::runtime::CallError;

/// Guest path of the read-only model directory.
pub const MODEL_DIR: &str = "/model";
/// Guest path of the deployment's writable directory.
pub const OUT_DIR: &str = "/out";

/// The host directories one deployment sees.
pub(crate) struct Mounts<'a> {
    /// Holds the verified files.
    pub(crate) model_dir: &'a Path,
    /// Must exist.
    pub(crate) out_dir: &'a Path,
}

pub(super) fn grant(
    wasi: &mut WasiCtxBuilder,
    mounts: Option<Mounts<'_>>,
) -> Result<(), CallError> {
    // Reading the model is the hot path; blocking reads on the current
    // thread are ~3x faster than hopping to a blocking pool.
    wasi.allow_blocking_current_thread(true);
    let Some(Mounts { model_dir, out_dir }) = mounts else {
        return Ok(());
    };
    wasi.preopened_dir(model_dir, MODEL_DIR, FsPerms::ReadOnly)
        .map_err(|e| CallError::Sandbox(format!("model directory {}: {e}", model_dir.display())))?;
    wasi.preopened_dir(out_dir, OUT_DIR, FsPerms::ReadWrite)
        .map_err(|e| CallError::Sandbox(format!("output directory {}: {e}", out_dir.display())))?;
    Ok(())
}
