//! `tagstripe bench` with no subcommand: the seed stories on a real volume (a dd-style
//! sweep, a bonnie-style summary, the fairness story), and `bench throughput`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};
use tagstripe::quirks::QuirkSet;
use tagstripe::scheduler::{IoClass, Profile, sim};
use tagstripe::striping::Flavor;
use tagstripe::{BlockDevice, FileOptions, IoOpts, Stats, StatsSnapshot, Volume};

use crate::components::{self, OpenOptions};
use crate::load::{self, Load, Op, Outcome, human, parse_size};

/// Arguments of `tagstripe bench` run without a subcommand.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// A component (file, block device, nbd://host:port/export, sim:PROFILE:SIZE); repeat
    /// for more. Default: 4 temporary files, removed at the end.
    #[arg(long = "component")]
    components: Vec<String>,
    /// Interleave in sectors.
    #[arg(long, default_value_t = 128)]
    interleave: u64,
    /// ccd / md flavor.
    #[arg(long, default_value = "netbsd", value_parser = crate::map::parse_flavor)]
    flavor: Flavor,
    /// Size of each temporary file, like 256M (default 256M; 32M with --quick).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Phases to run, comma-separated: sweep, bonnie, fairness (default: all).
    #[arg(long, value_delimiter = ',', value_parser = ["sweep", "bonnie", "fairness"])]
    phases: Vec<String>,
    /// A short smoke run.
    #[arg(long)]
    quick: bool,
    /// Print everything as JSON.
    #[arg(long)]
    json: bool,
    /// Print the bonnie-style summary as bonnie++'s CSV line (columns where they fit).
    #[arg(long)]
    csv: bool,
    /// An iostat-style line per second on stderr: tps, KB/t and MB/s of each component.
    #[arg(long)]
    iostat: bool,
    /// Draw the sweep's throughput against block size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Runtime threads (1: everything on one thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: u64,
    /// Open files and block devices through the page cache (default: O_DIRECT, as fio's
    /// --direct=1).
    #[arg(long)]
    buffered: bool,
}

/// Progress on stderr: a bar where stderr is a terminal (feature `extras`), plain lines
/// otherwise. iostat lines go through it so they do not tear the bar.
#[derive(Clone)]
struct Progress {
    #[cfg(feature = "extras")]
    bar: indicatif::ProgressBar,
}

impl Progress {
    fn new(steps: u64) -> Self {
        #[cfg(feature = "extras")]
        {
            let bar = indicatif::ProgressBar::new(steps);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:32}] {pos}/{len} {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            Self { bar }
        }
        #[cfg(not(feature = "extras"))]
        {
            let _ = steps;
            Self {}
        }
    }

    /// One step begins.
    fn step(&self, what: &str) {
        #[cfg(feature = "extras")]
        {
            if self.bar.is_hidden() {
                eprintln!("{what}");
            }
            self.bar.set_message(what.to_owned());
            self.bar.inc(1);
        }
        #[cfg(not(feature = "extras"))]
        eprintln!("{what}");
    }

    fn line(&self, text: &str) {
        #[cfg(feature = "extras")]
        {
            if self.bar.is_hidden() {
                eprintln!("{text}");
            } else {
                self.bar.println(text);
            }
        }
        #[cfg(not(feature = "extras"))]
        eprintln!("{text}");
    }

    fn finish(&self) {
        #[cfg(feature = "extras")]
        self.bar.finish_and_clear();
    }
}

/// The components' statistics the iostat ticker reads (the volume in use changes between
/// phases).
type Watched = Arc<std::sync::Mutex<Vec<Arc<Stats>>>>;

/// Prints an iostat line per second until dropped.
fn iostat(progress: Progress, watched: Watched) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last: Vec<StatsSnapshot> = Vec::new();
        let mut at = std::time::Instant::now();
        loop {
            tick.tick().await;
            let stats = watched.lock().map(|w| w.clone()).unwrap_or_default();
            let now: Vec<StatsSnapshot> = stats.iter().map(|s| s.snapshot()).collect();
            let elapsed = at.elapsed();
            at = std::time::Instant::now();
            if !now.is_empty() && now.len() == last.len() {
                let mut line = String::from("iostat");
                for (i, (n, l)) in now.iter().zip(&last).enumerate() {
                    use std::fmt::Write as _;
                    let _ = write!(
                        line,
                        " | c{i} {:>6.0} tps {:>6.1} KB/t {:>7.1} MB/s",
                        n.tps(l, elapsed),
                        n.kb_per_transfer(l),
                        n.mb_per_sec(l, elapsed)
                    );
                }
                progress.line(&line);
            }
            last = now;
        }
    })
}

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

