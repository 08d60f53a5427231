//! The `archive` deployer: packs a model's files into a reproducible `.tar.gz`
//! in the deployment's output directory.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use berth::deployer::host::{self, Level};
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};

wit_bindgen::generate!({
    world: "deployer",
    path: "../../wit/0.1.0",
    // The world imports wasi:filesystem explicitly for languages without a file
    // API; Rust reaches it through std, so generated bindings just go unused.
    generate_all,
});

const DEFAULT_LEVEL: u32 = 6;

// Model files are often gigabytes; bigger reads mean fewer host calls.
const READ_BUFFER: usize = 1 << 20;
const WRITE_BUFFER: usize = 1 << 20;

const OPTIONS_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "level": {
      "type": "integer",
      "minimum": 0,
      "maximum": 9,
      "default": 6,
      "description": "gzip compression level: 0 stores, 9 compresses hardest"
    }
  },
  "additionalProperties": false
}"#;

struct Archive;

impl Guest for Archive {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description:
                "Packs the model's files into a .tar.gz in the deployment's output directory"
                    .to_string(),
            options_schema: Some(OPTIONS_SCHEMA.to_string()),
        }
    }

    fn check_options(options_json: String) -> Result<(), String> {
        parse_level(&options_json).map(|_| ())
    }

    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        let level = parse_level(&request.options_json)?;
        let name = format!("{}-{}.tar.gz", request.model.job_id, request.deploy_id);
        let archive_path = Path::new(&request.out_dir).join(name);

        let packed = pack(&request, &archive_path, level);
        if packed.is_err() {
            // The out-dir outlives the call: don't leave a truncated archive
            // that looks like a result.
            let _ = fs::remove_file(&archive_path);
        }
        let (bytes, sha256) = packed?;

        let archive_name = archive_path.display().to_string();
        let files = request.model.files.len();
        host::log(
            Level::Info,
            &format!("wrote {archive_name}: {files} files, {bytes} bytes, sha256 {sha256}"),
        );
        Ok(DeployResult {
            ref_: archive_name,
            details_json: json!({ "files": files, "bytes": bytes, "sha256": sha256 }).to_string(),
        })
    }
}

/// Writes the archive, returning its size and lowercase hex SHA-256.
fn pack(request: &DeployRequest, archive_path: &Path, level: u32) -> Result<(u64, String), String> {
    let archive_error = |e: io::Error| format!("{}: {e}", archive_path.display());
    let file = File::create(archive_path).map_err(archive_error)?;
    // The compressor hands over 32 KiB at a time and each write is a host
    // call: writes of 1 MiB take a sixth off the deployment's CPU
    // (docs/src/perf, 16).
    let file = BufWriter::with_capacity(WRITE_BUFFER, file);
    let gzip = GzEncoder::new(HashingWriter::new(file), Compression::new(level));
    let mut tar = tar::Builder::new(gzip);

    let files = &request.model.files;
    let total = files.len() as u64;
    for (done, entry) in (1..).zip(files) {
        let source = Path::new(&request.dir).join(&entry.path);
        append_file(&mut tar, &source, &entry.path)
            .map_err(|e| format!("{}: {e}", source.display()))?;
        host::progress(done, total, &entry.path);
    }

    let hashing = tar
        .into_inner()
        .and_then(GzEncoder::finish)
        .map_err(archive_error)?;
    let (file, bytes, sha256) = hashing.finish();
    file.into_inner()
        .map_err(|e| archive_error(e.into_error()))?;
    Ok((bytes, sha256))
}

/// Parses the options object, returning the gzip level to use.
fn parse_level(options_json: &str) -> Result<u32, String> {
    let options: Value = serde_json::from_str(options_json)
        .map_err(|e| format!("options are not valid JSON: {e}"))?;
    let Value::Object(options) = options else {
        return Err("options must be a JSON object".to_string());
    };
    if let Some(key) = options.keys().find(|key| *key != "level") {
        return Err(format!(
            "unknown option {key:?}: the archive deployer accepts only \"level\" (0-9)"
        ));
    }
    match options.get("level") {
        None => Ok(DEFAULT_LEVEL),
        Some(level) => level
            .as_u64()
            .filter(|level| *level <= 9)
            .map(|level| level as u32)
            .ok_or_else(|| format!("option \"level\" must be an integer from 0 to 9, not {level}")),
    }
}

/// Appends one regular file at `path` with fixed metadata, so the same model
/// always packs to the same bytes.
fn append_file<W: Write>(tar: &mut tar::Builder<W>, source: &Path, path: &str) -> io::Result<()> {
    let file = File::open(source)?;
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(file.metadata()?.len());
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    tar.append_data(
        &mut header,
        path,
        BufReader::with_capacity(READ_BUFFER, file),
    )
}

/// Counts and hashes the archive's bytes on their way to disk, so the file
/// never has to be read back.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// Returns the writer, the byte count and the lowercase hex SHA-256.
    fn finish(self) -> (W, u64, String) {
        (
            self.inner,
            self.bytes,
            format!("{:x}", self.hasher.finalize()),
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        // Only what the inner writer accepted ends up in the file.
        self.hasher.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

export!(Archive);
