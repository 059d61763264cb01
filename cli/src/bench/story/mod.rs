//! `tagstripe bench` with no subcommand: the seed stories on a real volume, one module a
//! phase (a dd-style [`sweep`], a [`bonnie`]-style summary, the [`fairness`] story), their
//! typed results rendered in one place ([`report`]); and `bench throughput`.

mod bonnie;
mod fairness;
mod report;
mod sweep;
mod tenants;
mod throughput;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::layout::LayoutArgs;
use clap::Args;
use tagstripe::quirks::QuirkSet;
use tagstripe::scheduler::{IoClass, Profile, sim};
use tagstripe::{BlockDevice, DynBlockDevice, FileOptions, IoOpts, Stats, StatsSnapshot, Volume};

use crate::bench::load::{Load, Op, parse_size};
use crate::components;

pub(crate) use fairness::fairness_live;
pub(crate) use tenants::{TenantsArgs, tenants};
pub(crate) use throughput::{ThroughputArgs, throughput};

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
    #[command(flatten)]
    layout: LayoutArgs,
    /// An md array of this level over the components instead of a ccd stripe (raid5,
    /// raid6, raid10), for the sweep and the bonnie-style summary; the fairness story
    /// measures the tagged queue on the ccd stripe either way.
    #[arg(long, value_enum, conflicts_with_all = ["mirror", "uniform"])]
    level: Option<crate::map_md::Level>,
    /// With --level: md's layout as mdadm names it (default left-symmetric; raid10 n2).
    #[arg(long = "layout", requires = "level")]
    md_layout: Option<String>,
    /// With --level: chunk in sectors.
    #[arg(long, requires = "level", default_value_t = 1024)]
    chunk: u64,
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
    comps: Vec<Arc<dyn DynBlockDevice>>,
    interleave: u64,
    layout: &LayoutArgs,
    queue: bool,
) -> Result<Volume, String> {
    layout
        .volume(Volume::builder(comps).name("bench").interleave(interleave))
        .quirks(QuirkSet::builtin())
        .queue(queue)
        .build()
        .map_err(|e| e.to_string())
}

/// `value` as one line of JSON.
fn to_json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
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
type Opened = (Vec<Arc<dyn DynBlockDevice>>, Vec<String>, bool);

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
    let mut comps: Vec<Arc<dyn DynBlockDevice>> = Vec::new();
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
    let vol = match build(comps.clone(), a.interleave, &a.layout, true) {
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
    let dev: Arc<dyn DynBlockDevice> = match a.level {
        Some(level) => match crate::map_md::build_raid(
            "bench",
            level,
            a.md_layout.as_deref(),
            a.chunk,
            a.layout.reserved.unwrap_or(0),
            comps.clone(),
            tagstripe::scheduler::FairConfig::default(),
        ) {
            Ok(r) => {
                if text {
                    outln!(
                        "  as md {level:?} ({}), chunk {} sectors, {} MiB: sweep and bonnie run on it",
                        a.md_layout.as_deref().unwrap_or("default layout"),
                        a.chunk,
                        r.info().sectors / 2048
                    );
                }
                Arc::new(r)
            }
            Err(e) => return crate::fail("bench", "md", &e, a.json),
        },
        None => vol.clone(),
    };
    let total = dev.info().sectors;
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
    let mut report = report::Report {
        components: names.clone(),
        interleave: a.interleave,
        volume_bytes: total * 512,
        direct,
        sweep: None,
        bonnie: None,
        fairness: None,
    };

    if phase("sweep") {
        let rows = sweep::sweep(&dev, total, quick, text, &progress).await;
        #[cfg(feature = "extras")]
        if let Some(path) = &a.plot {
            let title = format!(
                "tagstripe: {} components, interleave {}",
                names.len(),
                a.interleave
            );
            if let Err(e) = report::sweep_svg(path, &title, &rows) {
                return crate::fail("bench", "plot", &e, a.json);
            }
            if text {
                outln!("plot written to {}", path.display());
            }
        }
        report.sweep = Some(rows);
    }

    if phase("bonnie") {
        let b = bonnie::bonnie(&dev, total, quick, &progress).await;
        if text {
            report::bonnie_table(&b);
        }
        if a.csv {
            report::bonnie_csv(&b, total / 2048);
        }
        report.bonnie = Some(b);
    }

    if phase("fairness") {
        let seconds = if quick { 60 } else { 600 };
        progress.step(&format!("fairness: simulating hdd-1998 for {seconds} s"));
        let r = sim::report(Profile::Hdd1998, seconds, 1);
        if text {
            outln!("");
            crate::bench::simreport::fairness_table(&r, Profile::Hdd1998, seconds, 1);
        }
        let secs = Duration::from_millis(if quick { 1500 } else { 5000 });
        let shape = (a.interleave, &a.layout);
        let (live, goals) =
            match fairness::live_fairness(&comps, shape, secs, text, &progress, Some(&watched))
                .await
            {
                Ok(l) => l,
                Err(e) => return crate::fail("bench", "volume", &e, a.json),
            };
        report.fairness = Some(report::Fairness {
            sim: crate::bench::simreport::fairness_json(&r, Profile::Hdd1998, seconds, 1),
            live,
            goals,
            report: Some(r),
        });
    }
    if let Some(t) = ticker {
        t.abort();
    }
    progress.finish();
    if let Err(e) = dev.flush(IoOpts::new()).await {
        return crate::fail("bench", "flush", &e.to_string(), a.json);
    }
    if text {
        report::summary(&report);
    }
    if a.json {
        outln!("{}", to_json(&report));
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
