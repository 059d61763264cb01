//! Group `mirror`: what the write-intent bitmap costs. 4 KiB random writes, 32 in flight,
//! over a mirror of two 256 MiB memory devices, without metadata (ccd's layout) and with it
//! (every write's chunk marked durably before the write is issued), each with and without a
//! flush after every batch of 2,048 writes (the flush clears the bits, so the next batch
//! pays to set them again: the worst case).

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tagstripe::quirks::QuirkSet;
use tagstripe::striping::Flavor;
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MemDevice, Volume};

const COMP_SECTORS: u64 = 256 * 2048;

async fn mirror(metadata: bool) -> Volume {
    let devs = (0..2).map(|i| Arc::new(MemDevice::new(&format!("m{i}"), COMP_SECTORS)));
    let b = Volume::builder(devs)
        .flavor(Flavor::FreeBsd)
        .mirror(true)
        .interleave(128)
        .quirks(QuirkSet::empty());
    if metadata {
        b.metadata(true)
            .assume_clean(true)
            .open()
            .await
            .expect("mirror")
    } else {
        b.build().expect("mirror")
    }
}

fn bench_mirror(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("mirror");
    let batch = 32 * 64;
    g.throughput(Throughput::Elements(batch));
    for metadata in [false, true] {
        let vol = Arc::new(rt.block_on(mirror(metadata)));

        for flush in [false, true] {
            let name = format!(
                "{}{}",
                if metadata { "bitmap" } else { "no-metadata" },
                if flush { "-flush-per-batch" } else { "" }
            );
            let mut round = 0u64;
            g.bench_function(BenchmarkId::new("4k-randwrite-qd32", name), |b| {
                b.iter(|| {
                    round += 1;
                    rt.block_on(async {
                        let dev = Arc::clone(&vol) as Arc<dyn DynBlockDevice>;
                        tagstripe_benches::random_4k_writes(dev, round).await;
                        if flush {
                            vol.flush(IoOpts::new()).await.unwrap();
                        }
                    })
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_mirror);
criterion_main!(benches);
