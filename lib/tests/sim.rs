//! The async stack on a simulated disk, on tokio's paused clock: the fairness story end to
//! end (bulk writers and an interactive reader through `Queue<SimDevice>`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tagstripe::scheduler::{Fair, FairConfig, Fifo, IoClass, Policy, Profile};
use tagstripe::{BlockDevice, IoOpts, Queue, SimDevice};
use tokio::time::Instant;

const SECTORS: u64 = 1 << 21;

async fn reader_latencies(policy: Box<dyn Policy + Send>) -> Vec<Duration> {
    let dev = SimDevice::with_profile("sim", Profile::Hdd1998, SECTORS).unwrap();
    let q = Arc::new(Queue::with_policy(dev, policy));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..16u64 {
        let (q, stop) = (Arc::clone(&q), Arc::clone(&stop));
        writers.push(tokio::spawn(async move {
            let mut lba = w * 16_384;
            let bulk = IoOpts::new().class(IoClass::Bulk);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                q.write(lba, Bytes::from(vec![w as u8; 65536]), bulk)
                    .await
                    .unwrap();
                lba = (lba + 128) % SECTORS;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut lat = Vec::new();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t = Instant::now();
        let lba = x % (SECTORS / 8) * 8;
        // A read starved for a second counts as a second (and is cancelled, which must give
        // its tag back).
        let read = q.read(lba, 8, IoOpts::new().class(IoClass::Interactive));
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(1), read).await {
            r.unwrap();
        }
        lat.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    lat.sort();
    lat
}

#[tokio::test(start_paused = true)]
async fn fair_queue_keeps_reads_fast_under_bulk_writes_on_a_simulated_disk() {
    let fifo = reader_latencies(Box::new(Fifo)).await;
    let fair = reader_latencies(Box::new(Fair::new(FairConfig::default()))).await;
    let p = |v: &[Duration], q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    let (fifo_p90, fair_p90) = (p(&fifo, 0.9), p(&fair, 0.9));
    eprintln!(
        "reader p90: fifo {fifo_p90:?}, fair {fair_p90:?}; fair max {:?}",
        fair.last()
    );
    assert!(
        fair_p90 * 5 < fifo_p90,
        "fair p90 {fair_p90:?} vs fifo p90 {fifo_p90:?}"
    );
    assert!(
        fair.last().unwrap() < &Duration::from_millis(500),
        "fair max {:?}",
        fair.last()
    );
}

#[tokio::test(start_paused = true)]
async fn sim_device_window_gives_queue_full_and_the_queue_retries() {
    let mut cfg = Profile::Ssd.config();
    cfg.window = 4;
    // The device advertises 32 tags but holds 4: QUEUE FULL, back-off, and all succeed.
    let dev = SimDevice::new("sim", cfg, 1 << 16)
        .unwrap()
        .advertise_tags(32);
    assert_eq!(dev.info().limits.max_tags, 32);
    let q = Arc::new(Queue::new(dev));
    let tasks: Vec<_> = (0..32u64)
        .map(|i| {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                q.write(i * 8, Bytes::from(vec![i as u8; 4096]), IoOpts::new())
                    .await
                    .unwrap();
                q.read(i * 8, 8, IoOpts::new()).await.unwrap()
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), vec![i as u8; 4096]);
    }
    assert!(
        q.openings() <= 4,
        "openings shrank to the device's window: {}",
        q.openings()
    );
}
