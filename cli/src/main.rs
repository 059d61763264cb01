//! `tagstripe`: the pure crates from the shell, with machine-readable output.
//!
//! Subcommands print a readable view by default and JSON with `--json`; the JSON shapes are a
//! contract (see the project's DESIGN.md §4) so results can be checked against other
//! implementations. Bad flags print a clear message and exit 2.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod map;

/// Striping, tagged queueing and request splitting for storage engineers.
#[derive(Debug, Parser)]
#[command(name = "tagstripe", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show a ccd/md striping geometry and where requests land on its components.
    Map(map::MapArgs),
}

/// Exit code for usage errors and refused configurations (clap uses the same).
pub(crate) const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Map(args) => map::run(&args),
    }
}
