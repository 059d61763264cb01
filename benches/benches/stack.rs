//! Group `stack`: the whole stack (Volume → Striped → Split → Queue → memory) against plain
//! memcpy of the same bytes, in the same run.
//!
//! Targets: 1 MiB requests at ≥ 90% of memcpy bandwidth; 4 KiB random reads at
//! depth 32 at ≥ 1 M IOPS on 2 cores, and through one tenant of a `Tenants` (`qd32-tenant`)
//! at ≥ 0.9x of that.
//!
//! The reference copies the same bytes out of the same pages (`memcpy-same-pages`: the memory
//! devices under the volume, read directly, each a lock and one `copy_from_slice` per piece).
//! On the VMs this runs on, copying out of two different allocations of the same size differs
//! by up to ±40% from run to run (where the host backs guest memory with huge pages or not),
//! so a reference in other memory measures placement luck, not the stack; `memcpy` (one large
//! buffer) is kept for scale. A paired run, alternating the two every 16 MiB, is printed too.

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tagstripe::{BlockDevice, IoOpts, MemDevice, Queue, Recorder, TenantSpec, Tenants, Volume};
use tagstripe_benches::random_block;

const COMP_SECTORS: u64 = 256 * 2048; // 256 MiB each

/// 16 MiB read as the volume lays it out (a 256 KiB piece from each device per MiB) straight
/// from the devices: the same bytes from the same pages, without the stack.
async fn same_pages(devs: &[Arc<MemDevice>], at: &mut u64, dst: &mut [u8]) {
    let piece = 256 << 10;
    for _ in 0..16 {
        *at = (*at + 512) % COMP_SECTORS;
        for (i, d) in devs.iter().enumerate() {
            d.read_into(*at, &mut dst[i * piece..(i + 1) * piece], IoOpts::new())
                .await
                .expect("in range");
        }
        black_box(&*dst);
    }
}

/// 16 MiB of 1 MiB volume reads.
async fn volume_reads(vol: &Volume, next: &mut u64, buf: &mut [u8]) {
    let total = vol.info().sectors;
    for _ in 0..16 {
        *next = (*next + 2048) % total;
        vol.read_into(*next, buf, IoOpts::new())
            .await
            .expect("in range");
    }
    black_box(&*buf);
}

/// 16 MiB written as the volume lays it out (a 256 KiB piece to each device per MiB) straight
/// to the devices: the same bytes into the same pages, without the stack.
async fn same_pages_written(devs: &[Arc<MemDevice>], at: &mut u64, data: &Bytes) {
    let piece = 256 << 10;
    for _ in 0..16 {
        *at = (*at + 512) % COMP_SECTORS;
        for (i, d) in devs.iter().enumerate() {
            d.write(*at, data.slice(i * piece..(i + 1) * piece), IoOpts::new())
                .await
                .expect("in range");
        }
    }
}

/// 16 MiB of 1 MiB volume writes.
async fn volume_writes(vol: &Volume, next: &mut u64, data: &Bytes) {
    let total = vol.info().sectors;
    for _ in 0..16 {
        *next = (*next + 2048) % total;
        vol.write(*next, data.clone(), IoOpts::new())
            .await
            .expect("in range");
    }
}

/// A 1 MiB ratio measured pairwise: each round times 16 MiB to or from the devices directly
/// (`direct`), then 16 MiB through the volume (`stacked`), back to back, so that drift hits
/// both alike; printed as the median of the rounds with its quartiles.
fn paired(what: &str, mut direct: impl FnMut(), mut stacked: impl FnMut()) {
    let rounds = if std::env::args().any(|a| a == "--test") {
        3
    } else {
        300
    };
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = std::time::Instant::now();
            direct();
            let d = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            stacked();
            d / t.elapsed().as_secs_f64()
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f) as usize] * 100.0;
    println!(
        "stack/1m paired: {what} (median of {rounds} rounds; quartiles {:.1}%..{:.1}%): {:.1}%",
        q(0.25),
        q(0.75),
        q(0.5)
    );
}

/// 4 KiB writes one at a time on `single`'s thread, each block of `blocks` (volume sector,
/// component, component sector) written to `devs[component]` at its component sector:
/// `stack/4k-write/NAME`, `batch` writes an iteration.
fn one_at_a_time<D: BlockDevice>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    single: &tokio::runtime::Runtime,
    blocks: &[(u64, usize, u64)],
    devs: &[D],
    data: &Bytes,
    batch: usize,
) {
    g.bench_function(BenchmarkId::new("4k-write", name), |b| {
        let mut next = blocks.iter().cycle();
        b.iter(|| {
            single.block_on(async {
                for &(_, d, at) in next.by_ref().take(batch) {
                    devs[d]
                        .write(at, data.clone(), IoOpts::new())
                        .await
                        .unwrap();
                }
            })
        })
    });
}

