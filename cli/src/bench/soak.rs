//! `tagstripe bench soak`: a mixed load on every volume kind with faults injected at a set
//! rate, every acknowledged byte checked against a model. Prints operations, faults
//! injected, bytes verified and bytes lost (which must be 0).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use serde_json::json;
use tagstripe::nbd::{NbdDevice, NbdServer, ServerConfig};
use tagstripe::quirks::QuirkSet;
use tagstripe::scheduler::{IoClass, Rng};
use tagstripe::striping::Flavor;
use tagstripe::{
    BlockDevice, ByteModel, DynBlockDevice, Error, FaultDevice, FaultKind, IoOpts, MemDevice,
    Volume,
};

/// Arguments of `tagstripe bench soak`.
#[derive(Debug, Args)]
pub(crate) struct SoakArgs {
    /// How long to run, in minutes.
    #[arg(long, default_value_t = 1.0, value_parser = parse_minutes)]
    minutes: f64,
    /// Probability that a request to a component fails (EIO, QUEUE FULL, BUSY or a torn
    /// write, in turn).
    #[arg(long, default_value_t = 0.01, value_parser = parse_rate)]
    fault_rate: f64,
    /// Seed of the operations and faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long, in milliseconds, each component's queue pauses after BUSY (or QUEUE FULL
    /// with nothing else in flight) when nothing completes first. Each worker sends one
    /// request at a time, so every such fault is a whole pause: at CAM's 1000 the striped
    /// volumes spend most of the soak waiting instead of being tested.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    busy_delay_ms: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn parse_minutes(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 10080.0 => Ok(v),
        _ => Err(format!(
            "{s:?}: minutes must be more than 0 and at most 10080"
        )),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=0.5).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: a fault rate is between 0 and 0.5")),
    }
}

/// What one worker saw.
#[derive(Debug, Default, Clone)]
struct Tally {
    ops: u64,
    failed_ops: u64,
    faults: u64,
    verified: u64,
    lost: u64,
    /// Sectors unreadable at the end because their component failed for good (reported
    /// by the read's error, not lost silently).
    unavailable: u64,
    /// Sectors unreadable at the end with an error that names no component (must be 0).
    unnamed: u64,
    degraded: Vec<usize>,
    dropped_connections: u64,
    /// Restarts of a volume with metadata (dropped mid-flight, opened again).
    restarts: u64,
    /// Resyncs started.
    resyncs: u64,
}

type Faulty = Arc<FaultDevice<Arc<dyn DynBlockDevice>>>;

/// One volume under test: its kind's name, the volume, the fault wrappers of its
/// components, and for the NBD mirror the connection to drop.
struct Rig {
    name: &'static str,
    vol: Volume,
    faults: Vec<Faulty>,
    drop_conn: Option<tokio::task::JoinHandle<()>>,
    /// A mirror with metadata: restarted and resynced in the loop.
    restarts: bool,
}

/// A FreeBSD mirror with metadata over `faults`, opened (the first open makes it).
async fn open_mirror(faults: &[Faulty]) -> tagstripe::Result<Volume> {
    let comps: Vec<Arc<dyn DynBlockDevice>> = faults
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn DynBlockDevice>)
        .collect();
    Volume::builder(comps)
        .interleave(16)
        .flavor(Flavor::FreeBsd)
        .mirror(true)
        .metadata(true)
        // Every flush clears what it may: the clearing is exercised all the time.
        .bitmap_delay(Duration::ZERO)
        .quirks(QuirkSet::empty())
        .open()
        .await
}

/// Opens the mirror again after a restart; random faults may fail an open (its metadata
/// reads and writes meet them too), so it is tried again, and at last with faults off.
async fn reopen(faults: &[Faulty]) -> Result<Volume, String> {
    for _ in 0..20 {
        if let Ok(v) = open_mirror(faults).await {
            return Ok(v);
        }
    }
    let rules: Vec<_> = faults.iter().map(|f| f.injected()).collect();
    for f in faults {
        f.clear();
    }
    open_mirror(faults).await.map_err(|e| {
        format!("the mirror did not open again with faults off ({rules:?} faults so far): {e}")
    })
}

