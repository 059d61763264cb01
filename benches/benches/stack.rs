//! Group `stack`: the whole stack (Volume → Striped → Split → Queue → memory) against plain
//! memcpy of the same bytes, in the same run.
//!
//! Targets (DESIGN.md §5): 1 MiB requests at ≥ 90% of memcpy bandwidth; 4 KiB random reads at
//! depth 32 at ≥ 1 M IOPS on 2 cores.

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tagstripe::quirks::QuirkSet;
use tagstripe::{BlockDevice, IoOpts, MemDevice, Volume};

const COMP_SECTORS: u64 = 256 * 2048; // 256 MiB each

fn volume() -> Volume {
    let comps: Vec<Arc<dyn BlockDevice>> = (0..4)
        .map(|i| Arc::new(MemDevice::new(&format!("mem{i}"), COMP_SECTORS)) as Arc<dyn BlockDevice>)
        .collect();
    Volume::builder(comps)
        .interleave(512)
        .quirks(QuirkSet::empty())
        .build()
        .expect("volume")
}

fn bench_stack(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let vol = Arc::new(volume());
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
    let comps: Vec<Vec<u8>> = (0..4)
        .map(|_| vec![0x5Au8; COMP_SECTORS as usize * 512])
        .collect();
    let piece = 256 << 10;
    let mut off = 0usize;
    g.bench_function(BenchmarkId::new("1m", "memcpy-same-layout"), |b| {
        b.iter(|| {
            for _ in 0..16 {
                off = (off + piece) % comps[0].len();
                for (i, c) in comps.iter().enumerate() {
                    dst[i * piece..(i + 1) * piece].copy_from_slice(&c[off..off + piece]);
                }
                black_box(&dst);
            }
        })
    });
    drop(comps);
    let mut next = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    g.bench_function(BenchmarkId::new("1m", "volume-read-into"), |b| {
        b.iter(|| {
            rt.block_on(async {
                for _ in 0..16 {
                    next = (next + 2048) % total;
                    vol.read_into(next, &mut buf, IoOpts::new()).await.unwrap();
                }
            });
            black_box(&buf);
        })
    });
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
    let data = Bytes::from(mib.clone());
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

    // 4 KiB random reads, 32 in flight: each iteration runs a batch of 32 * 64 reads.
    let batch = 32 * 64;
    g.throughput(Throughput::Elements(batch));
    g.bench_function(BenchmarkId::new("4k-randread", "qd32"), |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut tasks = Vec::with_capacity(32);
                for w in 0..32u64 {
                    let vol = Arc::clone(&vol);
                    tasks.push(tokio::spawn(async move {
                        let mut x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                        let mut buf = [0u8; 4096];
                        for _ in 0..64 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let s = x % (total / 8) * 8;
                            vol.read_into(s, &mut buf, IoOpts::new()).await.unwrap();
                            black_box(&buf);
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench_stack);
criterion_main!(benches);
