//! `tagstripe bench`: the seed stories as benchmarks. The stories (`story`: the sweep, the
//! bonnie-style summary, the live and simulated fairness runs, throughput), the soak under
//! faults (`soak`), the load generator they share (`load`), and their reports.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use tagstripe_scheduler::{Profile, sim};

mod load;
#[cfg(feature = "extras")]
mod plot;
mod simreport;
mod soak;
mod story;

use simreport::{fairness_json, fairness_table};

/// Arguments of `tagstripe bench`: with no subcommand, the seed stories on a striped
/// volume (by default over 4 temporary files).
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    what: Option<BenchCommand>,
    #[command(flatten)]
    run: story::RunArgs,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// A bulk writer and an interactive reader: live on a striped volume (fairness off and
    /// on), or with --sim on a disk model under each scheduler (unloaded, fifo, cam1998,
    /// maxtags2, deadline and tagstripe).
    Fairness(FairnessArgs),
    /// Throughput and latency of one workload on a striped volume.
    Throughput(story::ThroughputArgs),
    /// Tenants sharing a striped volume: a VM with a reservation and interactive reads, a
    /// database at weight 3, a backup at weight 1 with a limit; each one's owed against
    /// what it got (live, or with --sim on the disk models).
    Tenants(story::TenantsArgs),
    /// A mixed load on every volume kind with faults injected; every acknowledged byte is
    /// checked (bytes lost must be 0).
    Soak(soak::SoakArgs),
}

/// Arguments of `tagstripe bench fairness`.
#[derive(Debug, Args)]
pub(crate) struct FairnessArgs {
    /// Run the deterministic simulation (a disk model on a virtual clock). Without it: the
    /// live run, a bulk writer and an interactive reader on a striped volume, fairness off and
    /// on.
    #[arg(long)]
    sim: bool,
    /// Live run: a component (file, block device, nbd://, sim:PROFILE:SIZE); repeat for more.
    /// Default: 4 temporary files.
    #[arg(long = "component")]
    components: Vec<String>,
    /// Live run: interleave in sectors.
    #[arg(long, default_value_t = 128)]
    interleave: u64,
    /// Live run: seconds of each of its three runs.
    #[arg(long, default_value_t = 5.0, value_parser = story::parse_seconds)]
    live_seconds: f64,
    /// The simulated disk: hdd-1998, hdd-modern or ssd.
    #[arg(long, default_value = "hdd-1998", value_parser = parse_profile)]
    profile: Profile,
    /// Simulated seconds per run (the first 5 are warm-up). The default gives the disk
    /// profiles' reader about 6,000 reads, so its p99 is about the 60th slowest of them, not
    /// the 6th of a minute's 550.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(10..=3600))]
    seconds: u64,
    /// Seed of the workload's random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Live run: open files and block devices through the page cache (default: O_DIRECT,
    /// as fio's --direct=1).
    #[arg(long)]
    buffered: bool,
}

pub(crate) fn parse_profile(s: &str) -> Result<Profile, String> {
    Profile::parse(s).ok_or_else(|| format!("{s:?}: expected hdd-1998, hdd-modern or ssd"))
}

pub(crate) fn run(args: &BenchArgs) -> ExitCode {
    match &args.what {
        None => story::run(&args.run),
        Some(BenchCommand::Fairness(f)) => fairness(f),
        Some(BenchCommand::Throughput(t)) => story::throughput(t),
        Some(BenchCommand::Tenants(t)) => story::tenants(t),
        Some(BenchCommand::Soak(s)) => soak::run(s),
    }
}

fn fairness(args: &FairnessArgs) -> ExitCode {
    if !args.sim {
        return story::fairness_live(
            &args.components,
            args.interleave,
            args.live_seconds,
            args.json,
            args.buffered,
        );
    }
    let r = sim::report(args.profile, args.seconds, args.seed);
    if args.json {
        outln!(
            "{}",
            fairness_json(&r, args.profile, args.seconds, args.seed)
        );
    } else {
        fairness_table(&r, args.profile, args.seconds, args.seed);
    }
    ExitCode::SUCCESS
}
