//! Read buffers kept for reuse: a read handed out as `Bytes` gives its buffer back to the pool
//! when the last reference is dropped, so a warm pool reads with no allocation, no zeroing and
//! no page faults.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;

/// Buffers kept in a pool, and the largest kept.
const KEPT: usize = 64;
const MAX_BYTES: usize = 4 << 20;

/// A pool of read buffers (what it keeps is bounded: 64 buffers of at most 4 MiB).
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    kept: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A kept buffer of `room` bytes or more (at most twice as many), if there is one. Its
    /// bytes are whatever it last held: the caller overwrites what it hands out.
    pub(crate) fn take(&self, room: usize) -> Option<Vec<u8>> {
        let mut kept = self.kept.lock();
        let at = kept
            .iter()
            .position(|b| b.len() >= room && b.len() <= room.saturating_mul(2))?;
        Some(kept.swap_remove(at))
    }

    /// Keeps `v` for a later read, within the pool's bounds.
    pub(crate) fn give_back(&self, v: Vec<u8>) {
        if v.len() <= MAX_BYTES {
            let mut kept = self.kept.lock();
            if kept.len() < KEPT {
                kept.push(v);
            }
        }
    }

    /// `buf[off..off + len]` as `Bytes`; `buf` goes back to `pool` when they are dropped (or
    /// is freed, if the pool is gone).
    pub(crate) fn bytes(pool: &Arc<Self>, buf: Vec<u8>, off: usize, len: usize) -> Bytes {
        Bytes::from_owner(Recycled {
            buf,
            off,
            len,
            pool: Arc::downgrade(pool),
        })
    }
}

/// A read's bytes in a pool buffer.
struct Recycled {
    buf: Vec<u8>,
    off: usize,
    len: usize,
    pool: Weak<BufferPool>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.off..self.off + self.len]
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(p) = self.pool.upgrade() {
            p.give_back(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_their_bytes_are_dropped_within_bounds() {
        let pool = Arc::new(BufferPool::default());
        assert!(pool.take(4096).is_none());
        let b = BufferPool::bytes(&pool, vec![7u8; 8192], 100, 4096);
        assert_eq!(b.len(), 4096);
        let b2 = b.slice(10..20);
        drop(b);
        assert!(pool.take(4096).is_none(), "a slice still holds it");
        assert_eq!(&b2[..], &[7u8; 10]);
        drop(b2);
        // Back: 8 KiB serves 4 KiB (at most twice), not 3 KiB or 16 KiB.
        assert!(pool.take(3000).is_none());
        assert!(pool.take(16384).is_none());
        assert_eq!(pool.take(4096).map(|v| v.len()), Some(8192));
        // Too large, or past the count: not kept.
        pool.give_back(vec![0u8; MAX_BYTES + 1]);
        assert!(pool.take(MAX_BYTES).is_none());
        for _ in 0..KEPT + 5 {
            pool.give_back(vec![0u8; 512]);
        }
        assert_eq!(pool.kept.lock().len(), KEPT);
        // Bytes outliving their pool free their buffer.
        let orphan = BufferPool::bytes(&pool, vec![1u8; 512], 0, 512);
        drop(pool);
        assert_eq!(orphan[0], 1);
    }
}