pub(crate) fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?}: not a number of seconds"))?;
    if v.is_finite() && v > 0.0 && v <= 86400.0 {
        Ok(v)
    } else {
        Err(format!("{s:?}: must be more than 0 and at most 86400"))
    }
}

/// The runtime the load runs on: one thread by default, which for I/O-bound loads does
/// more I/O per CPU second than a multi-threaded one (no cross-thread wakeups: measured 4 KiB
/// random reads at depth 32 on one O_DIRECT file with io_uring, 113-119k IOPS on one thread
/// against 71-79k on two workers, on the 2-core CI machine); `--threads N` for more.
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut b = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    b.enable_all()
        .build()
        .map_err(|e| crate::fail("bench", "runtime", &e.to_string(), false))
}

fn build(
    comps: Vec<Arc<dyn BlockDevice>>,
    interleave: u64,
    flavor: Flavor,
    queue: bool,
) -> Result<Volume, String> {
    Volume::builder(comps)
        .name("bench")
        .interleave(interleave)
        .flavor(flavor)
        .quirks(QuirkSet::builtin())
        .queue(queue)
        .build()
        .map_err(|e| e.to_string())
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
        let o = OpenOptions { read_only: matches!(a.op, Op::Read | Op::RandRead), direct: a.direct };
        let comps = match components::open_all(&a.components, o).await {
            Ok(c) => c,
            Err(e) => return crate::fail("bench throughput", "open", &e, a.json),
        };
        let vol = match build(comps, a.interleave, Flavor::NetBsd, true) {
            Ok(v) => Arc::new(v) as Arc<dyn BlockDevice>,
            Err(e) => return crate::fail("bench throughput", "volume", &e, a.json),
        };
        let total = vol.info().sectors;
        if a.bs / 512 > total {
            return crate::fail("bench throughput", "bad_option", "--bs is larger than the volume", a.json);
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
            eprintln!("tagstripe bench throughput: {} requests failed", out.errors);
        }
        let j = json!({
            "op": a.op.name(),
            "bs": a.bs,
            "depth": a.depth,
            "seconds": round(out.elapsed.as_secs_f64(), 3),
            "mb_s": round(out.mb_s(), 2),
            "iops": round(out.iops(), 1),
            "lat_us": {"p50": round(out.lat_us(0.5), 1), "p99": round(out.lat_us(0.99), 1), "max": round(out.lat_us(1.0), 1)},
        });
        if a.json {
            outln!("{j}");
        } else {
            outln!(
                "{} bs={} depth={}: {:.1} MB/s, {:.0} IOPS, latency p50 {:.1} us, p99 {:.1} us, max {:.1} us ({:.1} s)",
                a.op.name(), a.bs, a.depth, out.mb_s(), out.iops(), out.lat_us(0.5), out.lat_us(0.99), out.lat_us(1.0), out.elapsed.as_secs_f64()
            );
        }
        if out.errors > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
    })
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// Temporary component files, removed when dropped (also after Ctrl-C).
struct TempFiles {
    dir: PathBuf,
}

impl Drop for TempFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `tagstripe bench`: the stories.
pub(crate) fn run(a: &RunArgs) -> ExitCode {
    if a.interleave == 0 && a.components.len() > 1 {
        eprintln!("note: interleave 0 concatenates the components");
    }
    let rt = match runtime(a.threads as usize) {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    #[cfg(not(feature = "extras"))]
    if a.plot.is_some() {
        return crate::fail(
            "bench",
            "bad_option",
            "--plot needs the `extras` feature",
            a.json,
        );
    }
    let size = a.size.unwrap_or(if a.quick { 32 << 20 } else { 256 << 20 });
    if size % (1 << 20) != 0 || size < (8 << 20) {
        return crate::fail(
            "bench",
            "bad_option",
            "--size must be whole MiB and at least 8M",
            a.json,
        );
    }
    let temp = TempFiles {
        dir: std::env::temp_dir().join(format!("tagstripe-bench-{}", std::process::id())),
    };
    let code = rt.block_on(async {
        tokio::select! {
            c = stories(a, size, &temp) => c,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: removing the temporary files");
                ExitCode::from(130)
            }
        }
    });
    drop(temp);
    code
}

