//! Per-device statistics in iostat's terms, cheap enough to stay on (a few relaxed atomic
//! adds per request, in the worker thread's own shard of the counters).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::shard::{SHARDS, shard};

use tagstripe_scheduler::IoClass;

/// Sub-buckets per power of two: latencies are kept to within 1/64 (1.6%), as an
/// HdrHistogram of about two significant digits, with one relaxed atomic add per request.
const SUB: usize = 64;
const SUB_BITS: u32 = 6;
/// Powers of two above the exact range: up to 2^47 ns (39 hours).
const OCTAVES: usize = 42;
const BUCKETS: usize = SUB * (OCTAVES + 1);

/// The bucket of a latency of `ns` nanoseconds: exact below 64 ns, then 64 per octave.
fn bucket(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros();
    let sub = ((ns >> (e - SUB_BITS)) as usize) & (SUB - 1);
    (SUB * (e - SUB_BITS + 1) as usize + sub).min(BUCKETS - 1)
}

/// The highest latency bucket `b` holds, in nanoseconds.
fn bucket_top(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let e = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    (((SUB as u64 + sub + 1) << (e - SUB_BITS)) - 1).max(1)
}

/// Counters for one device or volume, with latency kept per I/O class.
///
/// Each worker thread counts in a shard of its own (made the first time it counts here), so
/// the workers of a runtime serving one device write no cache line in common; a snapshot
/// sums the shards.
#[derive(Default)]
pub struct Stats {
    shards: [OnceLock<Box<Shard>>; SHARDS],
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Stats").field(&self.snapshot()).finish()
    }
}

/// One thread's counters (on cache lines of their own). A request may begin on one thread
/// and end on another, so a shard's `in_flight` wraps below zero; the sum over the shards
/// is the count.
#[repr(align(128))]
struct Shard {
    ops: [AtomicU64; 4],
    bytes: [AtomicU64; 2],
    errors: AtomicU64,
    in_flight: AtomicU64,
    /// `BUCKETS` per I/O class, class after class.
    latency: Vec<AtomicU64>,
}

impl Shard {
    fn new() -> Self {
        Self {
            ops: Default::default(),
            bytes: Default::default(),
            errors: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            latency: (0..4 * BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// An operation kind, for the layers' bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Read = 0,
    Write = 1,
    Flush = 2,
    Discard = 3,
}

/// A request counted in flight: [`InFlight::end`] records how it went; dropped without
/// it (the caller's future was cancelled), it still leaves the in-flight count.
pub(crate) struct InFlight<'a> {
    stats: &'a Stats,
    ended: bool,
}

impl InFlight<'_> {
    pub(crate) fn end(
        mut self,
        op: OpKind,
        class: IoClass,
        bytes: u64,
        latency: Duration,
        ok: bool,
    ) {
        self.ended = true;
        self.stats.end(op, class, bytes, latency, ok);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.stats.mine().in_flight.fetch_sub(1, Relaxed);
        }
    }
}

impl Stats {
    /// The calling thread's shard, made on its first count.
    fn mine(&self) -> &Shard {
        self.shards[shard()].get_or_init(|| Box::new(Shard::new()))
    }

    /// The shards made so far.
    fn made(&self) -> impl Iterator<Item = &Shard> {
        self.shards.iter().filter_map(|s| s.get().map(|b| &**b))
    }

    /// A counter summed over the shards (wrapping: a shard's in-flight count may be below
    /// zero).
    fn sum(&self, f: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.made()
            .fold(0u64, |acc, s| acc.wrapping_add(f(s).load(Relaxed)))
    }

    pub(crate) fn begin(&self) -> InFlight<'_> {
        self.mine().in_flight.fetch_add(1, Relaxed);
        InFlight {
            stats: self,
            ended: false,
        }
    }

    fn end(&self, op: OpKind, class: IoClass, bytes: u64, latency: Duration, ok: bool) {
        let s = self.mine();
        s.in_flight.fetch_sub(1, Relaxed);
        if !ok {
            s.errors.fetch_add(1, Relaxed);
            return;
        }
        s.ops[op as usize].fetch_add(1, Relaxed);
        if matches!(op, OpKind::Read | OpKind::Write) {
            s.bytes[op as usize].fetch_add(bytes, Relaxed);
        }
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        s.latency[class as usize * BUCKETS + bucket(ns)].fetch_add(1, Relaxed);
    }

    /// Requests in flight and every request started so far: a cheap look at whether the
    /// device is in use (no histogram copied).
    ///
    /// ```
    /// let s = tagstripe::Stats::default();
    /// assert_eq!(s.activity(), (0, 0));
    /// ```
    #[must_use]
    pub fn activity(&self) -> (u64, u64) {
        let done = (0..4).map(|i| self.sum(|s| &s.ops[i])).sum::<u64>() + self.sum(|s| &s.errors);
        let now = self.sum(|s| &s.in_flight);
        (now, done + now)
    }

    /// The counters now.
    ///
    /// ```
    /// let s = tagstripe::Stats::default();
    /// assert_eq!(s.snapshot().transfers(), 0);
    /// ```
    #[must_use]
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut latency = vec![vec![0u64; BUCKETS]; 4];
        for s in self.made() {
            for (c, h) in latency.iter_mut().enumerate() {
                for (b, n) in h.iter_mut().enumerate() {
                    *n += s.latency[c * BUCKETS + b].load(Relaxed);
                }
            }
        }
        StatsSnapshot {
            reads: self.sum(|s| &s.ops[0]),
            writes: self.sum(|s| &s.ops[1]),
            flushes: self.sum(|s| &s.ops[2]),
            discards: self.sum(|s| &s.ops[3]),
            bytes_read: self.sum(|s| &s.bytes[0]),
            bytes_written: self.sum(|s| &s.bytes[1]),
            errors: self.sum(|s| &s.errors),
            in_flight: self.sum(|s| &s.in_flight),
            latency,
        }
    }
}

