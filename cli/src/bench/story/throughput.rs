//! `tagstripe bench throughput`: one load on a volume, its figures.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::layout::LayoutArgs;
use clap::Args;
use serde::Serialize;
use tagstripe::scheduler::IoClass;
use tagstripe::{BlockDevice, DynBlockDevice};

use super::{build, parse_seconds, round, runtime};
use crate::bench::load::{self, Load, Op, parse_size};
use crate::components::{self, OpenOptions};

/// Arguments of `tagstripe bench throughput`.
#[derive(Debug, Args)]
pub(crate) struct ThroughputArgs {
    /// A component; repeat for more (they are striped).
    #[arg(long = "component", required = true)]
    components: Vec<String>,
    /// Interleave in sectors.
    #[arg(long, default_value_t = 128)]
    interleave: u64,
    /// read, write, randread or randwrite.
    #[arg(long, value_parser = Op::parse)]
    op: Op,
    /// Request size, like 4k or 1M.
    #[arg(long, value_parser = parse_size)]
    bs: u64,
    /// Requests in flight on the volume.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    depth: u64,
    /// How long to run.
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    seconds: f64,
    /// Open files and block devices with O_DIRECT.
    #[arg(long)]
    direct: bool,
    /// Runtime threads (1: everything on one thread, the fastest for I/O-bound loads).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// What `bench throughput --json` prints.
#[derive(Debug, Serialize)]
struct Throughput {
    op: &'static str,
    bs: u64,
    depth: u64,
    seconds: f64,
    mb_s: f64,
    iops: f64,
    lat_us: Percentiles,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Serialize)]
struct Percentiles {
    p50: f64,
    p99: f64,
    max: f64,
}

/// `tagstripe bench throughput`.
pub(crate) fn throughput(a: &ThroughputArgs) -> ExitCode {
    let rt = match runtime(a.threads as usize) {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    if a.bs % 512 != 0 {
        return crate::fail(
            "bench throughput",
            "bad_option",
            "--bs must be whole 512-byte sectors",
            a.json,
        );
    }
    rt.block_on(async {
        let o = OpenOptions {
            read_only: matches!(a.op, Op::Read | Op::RandRead),
            direct: a.direct,
        };
        let comps = match components::open_all(&a.components, o).await {
            Ok(c) => c,
            Err(e) => return crate::fail("bench throughput", "open", &e, a.json),
        };
        let vol = match build(comps, a.interleave, &LayoutArgs::default(), true) {
            Ok(v) => Arc::new(v) as Arc<dyn DynBlockDevice>,
            Err(e) => return crate::fail("bench throughput", "volume", &e, a.json),
        };
        let total = vol.info().sectors;
        if a.bs / 512 > total {
            return crate::fail(
                "bench throughput",
                "bad_option",
                "--bs is larger than the volume",
                a.json,
            );
        }
        let out = load::run(
            Arc::clone(&vol),
            Load {
                op: a.op,
                bs: a.bs,
                depth: a.depth as usize,
                time: Duration::from_secs_f64(a.seconds),
                bytes: 0,
                region: (0, total),
                class: IoClass::BestEffort,
                think: Duration::ZERO,
                seed: 1,
            },
        )
        .await;
        if out.errors > 0 {
            eprintln!(
                "tagstripe bench throughput: {} requests failed",
                out.errors
            );
        }
        let r = Throughput {
            op: a.op.name(),
            bs: a.bs,
            depth: a.depth,
            seconds: round(out.elapsed.as_secs_f64(), 3),
            mb_s: round(out.mb_s(), 2),
            iops: round(out.iops(), 1),
            lat_us: Percentiles {
                p50: round(out.lat_us(0.5), 1),
                p99: round(out.lat_us(0.99), 1),
                max: round(out.lat_us(1.0), 1),
            },
        };
        if a.json {
            outln!("{}", super::to_json(&r));
        } else {
            outln!(
                "{} bs={} depth={}: {:.1} MB/s, {:.0} IOPS, latency p50 {:.1} us, p99 {:.1} us, max {:.1} us ({:.1} s)",
                r.op,
                r.bs,
                r.depth,
                out.mb_s(),
                out.iops(),
                out.lat_us(0.5),
                out.lat_us(0.99),
                out.lat_us(1.0),
                out.elapsed.as_secs_f64()
            );
        }
        if out.errors > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    })
}