/// Components, their names, and whether they are open with O_DIRECT.
type Opened = (Vec<Arc<dyn BlockDevice>>, Vec<String>, bool);

/// Makes a file of `size` bytes with every block written (and synced), so reads measure the
/// device rather than the filesystem answering holes with zeros.
fn write_through(p: &std::path::Path, size: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(p)?;
    let block = vec![0x5au8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

/// Opens 4 temporary files of `size` bytes (written through), O_DIRECT if the filesystem
/// allows it.
async fn temp_components(t: &TempFiles, size: u64, want_direct: bool) -> Result<Opened, String> {
    std::fs::create_dir_all(&t.dir).map_err(|e| format!("{}: {e}", t.dir.display()))?;
    let mut comps: Vec<Arc<dyn BlockDevice>> = Vec::new();
    let mut names = Vec::new();
    let mut direct = want_direct;
    for i in 0..4 {
        let p = t.dir.join(format!("c{i}.img"));
        write_through(&p, size).map_err(|e| format!("{}: {e}", p.display()))?;
        let open = |direct| {
            components::open_file(
                &p,
                FileOptions {
                    direct,
                    ..FileOptions::default()
                },
            )
        };
        let d = match open(direct).await {
            Ok(d) => d,
            Err(_) if direct => {
                direct = false;
                open(false).await?
            }
            Err(e) => return Err(e),
        };
        comps.push(d);
        names.push(p.display().to_string());
    }
    Ok((comps, names, direct))
}

async fn stories(a: &RunArgs, size: u64, temp: &TempFiles) -> ExitCode {
    let phase = |p: &str| a.phases.is_empty() || a.phases.iter().any(|x| x == p);
    let (comps, names, direct) = if a.components.is_empty() {
        match temp_components(temp, size, !a.buffered).await {
            Ok(x) => x,
            Err(e) => return crate::fail("bench", "open", &e, a.json),
        }
    } else {
        match components::open_all_for_bench(&a.components, false, a.buffered).await {
            Ok((c, direct)) => (c, a.components.clone(), direct),
            Err(e) => return crate::fail("bench", "open", &e, a.json),
        }
    };
    let vol = match build(comps.clone(), a.interleave, a.flavor, true) {
        Ok(v) => Arc::new(v),
        Err(e) => return crate::fail("bench", "volume", &e, a.json),
    };
    let total = vol.info().sectors;
    let quick = a.quick;
    let text = !a.json;
    if text {
        outln!(
            "tagstripe bench: {} components, interleave {}, {} MiB volume, {}",
            names.len(),
            a.interleave,
            total / 2048,
            if direct { "O_DIRECT" } else { "buffered" }
        );
        for n in &names {
            outln!("  {n}");
        }
    }
    let dev: Arc<dyn BlockDevice> = vol.clone();
    let steps = [("sweep", 13), ("bonnie", 4), ("fairness", 4)]
        .iter()
        .filter(|(p, _)| phase(p))
        .map(|(_, n)| n)
        .sum();
    let progress = Progress::new(steps);
    let watched: Watched = Arc::new(std::sync::Mutex::new(vol.component_stats().to_vec()));
    let ticker = a
        .iostat
        .then(|| iostat(progress.clone(), Arc::clone(&watched)));
    let mut report = json!({
        "components": names,
        "interleave": a.interleave,
        "volume_bytes": total * 512,
        "direct": direct,
    });

    if phase("sweep") {
        // dd-style: one request at a time, sequential, over a region written beforehand.
        let region = total.min(if quick { 16 << 11 } else { 128 << 11 });
        progress.step("sweep: writing the region");
        let _ = load::run(
            Arc::clone(&dev),
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
            let w = load::run(Arc::clone(&dev), seq(Op::Write, bs, 1, region, budget)).await;
            let r = load::run(Arc::clone(&dev), seq(Op::Read, bs, 1, region, budget)).await;
            if text {
                outln!("{:>8} {:>12.1} {:>12.1}", human(bs), w.mb_s(), r.mb_s());
            }
            rows.push(json!({"bs": bs, "write_mb_s": round(w.mb_s(), 2), "read_mb_s": round(r.mb_s(), 2), "write_lat_us_p50": round(w.lat_us(0.5), 1), "read_lat_us_p50": round(r.lat_us(0.5), 1)}));
            bs *= 2;
        }
        #[cfg(feature = "extras")]
        if let Some(path) = &a.plot {
            let series = |key: &str| -> Vec<(u64, f64)> {
                rows.iter()
                    .filter_map(|r| Some((r["bs"].as_u64()?, r[key].as_f64()?)))
                    .collect()
            };
            let title = format!(
                "tagstripe: {} components, interleave {}",
                names.len(),
                a.interleave
            );
            if let Err(e) = crate::plot::sweep_svg(
                path,
                &title,
                &[
                    ("write", series("write_mb_s")),
                    ("read", series("read_mb_s")),
                ],
            ) {
                return crate::fail("bench", "plot", &format!("{}: {e}", path.display()), a.json);
            }
            if text {
                outln!("plot written to {}", path.display());
            }
        }
        report["sweep"] = Value::Array(rows);
    }

    if phase("bonnie") {
        let limit = Duration::from_secs(if quick { 2 } else { 15 });
        progress.step("bonnie: block write");
        let put = load::run(Arc::clone(&dev), seq(Op::Write, 1 << 20, 1, total, limit)).await;
        progress.step("bonnie: rewrite");
        let rewrite = rewrite(&dev, total, limit).await;
        progress.step("bonnie: block read");
        let get = load::run(Arc::clone(&dev), seq(Op::Read, 1 << 20, 1, total, limit)).await;
        progress.step("bonnie: random seeks");
        let seeks = load::run(
            Arc::clone(&dev),
            Load {
                op: Op::RandRead,
                bs: 8192,
                depth: 3,
                time: Duration::from_secs(if quick { 1 } else { 5 }),
                bytes: 0,
                region: (0, total),
                class: IoClass::BestEffort,
                think: Duration::ZERO,
                seed: 7,
            },
        )
        .await;
        if text {
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
                put.mb_s(),
                rewrite.mb_s(),
                get.mb_s(),
                seeks.iops()
            );
        }
        if a.csv {
            // bonnie++ 1.98's CSV: format, version, name, concurrency, seed, file size,
            // chunk size, putc, putc CPU, put_block (KB/s), CPU, rewrite, CPU, getc, CPU,
            // get_block, CPU, seeks (/s), CPU. Columns tagstripe does not measure are empty.
            outln!(
                "1.98,tagstripe-{},{},1,1,{}M,1M,,,{:.0},,{:.0},,,,{:.0},,{:.1},",
                env!("CARGO_PKG_VERSION"),
                "volume",
                total / 2048,
                put.mb_s() * 1e6 / 1024.0,
                rewrite.mb_s() * 1e6 / 1024.0,
                get.mb_s() * 1e6 / 1024.0,
                seeks.iops()
            );
        }
        report["bonnie"] = json!({
            "block_write_mb_s": round(put.mb_s(), 2),
            "rewrite_mb_s": round(rewrite.mb_s(), 2),
            "block_read_mb_s": round(get.mb_s(), 2),
            "random_seeks_per_s": round(seeks.iops(), 1),
        });
    }

    if phase("fairness") {
        let seconds = if quick { 10 } else { 30 };
        progress.step(&format!("fairness: simulating hdd-1998 for {seconds} s"));
        let r = sim::report(Profile::Hdd1998, seconds, 1);
        if text {
            outln!("");
            crate::simreport::fairness_table(&r, Profile::Hdd1998, seconds, 1);
        }
        let secs = Duration::from_millis(if quick { 1500 } else { 5000 });
        let shape = (a.interleave, a.flavor);
        let (live, goals) =
            match live_fairness(&comps, shape, secs, text, &progress, Some(&watched)).await {
                Ok(l) => l,
                Err(e) => return crate::fail("bench", "volume", &e, a.json),
            };
        report["fairness"] = json!({"sim": crate::simreport::fairness_json(&r, Profile::Hdd1998, seconds, 1), "live": live, "goals": goals});
    }
    if let Some(t) = ticker {
        t.abort();
    }
    progress.finish();
    if let Err(e) = dev.flush(IoOpts::new()).await {
        return crate::fail("bench", "flush", &e.to_string(), a.json);
    }
    if text {
        summary(&report);
    }
    if a.json {
        outln!("{report}");
    }
    ExitCode::SUCCESS
}

fn seq(op: Op, bs: u64, depth: usize, region: u64, time: Duration) -> Load {
    Load {
        op,
        bs,
        depth,
        time,
        bytes: region * 512,
        region: (0, region),
        class: IoClass::BestEffort,
        think: Duration::ZERO,
        seed: 1,
    }
}

/// bonnie's rewrite: read a block, change it, write it back, sequentially.
async fn rewrite(dev: &Arc<dyn BlockDevice>, total: u64, limit: Duration) -> Outcome {
    let started = std::time::Instant::now();
    let mut out = Outcome::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at + 2048 <= total && started.elapsed() < limit {
        if dev.read_into(at, &mut buf, IoOpts::new()).await.is_err() {
            out.errors += 1;
        }
        buf[0] = buf[0].wrapping_add(1);
        match dev
            .write(at, bytes::Bytes::copy_from_slice(&buf), IoOpts::new())
            .await
        {
            Ok(()) => {
                out.ops += 1;
                out.bytes += 1 << 20;
            }
            Err(_) => out.errors += 1,
        }
        at += 2048;
    }
    out.elapsed = started.elapsed();
    out
}
/// The live fairness story on a volume over `comps` (interleave, flavor): an interactive
/// 4 KiB reader alone, then with a bulk writer of 16 × 1 MiB, fairness off (no queue) and on,
/// `secs` each. Prints a table if `text`; returns the runs and the goals as JSON.
async fn live_fairness(
    comps: &[Arc<dyn BlockDevice>],
    (interleave, flavor): (u64, Flavor),
    secs: Duration,
    text: bool,
    progress: &Progress,
    watched: Option<&Watched>,
) -> Result<(Value, Value), String> {
    if text {
        outln!(
            "\nlive on this volume: a bulk writer (1 MiB, 16 in flight) and an interactive reader (4 KiB random, one at a time, 1 ms apart), {secs:?}"
        );
        outln!(
            "{:<26} {:>10} {:>10} {:>10} {:>10}",
            "run",
            "p50 ms",
            "p99 ms",
            "max ms",
            "bulk MB/s"
        );
    }
    let mut live = Vec::new();
    // Reader p99 (ms) and bulk MB/s of each run, for the goals.
    let mut figures = Vec::new();
    for (label, queue, with_bulk) in [
        ("reader alone", true, false),
        ("fairness off (no queue)", false, true),
        ("fairness on (tagstripe)", true, true),
    ] {
        progress.step(&format!("fairness: {label}"));
        let v = Arc::new(build(comps.to_vec(), interleave, flavor, queue)?);
        if let Some(Ok(mut w)) = watched.map(|w| w.lock()) {
            *w = v.component_stats().to_vec();
        }
        let total = v.info().sectors;
        let trace = ShapeTrace::start(v.queues());
        let v: Arc<dyn BlockDevice> = v;
        let reader = Load {
            op: Op::RandRead,
            bs: 4096,
            depth: 1,
            time: secs,
            bytes: 0,
            region: (0, total),
            class: IoClass::Interactive,
            think: Duration::from_millis(1),
            seed: 3,
        };
        let bulk = Load {
            op: Op::Write,
            bs: 1 << 20,
            depth: 16,
            time: secs,
            bytes: 0,
            region: (0, total),
            class: IoClass::Bulk,
            think: Duration::ZERO,
            seed: 4,
        };
        let (i, b) = if with_bulk {
            tokio::join!(
                load::run(Arc::clone(&v), reader),
                load::run(Arc::clone(&v), bulk)
            )
        } else {
            (load::run(Arc::clone(&v), reader).await, Outcome::default())
        };
        let shaping = trace.finish().await;
        let ms = |p| round(i.lat_us(p) / 1e3, 2);
        if text {
            let bulk_mb = if with_bulk {
                format!("{:.1}", b.mb_s())
            } else {
                "-".to_owned()
            };
            outln!(
                "{:<26} {:>10.2} {:>10.2} {:>10.2} {:>10}",
                label,
                ms(0.5),
                ms(0.99),
                ms(1.0),
                bulk_mb
            );
        }
        let mut run = json!({
            "run": label,
            "interactive": {"p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": ms(1.0), "reads": i.ops},
            "bulk_mb_s": if with_bulk { round(b.mb_s(), 2) } else { 0.0 },
        });
        if queue && with_bulk {
            if text {
                outln!("{:<26} {}", "  bulk shaping", shaping.line());
            }
            run["bulk_shaping"] = shaping.json();
        }
        live.push(run);
        figures.push((i.lat_us(0.99) / 1e3, b.mb_s()));
    }
    let goals = Goals::of(&figures);
    if text {
        outln!("{}", goals.line());
    }
    Ok((Value::Array(live), goals.json()))
}

/// The live story's goals: with fairness on, the reader's p99 at most 4x the reader alone,
/// and bulk at least 0.75x of fairness off.
struct Goals {
    p99_ratio: f64,
    bulk_ratio: f64,
}

impl Goals {
    const P99_MAX: f64 = 4.0;
    const BULK_MIN: f64 = 0.75;

    /// From (reader p99 ms, bulk MB/s) of the runs: alone, off, on.
    fn of(runs: &[(f64, f64)]) -> Self {
        let (alone, off, on) = match runs {
            [a, b, c] => (*a, *b, *c),
            _ => ((0.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
        };
        Self {
            p99_ratio: on.0 / alone.0.max(1e-6),
            bulk_ratio: on.1 / off.1.max(1e-6),
        }
    }

    fn met(&self) -> bool {
        self.p99_ratio <= Self::P99_MAX && self.bulk_ratio >= Self::BULK_MIN
    }

    fn line(&self) -> String {
        format!(
            "fairness on: reader p99 {:.1}x alone (goal <= {}x), bulk {:.2}x of fairness off (goal >= {}x): {}",
            self.p99_ratio,
            Self::P99_MAX,
            self.bulk_ratio,
            Self::BULK_MIN,
            if self.met() { "met" } else { "NOT met" }
        )
    }

    fn json(&self) -> Value {
        json!({
            "p99_ratio": round(self.p99_ratio, 2),
            "p99_ratio_max": Self::P99_MAX,
            "bulk_ratio": round(self.bulk_ratio, 3),
            "bulk_ratio_min": Self::BULK_MIN,
            "met": self.met(),
        })
    }
}

/// How the queues shaped bulk during a live run: samples of bulk's depth at each
/// component (commands at the device), its piece size and budget, every 2 ms, and the
/// controller's changes (the queues' `Shaped` events).
struct ShapeTrace {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<ShapeSamples>,
}

#[derive(Default)]
struct ShapeSamples {
    depth: Vec<u64>,
    piece_kib: Vec<u64>,
    budget_kib: Vec<u64>,
    target_us: Vec<u64>,
    changes: u64,
}

impl ShapeTrace {
    fn start(queues: &[tagstripe::QueueHandle]) -> Self {
        let queues = queues.to_vec();
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut out = ShapeSamples::default();
            let mut events: Vec<_> = queues.iter().map(|q| q.subscribe()).collect();
            let mut tick = tokio::time::interval(Duration::from_millis(2));
            loop {
                tokio::select! {
                    _ = stopped.notified() => break,
                    _ = tick.tick() => {}
                }
                for (q, rx) in queues.iter().zip(events.iter_mut()) {
                    while let Ok(e) = rx.try_recv() {
                        if matches!(e, tagstripe::scheduler::Event::Shaped(_)) {
                            out.changes += 1;
                        }
                    }
                    out.depth.push(u64::from(q.active(IoClass::Bulk)));
                    if let Some(s) = q.shape() {
                        out.piece_kib.push(s.piece_sectors / 2);
                        out.budget_kib.push(s.budget_sectors / 2);
                        out.target_us.push(s.target_ns / 1000);
                    }
                }
            }
            out
        });
        Self { stop, task }
    }

    async fn finish(self) -> ShapeSamples {
        self.stop.notify_one();
        self.task.await.unwrap_or_default()
    }
}

/// Minimum, median and maximum of samples.
fn spread(v: &mut [u64]) -> (u64, u64, u64) {
    v.sort_unstable();
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(&a), Some(&m), Some(&z)) => (a, m, z),
        _ => (0, 0, 0),
    }
}

