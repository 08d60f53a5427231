//! Benchmark data: files of incompressible pseudo-random bytes under
//! `target/bench-data/source`, made once per run, with their sha256 (as a
//! model registration would record it).

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// One generated file, relative to the source root.
#[derive(Debug, Clone)]
pub struct DataFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// Writes `root/path` with `size` bytes from `seed`, unless a previous run
/// left it (then its hash is read from the `.sha256` beside it).
pub fn make(root: &Path, path: &str, size: u64, seed: u64) -> std::io::Result<DataFile> {
    let file = root.join(path);
    let seal = PathBuf::from(format!("{}.sha256", file.display()));
    if let (Ok(meta), Ok(sha)) = (std::fs::metadata(&file), std::fs::read_to_string(&seal))
        && meta.len() == size
        && sha.len() == 64
    {
        return Ok(DataFile {
            path: path.into(),
            size,
            sha256: sha,
        });
    }
    std::fs::create_dir_all(file.parent().unwrap())?;
    let mut out = std::io::BufWriter::with_capacity(4 << 20, std::fs::File::create(&file)?);
    let mut hasher = Sha256::new();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; MIB as usize];
    let mut left = size;
    while left > 0 {
        for word in buf.chunks_exact_mut(8) {
            // xorshift64*: fast, and incompressible enough for a network path.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    out.flush()?;
    let sha256 = hex::encode(hasher.finalize());
    std::fs::write(&seal, &sha256)?;
    Ok(DataFile {
        path: path.into(),
        size,
        sha256,
    })
}
