//! Per-thread shards of counters written on every request: a request counts itself in its
//! worker thread's shard (threads take shards in turn), so two workers write no cache line
//! in common; the sums are read where a decision or a report needs them.

use std::sync::atomic::{AtomicUsize, Ordering};

/// How many shards a sharded counter has.
pub(crate) const SHARDS: usize = 8;

/// The shard the calling thread counts in.
pub(crate) fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

/// A value on cache lines of its own: what one core writes for every request does not
/// evict what another reads (two lines: adjacent-line prefetch pairs them).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_shard_and_threads_take_them_in_turn() {
        let mine = shard();
        assert_eq!(shard(), mine);
        assert!(mine < SHARDS);
        let others: Vec<usize> = (0..SHARDS)
            .map(|_| std::thread::spawn(shard).join().expect("thread"))
            .collect();
        assert!(others.iter().all(|&s| s < SHARDS));
        // Threads created one after another (none in between in this test's own order)
        // take more than one shard between them.
        assert!(others.iter().any(|&s| s != others[0]));
    }

    #[test]
    fn padded_values_sit_on_lines_of_their_own() {
        let a = [Padded(0u8), Padded(1u8)];
        let gap = std::ptr::from_ref(&a[1]) as usize - std::ptr::from_ref(&a[0]) as usize;
        assert_eq!(gap, 128);
        assert_eq!(*a[1], 1);
    }
}