fn bench_stack(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (vol, devs) = tagstripe_benches::memory_volume(COMP_SECTORS);
    let vol = Arc::new(vol);
    let total = vol.info().sectors;
    let mib = vec![0xA5u8; 1 << 20];
    rt.block_on(async {
        // Touch every page once so page faults are not measured.
        for s in (0..total).step_by(2048) {
            vol.write(s, Bytes::from(mib.clone()), IoOpts::new())
                .await
                .unwrap();
        }
    });

    let mut g = c.benchmark_group("stack");
    // 16 MiB per iteration: 16 requests of 1 MiB, one at a time.
    g.throughput(Throughput::Bytes(16 << 20));
    // memcpy of the same bytes from the same kind of memory, two ways: from one source as
    // large as the volume, and laid out as the volume lays them out (four 256 MiB sources,
    // one 256 KiB piece from each per MiB) so that only the stack's own cost differs.
    let src = vec![0x5Au8; total as usize * 512];
    let mut dst = vec![0u8; 1 << 20];
    let mut at = 0usize;
    g.bench_function(BenchmarkId::new("1m", "memcpy"), |b| {
        b.iter(|| {
            for _ in 0..16 {
                at = (at + (1 << 20)) % src.len();
                dst.copy_from_slice(&src[at..at + (1 << 20)]);
                black_box(&dst);
            }
        })
    });
    drop(src);
    let mut at = 0u64;
    g.bench_function(BenchmarkId::new("1m", "memcpy-same-pages"), |b| {
        b.iter(|| rt.block_on(same_pages(&devs, &mut at, &mut dst)));
    });
    let mut next = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    g.bench_function(BenchmarkId::new("1m", "volume-read-into"), |b| {
        b.iter(|| rt.block_on(volume_reads(&vol, &mut next, &mut buf)));
    });
    // The two of each pair walk disjoint halves of the devices, so that neither warms the
    // other's cache (the L3 here is large enough to hold a good part of the volume).
    let (mut at, mut next) = (0u64, total / 2);
    let mut dst = vec![0u8; 1 << 20];
    paired(
        "volume-read-into against memcpy-same-pages",
        || rt.block_on(same_pages(&devs, &mut at, &mut dst)),
        || rt.block_on(volume_reads(&vol, &mut next, &mut buf)),
    );
    let data = Bytes::from(mib.clone());
    let (mut at, mut next) = (0u64, total / 2);
    paired(
        "volume-write against memcpy-same-pages-written",
        || rt.block_on(same_pages_written(&devs, &mut at, &data)),
        || rt.block_on(volume_writes(&vol, &mut next, &data)),
    );
    g.bench_function(BenchmarkId::new("1m", "volume-read"), |b| {
        b.iter(|| {
            rt.block_on(async {
                for _ in 0..16 {
                    next = (next + 2048) % total;
                    black_box(vol.read(next, 2048, IoOpts::new()).await.unwrap());
                }
            })
        })
    });
    g.bench_function(BenchmarkId::new("1m", "volume-write"), |b| {
        b.iter(|| {
            rt.block_on(async {
                for _ in 0..16 {
                    next = (next + 2048) % total;
                    vol.write(next, data.clone(), IoOpts::new()).await.unwrap();
                }
            })
        })
    });

    // The same writes through the crash lab's recording layer (the log written to /dev/null:
    // what recording costs the request path and the recorder's thread, not the log's disk).
    let recorded = rt.block_on(async {
        let rec = Recorder::create("/dev/null").expect("recorder");
        Arc::new(rec.record(Arc::clone(&vol)).await.expect("recorded"))
    });
    g.bench_function(BenchmarkId::new("1m", "volume-write-recorded"), |b| {
        b.iter(|| {
            rt.block_on(async {
                for _ in 0..16 {
                    next = (next + 2048) % total;
                    recorded
                        .write(next, data.clone(), IoOpts::new())
                        .await
                        .unwrap();
                }
            })
        })
    });

    // 4 KiB reads one at a time on the calling thread: the stack's own cost a request
    // (the layers' futures, the queue's bookkeeping), without a scheduler's.
    let batch = 2048;
    g.throughput(Throughput::Elements(batch));
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    g.bench_function(BenchmarkId::new("4k-read", "qd1"), |b| {
        let mut buf = [0u8; 4096];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        b.iter(|| {
            single.block_on(async {
                for _ in 0..batch {
                    let s = random_block(&mut x, total);
                    vol.read_into(s, &mut buf, IoOpts::new()).await.unwrap();
                    black_box(&buf);
                }
            })
        })
    });

    // 4 KiB writes one at a time on the calling thread, through the volume and straight to
    // its memory devices: the same random blocks, each to the device and the place where the
    // volume puts it (mapped beforehand: the same pages, the map not timed), so the
    // difference is what the layers cost a write.
    let data4k = Bytes::from(vec![0x5Au8; 4096]);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let blocks: Vec<(u64, usize, u64)> = (0..1 << 16)
        .map(|_| {
            let s = random_block(&mut x, total);
            let p = vol
                .geometry()
                .map(s, 8)
                .expect("in range")
                .next()
                .expect("one piece");
            (s, p.component, p.cblk)
        })
        .collect();
    g.bench_function(BenchmarkId::new("4k-write", "qd1"), |b| {
        let mut next = blocks.iter().cycle();
        b.iter(|| {
            single.block_on(async {
                for (s, _, _) in next.by_ref().take(batch as usize) {
                    vol.write(*s, data4k.clone(), IoOpts::new()).await.unwrap();
                }
            })
        })
    });
    // The same writes through a tagged queue over each device alone (the queue's fair
    // policy, as a volume's components get): the queue's share of the layers' cost.
    let queued: Vec<Queue<Arc<MemDevice>>> =
        devs.iter().map(|d| Queue::new(Arc::clone(d))).collect();
    one_at_a_time(
        &mut g,
        "qd1-queued",
        &single,
        &blocks,
        &queued,
        &data4k,
        batch as usize,
    );
    one_at_a_time(
        &mut g,
        "qd1-device",
        &single,
        &blocks,
        &devs,
        &data4k,
        batch as usize,
    );

    // 4 KiB random reads, 32 in flight: each iteration runs a batch of 32 * 64 reads; then
    // the same through one tenant of a `Tenants` over the volume (its scheduler's cost).
    let batch = 32 * 64;
    g.throughput(Throughput::Elements(batch));
    g.bench_function(BenchmarkId::new("4k-randread", "qd32"), |b| {
        b.iter(|| rt.block_on(randread_qd32(Arc::clone(&vol), total)));
    });
    let tenants = Tenants::new(Arc::clone(&vol));
    let tenant = Arc::new(tenants.add("t", TenantSpec::new()).expect("tenant"));
    g.bench_function(BenchmarkId::new("4k-randread", "qd32-tenant"), |b| {
        b.iter(|| rt.block_on(randread_qd32(Arc::clone(&tenant), total)));
    });
    // 4 KiB random writes, 32 in flight, plain and recorded.
    g.bench_function(BenchmarkId::new("4k-randwrite", "qd32"), |b| {
        b.iter(|| rt.block_on(randwrite_qd32(Arc::clone(&vol), total)));
    });
    g.bench_function(BenchmarkId::new("4k-randwrite", "qd32-recorded"), |b| {
        b.iter(|| rt.block_on(randwrite_qd32(Arc::clone(&recorded), total)));
    });
    g.finish();
}

