//! `berth deployers push | rm | versions | rollback`: the deployers stored
//! over a server's API, shared by every server on its database; a push
//! uploads a file, or has the server pull an `oci://` reference.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use super::api::{Api, Error};
use super::text::{Table, timestamp};
use super::{Common, print_json};
use crate::http::json::{Deployer, DeployerVersions, HeldVersion, PullBody, RollbackBody};
use crate::oci::Reference;

#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// Pushes a plugin as a deployer stored on the server (a new deployer,
    /// or a new version of one pushed before), for every server on its
    /// database. NAME.toml and NAME.wasm.sig beside FILE go with it.
    ///
    /// With oci://REGISTRY/REPOSITORY:TAG (or @sha256:DIGEST) instead of a
    /// file, the server pulls the component from the registry (the wasm OCI
    /// artifact layout, as `wkg oci push` writes it) with the login its
    /// sources file gives that repository, and keeps the manifest's digest
    /// as the version's source. --manifest and --signature go with it.
    Push {
        /// The plugin's `.wasm`, or `oci://REGISTRY/REPOSITORY:TAG`.
        #[arg(value_name = "FILE|OCI")]
        file: PathBuf,
        /// The deployer's name (default: the file's name without `.wasm`,
        /// or the repository's last component).
        #[arg(long)]
        name: Option<String>,
        /// Its manifest (default: the `.toml` beside FILE, if there is one).
        #[arg(long, value_name = "FILE")]
        manifest: Option<PathBuf>,
        /// Its detached signature (default: FILE.sig, if there is one).
        #[arg(long, value_name = "FILE")]
        signature: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Removes a deployer stored on the server, with all its versions.
    Rm {
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Lists the versions of a deployer stored on the server.
    Versions {
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Serves an earlier version of a stored deployer again: the one before
    /// the version it serves, or the one given.
    Rollback {
        name: String,
        /// The sha256 of the version to serve (see `berth deployers versions`).
        #[arg(long, value_name = "SHA256")]
        to: Option<String>,
        #[command(flatten)]
        common: Common,
    },
}

pub async fn run(command: CatalogCommand) -> Result<ExitCode, Error> {
    let common = match &command {
        CatalogCommand::Push { common, .. }
        | CatalogCommand::Rm { common, .. }
        | CatalogCommand::Versions { common, .. }
        | CatalogCommand::Rollback { common, .. } => common,
    };
    let api = Api::new(&common.server, common.token.as_deref())?;
    let json = common.json;
    match &command {
        CatalogCommand::Push {
            file,
            name,
            manifest,
            signature,
            ..
        } => match file
            .to_str()
            .and_then(|f| f.strip_prefix("oci://").map(|_| f))
        {
            Some(reference) => {
                pull(&api, reference, name.as_deref(), manifest, signature, json).await?
            }
            None => push(&api, file, name.as_deref(), manifest, signature, json).await?,
        },
        CatalogCommand::Rm { name, .. } => {
            api.delete(&path(name, "")).await?;
            println!(
                "removed deployer {name} and its versions from {}",
                api.server()
            );
        }
        CatalogCommand::Versions { name, .. } => versions(&api, name, json).await?,
        CatalogCommand::Rollback { name, to, .. } => {
            let body = RollbackBody { sha256: to.clone() };
            let answer = api
                .post::<Deployer>(&path(name, "/rollback"), &body)
                .await?;
            match json {
                true => print_json(&answer.raw),
                false => println!("deployer {name} now serves {} again", serves(&answer.body)),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `/v1/deployers/NAME` and what follows it.
fn path(name: &str, rest: &str) -> String {
    let name = percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
    format!("/v1/deployers/{name}{rest}")
}

async fn push(
    api: &Api,
    file: &Path,
    name: Option<&str>,
    manifest: &Option<PathBuf>,
    signature: &Option<PathBuf>,
    json: bool,
) -> Result<(), Error> {
    let name = match name {
        Some(name) => name.to_string(),
        None => file
            .file_name()
            .and_then(|f| f.to_str())
            .map(|f| f.strip_suffix(".wasm").unwrap_or(f).to_string())
            .ok_or_else(|| {
                Error::Invalid(format!("{} names no file; give --name", file.display()))
            })?,
    };
    let read = |path: &Path| {
        std::fs::read(path)
            .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", path.display())))
    };
    let wasm = read(file)?;
    let beside = |given: &Option<PathBuf>, path: PathBuf| match given {
        Some(given) => Some(given.clone()),
        None => path.is_file().then_some(path),
    };
    let mut form = reqwest::multipart::Form::new().part(
        "wasm",
        reqwest::multipart::Part::bytes(wasm).file_name(format!("{name}.wasm")),
    );
    let mut sent = Vec::new();
    for (part, path) in [
        ("manifest", beside(manifest, file.with_extension("toml"))),
        ("signature", beside(signature, sig_path(file))),
    ] {
        if let Some(path) = path {
            let text = String::from_utf8(read(&path)?)
                .map_err(|_| Error::Invalid(format!("{} is not UTF-8 text", path.display())))?;
            form = form.text(part, text);
            sent.push(format!("{part} {}", path.display()));
        }
    }
    let answer = api.put_form::<Pushed>(&path(&name, ""), form).await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    let with = match sent.is_empty() {
        true => String::new(),
        false => format!(" (with its {})", sent.join(" and ")),
    };
    match &answer.body {
        Pushed::Served(deployer) => println!(
            "deployer {name} now serves {} on {}{with}",
            serves(deployer),
            api.server()
        ),
        Pushed::Held(held) => say_held(&name, held),
    }
    Ok(())
}

/// What a push answers: the version now served, or (202) the version held
/// until an admin approves what it adds.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Pushed {
    Served(Box<Deployer>),
    Held(HeldVersion),
}

fn say_held(name: &str, held: &HeldVersion) {
    println!(
        "deployer {name}: version {} (sha256 {}) is stored but held, and the version served before goes on serving: \
         it asks for more ({}); an admin approves it with POST /v1/deployers/{name}/approve (or on the page)",
        held.number,
        short(&held.sha256),
        held.adds.join("; ")
    );
}

/// `berth deployers push oci://…`: the server pulls the component.
async fn pull(
    api: &Api,
    reference: &str,
    name: Option<&str>,
    manifest: &Option<PathBuf>,
    signature: &Option<PathBuf>,
    json: bool,
) -> Result<(), Error> {
    let name = match name {
        Some(name) => name.to_string(),
        None => {
            let parsed = Reference::parse(reference).map_err(Error::Invalid)?;
            let last = parsed.repository.rsplit('/').next();
            last.unwrap_or(&parsed.repository).to_string()
        }
    };
    let text = |path: &Option<PathBuf>| -> Result<Option<String>, Error> {
        let Some(path) = path else { return Ok(None) };
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", path.display())))?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| Error::Invalid(format!("{} is not UTF-8 text", path.display())))
    };
    let body = PullBody {
        manifest: text(manifest)?,
        oci: reference.to_string(),
        signature: text(signature)?,
    };
    let answer = api.put::<Pushed>(&path(&name, ""), &body).await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    let deployer = match &answer.body {
        Pushed::Served(deployer) => deployer,
        Pushed::Held(held) => {
            say_held(&name, held);
            return Ok(());
        }
    };
    let from = deployer.source.as_deref().unwrap_or(reference);
    println!(
        "deployer {name} now serves {} on {}, pulled from {from}",
        serves(deployer),
        api.server()
    );
    Ok(())
}

/// `FILE.sig`.
fn sig_path(file: &Path) -> PathBuf {
    let mut path = file.as_os_str().to_owned();
    path.push(".sig");
    PathBuf::from(path)
}

/// "version 3 (sha256 ab12…)" of a deployer.
fn serves(deployer: &Deployer) -> String {
    format!(
        "version {} (sha256 {})",
        version(deployer.version),
        short(&deployer.sha256)
    )
}

/// A stored deployer's version number; empty for a folder deployer.
pub fn version(number: Option<i64>) -> String {
    number.map(|n| n.to_string()).unwrap_or_default()
}

fn short(sha256: &str) -> String {
    sha256.chars().take(12).collect()
}

async fn versions(api: &Api, name: &str, json: bool) -> Result<(), Error> {
    let answer = api
        .get::<DeployerVersions>(&path(name, "/versions"))
        .await?;
    if json {
        print_json(&answer.raw);
        return Ok(());
    }
    let mut table = Table::new(&[
        "",
        "VERSION",
        "SHA256",
        "SIZE",
        "ADDED (UTC)",
        "BY",
        "SIGNED",
        "SOURCE",
    ])
    .right_align(&[1, 3]);
    for version in answer.body.versions {
        table.row(vec![
            if version.current { "*" } else { "" }.to_string(),
            version.number.to_string(),
            short(&version.sha256),
            crate::human::size(u64::try_from(version.size).unwrap_or_default()),
            timestamp(&version.added_at),
            version.added_by.unwrap_or_default(),
            if version.signed { "yes" } else { "no" }.to_string(),
            version.source.unwrap_or_else(|| "upload".into()),
        ]);
    }
    print!("{}", table.render());
    println!("* the version deployer {name} serves");
    Ok(())
}
