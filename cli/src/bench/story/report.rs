//! The stories' results, typed, and the one place they are rendered: JSON (serde), the
//! summary table, bonnie++'s CSV line and the sweep's SVG plot.

use serde::Serialize;
use tagstripe::scheduler::sim;

use super::bonnie::Bonnie;
use super::fairness::{Goals, LiveRun};
use super::sweep::SweepRow;
use crate::bench::load::human;

/// What `tagstripe bench --json` prints: the phases that ran.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) components: Vec<String>,
    pub(super) interleave: u64,
    pub(super) volume_bytes: u64,
    pub(super) direct: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) sweep: Option<Vec<SweepRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) bonnie: Option<Bonnie>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) fairness: Option<Fairness>,
}

/// The fairness phase: the simulation (as `bench fairness --sim --json` prints it), the live
/// runs and their goals.
#[derive(Debug, Serialize)]
pub(super) struct Fairness {
    pub(super) sim: serde_json::Value,
    pub(super) live: Vec<LiveRun>,
    pub(super) goals: Goals,
    /// The simulation itself, for the summary.
    #[serde(skip)]
    pub(super) report: Option<sim::Report>,
}

/// bonnie's table.
pub(super) fn bonnie_table(b: &Bonnie) {
    outln!("\nbonnie-style summary (1 MiB blocks; seeks: 3 readers of random 8 KiB)");
    outln!(
        "{:>14} {:>14} {:>14} {:>14}",
        "block write",
        "rewrite",
        "block read",
        "random seeks"
    );
    outln!(
        "{:>9.1} MB/s {:>9.1} MB/s {:>9.1} MB/s {:>12.0}/s",
        b.block_write_mb_s,
        b.rewrite_mb_s,
        b.block_read_mb_s,
        b.random_seeks_per_s
    );
}

/// bonnie++ 1.98's CSV: format, version, name, concurrency, seed, file size, chunk size,
/// putc, putc CPU, put_block (KB/s), CPU, rewrite, CPU, getc, CPU, get_block, CPU, seeks
/// (/s), CPU. Columns tagstripe does not measure are empty.
pub(super) fn bonnie_csv(b: &Bonnie, volume_mib: u64) {
    let kb = |mb_s: f64| mb_s * 1e6 / 1024.0;
    outln!(
        "1.98,tagstripe-{},{},1,1,{}M,1M,,,{:.0},,{:.0},,,,{:.0},,{:.1},",
        env!("CARGO_PKG_VERSION"),
        "volume",
        volume_mib,
        kb(b.block_write_mb_s),
        kb(b.rewrite_mb_s),
        kb(b.block_read_mb_s),
        b.random_seeks_per_s
    );
}

/// The sweep's throughput against block size as SVG.
#[cfg(feature = "extras")]
pub(super) fn sweep_svg(
    path: &std::path::Path,
    title: &str,
    rows: &[SweepRow],
) -> Result<(), String> {
    let series = |f: fn(&SweepRow) -> f64| -> Vec<(u64, f64)> {
        rows.iter().map(|r| (r.bs, f(r))).collect()
    };
    crate::bench::plot::sweep_svg(
        path,
        title,
        &[
            ("write", series(|r| r.write_mb_s)),
            ("read", series(|r| r.read_mb_s)),
        ],
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// The table at the end: the figures of each phase that ran, in one place.
pub(super) fn summary(r: &Report) {
    outln!("\nsummary");
    if let Some(rows) = &r.sweep {
        let best = |f: fn(&SweepRow) -> f64| {
            rows.iter()
                .max_by(|x, y| f(x).total_cmp(&f(y)))
                .map_or((0.0, 0), |row| (f(row), row.bs))
        };
        let ((w, wbs), (rd, rbs)) = (best(|x| x.write_mb_s), best(|x| x.read_mb_s));
        outln!(
            "  {:<34} write {:.1} MB/s at {}, read {:.1} MB/s at {}",
            "sweep: best sequential",
            w,
            human(wbs),
            rd,
            human(rbs)
        );
    }
    if let Some(b) = &r.bonnie {
        outln!(
            "  {:<34} write {:.1} MB/s, rewrite {:.1} MB/s, read {:.1} MB/s, {:.0} seeks/s",
            "bonnie-style",
            b.block_write_mb_s,
            b.rewrite_mb_s,
            b.block_read_mb_s,
            b.random_seeks_per_s
        );
    }
    if let Some(f) = &r.fairness {
        if let Some(sim) = &f.report {
            let p99 = |name: &str| {
                sim.rows
                    .iter()
                    .find(|row| row.scheduler == name)
                    .map_or(0.0, |row| row.with_reader.interactive.p99 as f64 / 1e6)
            };
            outln!(
                "  {:<34} fifo {:.0} ms, cam1998 {:.0} ms, tagstripe {:.0} ms",
                "simulated 1998 disk: reader p99",
                p99("fifo"),
                p99("cam1998"),
                p99("tagstripe")
            );
        }
        for run in f.live.iter().skip(1) {
            outln!(
                "  {:<34} reader p99 {:.2} ms, bulk {:.1} MB/s",
                format!("live: {}", run.run),
                run.interactive.p99_ms,
                run.bulk_mb_s
            );
        }
    }
}
