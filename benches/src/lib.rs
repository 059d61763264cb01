//! Criterion benches for every tagstripe layer; see `benches/README.md`.
//!
//! The benches live in `benches/*.rs`; the library holds the workloads more than one
//! group runs.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe::quirks::QuirkSet;
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MemDevice, Volume};

/// A 4-way striped volume (256 KiB interleave, no quirks) over 4 memory devices of
/// `comp_sectors` each, and the devices (the `stack` group's and the `layer-cost` example's
/// volume).
///
/// # Panics
/// If the volume cannot be built (`comp_sectors` too small for one interleave).
#[must_use]
pub fn memory_volume(comp_sectors: u64) -> (Volume, Vec<Arc<MemDevice>>) {
    let devs: Vec<Arc<MemDevice>> = (0..4)
        .map(|i| Arc::new(MemDevice::new(&format!("mem{i}"), comp_sectors)))
        .collect();
    let vol = Volume::builder(devs.iter().cloned())
        .interleave(512)
        .quirks(QuirkSet::empty())
        .build()
        .expect("volume");
    (vol, devs)
}

/// The next of a xorshift sequence in `x`, as a 4 KiB-aligned sector below `total`.
pub fn random_block(x: &mut u64, total: u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x % (total / 8) * 8
}

/// One round of 4 KiB random writes over `dev`: 32 writers, 64 writes each (2,048 in all,
/// 32 in flight), at random 4 KiB-aligned places drawn from `round` (the `mirror` and `raid`
/// groups' workload).
///
/// # Panics
/// If a write fails (a bench over memory devices has no business failing).
pub async fn random_4k_writes(dev: Arc<dyn DynBlockDevice>, round: u64) {
    let total = dev.info().sectors;
    let mut tasks = Vec::with_capacity(32);
    for w in 0..32u64 {
        let dev = Arc::clone(&dev);
        tasks.push(tokio::spawn(async move {
            let mut x = (w + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round;
            let data = Bytes::from(vec![w as u8; 4096]);
            for _ in 0..64 {
                let s = random_block(&mut x, total);
                dev.write(s, data.clone(), IoOpts::new())
                    .await
                    .expect("a write to memory devices");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer task");
    }
}
