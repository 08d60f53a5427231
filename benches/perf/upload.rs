//! Benchmark 19: `berth models push` of a run folder (one file of
//! `--big-gib`) into a real server on loopback, against `curl -T` of the
//! same file to the same server's upload endpoint (`PUT
//! /v1/blobs/sha256:…`), each into a fresh server; and the server's peak
//! resident memory meanwhile. The baseline is that endpoint, not a plain
//! sink: the server's work (hash as the bytes arrive, write, fsync, store)
//! is the same for both, so the ratio is what the client costs. push's time
//! is the whole command: listing, the upload (named by an id, checked end to
//! end by the CRC-32 of its bytes; the sha256 is the server's), the
//! registration; curl is handed the digest. A third row is what push cost
//! before, hashing first: `openssl dgst -sha256` (SHA-NI, as berth's hash)
//! before `curl -T`.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use crate::Ctx;
use crate::api::Server;
use crate::data::{self, GIB};
use crate::report::{PeakRss, Table, gbps, median, secs, settle};

pub async fn run(ctx: &Ctx) -> anyhow::Result<()> {
    let size = ctx.big_gib * GIB;
    let run = ctx.source_root.join("push-run");
    let file = data::make(&run, "model.safetensors", size, 19)?;
    // Read once, so both clients read it from memory alike.
    crate::report::sh(&format!(
        "cat '{}' > /dev/null",
        run.join(&file.path).display()
    ))?;
    let (mut pushed, mut curled, mut hashed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut push_rss, mut curl_rss) = (0, 0);
    // Each server's models dir is removed once measured: a round stores
    // the file twice.
    let gone = |name: &str| {
        let _ = std::fs::remove_dir_all(ctx.out_dir.join(name));
    };
    for round in 0..ctx.rounds {
        let server = Server::start(ctx, "upload-curl", &[])?;
        let url = format!("{}/v1/blobs/sha256:{}", server.url, file.sha256);
        let (took, rss) = timed(&server, || {
            Command::new("curl")
                .args(["-sS", "-f", "-o", "/dev/null", "-T"])
                .arg(run.join(&file.path))
                .args(["-H", &format!("Upload-Length: {size}"), &url])
                .status()
        })?;
        curled.push(took.as_secs_f64());
        curl_rss = curl_rss.max(rss);
        stored(&server, &file.sha256).await?;
        drop(server);
        gone("upload-curl");

        settle();
        let started = Instant::now();
        Command::new("openssl")
            .args(["dgst", "-sha256"])
            .arg(run.join(&file.path))
            .stdout(std::process::Stdio::null())
            .status()?;
        hashed.push(started.elapsed().as_secs_f64() + curled[round]);

        let server = Server::start(ctx, "upload-push", &[])?;
        let (took, rss) = timed(&server, || {
            Command::new(env!("CARGO_BIN_EXE_berth"))
                .args(["models", "push"])
                .arg(&run)
                // The benchmark data's own seal, not the model's.
                .args(["--exclude", "*.sha256", "--server", &server.url])
                .env_remove("BERTH_TOKEN")
                .stdout(std::process::Stdio::null())
                .status()
        })?;
        pushed.push(took.as_secs_f64());
        push_rss = push_rss.max(rss);
        stored(&server, &file.sha256).await?;
        drop(server);
        gone("upload-push");
    }
    let (push, curl, hash_curl) = (median(&pushed), median(&curled), median(&hashed));
    let mut table = Table::new(&format!(
        "19. a {} GiB file uploaded into a server on loopback (median of {})",
        ctx.big_gib, ctx.rounds
    ));
    table.row(
        "berth models push DIR (upload checked by CRC-32, register)",
        secs(push),
        format!(
            "{} · server peak RSS {} MiB",
            gbps(size, push),
            push_rss >> 10
        ),
    );
    table.row(
        "curl -T FILE to PUT /v1/blobs/sha256:… (digest given)",
        secs(curl),
        format!(
            "{} · server peak RSS {} MiB",
            gbps(size, curl),
            curl_rss >> 10
        ),
    );
    table.row(
        "openssl dgst -sha256, then curl -T (the same work)",
        secs(hash_curl),
        gbps(size, hash_curl),
    );
    table.row(
        "push / curl -T",
        format!("{:.2}×", curl / push),
        "the speed of curl -T (goal ≥ 0.9×)".into(),
    );
    table.row(
        "push / (openssl, then curl -T)",
        format!("{:.2}×", hash_curl / push),
        "the speed of hashing, then curl -T".into(),
    );
    table.print();
    Ok(())
}

/// Runs `client` against `server` from settled disks: how long it took and
/// the server's peak RSS meanwhile (KiB).
fn timed(
    server: &Server,
    client: impl FnOnce() -> std::io::Result<std::process::ExitStatus>,
) -> anyhow::Result<(Duration, u64)> {
    settle();
    let rss = PeakRss::start(server.pid());
    let started = Instant::now();
    let status = client().context("cannot run the client")?;
    let took = started.elapsed();
    let peak = rss.stop();
    ensure!(status.success(), "the upload failed: {status}");
    Ok((took, peak))
}

/// That the server stores the blob: each round really uploaded it.
async fn stored(server: &Server, sha256: &str) -> anyhow::Result<()> {
    let answer = server
        .client
        .head(format!("{}/v1/blobs/sha256:{sha256}", server.url))
        .send()
        .await?;
    ensure!(
        answer.status().is_success(),
        "the upload did not store the blob"
    );
    Ok(())
}
