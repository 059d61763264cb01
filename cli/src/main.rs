//! `tagstripe`: the pure crates from the shell, with machine-readable output.
//!
//! Subcommands print a readable view by default and JSON with `--json`; the JSON shapes are a
//! contract (described in the README) so results can be checked against other
//! implementations. Bad flags print a clear message and exit 2.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` to stdout that ends the process quietly when the reader has gone away (a
/// closed pipe, as with `| head`), instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod bench;
mod components;
mod crash;
mod info;
mod layout;
mod map;
mod map_md;
mod quirks;
mod serve;
mod split;
mod tenants;

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
    /// Split a request by a device's limits and quirks, in Linux's order.
    Split(split::SplitArgs),
    /// List the quirk table with sources, or show what applies to a device and why.
    Quirks(quirks::QuirksArgs),
    /// Benchmarks: the seed stories on a striped volume (sweep, bonnie-style summary,
    /// fairness), one workload's throughput, the fairness simulation.
    Bench(bench::BenchArgs),
    /// What tagstripe sees of a file or block device: size, block sizes, limits, identity,
    /// and the quirk row that applies.
    Info(info::InfoArgs),
    /// Export a striped volume (or one device) over NBD to any NBD client.
    Serve(serve::ServeArgs),
    /// The crash lab: check every state a power cut could leave on a volume recorded with
    /// `serve --record`, rebuild one, or say what a log holds.
    Crash(crash::CrashArgs),
}

/// Exit code for usage errors and refused configurations (clap uses the same).
pub(crate) const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Map(args) => map::run(&args),
        Command::Split(args) => split::run(&args),
        Command::Quirks(args) => quirks::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Info(args) => info::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Crash(args) => crash::run(&args),
    }
}

/// Writes to stdout; a write error (the reader closed the pipe) ends the process with
/// success, as `head` expects of the programs it reads.
pub(crate) fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Reports a refused input: JSON `{"error": {"kind", "message"}}` on stdout with `--json`,
/// otherwise a message on stderr; exit code 2 either way.
pub(crate) fn fail(command: &str, kind: &str, message: &str, json: bool) -> ExitCode {
    if json {
        outln!(
            "{}",
            serde_json::json!({"error": {"kind": kind, "message": message}})
        );
    } else {
        eprintln!("tagstripe {command}: {message}");
    }
    ExitCode::from(EXIT_USAGE)
}
