//! The `berth` binary: parses the command line and hands over to `cli`.

#![deny(unsafe_code)]

use clap::Parser;

fn main() -> std::process::ExitCode {
    berth::cli::main(berth::cli::Args::parse())
}
