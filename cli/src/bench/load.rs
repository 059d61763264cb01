//! A load generator over any block device: sequential or random reads or writes at a
//! depth, for a time or a byte count, with per-request latencies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tagstripe::scheduler::{IoClass, Rng};
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts};

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
    RandRead,
    RandWrite,
}

impl Op {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            _ => {
                return Err(format!(
                    "{s:?}: expected read, write, randread or randwrite"
                ));
            }
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
        }
    }

    fn writes(self) -> bool {
        matches!(self, Self::Write | Self::RandWrite)
    }

    fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite)
    }
}

/// A size like `4k`, `1M`, `512` (bytes; binary multiples): the library's one parser.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    tagstripe::parse_size(s).map_err(|e| e.to_string())
}

/// One load's description.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Load {
    pub op: Op,
    /// Bytes per request (whole sectors).
    pub bs: u64,
    pub depth: usize,
    /// Stop after this long...
    pub time: Duration,
    /// ...or after this many bytes, whichever comes first (0: no byte limit).
    pub bytes: u64,
    /// The region used, in sectors: `[start, start + len)`.
    pub region: (u64, u64),
    pub class: IoClass,
    /// Time between one request's end and the next's start, per worker.
    pub think: Duration,
    pub seed: u64,
}

/// What a load did.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outcome {
    pub ops: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub errors: u64,
    /// Latencies in nanoseconds, sorted.
    pub lat: Vec<u64>,
}

impl Outcome {
    /// Adds another run's figures (the latencies are left unsorted: sort before
    /// [`lat_us`](Self::lat_us)).
    pub(crate) fn add(&mut self, other: Outcome) {
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.lat.extend(other.lat);
    }

    pub(crate) fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }
    pub(crate) fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// A latency percentile in microseconds.
    pub(crate) fn lat_us(&self, p: f64) -> f64 {
        if self.lat.is_empty() {
            return 0.0;
        }
        let i = ((self.lat.len() - 1) as f64 * p).round() as usize;
        self.lat[i] as f64 / 1e3
    }
}

/// Runs `load` on `dev` and gathers what happened.
pub(crate) async fn run(dev: Arc<dyn DynBlockDevice>, load: Load) -> Outcome {
    let sectors = load.bs / 512;
    let slots = (load.region.1 / sectors).max(1);
    let next = Arc::new(AtomicU64::new(0));
    let issued = Arc::new(AtomicU64::new(0));
    // Aligned, as fio's buffers are: an O_DIRECT write of it needs no copy.
    let data = tagstripe::aligned_bytes(&vec![0x5Au8; load.bs as usize]);
    let started = Instant::now();
    let deadline = started + load.time;
    let mut tasks = Vec::with_capacity(load.depth);
    for w in 0..load.depth {
        let (dev, next, issued, data) = (
            Arc::clone(&dev),
            Arc::clone(&next),
            Arc::clone(&issued),
            data.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(load.seed ^ ((w as u64 + 1) << 32));
            let mut out = Outcome::default();
            let mut buf = vec![0u8; load.bs as usize];
            let opts = IoOpts::new().class(load.class);
            loop {
                if Instant::now() >= deadline {
                    break;
                }
                if load.bytes > 0 && issued.fetch_add(load.bs, Relaxed) >= load.bytes {
                    break;
                }
                let slot = if load.op.random() {
                    rng.below(slots)
                } else {
                    next.fetch_add(1, Relaxed) % slots
                };
                let start = load.region.0 + slot * sectors;
                let t = Instant::now();
                let ok = if load.op.writes() {
                    dev.write(start, data.clone(), opts).await.is_ok()
                } else {
                    dev.read_into(start, &mut buf, opts).await.is_ok()
                };
                out.lat.push(t.elapsed().as_nanos() as u64);
                if ok {
                    out.ops += 1;
                    out.bytes += load.bs;
                } else {
                    out.errors += 1;
                }
                if !load.think.is_zero() {
                    think(load.think).await;
                }
            }
            out
        }));
    }
    let mut total = gather(tasks).await;
    total.elapsed = started.elapsed();
    total
}

/// The workers' outcomes together, their latencies sorted (`elapsed` left for the caller).
pub(crate) async fn gather(tasks: Vec<tokio::task::JoinHandle<Outcome>>) -> Outcome {
    let mut total = Outcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.ops += o.ops;
            total.bytes += o.bytes;
            total.errors += o.errors;
            total.lat.extend(o.lat);
        }
    }
    total.lat.sort_unstable();
    total
}

/// Waits `d` between one request's end and the next's start, to within tens of
/// microseconds. tokio's timer wheel has 1 ms ticks, so `tokio::time::sleep` of 1 ms lasts
/// 1-2 ms (the fairness story's reader, meant to think 1 ms as fio's `--thinktime=1000`,
/// thought 1.3-2.2 ms and sent about a third fewer reads); a blocking sleep on tokio's
/// blocking pool uses the kernel's high-resolution timers.
async fn think(d: Duration) {
    if tokio::task::spawn_blocking(move || std::thread::sleep(d))
        .await
        .is_err()
    {
        tokio::time::sleep(d).await;
    }
}

/// A size as the sweep prints it: 512, 4k, 1M.
pub(crate) fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 1024 {
        format!("{}k", b >> 10)
    } else {
        b.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("0").is_err());
        assert!(parse_size("4x").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[tokio::test]
    async fn a_load_reads_what_it_says() {
        let dev: Arc<dyn DynBlockDevice> = Arc::new(tagstripe::MemDevice::new("m", 2048));
        let o = run(
            dev,
            Load {
                op: Op::Write,
                bs: 4096,
                depth: 4,
                time: Duration::from_secs(30),
                bytes: 1 << 20,
                region: (0, 2048),
                class: IoClass::BestEffort,
                think: Duration::ZERO,
                seed: 1,
            },
        )
        .await;
        assert_eq!(o.bytes, 1 << 20);
        assert_eq!(o.ops, 256);
        assert_eq!(o.lat.len(), 256);
        assert_eq!(o.errors, 0);
    }
}
