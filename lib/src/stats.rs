//! Per-device statistics in iostat's terms, cheap enough to stay on (a few relaxed atomic
//! adds per request).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const BUCKETS: usize = 48;

/// Counters for one device or volume.
#[derive(Debug)]
pub struct Stats {
    ops: [AtomicU64; 4],
    bytes: [AtomicU64; 2],
    errors: AtomicU64,
    in_flight: AtomicU64,
    latency: [AtomicU64; BUCKETS],
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            ops: Default::default(),
            bytes: Default::default(),
            errors: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
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
    pub(crate) fn end(mut self, op: OpKind, bytes: u64, latency: Duration, ok: bool) {
        self.ended = true;
        self.stats.end(op, bytes, latency, ok);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.stats.in_flight.fetch_sub(1, Relaxed);
        }
    }
}

impl Stats {
    pub(crate) fn begin(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight {
            stats: self,
            ended: false,
        }
    }

    fn end(&self, op: OpKind, bytes: u64, latency: Duration, ok: bool) {
        self.in_flight.fetch_sub(1, Relaxed);
        if !ok {
            self.errors.fetch_add(1, Relaxed);
            return;
        }
        self.ops[op as usize].fetch_add(1, Relaxed);
        if matches!(op, OpKind::Read | OpKind::Write) {
            self.bytes[op as usize].fetch_add(bytes, Relaxed);
        }
        // Bucket b holds latencies in [2^b, 2^(b+1)) nanoseconds.
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        let b = (63 - ns.leading_zeros() as usize).min(BUCKETS - 1);
        self.latency[b].fetch_add(1, Relaxed);
    }

    /// The counters now.
    ///
    /// ```
    /// let s = tagstripe::Stats::default();
    /// assert_eq!(s.snapshot().transfers(), 0);
    /// ```
    #[must_use]
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            reads: self.ops[0].load(Relaxed),
            writes: self.ops[1].load(Relaxed),
            flushes: self.ops[2].load(Relaxed),
            discards: self.ops[3].load(Relaxed),
            bytes_read: self.bytes[0].load(Relaxed),
            bytes_written: self.bytes[1].load(Relaxed),
            errors: self.errors.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            latency: std::array::from_fn(|i| self.latency[i].load(Relaxed)),
        }
    }
}

/// A copy of the counters; differences of two give rates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    latency: [u64; BUCKETS],
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

    /// The latency below which a fraction `p` of completed requests fell, to within a factor
    /// of two (power-of-two buckets); `None` before any completion.
    #[must_use]
    pub fn latency_percentile(&self, p: f64) -> Option<Duration> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((p.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(Duration::from_nanos(2u64.saturating_pow(b as u32 + 1)));
            }
        }
        None
    }
}
