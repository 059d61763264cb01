//! Group `raid`: md's raid5 served by `Raid` against raid0 (a `Volume` striped over the
//! same kind of members, no queues) on four 64 MiB memory members with 64 KiB chunks:
//! - full-stripe writes (192 KiB, stripe-aligned: parity from the new data alone, no
//!   read) against raid0's writes of the same size;
//! - 64 KiB sequential writes, one chunk at a time (partial stripes: the stripe cache
//!   serves all but the first of each stripe's reads);
//! - 4 KiB random writes, 32 in flight (read-modify-write: two reads and two writes each);
//! - 1 MiB reads, healthy and with a member failed (a quarter of the chunks rebuilt from
//!   the other three and P).

use std::sync::Arc;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tagstripe::quirks::QuirkSet;
use tagstripe::striping::Flavor;
use tagstripe::striping::md::{Parity, ParityLayout};
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MemDevice, Raid, Volume};

const MEMBER: u64 = 64 * 2048;
const CHUNK: u64 = 128;

fn members_n(n: usize) -> Vec<Arc<dyn DynBlockDevice>> {
    (0..n)
        .map(|i| Arc::new(MemDevice::new(&format!("m{i}"), MEMBER)) as Arc<dyn DynBlockDevice>)
        .collect()
}

fn members() -> Vec<Arc<dyn DynBlockDevice>> {
    members_n(4)
}

fn raid5_n(n: usize) -> Raid {
    let g = Parity::new(5, ParityLayout::LeftSymmetric, n, CHUNK, MEMBER).expect("geometry");
    Raid::parity("md", g, members_n(n)).expect("raid5")
}

fn raid5() -> Raid {
    raid5_n(4)
}

fn raid0_n(n: usize) -> Volume {
    Volume::builder(members_n(n))
        .flavor(Flavor::Md(tagstripe::striping::MdLayout::Alt))
        .interleave(CHUNK)
        .queue(false)
        .quirks(QuirkSet::empty())
        .build()
        .expect("raid0")
}

fn raid0() -> Volume {
    raid0_n(4)
}

/// Sequential writes of `bytes` at a time over `dev`, 16 MiB a round.
async fn seq_writes<D: BlockDevice>(dev: &D, at: &mut u64, bytes: u64) {
    let data = Bytes::from(vec![0x5au8; bytes as usize]);
    let (n, total) = (bytes / 512, dev.info().sectors);
    for _ in 0..(16 << 20) / bytes {
        if *at + n > total {
            *at = 0;
        }
        dev.write(*at, data.clone(), IoOpts::new())
            .await
            .expect("write");
        *at += n;
    }
}

/// 1 MiB reads over `dev`, 16 MiB a round.
async fn seq_reads<D: BlockDevice>(dev: &D, at: &mut u64, buf: &mut [u8]) {
    let total = dev.info().sectors;
    for _ in 0..16 {
        if *at + 2048 > total {
            *at = 0;
        }
        dev.read_into(*at, buf, IoOpts::new()).await.expect("read");
        *at += 2048;
    }
}

