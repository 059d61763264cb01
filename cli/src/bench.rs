//! `tagstripe bench`: the seed stories as benchmarks.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;
use tagstripe_scheduler::{Nanos, Profile, sim};

/// Arguments of `tagstripe bench`: with no subcommand, the seed stories on a striped
/// volume (by default over 4 temporary files).
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    what: Option<BenchCommand>,
    #[command(flatten)]
    run: crate::story::RunArgs,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// A bulk writer and an interactive reader: live on a striped volume (fairness off and
    /// on), or with --sim on a disk model under each scheduler (unloaded, fifo, cam1998,
    /// maxtags2, deadline and tagstripe).
    Fairness(FairnessArgs),
    /// Throughput and latency of one workload on a striped volume.
    Throughput(crate::story::ThroughputArgs),
    /// A mixed load on every volume kind with faults injected; every acknowledged byte is
    /// checked (bytes lost must be 0).
    Soak(crate::soak::SoakArgs),
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
    #[arg(long, default_value_t = 5.0, value_parser = crate::story::parse_seconds)]
    live_seconds: f64,
    /// The simulated disk: hdd-1998, hdd-modern or ssd.
    #[arg(long, default_value = "hdd-1998", value_parser = parse_profile)]
    profile: Profile,
    /// Simulated seconds per run (the first 5 are warm-up).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(10..=3600))]
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

fn parse_profile(s: &str) -> Result<Profile, String> {
    Profile::parse(s).ok_or_else(|| format!("{s:?}: expected hdd-1998, hdd-modern or ssd"))
}

pub(crate) fn run(args: &BenchArgs) -> ExitCode {
    match &args.what {
        None => crate::story::run(&args.run),
        Some(BenchCommand::Fairness(f)) => fairness(f),
        Some(BenchCommand::Throughput(t)) => crate::story::throughput(t),
        Some(BenchCommand::Soak(s)) => crate::soak::run(s),
    }
}

fn ms(n: Nanos) -> f64 {
    (n as f64 / 1e4).round() / 100.0
}

fn mb(bytes_per_sec: f64) -> f64 {
    (bytes_per_sec / 1e4).round() / 100.0
}

fn fairness(args: &FairnessArgs) -> ExitCode {
    if !args.sim {
        return crate::story::fairness_live(
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

/// The simulation's report as the JSON of `bench fairness --sim --json`.
pub(crate) fn fairness_json(
    r: &sim::Report,
    profile: Profile,
    seconds: u64,
    seed: u64,
) -> serde_json::Value {
    let u = &r.unloaded.interactive;
    let chain_ms = ms(r.unloaded_chains.chains.p99);
    let runs: Vec<_> = r
        .rows
        .iter()
        .map(|row| {
            let i = &row.with_reader.interactive;
            json!({
                "scheduler": row.scheduler,
                "interactive": {"p50_ms": ms(i.p50), "p99_ms": ms(i.p99), "max_ms": ms(i.max)},
                "interactive_device_p99_ms": ms(row.with_reader.interactive_device.p99),
                "chain_p99_ms": ms(row.with_chains.chains.p99),
                "bulk_mb_s": mb(row.with_reader.bulk_bytes_per_sec),
                "bulk_idle_mb_s": mb(row.bulk_idle_bytes_per_sec),
                "barriers": row.with_reader.barriers,
                "min_openings": row.with_reader.min_openings,
            })
        })
        .collect();
    json!({
        "profile": profile.name(),
        "seconds": seconds,
        "seed": seed,
        "unloaded": {"p50_ms": ms(u.p50), "p99_ms": ms(u.p99), "max_ms": ms(u.max), "chain_ms": chain_ms},
        "runs": runs,
    })
}

/// The simulation's report as a table.
pub(crate) fn fairness_table(r: &sim::Report, profile: Profile, seconds: u64, seed: u64) {
    let u = &r.unloaded.interactive;
    let chain_ms = ms(r.unloaded_chains.chains.p99);
    outln!(
        "fairness on {} ({} s simulated, seed {}): one sequential 64 KiB writer at QD 64, QD-1 4 KiB random reads, 20-read login chains",
        profile.name(),
        seconds,
        seed
    );
    outln!(
        "{:<10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10}",
        "scheduler",
        "p50 ms",
        "p99 ms",
        "max ms",
        "chain p99",
        "bulk MB/s",
        "idle MB/s"
    );
    outln!(
        "{:<10} {:>10.2} {:>10.2} {:>10.2} {:>12.1} {:>10} {:>10}",
        "unloaded",
        ms(u.p50),
        ms(u.p99),
        ms(u.max),
        chain_ms,
        "-",
        "-"
    );
    for row in &r.rows {
        let i = &row.with_reader.interactive;
        outln!(
            "{:<10} {:>10.2} {:>10.2} {:>10.2} {:>12.1} {:>10.2} {:>10.2}",
            row.scheduler,
            ms(i.p50),
            ms(i.p99),
            ms(i.max),
            ms(row.with_chains.chains.p99),
            mb(row.with_reader.bulk_bytes_per_sec),
            mb(row.bulk_idle_bytes_per_sec)
        );
    }
    outln!(
        "latencies run from submission to completion; reads still waiting at the end count with the time waited"
    );
}
