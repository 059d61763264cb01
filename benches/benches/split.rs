//! Group `split`: splitting a request by device limits, reported per piece.
//!
//! Target: under 20 ns per piece.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tagstripe_quirks::{Limits, Mod15, Op, Splitter};

fn bench_split(c: &mut Criterion) {
    let mut plain = Limits::default();
    plain.physical_block_size = 4096;
    plain.max_hw_sectors = 256;
    let mut chunked = plain.clone();
    chunked.max_hw_sectors = 2560;
    chunked.chunk_sectors = 96;
    let mut seagate = Limits::default();
    seagate.max_hw_sectors = 2560;
    let cases = [
        ("plain-256", Splitter::new(&plain, Mod15::Off).unwrap()),
        ("chunk-96", Splitter::new(&chunked, Mod15::Off).unwrap()),
        (
            "mod15-cap15",
            Splitter::new(&seagate, Mod15::Cap15).unwrap(),
        ),
        (
            "mod15-smart",
            Splitter::new(&seagate, Mod15::Smart).unwrap(),
        ),
    ];
    let mut group = c.benchmark_group("split");
    // A 10 MB write from an unaligned start: the common path plus partial first and last pieces.
    let (start, sectors) = (3, 20_000);
    for (name, s) in &cases {
        let pieces = s.split(Op::Write, start, sectors).unwrap().count() as u64;
        group.throughput(Throughput::Elements(pieces));
        group.bench_with_input(BenchmarkId::new("10m-write", name), s, |b, s| {
            b.iter(|| {
                s.split(Op::Write, black_box(start), black_box(sectors))
                    .unwrap()
                    .fold(0u64, |acc, p| acc ^ p.sectors)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_split);
criterion_main!(benches);