impl ShapeSamples {
    fn json(mut self) -> Value {
        let f = |v: &mut Vec<u64>| {
            let (min, median, max) = spread(v);
            json!({"min": min, "median": median, "max": max})
        };
        json!({
            "depth": f(&mut self.depth),
            "piece_kib": f(&mut self.piece_kib),
            "budget_kib": f(&mut self.budget_kib),
            "target_us": f(&mut self.target_us),
            "changes": self.changes,
            "samples": self.depth.len(),
        })
    }

    fn line(&self) -> String {
        let (mut d, mut p, mut b) = (
            self.depth.clone(),
            self.piece_kib.clone(),
            self.budget_kib.clone(),
        );
        let mut t = self.target_us.clone();
        let (d, p, b, t) = (
            spread(&mut d),
            spread(&mut p),
            spread(&mut b),
            spread(&mut t),
        );
        format!(
            "depth {}/{}/{}, piece {}/{}/{} KiB, budget {}/{}/{} KiB, target {}/{}/{} us (min/median/max), {} changes",
            d.0, d.1, d.2, p.0, p.1, p.2, b.0, b.1, b.2, t.0, t.1, t.2, self.changes
        )
    }
}

/// `tagstripe bench fairness` without `--sim`: the live story on a volume over `components`
/// (default: 4 temporary files, removed at the end).
pub(crate) fn fairness_live(
    components: &[String],
    interleave: u64,
    secs: f64,
    json: bool,
    buffered: bool,
) -> ExitCode {
    let rt = match runtime(1) {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let temp = TempFiles {
        dir: std::env::temp_dir().join(format!("tagstripe-fairness-{}", std::process::id())),
    };
    let code = rt.block_on(async {
        let run = async {
            let (comps, _, direct) = if components.is_empty() {
                temp_components(&temp, 256 << 20, !buffered).await?
            } else {
                let (c, direct) =
                    components::open_all_for_bench(components, false, buffered).await?;
                (c, components.to_vec(), direct)
            };
            if !json {
                outln!(
                    "components: {}",
                    if direct { "O_DIRECT" } else { "buffered (page cache)" }
                );
            }
            let progress = Progress::new(3);
            let live = live_fairness(
                &comps,
                (interleave, Flavor::NetBsd),
                Duration::from_secs_f64(secs),
                !json,
                &progress,
                None,
            )
            .await;
            progress.finish();
            live.map(|(l, g)| (l, g, direct))
        };
        tokio::select! {
            r = run => match r {
                Ok((live, goals, direct)) => {
                    if json {
                        outln!("{}", json!({"live": live, "seconds": secs, "interleave": interleave, "direct": direct, "goals": goals}));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => crate::fail("bench fairness", "volume", &e, json),
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: removing the temporary files");
                ExitCode::from(130)
            }
        }
    });
    drop(temp);
    code
}

/// The table at the end: the figures of each phase that ran, in one place.
fn summary(report: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    outln!("\nsummary");
    if let Some(rows) = report["sweep"].as_array() {
        let best = |key: &str| {
            rows.iter()
                .max_by(|x, y| f(&x[key]).total_cmp(&f(&y[key])))
                .map(|r| (f(&r[key]), r["bs"].as_u64().unwrap_or(0)))
                .unwrap_or((0.0, 0))
        };
        let ((w, wbs), (r, rbs)) = (best("write_mb_s"), best("read_mb_s"));
        outln!(
            "  {:<34} write {:.1} MB/s at {}, read {:.1} MB/s at {}",
            "sweep: best sequential",
            w,
            human(wbs),
            r,
            human(rbs)
        );
    }
    let b = &report["bonnie"];
    if b.is_object() {
        outln!(
            "  {:<34} write {:.1} MB/s, rewrite {:.1} MB/s, read {:.1} MB/s, {:.0} seeks/s",
            "bonnie-style",
            f(&b["block_write_mb_s"]),
            f(&b["rewrite_mb_s"]),
            f(&b["block_read_mb_s"]),
            f(&b["random_seeks_per_s"])
        );
    }
    if let Some(runs) = report["fairness"]["sim"]["runs"].as_array() {
        let p99 = |name: &str| {
            runs.iter()
                .find(|r| r["scheduler"] == name)
                .map_or(0.0, |r| f(&r["interactive"]["p99_ms"]))
        };
        outln!(
            "  {:<34} fifo {:.0} ms, cam1998 {:.0} ms, tagstripe {:.0} ms",
            "simulated 1998 disk: reader p99",
            p99("fifo"),
            p99("cam1998"),
            p99("tagstripe")
        );
    }
    if let Some(live) = report["fairness"]["live"].as_array() {
        for r in live.iter().skip(1) {
            outln!(
                "  {:<34} reader p99 {:.2} ms, bulk {:.1} MB/s",
                format!("live: {}", r["run"].as_str().unwrap_or("")),
                f(&r["interactive"]["p99_ms"]),
                f(&r["bulk_mb_s"])
            );
        }
    }
}
