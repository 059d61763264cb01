//! How fast `tagstripe crash check` goes through crash states, with `true` as the check (so
//! what is timed is the lab: choosing a state, moving the image to it, starting the check),
//! on volumes of several sizes and logs of several lengths.
//!
//! ```sh
//! cargo build --release -p tagstripe-cli
//! cargo run --release -p tagstripe-benches --example crash-states [ROUNDS]
//! ```
//!
//! Each cell's log: 4 writers of 4 KiB random writes (one in eight with FUA), a flush every
//! eight writes each, recorded by the library's `Recorder` over a device that keeps nothing
//! (so a 16 GiB volume costs no memory). Each cell runs `--mode subset --states 1000` and
//! `--mode prefix --states 1000` through the release binary, ROUNDS times (default 3), the
//! cells alternated round by round; min / median / max states per second.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tagstripe::{BlockDevice, DeviceInfo, Extent, IoOpts, Recorder, Result};

/// A device that keeps nothing and reads as zeroes: what the recorder wraps here.
#[derive(Debug)]
struct Null(DeviceInfo);

impl BlockDevice for Null {
    fn info(&self) -> &DeviceInfo {
        &self.0
    }
    async fn read(&self, _start: u64, sectors: u64, _opts: IoOpts) -> Result<Bytes> {
        Ok(Bytes::from(vec![0u8; sectors as usize * 512]))
    }
    async fn write(&self, _start: u64, _data: Bytes, _opts: IoOpts) -> Result<()> {
        Ok(())
    }
    async fn flush(&self, _opts: IoOpts) -> Result<()> {
        Ok(())
    }
    async fn discard(&self, _start: u64, _sectors: u64, _opts: IoOpts) -> Result<()> {
        Ok(())
    }
    async fn allocation(&self, _start: u64, sectors: u64) -> Result<Vec<Extent>> {
        Ok(vec![Extent::hole(sectors)])
    }
}

/// Records `writes` random 4 KiB writes on a volume of `mib` MiB into `path`.
fn record(path: &Path, mib: u64, writes: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        let rec = Recorder::create(path).unwrap();
        let dev = Arc::new(
            rec.record(Null(DeviceInfo::new("null", mib * 2048)))
                .await
                .unwrap(),
        );
        let blocks = mib * 256;
        let mut tasks = Vec::new();
        for t in 0..4u64 {
            let dev = Arc::clone(&dev);
            tasks.push(tokio::spawn(async move {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                for i in 0..writes / 4 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let data = Bytes::from(vec![(x >> 56) as u8; 4096]);
                    let opts = IoOpts::new().fua(x % 8 == 0);
                    dev.write((x % blocks) * 8, data, opts).await.unwrap();
                    if i % 8 == 7 {
                        dev.flush(IoOpts::new()).await.unwrap();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        rec.finish().await.unwrap();
    });
}

fn states_per_second(bin: &Path, log: &Path, mode: &str) -> f64 {
    let o = Command::new(bin)
        .args(["crash", "check"])
        .arg(log)
        .args(["--mode", mode, "--states", "1000", "--json", "--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    j["states_per_second"].as_f64().unwrap()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = std::env::var_os("TAGSTRIPE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/tagstripe"));
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p tagstripe-cli first (or set TAGSTRIPE)",
        bin.display()
    );
    let dir = std::env::temp_dir().join(format!("tagstripe-crash-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cells: Vec<(u64, u64)> = vec![
        (120, 1_000),
        (120, 8_000),
        (120, 64_000),
        (1024, 8_000),
        (16_384, 8_000),
    ];
    let mut logs = Vec::new();
    for &(mib, writes) in &cells {
        let log = dir.join(format!("log-{mib}-{writes}"));
        let t = Instant::now();
        record(&log, mib, writes);
        let len = std::fs::metadata(&log).unwrap().len();
        eprintln!(
            "recorded {writes} writes on {mib} MiB: {:.1} MiB log in {:.2} s",
            len as f64 / 1048576.0,
            t.elapsed().as_secs_f64()
        );
        logs.push(log);
    }
    let mut figures = vec![(Vec::new(), Vec::new()); cells.len()];
    for round in 0..rounds {
        for (i, log) in logs.iter().enumerate() {
            figures[i].0.push(states_per_second(&bin, log, "subset"));
            figures[i].1.push(states_per_second(&bin, log, "prefix"));
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!("| volume | log | subset states/s (min / median / max) | prefix states/s |");
    println!("|---|---|---|---|");
    let spread = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!(
            "{:.0} / {:.0} / {:.0}",
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        )
    };
    for (i, &(mib, writes)) in cells.iter().enumerate() {
        let len = std::fs::metadata(&logs[i]).unwrap().len();
        println!(
            "| {mib} MiB | {writes} writes ({:.0} MiB) | {} | {} |",
            len as f64 / 1048576.0,
            spread(&mut figures[i].0),
            spread(&mut figures[i].1)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
