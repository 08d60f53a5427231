//! The command line: `serve`, the plugin author's tools, and a client of a
//! running server. Flags double as `BERTH_*` environment variables. Only this
//! module prints to stdout.

mod backup;
mod choose;
mod client;
mod config;
mod folder;
mod plugin;
mod reference;
mod serve;
mod token;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "berth",
    version,
    about = "Hands trained models to deployers written as WebAssembly components"
)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves the HTTP API: registers models, fetches and verifies their
    /// files, runs deployers.
    Serve(serve::ServeArgs),
    /// Prints the settings `berth serve` would run with (same flags, same
    /// environment, same --config file) and where each comes from, and the
    /// publishing targets of the sources file; secrets are redacted. With
    /// --reference, the book's page of every setting instead.
    Config(config::ConfigArgs),
    /// Tools for plugin authors: start, check and run a deployer without a
    /// server, and sign it.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// API tokens for `berth serve --api-tokens-file`.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Writes a consistent copy of a server's SQLite database to a new
    /// file, while the server runs. To restore, stop the server and put
    /// the copy at DATA_DIR/berth.db.
    Backup(backup::BackupArgs),
    /// `deploy`, `models`, `deployments`, `deployers`: a running server's client.
    #[command(flatten)]
    Client(client::ClientCommand),
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// For people: one line of text per event, with its spans.
    Text,
    /// For log collectors: one JSON object per line, with the current span
    /// and the list of spans.
    Json,
}

/// Parses the command line, with the config file's values (if one is
/// named) as the defaults of `serve`'s flags, and runs the command.
pub fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let file = match config::named(&argv).map(|path| config::read(&path)) {
        None => None,
        Some(Ok(file)) => Some(file),
        Some(Err(e)) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let mut command = Args::command();
    if let Some(file) = &file {
        command = config::with_defaults(command, file);
    }
    let matches = command.get_matches_from(argv);
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Config(config) = &args.command {
        if config.reference {
            print!("{}", reference::page());
            return ExitCode::SUCCESS;
        }
        let settings = matches
            .subcommand_matches("config")
            .expect("the config subcommand was parsed");
        return match config::describe(settings, file.as_ref()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    run(args)
}

fn run(args: Args) -> ExitCode {
    init_logging(match &args.command {
        Command::Serve(serve) => serve.log_format,
        _ => LogFormat::Text,
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match args.command {
            Command::Serve(args) => serve::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Config(_) => unreachable!("answered before the runtime starts"),
            Command::Plugin(command) => plugin::run(command).await,
            Command::Token(command) => token::run(command),
            Command::Backup(args) => backup::run(args).await,
            Command::Client(command) => client::run(command).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr; `RUST_LOG` (or `BERTH_LOG`) chooses what, default info.
fn init_logging(format: LogFormat) {
    let filter = std::env::var("BERTH_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info,wasmtime=warn,cranelift=warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().init(),
    }
}
