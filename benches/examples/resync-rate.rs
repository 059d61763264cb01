//! The resync rate of a mirror side: a new 1 GiB mirror over two files (written through
//! first, opened with O_DIRECT) copies its second side from the first, once with no other
//! load and once beside a client doing 4 KiB random reads and writes at depth 4 in the
//! best-effort class. Prints the copy rate, and the client's IOPS and p99 latency (and the
//! same client's for two seconds on the mirror in sync, for comparison).
//!
//! `cargo run --release -p tagstripe-benches --example resync-rate [DIR] [MIB]` (default: the
//! temporary directory, 1024 MiB).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tagstripe::quirks::QuirkSet;
use tagstripe::striping::Flavor;
use tagstripe::{
    BlockDevice, DynBlockDevice, FileDevice, FileOptions, IoOpts, MirrorEvent, Volume,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().map_or_else(std::env::temp_dir, Into::into);
    let mib: u64 = args.next().map_or(Ok(1024), |s| s.parse())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let paths: Vec<_> = (0..2)
        .map(|i| dir.join(format!("tagstripe-resync-{}-{i}.img", std::process::id())))
        .collect();
    // Written through (no holes: a sparse file answers reads from nowhere).
    let chunk = vec![0x5au8; 1 << 20];
    for p in &paths {
        let mut f = std::fs::File::create(p)?;
        for _ in 0..mib {
            std::io::Write::write_all(&mut f, &chunk)?;
        }
        f.sync_all()?;
    }
    let (secs, _, ops, p99) = rt.block_on(run(&paths, true, true))?;
    println!(
        "the same client alone on the mirror in sync, {secs:.2} s: {:.0} IOPS, p99 {:.2} ms",
        ops as f64 / secs,
        p99 * 1e3
    );
    for load in [false, true] {
        let (secs, copied, ops, p99) = rt.block_on(run(&paths, load, false))?;
        let rate = copied as f64 * 512.0 / 1048576.0 / secs;
        if load {
            println!(
                "resync of {mib} MiB beside 4 KiB random r/w at QD4: {secs:.2} s, {rate:.0} MiB/s; client {:.0} IOPS, p99 {:.2} ms",
                ops as f64 / secs,
                p99 * 1e3
            );
        } else {
            println!("resync of {mib} MiB, no other load: {secs:.2} s, {rate:.0} MiB/s");
        }
    }
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// One resync; returns seconds, sectors copied, client operations and their p99 (seconds).
async fn run(
    paths: &[std::path::PathBuf],
    load: bool,
    clean: bool,
) -> Result<(f64, u64, u64, f64), Box<dyn std::error::Error>> {
    // Blank metadata areas: a new mirror, copied whole.
    for p in paths {
        let f = std::fs::OpenOptions::new().write(true).open(p)?;
        let len = f.metadata()?.len();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 8192], len - 8192)?;
        f.sync_all()?;
    }
    let opts = FileOptions {
        direct: true,
        ..FileOptions::default()
    };
    let comps: Vec<Arc<dyn DynBlockDevice>> = paths
        .iter()
        .map(|p| FileDevice::open(p, opts).map(|d| Arc::new(d) as Arc<dyn DynBlockDevice>))
        .collect::<Result<_, _>>()?;
    let copied = Arc::new(std::sync::Mutex::new(0u64));
    let c2 = copied.clone();
    let started = Instant::now();
    let vol = Arc::new(
        Volume::builder(comps)
            .flavor(Flavor::FreeBsd)
            .mirror(true)
            .quirks(QuirkSet::empty())
            .metadata(true)
            .assume_clean(clean)
            .on_event(move |e: &MirrorEvent| {
                if let MirrorEvent::ResyncComplete { sectors, .. } = e {
                    *c2.lock().unwrap() = *sectors;
                }
            })
            .open()
            .await?,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    if load {
        for w in 0..4u64 {
            let (vol, stop) = (vol.clone(), stop.clone());
            clients.push(tokio::spawn(async move {
                let total = vol.info().sectors;
                let mut x = (w + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut lat = Vec::new();
                let data = Bytes::from(vec![w as u8; 4096]);
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let s = x % (total / 8) * 8;
                    let t = Instant::now();
                    if x % 2 == 0 {
                        let _ = vol.read(s, 8, IoOpts::new()).await;
                    } else {
                        let _ = vol.write(s, data.clone(), IoOpts::new()).await;
                    }
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
    }
    if clean {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    vol.wait_resync().await;
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<Duration> = Vec::new();
    for c in clients {
        lat.extend(c.await?);
    }
    lat.sort_unstable();
    let p99 = lat
        .get(lat.len() * 99 / 100)
        .map_or(0.0, Duration::as_secs_f64);
    let n = *copied.lock().unwrap();
    Ok((secs, n, lat.len() as u64, p99))
}
