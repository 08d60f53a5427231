//! `berth backup PATH`: a consistent copy of a server's SQLite database,
//! taken while the server runs (SQLite's `VACUUM INTO` reads one snapshot,
//! so writes going on meanwhile are either wholly in the copy or not at
//! all). Written under a temporary name beside PATH and renamed when whole,
//! then opened and checked. PostgreSQL is backed up with its own tools.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::ConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

/// `berth backup`'s arguments: where the copy goes, and the server's
/// database as `serve` names it.
#[derive(Debug, clap::Args)]
pub(super) struct BackupArgs {
    /// The file to write: a new one (an existing file is never
    /// overwritten).
    path: PathBuf,
    /// The server's data dir; its database is DATA_DIR/berth.db.
    #[arg(long, env = "BERTH_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    /// The server's database, if not DATA_DIR/berth.db (sqlite://PATH).
    #[arg(long, env = "BERTH_DATABASE_URL")]
    database_url: Option<String>,
}

/// How long the copy waits for a write in progress (the server's group
/// commit holds the write lock for milliseconds).
const BUSY: Duration = Duration::from_secs(30);

pub(super) async fn run(args: BackupArgs) -> anyhow::Result<ExitCode> {
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", args.data_dir.join("berth.db").display()));
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        bail!(
            "berth backup copies SQLite databases; this one is PostgreSQL: back it up with \
             pg_dump or your provider's snapshots (see docs/src/operating/backups.md)"
        );
    }
    let options = SqliteConnectOptions::from_str(&url)
        .with_context(|| format!("{url} is not a SQLite database URL (sqlite://PATH)"))?;
    let source = options.get_filename().to_path_buf();
    if !source.is_file() {
        bail!(
            "there is no database at {}: give the server's --data-dir (or --database-url), \
             or run this where the server runs",
            source.display()
        );
    }
    if args.path.exists() {
        bail!(
            "{} exists: berth backup writes a new file and never overwrites one; choose \
             another name or remove it",
            args.path.display()
        );
    }
    let partial = partial_path(&args.path)?;
    let clock = Instant::now();
    let copied = copy(options, &partial).await;
    let checked = match copied {
        Ok(()) => check(&partial).await,
        Err(e) => Err(e),
    };
    let counts = match checked {
        Ok(counts) => counts,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, &args.path).with_context(|| {
        format!(
            "cannot move the copy {} to {}",
            partial.display(),
            args.path.display()
        )
    })?;
    let bytes = std::fs::metadata(&args.path).map_or(0, |m| m.len());
    println!(
        "backed up {} to {} ({}, {counts}) in {}",
        source.display(),
        args.path.display(),
        crate::human::size(bytes),
        crate::human::duration(clock.elapsed())
    );
    Ok(ExitCode::SUCCESS)
}

/// Beside `path`, so the rename is on one filesystem.
fn partial_path(path: &Path) -> anyhow::Result<PathBuf> {
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let mut partial = name.to_os_string();
    partial.push(format!(".partial-{}", std::process::id()));
    Ok(path.with_file_name(partial))
}

async fn copy(options: SqliteConnectOptions, to: &Path) -> anyhow::Result<()> {
    let mut conn = options
        .read_only(true)
        .busy_timeout(BUSY)
        .connect()
        .await
        .context("cannot open the database")?;
    let to = to
        .to_str()
        .with_context(|| format!("{} is not a UTF-8 path", to.display()))?;
    sqlx::query("VACUUM INTO ?")
        .bind(to)
        .execute(&mut conn)
        .await
        .with_context(|| format!("cannot write the copy to {to}"))?;
    Ok(())
}

/// Opens the copy and checks it whole; what it holds, in words.
async fn check(copy: &Path) -> anyhow::Result<String> {
    let mut conn = SqliteConnectOptions::new()
        .filename(copy)
        .read_only(true)
        .connect()
        .await
        .context("cannot open the copy")?;
    let verdict: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .context("cannot check the copy")?;
    if verdict != "ok" {
        bail!("the copy is damaged ({verdict}); nothing was kept");
    }
    let mut counts = Vec::new();
    for table in ["models", "deployments", "events"] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&mut conn)
            .await
            .with_context(|| format!("the copy has no readable {table} table"))?;
        counts.push(format!("{table}: {n}"));
    }
    Ok(counts.join(", "))
}
