//! `bench tenants`: three tenants share a striped volume, as a storage server's do. A VM with
//! a reservation and interactive 4 KiB reads, a database at weight 3, a backup at weight 1
//! with a limit; each one's figures alone first (no tenants), then as tenants alone, the
//! database beside the backup, and all three at once; each tenant's owed against what it
//! got, and the goals met or not.
//!
//! Live on the default temporary files or `--component`s; with `--sim` on four disk models
//! on tokio's paused clock (virtual seconds; the same seed gives the same figures).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tagstripe::scheduler::{IoClass, Profile, Rng, weight_cost};
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, TenantSpec, Tenants};
use tokio::time::Instant;

use super::{Progress, TempFiles, build, round, temp_components};
use crate::bench::load::{self, Outcome};
use crate::components;
use crate::layout::LayoutArgs;

/// Arguments of `tagstripe bench tenants`.
#[derive(Debug, Args)]
pub(crate) struct TenantsArgs {
    /// Run on four disk models (sim:PROFILE:256M) on a virtual clock: deterministic (the
    /// same seed, the same figures), minutes of disk time in seconds.
    #[arg(long)]
    sim: bool,
    /// With --sim: the disk model, hdd-1998, hdd-modern or ssd.
    #[arg(long, default_value = "hdd-modern", value_parser = crate::bench::parse_profile)]
    profile: Profile,
    /// A component (file, block device, nbd://, sim:PROFILE:SIZE); repeat for more.
    /// Default: 4 temporary files of 256 MiB, removed at the end.
    #[arg(long = "component", conflicts_with = "sim")]
    components: Vec<String>,
    /// Interleave in sectors.
    #[arg(long, default_value_t = 128)]
    interleave: u64,
    /// Seconds of each of the story's seven runs (virtual seconds with --sim).
    #[arg(long, default_value_t = 3.0, value_parser = super::parse_seconds)]
    seconds: f64,
    /// The VM's reservation in IOPS (default: half of what it reads alone).
    #[arg(long, value_parser = positive)]
    vm_reserve_iops: Option<f64>,
    /// The backup's limit in MB/s, 10^6 bytes (default: half of what it writes alone).
    #[arg(long, value_parser = positive)]
    backup_limit_mbs: Option<f64>,
    /// Seed of the loads' random offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Open files and block devices through the page cache (default: O_DIRECT).
    #[arg(long)]
    buffered: bool,
}

fn positive(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("{s:?}: expected a number above 0"))
}

/// One tenant's load: its requests' size, kind, how many in flight and its class.
#[derive(Clone, Copy, Debug)]
struct Work {
    name: &'static str,
    write: bool,
    random: bool,
    bs: u64,
    depth: usize,
    /// Time between one request's end and the same worker's next.
    think: Duration,
    class: IoClass,
}

impl Work {
    fn describe(&self) -> String {
        let think = if self.think.is_zero() {
            String::new()
        } else {
            format!(", {} ms apart", self.think.as_millis())
        };
        format!(
            "{}: {} {} {}, {} in flight{think}",
            self.class.name(),
            load::human(self.bs),
            if self.random { "random" } else { "sequential" },
            if self.write { "writes" } else { "reads" },
            self.depth,
        )
    }
}

const VM: Work = Work {
    name: "vm",
    write: false,
    random: true,
    bs: 4096,
    depth: 1,
    think: Duration::from_millis(1),
    class: IoClass::Interactive,
};
const DB: Work = Work {
    name: "db",
    write: false,
    random: true,
    bs: 16 << 10,
    depth: 32,
    think: Duration::ZERO,
    class: IoClass::BestEffort,
};
const BACKUP: Work = Work {
    name: "backup",
    write: true,
    random: false,
    bs: 1 << 20,
    depth: 16,
    think: Duration::ZERO,
    class: IoClass::Bulk,
};
const WORKS: [Work; 3] = [VM, DB, BACKUP];
const DB_WEIGHT: u32 = 3;
const BACKUP_WEIGHT: u32 = 1;
const VM_WEIGHT: u32 = 1;

