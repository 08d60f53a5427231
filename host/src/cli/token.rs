//! `berth token new NAME --role ROLE`: a fresh API token, and the line of
//! `--api-tokens-file` that accepts it. The file holds only the token's
//! hash, so the token itself is shown once, here.

use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};

use crate::auth::{self, Role};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Prints a new token and the --api-tokens-file line that accepts it.
    New {
        /// The token's name: recorded as `created_by` on what it creates.
        name: String,
        /// read: GET endpoints and events; deploy: everything else too;
        /// admin: also the deployer catalog.
        #[arg(long, value_enum, default_value_t = RoleArg::Deploy)]
        role: RoleArg,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Read,
    Deploy,
    Admin,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Self {
        match role {
            RoleArg::Read => Role::Read,
            RoleArg::Deploy => Role::Deploy,
            RoleArg::Admin => Role::Admin,
        }
    }
}

pub fn run(command: TokenCommand) -> anyhow::Result<ExitCode> {
    let TokenCommand::New { name, role } = command;
    let (token, line) = auth::new_token(&name, role.into()).map_err(anyhow::Error::msg)?;
    // The token on stdout, alone, so `TOKEN=$(berth token new ci 2>/dev/null)`
    // works; what to do with it on stderr.
    eprintln!(
        "The token (shown only now; give it to the client as Authorization: Bearer …, or BERTH_TOKEN):"
    );
    println!("{token}");
    eprintln!("The line to add to the --api-tokens-file (it holds only the token's hash):");
    eprintln!("{line}");
    Ok(ExitCode::SUCCESS)
}
