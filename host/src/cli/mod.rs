//! The command line: `serve`, the plugin author's tools, and a client of a
//! running server. Flags double as `BERTH_*` environment variables. Only this
//! module prints to stdout.

mod client;
mod plugin;
mod serve;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
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
    /// Tools for plugin authors: check and run a deployer without a server.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
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

pub fn main(args: Args) -> ExitCode {
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
            Command::Plugin(command) => plugin::run(command).await,
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