/// The same counters as [`Stats`] in plain integers, for a layer that already holds a
/// lock when a request ends (the tenants' state): no atomic adds, and no cache lines of
/// their own passed between cores.
#[derive(Debug)]
pub(crate) struct Tally {
    ops: [u64; 4],
    bytes: [u64; 2],
    errors: u64,
    latency: Box<[[u64; BUCKETS]; 4]>,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            ops: [0; 4],
            bytes: [0; 2],
            errors: 0,
            latency: Box::new([[0; BUCKETS]; 4]),
        }
    }
}

impl Tally {
    /// One request ended, `latency_ns` after it was submitted.
    pub(crate) fn record(
        &mut self,
        op: OpKind,
        class: IoClass,
        bytes: u64,
        latency_ns: u64,
        ok: bool,
    ) {
        if !ok {
            self.errors += 1;
            return;
        }
        self.ops[op as usize] += 1;
        if matches!(op, OpKind::Read | OpKind::Write) {
            self.bytes[op as usize] += bytes;
        }
        self.latency[class as usize][bucket(latency_ns)] += 1;
    }

    /// Adds `other`'s counts to these (shards of one device's counters merged).
    pub(crate) fn add(&mut self, other: &Tally) {
        for (a, b) in self.ops.iter_mut().zip(other.ops) {
            *a += b;
        }
        for (a, b) in self.bytes.iter_mut().zip(other.bytes) {
            *a += b;
        }
        self.errors += other.errors;
        for (a, b) in self.latency.iter_mut().zip(other.latency.iter()) {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
    }

    /// The counters now, with `in_flight` requests in progress.
    pub(crate) fn snapshot(&self, in_flight: u64) -> StatsSnapshot {
        StatsSnapshot {
            reads: self.ops[0],
            writes: self.ops[1],
            flushes: self.ops[2],
            discards: self.ops[3],
            bytes_read: self.bytes[0],
            bytes_written: self.bytes[1],
            errors: self.errors,
            in_flight,
            latency: self.latency.iter().map(|h| h.to_vec()).collect(),
        }
    }
}

/// A copy of the counters; differences of two give rates. Its `Debug` shows the counters and
/// the p50 / p99 / max latency, not the histogram's buckets.
#[derive(Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Completed reads.
    pub reads: u64,
    /// Completed writes.
    pub writes: u64,
    /// Completed flushes.
    pub flushes: u64,
    /// Completed discards.
    pub discards: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Failed requests.
    pub errors: u64,
    /// Requests in progress (iostat's queue depth).
    pub in_flight: u64,
    /// Completions per latency bucket, per I/O class.
    latency: Vec<Vec<u64>>,
}

impl StatsSnapshot {
    /// Reads plus writes.
    #[must_use]
    pub fn transfers(&self) -> u64 {
        self.reads + self.writes
    }

    /// Transfers per second since `earlier`, over `elapsed` (iostat's tps).
    #[must_use]
    pub fn tps(&self, earlier: &StatsSnapshot, elapsed: Duration) -> f64 {
        self.transfers().saturating_sub(earlier.transfers()) as f64
            / elapsed.as_secs_f64().max(1e-9)
    }

    /// Bytes moved since `earlier` (0 if `earlier` is in fact the later snapshot).
    fn bytes_since(&self, earlier: &StatsSnapshot) -> u64 {
        (self.bytes_read + self.bytes_written)
            .saturating_sub(earlier.bytes_read + earlier.bytes_written)
    }

    /// KiB per transfer since `earlier` (iostat's KB/t).
    #[must_use]
    pub fn kb_per_transfer(&self, earlier: &StatsSnapshot) -> f64 {
        let t = self.transfers().saturating_sub(earlier.transfers());
        let b = self.bytes_since(earlier);
        if t == 0 {
            0.0
        } else {
            b as f64 / 1024.0 / t as f64
        }
    }