/// 32 readers of 64 random 4 KiB reads each.
async fn randread_qd32<D: BlockDevice + 'static>(dev: Arc<D>, total: u64) {
    let mut tasks = Vec::with_capacity(32);
    for w in 0..32u64 {
        let dev = Arc::clone(&dev);
        tasks.push(tokio::spawn(async move {
            let mut x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut buf = [0u8; 4096];
            for _ in 0..64 {
                let s = random_block(&mut x, total);
                dev.read_into(s, &mut buf, IoOpts::new()).await.unwrap();
                black_box(&buf);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// 32 writers of 64 random 4 KiB writes each, each writer its own buffer (as a server's
/// requests each have theirs, and as each reader reads into its own): one buffer shared by
/// all would have its reference count's cache line move between the cores at every write.
async fn randwrite_qd32<D: BlockDevice + 'static>(dev: Arc<D>, total: u64) {
    let mut tasks = Vec::with_capacity(32);
    for w in 0..32u64 {
        let dev = Arc::clone(&dev);
        let data = Bytes::from(vec![0x3Cu8; 4096]);
        tasks.push(tokio::spawn(async move {
            let mut x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for _ in 0..64 {
                let s = random_block(&mut x, total);
                dev.write(s, data.clone(), IoOpts::new()).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

criterion_group!(benches, bench_stack);
criterion_main!(benches);
