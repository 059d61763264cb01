//! Group `queue`: one request through the tagged queue (submit + dispatch + complete).
//!
//! Target: under 250 ns per request (4 M requests/s on one core).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tagstripe_scheduler::{
    Dir, Fair, FairConfig, Fifo, IoClass, Meta, Outcome, Policy, QueueConfig, TagQueue,
};

/// Keeps `depth` requests at the device: each iteration completes the oldest, submits one
/// and dispatches it.
fn steady<P: Policy>(policy: P, depth: usize, classes: &[IoClass], c: &mut Criterion, name: &str) {
    let mut q = TagQueue::new(
        QueueConfig {
            max_tags: 64,
            ..QueueConfig::default()
        },
        policy,
    );
    let mut out = std::collections::VecDeque::new();
    let mut now = 0u64;
    let mut n = 0usize;
    for _ in 0..depth {
        let class = classes[n % classes.len()];
        n += 1;
        q.submit(now, n, Meta::new(class, Dir::Write)).unwrap();
        while let Some(d) = q.poll_dispatch(now) {
            out.push_back(d.tag);
        }
    }
    let mut group = c.benchmark_group("queue");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("submit-dispatch-complete", name), |b| {
        b.iter(|| {
            now += 1_000;
            if let Some(tag) = out.pop_front() {
                q.handle_completion(now, tag, Outcome::Done).unwrap();
            }
            while let Some(e) = q.poll_event() {
                black_box(e);
            }
            let class = classes[n % classes.len()];
            n += 1;
            q.submit(now, n, Meta::new(class, Dir::Write)).unwrap();
            while let Some(d) = q.poll_dispatch(now) {
                out.push_back(d.tag);
            }
        })
    });
    group.finish();
}

fn bench_queue(c: &mut Criterion) {
    steady(Fifo, 32, &[IoClass::BestEffort], c, "fifo-qd32");
    steady(
        Fair::new(FairConfig::default()),
        32,
        &[IoClass::Bulk],
        c,
        "tagstripe-bulk-qd32",
    );
    steady(
        Fair::new(FairConfig::default()),
        1,
        &[IoClass::Interactive],
        c,
        "tagstripe-interactive-qd1",
    );
}

criterion_group!(benches, bench_queue);
criterion_main!(benches);
