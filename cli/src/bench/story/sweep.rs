//! The dd-style sweep: sequential writes and reads, one request at a time, at every block
//! size from 512 bytes to 1 MiB.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tagstripe::DynBlockDevice;

use super::{Progress, round, seq};
use crate::bench::load::{self, Op, human};

/// One block size of the sweep.
#[derive(Clone, Debug, Serialize)]
pub(super) struct SweepRow {
    /// Request size in bytes.
    pub(super) bs: u64,
    pub(super) write_mb_s: f64,
    pub(super) read_mb_s: f64,
    pub(super) write_lat_us_p50: f64,
    pub(super) read_lat_us_p50: f64,
}

/// Runs the sweep over the first `total` sectors of `dev` (or 128 MiB, 16 with `quick`),
/// written first; prints the table if `text`.
pub(super) async fn sweep(
    dev: &Arc<dyn DynBlockDevice>,
    total: u64,
    quick: bool,
    text: bool,
    progress: &Progress,
) -> Vec<SweepRow> {
    let region = total.min(if quick { 16 << 11 } else { 128 << 11 });
    progress.step("sweep: writing the region");
    let _ = load::run(
        Arc::clone(dev),
        seq(Op::Write, 1 << 20, 1, region, Duration::from_secs(60)),
    )
    .await;
    let budget = Duration::from_millis(if quick { 80 } else { 400 });
    if text {
        outln!(
            "\ndd-style sweep: sequential, one request at a time, {budget:?} or {} MiB per point",
            region / 2048
        );
        outln!("{:>8} {:>12} {:>12}", "bs", "write MB/s", "read MB/s");
    }
    let mut rows = Vec::new();
    let mut bs = 512u64;
    while bs <= 1 << 20 {
        progress.step(&format!("sweep: {}", human(bs)));
        let w = load::run(Arc::clone(dev), seq(Op::Write, bs, 1, region, budget)).await;
        let r = load::run(Arc::clone(dev), seq(Op::Read, bs, 1, region, budget)).await;
        if text {
            outln!("{:>8} {:>12.1} {:>12.1}", human(bs), w.mb_s(), r.mb_s());
        }
        rows.push(SweepRow {
            bs,
            write_mb_s: round(w.mb_s(), 2),
            read_mb_s: round(r.mb_s(), 2),
            write_lat_us_p50: round(w.lat_us(0.5), 1),
            read_lat_us_p50: round(r.lat_us(0.5), 1),
        });
        bs *= 2;
    }
    rows
}
