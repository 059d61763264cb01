//! Group `map`: one `Geometry::map` call per iteration, consuming its pieces.
//!
//! Targets: under 10 ns per call for one power-of-two row, under 30 ns with
//! five unequal members.

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use tagstripe_striping::Geometry;

/// Deterministic pseudo-random request starts inside the volume, so lookups are not all in
/// one row or one cache line of the table.
fn starts(total: u64, count: u64) -> Vec<u64> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (total - count)
        })
        .collect()
}

fn bench_map(c: &mut Criterion) {
    let gib = 2 * 1024 * 1024; // sectors in 1 GiB
    let cases: Vec<(&str, Geometry)> = vec![
        (
            "1x-equal-il128",
            Geometry::builder([gib], 128).build().unwrap(),
        ),
        (
            "2x-equal-il128",
            Geometry::builder([gib; 2], 128).build().unwrap(),
        ),
        (
            "4x-equal-il128",
            Geometry::builder([gib; 4], 128).build().unwrap(),
        ),
        (
            "5x-unequal-il128",
            Geometry::builder([gib, 2 * gib, 3 * gib / 2, gib / 2, 5 * gib / 4], 128)
                .build()
                .unwrap(),
        ),
        (
            "3x-equal-il13",
            Geometry::builder([gib; 3], 13).build().unwrap(),
        ),
    ];
    let mut group = c.benchmark_group("map");
    group.throughput(Throughput::Elements(1));
    // A 4 KiB request: one piece, the common case.
    for (name, g) in &cases {
        bench_requests(&mut group, "4k", name, g, 8);
    }
    // A 1 MiB request over five unequal members: 16 pieces of one 64 KiB interleave each.
    bench_requests(&mut group, "1m", cases[3].0, &cases[3].1, 2048);
    group.finish();
}

/// One `map` call per iteration over 1024 precomputed starts, folding the pieces.
fn bench_requests(
    group: &mut BenchmarkGroup<'_, WallTime>,
    size: &str,
    name: &str,
    g: &Geometry,
    sectors: u64,
) {
    let s = starts(g.total_sectors(), sectors);
    let mut i = 0usize;
    group.bench_with_input(BenchmarkId::new(size, name), g, |b, g| {
        b.iter(|| {
            i = (i + 1) & 1023;
            let pieces = g.map(black_box(s[i]), sectors).unwrap();
            pieces.fold(0u64, |acc, p| acc ^ p.cblk ^ p.component as u64)
        })
    });
}

/// The harness's own cost per iteration (index + load), to read the figures against.
fn bench_baseline(c: &mut Criterion) {
    let s = starts(1 << 30, 8);
    let mut i = 0usize;
    c.bench_function("map/baseline", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            black_box(s[i]) ^ 3
        })
    });
}

criterion_group!(baseline, bench_baseline);
criterion_group!(benches, bench_map);
criterion_main!(benches, baseline);