    /// MB per second (10^6 bytes) since `earlier`.
    #[must_use]
    pub fn mb_per_sec(&self, earlier: &StatsSnapshot, elapsed: Duration) -> f64 {
        self.bytes_since(earlier) as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9)
    }

    /// The latency below which `p` percent of completed requests fell (`p` from 0 to 100,
    /// as hdrhistogram's `value_at_percentile` and fio's `clat` percentiles count: 99.0 is
    /// the p99), within 1.6% (rounded up to its bucket's top). `None` before any completion,
    /// and for a `p` outside 0..=100 or NaN.
    ///
    /// ```
    /// use tagstripe::Stats;
    /// let s = Stats::default();
    /// assert_eq!(s.snapshot().latency_percentile(99.0), None); // nothing completed yet
    /// assert_eq!(s.snapshot().latency_percentile(990.0), None); // not a percentage
    /// ```
    #[must_use]
    pub fn latency_percentile(&self, p: f64) -> Option<Duration> {
        let all: Vec<u64> = (0..BUCKETS)
            .map(|b| self.latency.iter().map(|h| h[b]).sum())
            .collect();
        percentile(&all, p)
    }

    /// As [`latency_percentile`](Self::latency_percentile) (`p` in percent), for the requests
    /// of one I/O class.
    #[must_use]
    pub fn class_latency_percentile(&self, class: IoClass, p: f64) -> Option<Duration> {
        percentile(&self.latency[class as usize], p)
    }

    /// Requests of one class that completed (successfully).
    #[must_use]
    pub fn class_completions(&self, class: IoClass) -> u64 {
        self.latency[class as usize].iter().sum()
    }
}

impl std::fmt::Debug for StatsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsSnapshot")
            .field("reads", &self.reads)
            .field("writes", &self.writes)
            .field("flushes", &self.flushes)
            .field("discards", &self.discards)
            .field("bytes_read", &self.bytes_read)
            .field("bytes_written", &self.bytes_written)
            .field("errors", &self.errors)
            .field("in_flight", &self.in_flight)
            .field("p50", &self.latency_percentile(50.0))
            .field("p99", &self.latency_percentile(99.0))
            .field("max", &self.latency_percentile(100.0))
            .finish()
    }
}

/// The latency below which `p` percent of the histogram `h` fell.
fn percentile(h: &[u64], p: f64) -> Option<Duration> {
    if !(0.0..=100.0).contains(&p) {
        return None;
    }
    let total: u64 = h.iter().sum();
    if total == 0 {
        return None;
    }
    let want = ((p / 100.0 * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (b, &n) in h.iter().enumerate() {
        seen += n;
        if seen >= want {
            return Some(Duration::from_nanos(bucket_top(b)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_latencies_within_a_sixty_fourth() {
        for ns in [1u64, 63, 64, 65, 1000, 33_554_432, 123_456_789, 1 << 40] {
            let b = bucket(ns);
            let top = bucket_top(b);
            assert!(top >= ns, "{ns} in bucket {b} topped at {top}");
            assert!(
                (top - ns) as f64 <= ns as f64 / 64.0 + 1.0,
                "{ns}: bucket top {top} too far"
            );
            if b > 0 {
                assert!(bucket_top(b - 1) < ns, "{ns} belongs in an earlier bucket");
            }
        }
        // A p99 of 33.5 ms is 33.5 ms, not a power of two.
        let s = Stats::default();
        for ms in 1..=100u64 {
            let f = s.begin();
            f.end(
                OpKind::Read,
                IoClass::Interactive,
                512,
                Duration::from_micros(ms * 335),
                true,
            );
        }
        let snap = s.snapshot();
        let p99 = snap.latency_percentile(99.0).unwrap().as_secs_f64() * 1e3;
        assert!((p99 - 33.165).abs() < 33.165 / 60.0, "p99 {p99} ms");
        assert_eq!(snap.class_completions(IoClass::Interactive), 100);
        assert_eq!(snap.class_latency_percentile(IoClass::Bulk, 50.0), None);
    }

    #[test]
    fn requests_begun_on_one_thread_and_ended_on_others_add_up() {
        let s = Stats::default();
        // 64 requests begin here; half end on four other threads, each in its own shard.
        let mut begun: Vec<InFlight<'_>> = (0..64).map(|_| s.begin()).collect();
        assert_eq!(s.activity(), (64, 64));
        let mut moved: Vec<InFlight<'_>> = begun.drain(..32).collect();
        std::thread::scope(|scope| {
            while !moved.is_empty() {
                let mine: Vec<InFlight<'_>> = moved.drain(..8).collect();
                scope.spawn(move || {
                    for f in mine {
                        f.end(
                            OpKind::Write,
                            IoClass::Bulk,
                            4096,
                            Duration::from_micros(7),
                            true,
                        );
                    }
                });
            }
        });
        // One fails, one is dropped (cancelled), the rest end here.
        begun.pop().expect("begun").end(
            OpKind::Read,
            IoClass::Interactive,
            512,
            Duration::ZERO,
            false,
        );
        drop(begun.pop());
        let snap = s.snapshot();
        assert_eq!(snap.writes, 32);
        assert_eq!(snap.bytes_written, 32 * 4096);
        assert_eq!(snap.errors, 1);
        assert_eq!(snap.in_flight, 30);
        assert_eq!(snap.class_completions(IoClass::Bulk), 32);
        assert_eq!(s.activity(), (30, 63));
        drop(begun);
        assert_eq!(s.snapshot().in_flight, 0);
        assert!(format!("{s:?}").contains("writes: 32"));
    }
}
