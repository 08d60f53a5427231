//! The `berth` binary: parses the command line and hands over to `cli`.

#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    berth::cli::main()
}
