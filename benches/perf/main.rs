//! berth's performance benchmarks (`scripts/bench`, or
//! `cargo bench -p berth --bench perf -- [SECTION…] [--rounds N] [--keep]`).
//! Every figure is printed beside a baseline measured in the same run, on
//! the same files: the machine is shared and noisy, so ratios mean more
//! than absolute times. Sections: `fetch` (one large file, many files),
//! `resume`, `reverify`, `plugin` (plugin calls in Rust, Python and
//! JavaScript, instances pooled or not), `api`, `memory`, `capped` (one file from
//! a source that caps each connection's rate), `store` (a model from an
//! S3-compatible server), `load` (`/healthz` and memory while deployers
//! misbehave or read large models; `--berth LABEL=PATH` adds another build
//! of berth to compare, `--load-secs N`), `quota` (how far a deployer gets
//! past its out-dir quota), `deploys` (synchronous deployments at 1, 16
//! and 100 in flight on SQLite and on each `--pg LABEL=URL`, beside the
//! disk's synced-commit bound; every `--berth` build; `--history N` ended
//! deployments recorded first), `dropin` (from a
//! plugin dropped into the folder to its first deployment, cold),
//! `cluster` (queued deployments and events on one server against three
//! sharing the first `--pg`), `push` (from a deployer pushed over the API
//! to one server to its first deployment on another, against dropping it
//! into that server's folder; the first `--pg`), `publish` (a model of 4
//! files, `--publish-mib` each, put into an S3-compatible store and onto an
//! HTTP mirror by berth's example deployers, against boto3, the AWS CLI and
//! curl, and berth's memory meanwhile), `oci` (the same model pulled from
//! and pushed to an OCI registry, against skopeo and the ORAS Python SDK),
//! `native` (gzip and sha256 of a `--native-mib` model natively and in
//! the Rust and Python guests, on each tier; `--archive LABEL=PATH` adds
//! another build of the archive example), `blobs` (a second model sharing
//! 3.5 GiB of 4 GiB with one held, against fetching it into an empty
//! models dir; adopting a models dir of 10,000 files), `upload` (`berth
//! models push` of a `--big-gib` file against `curl -T` of it to the same
//! upload endpoint, and the server's memory), `signatures` (a 50-file
//! model's model.sig verified against its record, against re-hashing it
//! and `model_signing verify`), `buckets` (a model fetched from S3, GCS
//! and Azure Blob emulators, the S3 one the baseline); all by default.
//! Data goes
//! to `target/bench-data` and is deleted at the end unless `--keep`.

mod api;
#[path = "../../tests/azurite/azurite.rs"]
mod azurite;
mod blobs;
mod buckets;
mod capped;
mod cluster;
mod coordination;
mod data;
mod deploys;
mod dropin;
#[path = "../../tests/fake-gcs/fake_gcs.rs"]
mod fake_gcs;
mod fetch;
mod load;
#[path = "../../tests/moto/moto.rs"]
mod moto;
mod native;
mod oci;
mod pgwire;
mod plugin;
mod publish;
mod push;
mod quota;
#[path = "../../tests/registry/registry.rs"]
mod registry;
mod report;
mod signatures;
mod source;
mod store;
mod upload;

use std::path::PathBuf;

use anyhow::Context;

pub struct Ctx {
    /// `target/bench-data`.
    pub data_dir: PathBuf,
    /// What the loopback source serves: `<job id>/<path>`.
    pub source_root: PathBuf,
    /// Where downloads go; emptied between runs.
    pub out_dir: PathBuf,
    pub source: source::Source,
    pub rounds: usize,
    /// Size of the one large file, GiB.
    pub big_gib: u64,
    /// Size of the model of the re-verification and memory benchmarks, GiB.
    pub model_gib: u64,
    /// Plugin calls per measurement.
    pub calls: usize,
    /// Size of the file of the capped-source benchmark, GiB.
    pub capped_gib: u64,
    /// Size of the file berth's memory is measured on there, GiB.
    pub rss_gib: u64,
    /// The capped source's rate per connection, MB/s.
    pub cap_mbps: u64,
    /// The berth binaries the load benchmark runs, by label: this build
    /// unless `--berth` names others. Sections of one build run the last
    /// (`Ctx::newest`).
    pub builds: Vec<(String, PathBuf)>,
    /// How long each load runs, seconds.
    pub load_secs: u64,
    /// PostgreSQL servers the deployments benchmark also runs on, by
    /// label: an admin URL, where it makes a database per server.
    pub pg: Vec<(String, String)>,
    /// The deployments benchmark's concurrencies (`--in-flight N`, again
    /// for more): 1, 16 and 100 unless given.
    pub in_flight: Vec<usize>,
    /// Ended deployments each server of the deployments benchmark has
    /// recorded before it is measured (`--history N`; none unless given):
    /// a server in use for a while, not one started a moment ago.
    pub history: u64,
    /// Size of each of the 4 files the publishing benchmark puts, MiB.
    pub publish_mib: u64,
    /// Size of the model the native-speed benchmark gzips and hashes, MiB.
    pub native_mib: u64,
    /// Builds of the archive example it runs, by label (`--archive
    /// LABEL=PATH`, for a before and after); this build's if none.
    pub archives: Vec<(String, PathBuf)>,
}

impl Ctx {
    /// The build a section of one build runs: the last `--berth`, which is
    /// the build under test (an older one named before it for comparison
    /// may lack the flags such a section starts servers with).
    pub fn newest(&self) -> &std::path::Path {
        &self.builds.last().expect("there is always a build").1
    }
}