/// Runs `w` on `dev` for `secs` (tokio's clock: virtual when paused). Only requests done
/// within the `secs` count, and rates are over `secs`: the requests still queued at the end
/// drain with the others stopped, and would count a tenant's time alone as shared.
///
/// Readers read the volume's first half, writers write its second: a disk's write cache
/// holding the backup's writes would otherwise serve the database's reads.
async fn drive(dev: Arc<dyn DynBlockDevice>, w: Work, secs: Duration, seed: u64) -> Outcome {
    let sectors = w.bs / 512;
    let half = dev.info().sectors / 2;
    let base = if w.write { half } else { 0 };
    let slots = (half / sectors).max(1);
    let next = Arc::new(AtomicU64::new(0));
    let data = tagstripe::aligned_bytes(&vec![0x5a; w.bs as usize]);
    let deadline = Instant::now() + secs;
    let mut tasks = Vec::with_capacity(w.depth);
    for k in 0..w.depth {
        let (dev, next, data) = (Arc::clone(&dev), Arc::clone(&next), data.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed ^ ((k as u64 + 1) << 32));
            let mut out = Outcome::default();
            let mut buf = vec![0u8; w.bs as usize];
            let opts = IoOpts::new().class(w.class);
            while Instant::now() < deadline {
                let slot = if w.random {
                    rng.below(slots)
                } else {
                    next.fetch_add(1, Relaxed) % slots
                };
                let t = Instant::now();
                let ok = if w.write {
                    dev.write(base + slot * sectors, data.clone(), opts)
                        .await
                        .is_ok()
                } else {
                    dev.read_into(base + slot * sectors, &mut buf, opts)
                        .await
                        .is_ok()
                };
                if Instant::now() > deadline {
                    break;
                }
                out.lat.push(t.elapsed().as_nanos() as u64);
                if ok {
                    out.ops += 1;
                    out.bytes += w.bs;
                } else {
                    out.errors += 1;
                }
                if !w.think.is_zero() {
                    tokio::time::sleep(w.think).await;
                }
            }
            out
        }));
    }
    let mut total = load::gather(tasks).await;
    total.elapsed = secs;
    total
}

/// One tenant's figures in one run.
#[derive(Clone, Debug, Serialize)]
struct Row {
    tenant: &'static str,
    iops: f64,
    mb_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Proportional-share cost served a second (one per I/O plus one per 64 KiB): what
    /// the weights divide.
    cost_per_s: f64,
    /// Requests served to meet its reservation.
    reserved: u64,
    /// Seconds it had work held back by its limit.
    held_s: f64,
    errors: u64,
}

/// One run of the story: who ran, and what each got.
#[derive(Clone, Debug, Serialize)]
struct Run {
    run: &'static str,
    tenants: Vec<Row>,
}

/// A goal: what was owed, what was got.
#[derive(Clone, Debug, Serialize)]
struct Goal {
    goal: String,
    owed: String,
    got: String,
    met: bool,
}

/// What `bench tenants --json` prints.
#[derive(Debug, Serialize)]
struct Report {
    mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<&'static str>,
    components: usize,
    direct: bool,
    seconds: f64,
    seed: u64,
    tenants: Vec<SpecRow>,
    runs: Vec<Run>,
    goals: Vec<Goal>,
    met: bool,
    /// Requests the tenants' scheduler let through to the volume at the end (adaptive).
    depth: usize,
}

/// A tenant's spec and load as the report states them.
#[derive(Clone, Debug, Serialize)]
struct SpecRow {
    tenant: &'static str,
    weight: u32,
    reserve_iops: f64,
    limit_mbs: f64,
    workload: String,
}

fn row(
    w: &Work,
    o: &Outcome,
    before: Option<&tagstripe::TenantStats>,
    after: Option<&tagstripe::TenantStats>,
) -> Row {
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    let (reserved, held) = match (before, after) {
        (Some(b), Some(a)) => (
            a.served.reserved - b.served.reserved,
            (a.served.throttled - b.served.throttled) as f64 / 1e9,
        ),
        _ => (0, 0.0),
    };
    Row {
        tenant: w.name,
        iops: round(o.iops(), 1),
        mb_s: round(o.mb_s(), 2),
        p50_ms: round(o.lat_us(0.5) / 1e3, 3),
        p99_ms: round(o.lat_us(0.99) / 1e3, 3),
        cost_per_s: round(o.ops as f64 * weight_cost(w.bs) / secs, 1),
        reserved,
        held_s: round(held, 3),
        errors: o.errors,
    }
}