fn mem_faulty(n: usize, sectors: u64) -> Vec<Faulty> {
    (0..n)
        .map(|i| {
            let m: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new(&format!("m{i}"), sectors));
            Arc::new(FaultDevice::new(m))
        })
        .collect()
}

fn build(
    faults: &[Faulty],
    interleave: u64,
    flavor: Flavor,
    mirror: bool,
    uniform: bool,
) -> Volume {
    let comps = faults
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn DynBlockDevice>)
        .collect();
    build_over(comps, interleave, flavor, mirror, uniform)
}

fn build_over(
    comps: Vec<Arc<dyn DynBlockDevice>>,
    interleave: u64,
    flavor: Flavor,
    mirror: bool,
    uniform: bool,
) -> Volume {
    Volume::builder(comps)
        .interleave(interleave)
        .flavor(flavor)
        .mirror(mirror)
        .uniform(uniform)
        .quirks(QuirkSet::empty())
        .build()
        .expect("the soak's geometries are valid")
}

/// A mirror over two NBD exports served in this process; one connection can be dropped.
async fn nbd_mirror() -> Result<Rig, String> {
    let faults = mem_faulty(2, 8192);
    let mut clients: Vec<Arc<dyn DynBlockDevice>> = Vec::new();
    let mut handles = Vec::new();
    for f in &faults {
        let server = Arc::new(
            NbdServer::new(ServerConfig::default())
                .export("c", Arc::clone(f) as Arc<dyn DynBlockDevice>),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        // One connection, served on a task that can be aborted: the dropped connection.
        handles.push(tokio::spawn(async move {
            if let Ok((s, _)) = l.accept().await {
                let _ = server.serve_connection(s, IoClass::BestEffort).await;
            }
        }));
        let d = NbdDevice::connect(&format!("nbd://{addr}/c"))
            .await
            .map_err(|e| e.to_string())?;
        clients.push(Arc::new(d));
    }
    // Faults are injected on the server side (the memory devices), so each one reaches
    // the volume as an NBD error reply.
    let vol = build_over(clients, 16, Flavor::FreeBsd, true, false);
    // Side 0 takes the faults and later loses its connection for good; side 1 stays
    // healthy, so the mirror keeps serving, degraded.
    let side0 = faults.into_iter().take(1).collect();
    Ok(Rig {
        name: "nbd-mirror",
        vol,
        faults: side0,
        drop_conn: Some(handles.swap_remove(0)),
        restarts: false,
    })
}

/// Sets the busy delay of every queue of `vol`.
fn pause_after_busy(vol: &Volume, delay: Duration) {
    for q in vol.queues() {
        q.set_busy_delay(delay);
    }
}

async fn work(
    mut rig: Rig,
    until: Instant,
    rate: f64,
    busy: Duration,
    seed: u64,
) -> Result<(String, Tally), String> {
    pause_after_busy(&rig.vol, busy);
    let mut t = Tally::default();
    let mut rng = Rng::new(seed);
    let total = rig.vol.info().sectors;
    let mut model = ByteModel::new(total);
    let kinds = [
        FaultKind::Error,
        FaultKind::QueueFull,
        FaultKind::Busy,
        FaultKind::TornWrite,
    ];
    let mut round = 0usize;
    let started = Instant::now();
    // The operation after a dropped connection is a write, which finds it gone.
    let mut force_write = false;
    while Instant::now() < until {
        // Every 500 operations: the next kind of fault, and now and then a latency spike.
        if t.ops % 500 == 0 {
            let kind = kinds[round % kinds.len()];
            for (i, f) in rig.faults.iter().enumerate() {
                f.random(rate, kind, seed ^ (round as u64 * 31 + i as u64));
                f.set_latency(if round % 5 == 4 {
                    Duration::from_millis(2)
                } else {
                    Duration::ZERO
                });
            }
            round += 1;
        }
        // Halfway through, the NBD mirror loses a connection for good.
        if started.elapsed() > (until - started) / 2 {
            if let Some(h) = rig.drop_conn.take() {
                h.abort();
                t.dropped_connections += 1;
                force_write = true;
            }
        }
        // A mirror with metadata: now and then degraded sides are resynced, and the
        // volume is restarted as a crash would leave it (a resync under way stops where
        // it is; the next open goes on from the bitmap).
        if rig.restarts && t.ops % 150 == 75 && rig.vol.resync().is_ok() {
            t.resyncs += 1;
        }
        if rig.restarts && t.ops % 300 == 299 {
            rig.vol.stop_resync().await;
            let old = std::mem::replace(&mut rig.vol, reopen(&rig.faults).await?);
            drop(old);
            pause_after_busy(&rig.vol, busy);
            t.restarts += 1;
        }
        t.ops += 1;
        let s = rng.below(total);
        let n = (rng.below(256) + 1).min(total - s);
        let pick = if std::mem::take(&mut force_write) {
            0
        } else {
            rng.below(10)
        };
        match pick {
            0..=3 => {
                let seed = rng.next_u64() as u8;
                let bytes: Vec<u8> = (0..n * 512)
                    .map(|i| (i as u8).wrapping_mul(seed | 1) ^ (s as u8))
                    .collect();
                let ok = rig
                    .vol
                    .write(s, Bytes::from(bytes.clone()), IoOpts::new())
                    .await
                    .is_ok();
                t.failed_ops += u64::from(!ok);
                model.write(s, &bytes, ok);
            }
            4..=7 => match rig.vol.read(s, n, IoOpts::new()).await {
                Ok(got) => check(&got, s, &model, &mut t),
                Err(_) => t.failed_ops += 1,
            },
            8 => {
                let ok = rig.vol.discard(s, n, IoOpts::new()).await.is_ok();
                t.failed_ops += u64::from(!ok);
                model.zero(s, n, ok);
            }
            _ => {
                if rig.vol.flush(IoOpts::new()).await.is_err() {
                    t.failed_ops += 1;
                }
            }
        }
    }
    // Faults off: everything acknowledged must read back, except what sits on a component
    // that failed for good, which must say so.
    for f in &rig.faults {
        t.faults += f.injected();
        f.clear();
    }
    if rig.restarts {
        // Healed: one more restart, and every side copied back.
        rig.vol.stop_resync().await;
        drop(std::mem::replace(&mut rig.vol, reopen(&rig.faults).await?));
        pause_after_busy(&rig.vol, busy);
        rig.vol.wait_resync().await;
        if rig.vol.resync().is_ok() {
            t.resyncs += 1;
            rig.vol.wait_resync().await;
        }
        t.restarts += 1;
    }
    for s in (0..total).step_by(256) {
        let n = 256.min(total - s);
        match rig.vol.read(s, n, IoOpts::new()).await {
            Ok(got) => check(&got, s, &model, &mut t),
            // Unreadable only because a component failed for good, and the error says which.
            Err(Error::Component { .. }) => t.unavailable += n,
            Err(_) => t.unnamed += n,
        }
    }
    t.degraded = rig.vol.degraded();
    Ok((rig.name.to_owned(), t))
}

fn check(got: &[u8], s: u64, model: &ByteModel, t: &mut Tally) {
    let c = model.check(s, got);
    t.verified += c.verified;
    t.lost += c.lost();
}

pub(crate) fn run(a: &SoakArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return crate::fail("bench soak", "runtime", &e.to_string(), a.json),
    };
    rt.block_on(async {
        let until = Instant::now() + Duration::from_secs_f64(a.minutes * 60.0);
        let busy = Duration::from_millis(a.busy_delay_ms);
        let mut rigs = Vec::new();
        let f = mem_faulty(3, 4096);
        rigs.push(Rig { name: "concat", vol: build(&f, 0, Flavor::NetBsd, false, false), faults: f, drop_conn: None, restarts: false });
        let f = mem_faulty(3, 4096);
        rigs.push(Rig { name: "stripes", vol: build(&f, 16, Flavor::NetBsd, false, false), faults: f, drop_conn: None, restarts: false });
        let f: Vec<Faulty> = [3000u64, 4096, 3500]
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let m: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new(&format!("u{i}"), s));
                Arc::new(FaultDevice::new(m))
            })
            .collect();
        rigs.push(Rig { name: "uniform", vol: build(&f, 32, Flavor::NetBsd, false, true), faults: f, drop_conn: None, restarts: false });
        let f = mem_faulty(2, 8192);
        let vol = match open_mirror(&f).await {
            Ok(v) => v,
            Err(e) => return crate::fail("bench soak", "mirror", &e.to_string(), a.json),
        };
        // The mirror keeps metadata: restarted and resynced in the loop.
        rigs.push(Rig { name: "mirror", vol, faults: f, drop_conn: None, restarts: true });
        match nbd_mirror().await {
            Ok(r) => rigs.push(r),
            Err(e) => return crate::fail("bench soak", "nbd", &e, a.json),
        }
        let tasks: Vec<_> = rigs
            .into_iter()
            .enumerate()
            .map(|(i, r)| tokio::spawn(work(r, until, a.fault_rate, busy, a.seed.wrapping_add(i as u64))))
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            match t.await {
                Ok(Ok(r)) => results.push(r),
                Ok(Err(e)) => return crate::fail("bench soak", "restart", &e, a.json),
                Err(e) => return crate::fail("bench soak", "worker", &e.to_string(), a.json),
            }
        }
        let sum = |f: fn(&Tally) -> u64| results.iter().map(|(_, t)| f(t)).sum::<u64>();
        let (ops, faults, verified, lost) = (sum(|t| t.ops), sum(|t| t.faults), sum(|t| t.verified), sum(|t| t.lost));
        if a.json {
            let per: Vec<_> = results
                .iter()
                .map(|(n, t)| json!({"volume": n, "ops": t.ops, "failed_ops": t.failed_ops, "faults": t.faults, "bytes_verified": t.verified, "bytes_lost": t.lost, "sectors_unavailable": t.unavailable, "sectors_unnamed_errors": t.unnamed, "degraded": t.degraded, "dropped_connections": t.dropped_connections, "restarts": t.restarts, "resyncs": t.resyncs}))
                .collect();
            outln!("{}", json!({"minutes": a.minutes, "fault_rate": a.fault_rate, "seed": a.seed, "busy_delay_ms": a.busy_delay_ms, "ops": ops, "faults": faults, "bytes_verified": verified, "bytes_lost": lost, "volumes": per}));
        } else {
            outln!("soak: {:.2} min, fault rate {}, seed {}, {} ms pause after BUSY", a.minutes, a.fault_rate, a.seed, a.busy_delay_ms);
            outln!("{:<12} {:>10} {:>10} {:>8} {:>16} {:>10} {:>12} {:>9} {:>9}", "volume", "ops", "failed", "faults", "bytes verified", "bytes lost", "unavailable", "degraded", "restarts");
            for (n, t) in &results {
                let restarts = if t.restarts > 0 { format!("{} ({} resyncs)", t.restarts, t.resyncs) } else { "-".to_owned() };
                outln!("{:<12} {:>10} {:>10} {:>8} {:>16} {:>10} {:>12} {:>9} {:>9}", n, t.ops, t.failed_ops, t.faults, t.verified, t.lost, t.unavailable, format!("{:?}", t.degraded), restarts);
            }
            outln!("total: {ops} operations, {faults} faults injected, {verified} bytes verified, {lost} bytes lost");
        }
        let unnamed = sum(|t| t.unnamed);
        if unnamed > 0 {
            eprintln!("tagstripe bench soak: {unnamed} sectors failed with an error naming no component");
        }
        if lost == 0 && unnamed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
    })
}
