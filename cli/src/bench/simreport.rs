//! The fairness simulation's report, as a table and as JSON (`bench fairness --sim` and the
//! main `bench`'s fairness phase).

use serde_json::json;
use tagstripe_scheduler::{Nanos, Profile, sim};

fn ms(n: Nanos) -> f64 {
    (n as f64 / 1e4).round() / 100.0
}

fn mb(bytes_per_sec: f64) -> f64 {
    (bytes_per_sec / 1e4).round() / 100.0
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
