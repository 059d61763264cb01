//! What the layers cost a 4 KiB write, one at a time on one thread: `COUNT` writes to random
//! blocks of a 4-way striped volume of memory devices (`volume`), the same writes through a
//! tagged queue over each device alone (`queued`), or straight to the devices (`device`).
//! Prints the time a write; the time on a shared VM moves by 10-20% from run to run, so
//! `benches/layer-instructions.sh` runs this under callgrind and counts the instructions a
//! write instead (the same from run to run: what a change to the layers saved).
//!
//! `cargo run --release -p tagstripe-benches --example layer-cost -- MODE [COUNT]` (MODE:
//! `volume`, `queued` or `device`; COUNT 1,000,000 by default). Every block is written once
//! before the timed writes, so no page is faulted in while they run.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tagstripe::{BlockDevice, IoOpts, MemDevice, Queue};
use tagstripe_benches::random_block;

/// Each memory device's size (32 MiB: a 128 MiB volume).
const COMP_SECTORS: u64 = 65_536;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    let count: u64 = args.next().map_or(Ok(1_000_000), |s| s.parse())?;
    if !["volume", "queued", "device"].contains(&mode.as_str()) {
        return Err(format!("MODE is volume, queued or device, not {mode:?}").into());
    }
    let (vol, devs) = tagstripe_benches::memory_volume(COMP_SECTORS);
    let queued: Vec<Queue<Arc<MemDevice>>> =
        devs.iter().map(|d| Queue::new(Arc::clone(d))).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let data = Bytes::from(vec![0x5Au8; 4096]);
    let total = vol.info().sectors;
    rt.block_on(async {
        for s in (0..total).step_by(8) {
            vol.write(s, data.clone(), IoOpts::new()).await?;
        }
        let t = Instant::now();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..count {
            // A random block of the volume, or of a random device.
            let at = random_block(&mut x, total);
            let (dev, block) = ((x >> 40) as usize % 4, x % (COMP_SECTORS / 8) * 8);
            match mode.as_str() {
                "volume" => vol.write(at, data.clone(), IoOpts::new()).await?,
                "queued" => {
                    queued[dev]
                        .write(block, data.clone(), IoOpts::new())
                        .await?
                }
                _ => devs[dev].write(block, data.clone(), IoOpts::new()).await?,
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / count.max(1) as f64;
        println!("{mode}: {ns:.0} ns a write ({count} writes)");
        Ok::<(), tagstripe::Error>(())
    })?;
    Ok(())
}