/// Runs `works` at once, each on its device, for `secs`; a row each. A run that wrote ends
/// with a flush (not timed), so the next does not inherit its write-back.
async fn run_together(
    label: &'static str,
    runs: &[(Work, Arc<dyn DynBlockDevice>)],
    tenants: Option<&Tenants<Arc<dyn DynBlockDevice>>>,
    secs: Duration,
    seed: u64,
) -> Result<Run, String> {
    let before = tenants.map(Tenants::stats).unwrap_or_default();
    let mut handles = Vec::new();
    for (i, (w, dev)) in runs.iter().enumerate() {
        handles.push(tokio::spawn(drive(
            Arc::clone(dev),
            *w,
            secs,
            seed ^ ((i as u64 + 1) << 48),
        )));
    }
    let mut outs = Vec::new();
    for h in handles {
        outs.push(h.await.unwrap_or_default());
    }
    let after = tenants.map(Tenants::stats).unwrap_or_default();
    for (w, dev) in runs {
        if w.write {
            dev.flush(IoOpts::new())
                .await
                .map_err(|e| format!("flush after {label}: {e}"))?;
        }
    }
    let find = |v: &[tagstripe::TenantStats], n: &str| v.iter().find(|s| s.name == n).cloned();
    let rows = runs
        .iter()
        .zip(&outs)
        .map(|((w, _), o)| {
            row(
                w,
                o,
                find(&before, w.name).as_ref(),
                find(&after, w.name).as_ref(),
            )
        })
        .collect();
    Ok(Run {
        run: label,
        tenants: rows,
    })
}

/// The story's figures, before they are judged.
struct Story {
    runs: Vec<Run>,
    specs: Vec<SpecRow>,
    reserve_iops: f64,
    limit_mbs: f64,
    secs: f64,
    depth: usize,
}