fn bench_raid(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let r5 = Arc::new(raid5());
    let r0 = Arc::new(raid0());
    // Every member written, so reads read memory, not holes.
    rt.block_on(r5.write(0, Bytes::from(vec![1u8; 192 << 20]), IoOpts::new()))
        .expect("fill");
    let mut g = c.benchmark_group("raid");
    let stripe = CHUNK * 512 * 3;
    g.throughput(Throughput::Bytes(16 << 20));
    let mut at = 0;
    g.bench_function(BenchmarkId::new("full-stripe-write", "raid5"), |b| {
        b.iter(|| rt.block_on(seq_writes(r5.as_ref(), &mut at, stripe)));
    });
    let mut at = 0;
    g.bench_function(BenchmarkId::new("full-stripe-write", "raid0"), |b| {
        b.iter(|| rt.block_on(seq_writes(r0.as_ref(), &mut at, stripe)));
    });
    // Eight members: a stripe is 7 data chunks and one parity, so the parity is an eighth
    // of what is written, not a quarter (the bound on a memory-bound full-stripe write is
    // (n - 1) / n of raid0's rate: 0.75x for 4 members, 0.875x for 8).
    let (r5_8, r0_8) = (raid5_n(8), raid0_n(8));
    let stripe8 = CHUNK * 512 * 7;
    let mut at = 0;
    g.bench_function(BenchmarkId::new("full-stripe-write", "raid5-8"), |b| {
        b.iter(|| rt.block_on(seq_writes(&r5_8, &mut at, stripe8)));
    });
    let mut at = 0;
    g.bench_function(BenchmarkId::new("full-stripe-write", "raid0-8"), |b| {
        b.iter(|| rt.block_on(seq_writes(&r0_8, &mut at, stripe8)));
    });
    drop((r5_8, r0_8));
    // A sequential writer of one chunk at a time: partial stripes, the stripe cache's case.
    let mut at = 0;
    g.bench_function(BenchmarkId::new("64k-seq-write", "raid5"), |b| {
        b.iter(|| rt.block_on(seq_writes(r5.as_ref(), &mut at, CHUNK * 512)));
    });
    let mut at = 0;
    g.bench_function(BenchmarkId::new("64k-seq-write", "raid0"), |b| {
        b.iter(|| rt.block_on(seq_writes(r0.as_ref(), &mut at, CHUNK * 512)));
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    g.bench_function(BenchmarkId::new("1m-read", "raid5-healthy"), |b| {
        b.iter(|| rt.block_on(seq_reads(r5.as_ref(), &mut at, &mut buf)));
    });
    let degraded = Raid::parity(
        "md",
        Parity::new(5, ParityLayout::LeftSymmetric, 4, CHUNK, MEMBER).expect("geometry"),
        members(),
    )
    .expect("raid5");
    rt.block_on(degraded.write(0, Bytes::from(vec![1u8; 192 << 20]), IoOpts::new()))
        .expect("fill");
    degraded.fail(1);
    let mut at = 0;
    g.bench_function(BenchmarkId::new("1m-read", "raid5-degraded"), |b| {
        b.iter(|| rt.block_on(seq_reads(&degraded, &mut at, &mut buf)));
    });
    let batch = 32 * 64;
    g.throughput(Throughput::Elements(batch));
    for (name, dev) in [
        ("raid5", Arc::clone(&r5) as Arc<dyn DynBlockDevice>),
        ("raid0", Arc::clone(&r0) as Arc<dyn DynBlockDevice>),
    ] {
        let mut round = 0u64;
        g.bench_function(BenchmarkId::new("4k-randwrite-qd32", name), |b| {
            b.iter(|| {
                round += 1;
                rt.block_on(tagstripe_benches::random_4k_writes(Arc::clone(&dev), round));
            })
        });
    }
    g.finish();
}

/// raid6's P and Q over 8 disks of 4 KiB (6 of data), the shape of md's own boot-time
/// benchmark (`lib/raid6/algos.c`: MB/s of data through `gen_syndrome`), the data in cache:
/// one pass by Horner's rule eight bytes at a time (`gf::gen_syndrome`, what `Raid` uses),
/// and a pass a block with a multiplication table (`gf::mul_acc`, what it used before).
fn bench_gen(c: &mut Criterion) {
    use tagstripe::striping::md::gf;
    let data: Vec<Vec<u8>> = (0..6u8)
        .map(|d| {
            (0..4096u32)
                .map(|i| (i as u8).wrapping_mul(d + 3))
                .collect()
        })
        .collect();
    let srcs: Vec<Option<&[u8]>> = data.iter().map(|d| Some(&d[..])).collect();
    let (mut p, mut q) = (vec![0u8; 4096], vec![0u8; 4096]);
    let mut g = c.benchmark_group("raid6-gen");
    g.throughput(Throughput::Bytes(6 * 4096));
    g.bench_function(BenchmarkId::new("8-disks-4k", "gen-syndrome"), |b| {
        b.iter(|| {
            gf::gen_syndrome(std::hint::black_box(&srcs), &mut p, &mut q);
            std::hint::black_box((&p, &q));
        })
    });
    g.bench_function(BenchmarkId::new("8-disks-4k", "table-a-block"), |b| {
        b.iter(|| {
            q.fill(0);
            for (c, d) in data.iter().enumerate() {
                gf::mul_acc(&mut q, gf::pow2(c), d);
            }
            let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            std::hint::black_box((gf::xor_sum_new(&refs, 4096), &q));
        })
    });
    g.finish();
}

criterion_group!(benches, bench_raid, bench_gen);
criterion_main!(benches);
