//! Prints the fairness report for a profile: `cargo run --release -p tagstripe-scheduler
//! --example fairness -- hdd-1998 60 1`.

use tagstripe_scheduler::{Profile, sim};

fn main() {
    let mut args = std::env::args().skip(1);
    let profile = args
        .next()
        .and_then(|p| Profile::parse(&p))
        .unwrap_or(Profile::Hdd1998);
    let seconds = args.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let r = sim::report(profile, seconds, seed);
    let ms = |n: u64| n as f64 / 1e6;
    let u = &r.unloaded;
    println!(
        "unloaded: p50 {:.2} p99 {:.2} max {:.2} chain p99 {:.1} (n={})",
        ms(u.interactive.p50),
        ms(u.interactive.p99),
        ms(u.interactive.max),
        ms(r.unloaded_chains.chains.p99),
        u.interactive.count
    );
    for row in &r.rows {
        let run = &row.with_reader;
        println!(
            "{:<10} p50 {:>9.2} p99 {:>9.2} max {:>9.2} dev-p99 {:>8.2} chain p99 {:>9.1} bulk {:>7.2} MB/s idle {:>7.2} MB/s barriers {} min-open {}",
            row.scheduler,
            ms(run.interactive.p50),
            ms(run.interactive.p99),
            ms(run.interactive.max),
            ms(run.interactive_device.p99),
            ms(row.with_chains.chains.p99),
            run.bulk_bytes_per_sec / 1e6,
            row.bulk_idle_bytes_per_sec / 1e6,
            run.barriers,
            run.min_openings
        );
    }
}