const SECTIONS: [&str; 21] = [
    "fetch",
    "resume",
    "reverify",
    "plugin",
    "api",
    "memory",
    "capped",
    "store",
    "load",
    "quota",
    "deploys",
    "dropin",
    "cluster",
    "push",
    "publish",
    "oci",
    "native",
    "blobs",
    "upload",
    "signatures",
    "buckets",
];

fn main() -> anyhow::Result<()> {
    let mut sections = Vec::new();
    let (mut rounds, mut big_gib, mut model_gib, mut calls, mut keep) = (3, 1, 4, 2000, false);
    let (mut capped_gib, mut rss_gib, mut cap_mbps) = (2, 4, 50);
    let (mut builds, mut load_secs, mut pg) = (Vec::new(), 20, Vec::new());
    let (mut in_flight, mut publish_mib, mut native_mib) = (Vec::new(), 1024, 512);
    let (mut archives, mut history) = (Vec::new(), 0);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> anyhow::Result<u64> {
            args.next()
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            // Added by `cargo bench`.
            "--bench" => {}
            "--rounds" => rounds = number("--rounds")? as usize,
            "--big-gib" => big_gib = number("--big-gib")?,
            "--model-gib" => model_gib = number("--model-gib")?,
            "--calls" => calls = number("--calls")? as usize,
            "--capped-gib" => capped_gib = number("--capped-gib")?,
            "--rss-gib" => rss_gib = number("--rss-gib")?,
            "--cap-mbps" => cap_mbps = number("--cap-mbps")?,
            "--load-secs" => load_secs = number("--load-secs")?,
            "--berth" => builds.push(load::build(
                &args.next().context("--berth needs LABEL=PATH")?,
            )?),
            "--in-flight" => in_flight.push(number("--in-flight")? as usize),
            "--publish-mib" => publish_mib = number("--publish-mib")?,
            "--native-mib" => native_mib = number("--native-mib")?,
            "--history" => history = number("--history")?,
            "--archive" => {
                let arg = args.next().context("--archive needs LABEL=PATH")?;
                let (label, path) = arg.split_once('=').context("--archive takes LABEL=PATH")?;
                archives.push((label.to_string(), PathBuf::from(path)));
            }
            "--pg" => {
                let arg = args.next().context("--pg needs LABEL=URL")?;
                let (label, url) = arg.split_once('=').context("--pg takes LABEL=URL")?;
                pg.push((label.to_string(), url.to_string()));
            }
            "--keep" => keep = true,
            section if SECTIONS.contains(&section) => sections.push(section.to_string()),
            other => anyhow::bail!(
                "unknown argument {other}; sections: {}",
                SECTIONS.join(", ")
            ),
        }
    }
    if builds.is_empty() {
        builds.push((
            "this build".to_string(),
            PathBuf::from(env!("CARGO_BIN_EXE_berth")),
        ));
    }
    if sections.is_empty() {
        sections = SECTIONS.iter().map(|s| s.to_string()).collect();
    }

    let data_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    let source_root = data_dir.join("source");
    let out_dir = data_dir.join("out");
    std::fs::create_dir_all(&source_root)?;
    let source = source::Source::start(&source_root)?;
    let ctx = Ctx {
        data_dir: data_dir.clone(),
        source_root,
        out_dir,
        source,
        rounds,
        big_gib,
        model_gib,
        calls,
        capped_gib,
        rss_gib,
        cap_mbps,
        builds,
        load_secs,
        pg,
        in_flight: if in_flight.is_empty() {
            vec![1, 16, 100]
        } else {
            in_flight
        },
        publish_mib,
        native_mib,
        archives,
        history,
    };
    machine();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(async {
        for section in &sections {
            match section.as_str() {
                "fetch" => fetch::throughput(&ctx).await?,
                "resume" => fetch::resume(&ctx).await?,
                "reverify" => fetch::reverify(&ctx).await?,
                "plugin" => plugin::calls(&ctx).await?,
                "api" => api::deployments(&ctx).await?,
                "memory" => api::memory(&ctx).await?,
                "capped" => capped::throughput(&ctx).await?,
                "store" => store::model(&ctx).await?,
                "load" => load::run(&ctx).await?,
                "quota" => quota::overshoot(&ctx).await?,
                "deploys" => deploys::run(&ctx).await?,
                "dropin" => dropin::run(&ctx).await?,
                "signatures" => signatures::run(&ctx).await?,
                "buckets" => buckets::run(&ctx).await?,
                "cluster" => cluster::run(&ctx).await?,
                "push" => push::run(&ctx).await?,
                "publish" => publish::run(&ctx).await?,
                "oci" => oci::run(&ctx).await?,
                "native" => native::run(&ctx).await?,
                "blobs" => blobs::run(&ctx).await?,
                "upload" => upload::run(&ctx).await?,
                _ => unreachable!("checked above"),
            }
        }
        anyhow::Ok(())
    });
    if !keep {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    outcome
}

/// What the figures were measured on.
fn machine() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let sha_ni = cpuinfo.split_whitespace().any(|w| w == "sha_ni");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib >> 20);
    println!("# berth benchmarks");
    println!(
        "machine: {model}, {cores} cores, {mem_gib} GiB, SHA-NI {}",
        if sha_ni { "yes" } else { "no" }
    );
    println!("load average at start: {}", report::load_average());
}