/// The story on `volume`: each load alone (no tenants), then as tenants.
async fn story(
    volume: Arc<dyn DynBlockDevice>,
    args: &TenantsArgs,
    progress: &Progress,
) -> Result<Story, String> {
    let secs = Duration::from_secs_f64(args.seconds);
    let mut runs = Vec::new();
    for (i, w) in WORKS.iter().enumerate() {
        progress.step(&format!("tenants: {} alone, no tenants", w.name));
        runs.push(
            run_together(
                match i {
                    0 => "vm alone, no tenants",
                    1 => "db alone, no tenants",
                    _ => "backup alone, no tenants",
                },
                &[(*w, Arc::clone(&volume))],
                None,
                secs,
                args.seed,
            )
            .await?,
        );
    }
    let alone = |i: usize| &runs[i].tenants[0];
    let reserve_iops = args
        .vm_reserve_iops
        .unwrap_or_else(|| (alone(0).iops / 2.0).round().max(1.0));
    let limit_mbs = args
        .backup_limit_mbs
        .unwrap_or_else(|| round(alone(2).mb_s / 2.0, 1).max(0.1));
    let shared = Tenants::new(Arc::clone(&volume));
    let spec = |w: &Work| match w.name {
        "vm" => TenantSpec::new()
            .weight(VM_WEIGHT)
            .reserve_iops(reserve_iops),
        "db" => TenantSpec::new().weight(DB_WEIGHT),
        _ => TenantSpec::new()
            .weight(BACKUP_WEIGHT)
            .limit_bps(limit_mbs * 1e6),
    };
    let mut handles: Vec<(Work, Arc<dyn DynBlockDevice>)> = Vec::new();
    let mut specs = Vec::new();
    for w in WORKS {
        let s = spec(&w);
        s.check().map_err(|e| format!("tenant {}: {e}", w.name))?;
        let h = shared.add(w.name, s).map_err(|e| e.to_string())?;
        handles.push((w, Arc::new(h)));
        specs.push(SpecRow {
            tenant: w.name,
            weight: s.weight,
            reserve_iops: s.reserve_iops,
            limit_mbs: s.limit_bps / 1e6,
            workload: w.describe(),
        });
    }
    let pick = |names: &[&str]| -> Vec<(Work, Arc<dyn DynBlockDevice>)> {
        handles
            .iter()
            .filter(|(w, _)| names.contains(&w.name))
            .cloned()
            .collect()
    };
    let acts: [(&'static str, &[&str]); 4] = [
        ("db alone, a tenant", &["db"]),
        ("backup alone, a tenant", &["backup"]),
        ("db and backup", &["db", "backup"]),
        ("vm, db and backup", &["vm", "db", "backup"]),
    ];
    for (label, names) in acts {
        progress.step(&format!("tenants: {label}"));
        runs.push(run_together(label, &pick(names), Some(&shared), secs, args.seed).await?);
    }
    Ok(Story {
        runs,
        specs,
        reserve_iops,
        limit_mbs,
        secs: args.seconds,
        depth: shared.depth(),
    })
}

/// The goals, judged from the story's runs (the bounds: weights 2.7-3.3x, a limit
/// within 5%, a reservation at least 95% met, a tenant alone at least 0.9x of no tenants,
/// the VM's p99 at most 4x its own alone).
fn goals(s: &Story) -> Vec<Goal> {
    let get = |run: &str, t: &str| {
        s.runs
            .iter()
            .find(|r| r.run == run)
            .and_then(|r| r.tenants.iter().find(|x| x.tenant == t))
            .cloned()
    };
    let mut g = Vec::new();
    let (Some(db0), Some(vm0)) = (
        get("db alone, no tenants", "db"),
        get("vm alone, no tenants", "vm"),
    ) else {
        return g;
    };
    if let Some(db1) = get("db alone, a tenant", "db") {
        let x = db1.iops / db0.iops.max(1e-9);
        g.push(Goal {
            goal: "db alone as a tenant, against no tenants (work-conserving)".into(),
            owed: ">= 0.90x".into(),
            got: format!("{x:.2}x ({:.0} against {:.0} IOPS)", db1.iops, db0.iops),
            met: x >= 0.9,
        });
    }
    let lim = s.limit_mbs;
    if let Some(bk1) = get("backup alone, a tenant", "backup") {
        g.push(Goal {
            goal: "backup alone at its limit".into(),
            owed: format!("{:.1}-{:.1} MB/s", lim * 0.95, lim * 1.05),
            got: format!("{:.1} MB/s", bk1.mb_s),
            met: (lim * 0.95..=lim * 1.05).contains(&bk1.mb_s),
        });
    }
    for run in ["db and backup", "vm, db and backup"] {
        let (Some(db), Some(bk)) = (get(run, "db"), get(run, "backup")) else {
            continue;
        };
        let ratio = db.cost_per_s / bk.cost_per_s.max(1e-9);
        // The backup held back by its limit for a tenth of the run or more: then its
        // limit, not its weight, bounds it, and the database is owed at least 3x.
        let held = bk.held_s >= 0.1 * s.secs;
        let want = f64::from(DB_WEIGHT) / f64::from(BACKUP_WEIGHT);
        g.push(Goal {
            goal: format!("{run}: db against backup by weight (cost a second)"),
            owed: if held {
                format!(">= {:.1}x (backup at its limit)", want * 0.9)
            } else {
                format!("{:.1}-{:.1}x", want * 0.9, want * 1.1)
            },
            got: format!(
                "{ratio:.2}x ({:.0} against {:.0})",
                db.cost_per_s, bk.cost_per_s
            ),
            met: ratio >= want * 0.9 && (held || ratio <= want * 1.1),
        });
        g.push(Goal {
            goal: format!("{run}: backup within its limit"),
            owed: format!("<= {:.1} MB/s", lim * 1.05),
            got: format!("{:.1} MB/s", bk.mb_s),
            met: bk.mb_s <= lim * 1.05,
        });
    }
    if let Some(vm) = get("vm, db and backup", "vm") {
        g.push(Goal {
            goal: "vm's reservation beside db and backup".into(),
            owed: format!(">= {:.0} IOPS", s.reserve_iops * 0.95),
            got: format!("{:.0} IOPS", vm.iops),
            met: vm.iops >= s.reserve_iops * 0.95,
        });
        let x = vm.p99_ms / vm0.p99_ms.max(1e-9);
        g.push(Goal {
            goal: "vm's p99 read latency beside db and backup, against alone".into(),
            owed: "<= 4.0x".into(),
            got: format!("{x:.2}x ({:.2} against {:.2} ms)", vm.p99_ms, vm0.p99_ms),
            met: x <= 4.0,
        });
    }
    g
}

fn table(s: &Story, goals: &[Goal], what: &str) {
    outln!(
        "tenants on a striped volume over {what}, {} s a run",
        s.secs
    );
    for sp in &s.specs {
        let mut spec = format!("weight {}", sp.weight);
        if sp.reserve_iops > 0.0 {
            spec.push_str(&format!(", reserve {:.0} IOPS", sp.reserve_iops));
        }
        if sp.limit_mbs > 0.0 {
            spec.push_str(&format!(", limit {:.1} MB/s", sp.limit_mbs));
        }
        outln!("  {:<7} {spec}; {}", sp.tenant, sp.workload);
    }
    outln!(
        "\n{:<26} {:<7} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>7}",
        "run",
        "tenant",
        "IOPS",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "cost/s",
        "reserved",
        "held s"
    );
    for r in &s.runs {
        for (i, t) in r.tenants.iter().enumerate() {
            outln!(
                "{:<26} {:<7} {:>9.0} {:>9.1} {:>8.2} {:>8.2} {:>9.0} {:>9} {:>7.2}",
                if i == 0 { r.run } else { "" },
                t.tenant,
                t.iops,
                t.mb_s,
                t.p50_ms,
                t.p99_ms,
                t.cost_per_s,
                t.reserved,
                t.held_s
            );
        }
    }
    outln!("\nowed against got");
    for g in goals {
        outln!(
            "  [{}] {}: owed {}, got {}",
            if g.met { "met" } else { "MISSED" },
            g.goal,
            g.owed,
            g.got
        );
    }
    outln!(
        "the tenants' scheduler let {} requests through to the volume at the end (adaptive)",
        s.depth
    );
}

/// `tagstripe bench tenants`.
pub(crate) fn tenants(args: &TenantsArgs) -> ExitCode {
    let rt = if args.sim {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => return crate::fail("bench tenants", "runtime", &e.to_string(), args.json),
    };
    let temp = TempFiles {
        dir: std::env::temp_dir().join(format!("tagstripe-tenants-{}", std::process::id())),
    };
    let code = rt.block_on(async {
        let run = async {
            let (comps, direct, what) = if args.sim {
                let specs: Vec<String> = (0..4)
                    .map(|_| format!("sim:{}:256M", args.profile.name()))
                    .collect();
                let (c, _) = components::open_all_for_bench(&specs, false, true).await?;
                (c, false, format!("4 disk models ({})", args.profile.name()))
            } else if args.components.is_empty() {
                let (c, _, direct) = temp_components(&temp, 256 << 20, !args.buffered).await?;
                let what = format!(
                    "4 temporary files ({})",
                    if direct { "O_DIRECT" } else { "page cache" }
                );
                (c, direct, what)
            } else {
                let (c, direct) =
                    components::open_all_for_bench(&args.components, false, args.buffered).await?;
                let what = format!("{} components", c.len());
                (c, direct, what)
            };
            let n = comps.len();
            let volume: Arc<dyn DynBlockDevice> =
                Arc::new(build(comps, args.interleave, &LayoutArgs::default(), true)?);
            let progress = Progress::new(7);
            let s = story(volume, args, &progress).await;
            progress.finish();
            s.map(|s| (s, n, direct, what))
        };
        tokio::select! {
            r = run => match r {
                Ok((s, n, direct, what)) => {
                    let goals = goals(&s);
                    if args.json {
                        let met = goals.iter().all(|g| g.met);
                        let r = Report {
                            mode: if args.sim { "sim" } else { "live" },
                            profile: args.sim.then(|| args.profile.name()),
                            components: n,
                            direct,
                            seconds: s.secs,
                            seed: args.seed,
                            tenants: s.specs,
                            runs: s.runs,
                            goals,
                            met,
                            depth: s.depth,
                        };
                        outln!("{}", super::to_json(&r));
                    } else {
                        table(&s, &goals, &what);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => crate::fail("bench tenants", "volume", &e, args.json),
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
