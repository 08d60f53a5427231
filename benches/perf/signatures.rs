//! Benchmark: verifying a model's OpenSSF signature (`model.sig`) at
//! registration, against the files' recorded sha256 and without reading
//! them, beside what a verifier that re-hashes has to do: sha256 of every
//! byte (berth's own hashing) and the reference tool, `model_signing
//! verify key` (when `scripts/setup test` installed it). A model of 50
//! files, 20 MiB each (1000 MiB), signed once by berth with the test key.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use berth::signing::{self, SigningKey, Trust};
use sha2::{Digest, Sha256};

use crate::Ctx;
use crate::data::MIB;
use crate::fetch::{files, shell_quote};
use crate::report::{Table, median, secs, settle, sh};

const FILES: usize = 50;
const FILE: u64 = 20 * MIB;

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let specs: Vec<(String, u64)> = (0..FILES)
        .map(|i| (format!("shard-{i:02}.safetensors"), FILE))
        .collect();
    let made = files(ctx, "signed-50", &specs, 9100)?;
    // The model alone, as its producer would sign it: the source root
    // keeps a `.sha256` seal beside each file, which the reference tool
    // would find unsigned. Hard links, no copy.
    let folder = ctx.data_dir.join("signed-50");
    std::fs::create_dir_all(&folder)?;
    for file in &made {
        let link = folder.join(&file.path);
        if !link.exists() {
            std::fs::hard_link(ctx.source_root.join("signed-50").join(&file.path), link)?;
        }
    }
    // As a registration records them: path, size, sha256.
    let recorded = crate::fetch::model(ctx, "signed-50", &made).files;
    let keys = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/signing");
    let key = SigningKey::from_pkcs8_pem(&std::fs::read(keys.join("key-p256.pem"))?)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let trust = Trust::public_key_pem(&std::fs::read(keys.join("key-p256.pub.pem"))?)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let bundle = signing::sign(&key, "signed-50", &recorded).map_err(|e| anyhow::anyhow!("{e}"))?;
    let signature = ctx.data_dir.join("signed-50.sig");
    std::fs::write(&signature, &bundle)?;

    let (mut verify, mut rehash, mut tool) = (Vec::new(), Vec::new(), Vec::new());
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/model_signing");
    for _ in 0..ctx.rounds.max(3) {
        settle();
        let started = Instant::now();
        let verified = signing::verify(&bundle, &trust, &recorded)
            .map_err(|e| anyhow::anyhow!("berth refused its own signature: {e}"))?;
        verify.push(started.elapsed().as_secs_f64());
        anyhow::ensure!(verified.files_checked.len() == FILES);

        settle();
        let started = Instant::now();
        for file in &made {
            let mut hasher = Sha256::new();
            let mut reader = std::fs::File::open(folder.join(&file.path))?;
            let mut buf = vec![0u8; MIB as usize];
            loop {
                let n = std::io::Read::read(&mut reader, &mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
            }
            anyhow::ensure!(hex::encode(hasher.finalize()) == file.sha256);
        }
        rehash.push(started.elapsed().as_secs_f64());

        if reference.exists() {
            settle();
            let (took, _) = sh(&format!(
                "{} verify key --public_key {} --signature {} {}",
                shell_quote(&reference),
                shell_quote(&keys.join("key-p256.pub.pem")),
                shell_quote(&signature),
                shell_quote(&folder)
            ))
            .context("model_signing verify key refused berth's signature")?;
            tool.push(took.as_secs_f64());
        }
    }
    let verify = median(&verify);
    let mut table = Table::new(&format!(
        "signatures: verifying a {FILES}-file model's model.sig ({} MiB, page cache warm)",
        FILES as u64 * FILE / MIB
    ));
    table.row(
        "berth, against the recorded sha256s",
        format!("{:.2} ms", verify * 1e3),
        "no byte read".into(),
    );
    let rehash = median(&rehash);
    table.row(
        "sha256 of every byte (a re-hash)",
        secs(rehash),
        format!("{:.0}x berth's verification", rehash / verify),
    );
    if !tool.is_empty() {
        let tool = median(&tool);
        table.row(
            "model_signing verify key (re-hashes)",
            secs(tool),
            format!("{:.0}x berth's verification", tool / verify),
        );
    }
    table.print();
    Ok(())
}
