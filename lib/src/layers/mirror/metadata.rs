//! A volume's on-disk metadata at work: reading each component's two copies at open,
//! writing new ones when a side is dropped or resynced, and the write-intent bitmap that
//! says where a mirror's sides may differ (the format and the decision of whom to trust are
//! `tagstripe_striping::superblock`'s).
//!
//! The bitmap's rules, as md's: a write's chunks are set durably before the write is
//! issued; a chunk is cleared only after a flush of every side that began when no write to
//! it was in flight and that no write to it has followed, and only while every side is in
//! sync (or, during a resync, once the chunk has been copied). So whatever the crash, every
//! chunk where the sides may differ is set in the copy that wins at the next open.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

use bytes::Bytes;
use tagstripe_striping::Piece;
use tagstripe_striping::superblock::{self, Bitmap, Side, Superblock};

use crate::layers::Striped;
use crate::{BlockDevice, DynBlockDevice, Error, IoOpts, Result};

/// Sectors of one metadata copy.
const COPY_SECTORS: u64 = superblock::SIZE as u64 / 512;
/// Lock shards between writes and the resync's copies (a chunk's shard is its index modulo
/// this).
pub(crate) const SHARDS: usize = 64;

/// Where component `dev`'s metadata area starts (its last sectors).
pub(crate) fn area(dev: &dyn DynBlockDevice) -> u64 {
    dev.info()
        .sectors
        .saturating_sub(superblock::RESERVED_SECTORS)
}

/// The metadata a component carries (see [`crate::VolumeBuilder::metadata`]): its newest
/// valid copy, `None` if it carries none.
///
/// ```
/// use tagstripe::{component_metadata, MemDevice};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// assert_eq!(component_metadata(&MemDevice::new("m", 64)).await?, None);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
///
/// # Errors
/// I/O errors reading the component's last 16 sectors; [`Error::Metadata`] if both copies
/// are there but neither is usable (torn or corrupt).
pub async fn component_metadata(dev: &dyn DynBlockDevice) -> Result<Option<Superblock>> {
    read(dev).await
}

/// The newest valid copy on `dev`, `None` if it carries none.
pub(crate) async fn read(dev: &dyn DynBlockDevice) -> Result<Option<Superblock>> {
    Ok(read_slot(dev).await?.map(|(sb, _)| sb))
}

/// The newest valid copy on `dev` and the slot it is in, `None` if it carries none.
async fn read_slot(dev: &dyn DynBlockDevice) -> Result<Option<(Superblock, usize)>> {
    if dev.info().sectors < superblock::RESERVED_SECTORS {
        return Ok(None);
    }
    let at = area(dev);
    let b = dev
        .read(at, superblock::RESERVED_SECTORS, IoOpts::new())
        .await?;
    let (s0, s1) = b.split_at(superblock::SIZE);
    Ok(superblock::newest_slot(s0, s1)?)
}

/// Writes `sb` to `slot` on `dev`, durably (FUA).
async fn write(dev: &dyn DynBlockDevice, sb: &Superblock, slot: usize) -> Result<()> {
    let at = area(dev) + slot as u64 * COPY_SECTORS;
    dev.write(at, Bytes::from(sb.encode()), IoOpts::new().fua(true))
        .await
}

/// A bitmap of atomic words.
struct Bits(Vec<AtomicU64>);

impl Bits {
    fn new(n: u32) -> Self {
        Self((0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    fn get(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].load(SeqCst) & (1 << (i % 64)) != 0
    }
    fn set(&self, i: u32) {
        self.0[(i / 64) as usize].fetch_or(1 << (i % 64), SeqCst);
    }
    fn clear(&self, i: u32) {
        self.0[(i / 64) as usize].fetch_and(!(1 << (i % 64)), SeqCst);
    }
    fn ones(&self, n: u32) -> impl Iterator<Item = u32> + '_ {
        (0..n).filter(|&i| self.get(i))
    }
}

/// The bitmap's bookkeeping in memory: atomics on the write path, a lock for the rest.
struct Map {
    /// The chunks where the sides may differ: what the next copy written carries.
    map: Bits,
    /// The chunks known to be set on disk (never more than any trusted copy holds).
    durable: Bits,
    /// Writes in flight per chunk.
    inflight: Vec<AtomicU32>,
    /// Per chunk, the flush epoch in which it was last written.
    last: Vec<AtomicU64>,
    /// The present flush epoch.
    epoch: AtomicU64,
    /// How many bits.
    n: u32,
    /// An empty bitmap of this shape (for copies to be written).
    shape: Bitmap,
    /// A resync copies: writes take their chunks' shard locks.
    copying: AtomicBool,
    /// Writes in flight that took no shard lock, counted in a few padded counters (one
    /// shared counter would bounce between the cores on every write).
    unlocked: Vec<Padded>,
    /// Told when the last of those ends while a resync waits.
    drained: tokio::sync::Notify,
}

impl Map {
    fn snapshot(&self) -> Bitmap {
        let mut b = self.shape.clone();
        for i in self.map.ones(self.n) {
            b.set(i);
        }
        b
    }
}

/// A counter on a cache line of its own.
#[repr(align(64))]
struct Padded(AtomicUsize);

/// How many `unlocked` counters.
const COUNTERS: usize = 16;

/// The rest of the bookkeeping, seldom touched.
#[derive(Debug)]
struct Slow {
    /// The event count of the last clearing written.
    cleared: u64,
    /// Bits were cleared since the last copy written.
    clearing: bool,
    /// How far a resync has come (component sector), for the record.
    resync_from: u64,
    /// A resync's progress: sectors copied, sectors to copy.
    progress: Option<(u64, u64)>,
}

/// Keeps a volume's metadata: its identity, the event count last written, and the
/// write-intent bitmap of a mirror.
pub(crate) struct Keeper {
    uuid: [u8; 16],
    fingerprint: u64,
    events: tokio::sync::Mutex<u64>,
    /// The sides' states as last written durably (empty before the first write).
    written: parking_lot::Mutex<Vec<Side>>,
    bits: Map,
    slow: parking_lot::Mutex<Slow>,
    /// Sectors per bit (0: no bitmap, a volume without a mirror).
    chunk: u64,
    /// While a resync copies, writes hold their chunks' shards shared and the resync holds
    /// them exclusively, so no write lands between its read of a chunk and its write of it.
    pub(crate) shards: Vec<tokio::sync::RwLock<()>>,
    /// Per side dropped in this process: the bitmap's last clearing at the time.
    dropped_at: parking_lot::Mutex<Vec<Option<u64>>>,
    /// How long a chunk stays set after its last write, at least.
    delay: std::time::Duration,
    /// Recent flush epochs and when they began (the oldest at most `delay` old, plus one).
    marks: parking_lot::Mutex<std::collections::VecDeque<(u64, tokio::time::Instant)>>,
    /// Per component, the slot of its newest valid copy, if known: the next copy goes to
    /// the other one, so a torn write never takes the last valid copy with it.
    slots: parking_lot::Mutex<Vec<Option<usize>>>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("chunk", &self.chunk)
            .field("dirty", &self.bits.map.ones(self.bits.n).count())
            .field("slow", &*self.slow.lock())
            .finish_non_exhaustive()
    }
}

/// A write's chunks: one run (the common case, no allocation) or a list.
#[derive(Debug)]
enum Chunks {
    Run(std::ops::Range<u32>),
    List(Vec<u32>),
}

impl Chunks {
    fn each(&self, mut f: impl FnMut(u32)) {
        match self {
            Self::Run(r) => r.clone().for_each(f),
            Self::List(l) => l.iter().for_each(|&c| f(c)),
        }
    }
}

/// A write's chunks, held as in flight until dropped (also when the write is cancelled).
#[derive(Debug)]
pub(crate) struct WriteGuard<'a> {
    keeper: &'a Keeper,
    chunks: Chunks,
    /// The counter it is counted in if it took no shard lock (no resync was copying when it
    /// began).
    unlocked: Option<usize>,
    _locks: Vec<tokio::sync::RwLockReadGuard<'a, ()>>,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let m = &self.keeper.bits;
        self.chunks.each(|c| {
            m.inflight[c as usize].fetch_sub(1, SeqCst);
        });
        if let Some(i) = self.unlocked {
            if m.unlocked[i].0.fetch_sub(1, SeqCst) == 1 && m.copying.load(SeqCst) {
                m.drained.notify_waiters();
            }
        }
    }
}

/// Stops writes taking shard locks when dropped (the end of a resync, or its abort).
pub(crate) struct Copying<'a>(&'a Keeper);

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.0.bits.copying.store(false, SeqCst);
    }
}

impl Keeper {
    /// A keeper for a volume `uuid` whose last event was `events`, with `bitmap` (empty
    /// for none) last cleared at event `cleared`.
    pub(crate) fn new(
        uuid: [u8; 16],
        fingerprint: u64,
        events: u64,
        bitmap: Bitmap,
        cleared: u64,
    ) -> Self {
        let n = bitmap.bits();
        let map = Bits::new(n);
        let durable = Bits::new(n);
        for i in bitmap.iter() {
            map.set(i);
            durable.set(i);
        }
        let mut shape = bitmap.clone();
        for i in 0..n {
            shape.clear(i);
        }
        Self {
            uuid,
            fingerprint,
            events: tokio::sync::Mutex::new(events),
            written: parking_lot::Mutex::new(Vec::new()),
            chunk: bitmap.chunk_sectors(),
            bits: Map {
                map,
                durable,
                inflight: (0..n).map(|_| AtomicU32::new(0)).collect(),
                last: (0..n).map(|_| AtomicU64::new(0)).collect(),
                epoch: AtomicU64::new(1),
                n,
                shape,
                copying: AtomicBool::new(false),
                unlocked: (0..COUNTERS).map(|_| Padded(AtomicUsize::new(0))).collect(),
                drained: tokio::sync::Notify::new(),
            },
            slow: parking_lot::Mutex::new(Slow {
                cleared,
                clearing: false,
                resync_from: 0,
                progress: None,
            }),
            shards: (0..SHARDS).map(|_| tokio::sync::RwLock::new(())).collect(),
            dropped_at: parking_lot::Mutex::new(Vec::new()),
            delay: std::time::Duration::ZERO,
            marks: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            slots: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Where each component's newest valid copy is (`None`: nowhere, or not known), one
    /// entry per component (the open reads them all).
    pub(crate) fn with_slots(self, slots: Vec<Option<usize>>) -> Self {
        *self.slots.lock() = slots;
        self
    }

    /// Chunks stay set at least `delay` after their last write.
    pub(crate) fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Whether the volume keeps a write-intent bitmap (a mirror does).
    pub(crate) fn has_bitmap(&self) -> bool {
        self.chunk > 0
    }

    /// Sectors per bit.
    pub(crate) fn chunk_sectors(&self) -> u64 {
        self.chunk
    }

    /// The chunks set now, ascending.
    pub(crate) fn dirty_chunks(&self) -> Vec<u32> {
        self.bits.map.ones(self.bits.n).collect()
    }

    /// Records that side `c` was dropped now: the bitmap covers what it misses until bits
    /// are next cleared.
    pub(crate) fn note_drop(&self, c: usize) {
        let cleared = self.slow.lock().cleared;
        let mut d = self.dropped_at.lock();
        if d.len() <= c {
            d.resize(c + 1, None);
        }
        d[c] = Some(cleared);
    }

    /// Whether the bitmap still holds everything side `c` missed since it was dropped in
    /// this process (no bits cleared since; a side found stale at open is judged there).
    pub(crate) fn covers(&self, c: usize) -> bool {
        let b = self.slow.lock();
        let d = self.dropped_at.lock();
        d.get(c)
            .copied()
            .flatten()
            .is_none_or(|at| at == b.cleared && !b.clearing)
    }

    /// Sets every chunk (a side to be copied whole).
    pub(crate) fn set_all(&self) {
        for i in 0..self.bits.n {
            self.bits.map.set(i);
        }
    }

    /// A resync's progress, if one runs: sectors copied, sectors to copy.
    pub(crate) fn progress(&self) -> Option<(u64, u64)> {
        self.slow.lock().progress
    }

    pub(crate) fn set_progress(&self, p: Option<(u64, u64)>, resync_from: u64) {
        let mut b = self.slow.lock();
        b.progress = p;
        b.resync_from = resync_from;
    }

    /// From now until the guard is dropped writes take shard locks; returns once every
    /// write that began without one has ended.
    pub(crate) async fn start_copying(&self) -> Copying<'_> {
        let m = &self.bits;
        m.copying.store(true, SeqCst);
        loop {
            let drained = m.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if m.unlocked.iter().all(|c| c.0.load(SeqCst) == 0) {
                break;
            }
            drained.await;
        }
        Copying(self)
    }

    /// Whether the sides' states differ from what was last written durably (a persist
    /// that failed): then no write may be acknowledged until it is written.
    pub(crate) fn behind(&self, s: &Striped) -> bool {
        let w = self.written.lock();
        (0..s.components().len()).any(|i| w.get(i).copied().unwrap_or(Side::InSync) != s.side(i))
    }

    /// Marks the chunks of `pieces` as written, durably before returning (one metadata
    /// write serves every write waiting for it); the guard keeps them in flight.
    ///
    /// # Errors
    /// As [`Keeper::persist`]: the write must not be issued.
    pub(crate) async fn begin_write<'a>(
        &'a self,
        s: &Striped,
        pieces: &[Piece],
    ) -> Result<WriteGuard<'a>> {
        let m = &self.bits;
        let of = |p: &Piece| self.bits.shape.chunks_of(p.cblk, p.count);
        let chunks = match pieces {
            [p] => Chunks::Run(of(p)),
            _ => {
                let mut l: Vec<u32> = pieces.iter().flat_map(of).collect();
                l.sort_unstable();
                l.dedup();
                Chunks::List(l)
            }
        };
        // No shard lock unless a resync copies (it waits for the writes that took none).
        let mut first = 0;
        chunks.each(|c| first = c);
        let counter = first as usize % COUNTERS;
        m.unlocked[counter].0.fetch_add(1, SeqCst);
        let unlocked = (!m.copying.load(SeqCst)).then_some(counter);
        let mut locks = Vec::new();
        if unlocked.is_none() {
            if m.unlocked[counter].0.fetch_sub(1, SeqCst) == 1 {
                m.drained.notify_waiters();
            }
            let mut shards = Vec::new();
            chunks.each(|c| shards.push(c as usize % SHARDS));
            shards.sort_unstable();
            shards.dedup();
            for sh in shards {
                locks.push(self.shards[sh].read().await);
            }
        }
        // In flight first, then the epoch: a flush that began before this write counted it
        // in flight, or else this write reads that flush's new epoch, and so is never taken
        // for one the flush covered.
        chunks.each(|c| {
            m.inflight[c as usize].fetch_add(1, SeqCst);
        });
        let epoch = m.epoch.load(SeqCst);
        let mut need = false;
        chunks.each(|c| {
            m.last[c as usize].fetch_max(epoch, SeqCst);
            m.map.set(c);
            need |= !m.durable.get(c);
        });
        let guard = WriteGuard {
            keeper: self,
            chunks,
            unlocked,
            _locks: locks,
        };
        if need {
            let mut events = self.events.lock().await;
            // Another write's record may have carried these chunks already.
            let mut still = false;
            guard.chunks.each(|c| still |= !m.durable.get(c));
            if still {
                self.write_locked(s, &mut events).await?;
            }
        }
        Ok(guard)
    }

    /// Starts a flush for the bitmap: the chunks set with no write in flight now and none
    /// marked for the bitmap's delay (see [`crate::VolumeBuilder::bitmap_delay`]), and the
    /// epoch they must not have been written after. `None` without a bitmap or nothing to
    /// clear.
    pub(crate) fn flush_mark(&self) -> Option<(u64, Vec<u32>)> {
        let epoch = self.bits.epoch.fetch_add(1, SeqCst);
        if !self.has_bitmap() {
            return None;
        }
        // The newest flush epoch that began at least `delay` ago: chunks not written since
        // then have been idle that long (md's bitmap daemon clears after a delay, so a chunk
        // written again and again is not marked again and again).
        let now = tokio::time::Instant::now();
        let horizon = {
            let mut marks = self.marks.lock();
            // Marks a sixteenth of the delay apart at most: a bounded list however often
            // the volume is flushed.
            if marks
                .back()
                .is_none_or(|&(_, at)| now.duration_since(at) >= self.delay / 16)
            {
                marks.push_back((epoch, now));
            }
            while marks.len() > 1 && now.duration_since(marks[1].1) >= self.delay {
                marks.pop_front();
            }
            match marks.front() {
                Some(&(e, at)) if now.duration_since(at) >= self.delay => e,
                _ => return None,
            }
        };
        self.candidates(horizon, None)
    }

    /// As [`flush_mark`](Self::flush_mark), at once (no delay), among `only` if given (a
    /// resync's copied chunks): for a resync's progress and a clean close.
    pub(crate) fn flush_mark_of(&self, only: Option<&[u32]>) -> Option<(u64, Vec<u32>)> {
        let epoch = self.bits.epoch.fetch_add(1, SeqCst);
        if !self.has_bitmap() {
            return None;
        }
        self.candidates(epoch, only)
    }

    fn candidates(&self, epoch: u64, only: Option<&[u32]>) -> Option<(u64, Vec<u32>)> {
        let m = &self.bits;
        let idle = |c: u32| m.map.get(c) && m.inflight[c as usize].load(SeqCst) == 0;
        let chunks: Vec<u32> = match only {
            None => m.map.ones(m.n).filter(|&c| idle(c)).collect(),
            Some(only) => only.iter().copied().filter(|&c| idle(c)).collect(),
        };
        (!chunks.is_empty()).then_some((epoch, chunks))
    }

    /// After a flush (started at `epoch`, see [`flush_mark`](Self::flush_mark)) of every
    /// side: clears `chunks` not written since, and records it. With `in_sync_only`,
    /// nothing is cleared unless every side is in sync. A record that cannot be written
    /// is logged, not returned: the bits stay set on disk, which is safe.
    pub(crate) async fn sweep(&self, s: &Striped, epoch: u64, chunks: &[u32], in_sync_only: bool) {
        let mut events = self.events.lock().await;
        if in_sync_only && (0..s.components().len()).any(|i| !s.readable(i)) {
            return;
        }
        let m = &self.bits;
        let busy = |c: u32| {
            m.inflight[c as usize].load(SeqCst) > 0 || m.last[c as usize].load(SeqCst) > epoch
        };
        let mut any = false;
        for &c in chunks {
            if !m.map.get(c) || busy(c) {
                continue;
            }
            m.map.clear(c);
            m.durable.clear(c);
            // A write that began meanwhile may have seen the bit still durable: then it
            // stays (the disk still holds it, nothing has been written under this lock).
            if busy(c) {
                m.map.set(c);
                m.durable.set(c);
            } else {
                any = true;
            }
        }
        if !any {
            return;
        }
        self.slow.lock().clearing = true;
        if let Err(e) = self.write_locked(s, &mut events).await {
            tracing::warn!(
                target: "tagstripe::mirror",
                volume = %s.info().name,
                error = %e,
                "the bitmap's cleared bits could not be recorded (they stay set)"
            );
        }
    }

    /// Writes the volume's present state (sides, bitmap) to every live component with the
    /// next event count; returns once it is durable everywhere. One at a time.
    ///
    /// # Errors
    /// The first component that cannot take it (named), when it cannot be dropped in its
    /// stead: then the state change is not durable, and the write that caused it must not
    /// be acknowledged.
    pub(crate) async fn persist(&self, s: &Striped) -> Result<()> {
        let mut events = self.events.lock().await;
        self.write_locked(s, &mut events).await
    }

    /// [`persist`](Self::persist) with the event lock held. A mirror side that cannot take
    /// the record while its partner is in sync is dropped (and that is recorded in turn).
    async fn write_locked(&self, s: &Striped, events: &mut u64) -> Result<()> {
        loop {
            match self.write_once(s, events).await {
                Ok(()) => return Ok(()),
                Err(Error::Component {
                    component, source, ..
                }) if s.geometry().is_mirror()
                    && s.try_drop(component, s.partner(component), &source) => {}
                Err(e) => return Err(e),
            }
        }
    }

    async fn write_once(&self, s: &Striped, events: &mut u64) -> Result<()> {
        let next = *events + 1;
        let n = s.components().len();
        let sides: Vec<Side> = (0..n).map(|i| s.side(i)).collect();
        let (cleared, resync_from) = {
            let b = self.slow.lock();
            (if b.clearing { next } else { b.cleared }, b.resync_from)
        };
        let bitmap = self.bits.snapshot();
        // Sides in sync first: a crash part-way leaves them ahead of a side being copied,
        // never the other way round.
        let mut order: Vec<usize> = (0..n).filter(|&i| sides[i] != Side::Failed).collect();
        order.sort_by_key(|&i| sides[i] != Side::InSync);
        for i in order {
            let c = &s.components()[i];
            let sb = Superblock {
                uuid: self.uuid,
                events: next,
                role: i as u32,
                geometry: self.fingerprint,
                data_sectors: area(c.as_ref()),
                dirty: !bitmap.is_clear(),
                sides: sides.clone(),
                resync_from,
                cleared,
                bitmap: bitmap.clone(),
            };
            // Not over the component's newest valid copy: after a torn write that is the
            // slot `events` would name.
            let valid = self.slots.lock().get(i).copied().flatten();
            let slot = valid.map_or(sb.slot(), |v| 1 - v);
            write(c.as_ref(), &sb, slot)
                .await
                .map_err(|e| Error::Component {
                    component: i,
                    volume_sector: None,
                    source: Box::new(e),
                })?;
            if let Some(valid) = self.slots.lock().get_mut(i) {
                *valid = Some(slot);
            }
        }
        *events = next;
        *self.written.lock() = sides;
        // Only what this copy carried is known to be on disk; chunks set since wait for the
        // next one.
        for c in bitmap.iter() {
            self.bits.durable.set(c);
        }
        {
            let mut b = self.slow.lock();
            if b.clearing && cleared == next {
                b.clearing = false;
            }
            b.cleared = cleared;
        }
        tracing::debug!(
            target: "tagstripe::mirror",
            volume = %s.info().name,
            events = next,
            failed = ?s.failed_components(),
            dirty_chunks = bitmap.count(),
            "metadata written"
        );
        Ok(())
    }
}

/// A new volume's identity: 16 bytes from the process's random hashing keys, the time and
/// the process id (no crate for sixteen random bytes).
pub(crate) fn new_uuid() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now);
        h.write_u32(std::process::id());
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// What must be copied once a volume is open: the sides to resync and whether whole.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The sides to copy back, each from its partner.
    pub(crate) targets: Vec<usize>,
    /// Whether every chunk is copied (a blank or long-gone side), not only the bitmap's.
    pub(crate) whole: bool,
}

/// A read-only open: nothing is written to any component, and no keeper is installed (so
/// nothing ever can be). The sides that a read-write open would resync are not read: stale
/// sides, the second half of a new mirror (never copied), and after an unclean stop
/// (a dirty bitmap) the second half, whose dirty chunks may differ from the first's. A side
/// is never taken out if its partner is not in sync: that copy is the only one.
fn open_read_only(s: &Striped, assembly: &superblock::Assembly, assume_clean: bool) {
    let mirror = s.geometry().is_mirror();
    let n = s.components().len();
    let half = n / 2;
    let not_read: Vec<usize> = match assembly {
        superblock::Assembly::New if mirror && !assume_clean => (half..n).collect(),
        superblock::Assembly::New => Vec::new(),
        superblock::Assembly::Existing { stale, bitmap, .. } => {
            let mut v = stale.clone();
            if mirror && stale.is_empty() && !bitmap.is_clear() {
                v.extend(half..n);
            }
            v
        }
    };
    for i in not_read {
        if s.readable(s.partner(i)) {
            s.mark_failed(i);
            tracing::warn!(
                target: "tagstripe::mirror",
                volume = %s.info().name,
                component = i,
                "read-only: the side is not read (stale, or not known to match its partner); \
                 nothing is written to resync it"
            );
        }
    }
}

/// Opens `s`'s metadata: a new volume gets its first copies on every component; an existing
/// one has its stale components marked (never read) and keeps its metadata from then on.
/// Returns what a resync must copy.
///
/// # Errors
/// [`Error::Metadata`] for components that do not belong (named), a stripe or
/// concatenation member that is stale (it has no partner to serve from), or I/O errors on a
/// component (named).
pub(crate) async fn open(
    s: &Striped,
    assume_clean: bool,
    delay: std::time::Duration,
) -> Result<Plan> {
    let mirror = s.geometry().is_mirror();
    let n = s.components().len();
    let (mut found, mut slots, mut unusable) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::new());
    for (i, c) in s.components().iter().enumerate() {
        match read_slot(c.as_ref()).await {
            Ok(f) => {
                slots.push(f.as_ref().map(|&(_, slot)| slot));
                found.push(f.map(|(sb, _)| sb));
            }
            // A mirror side whose copies are both torn or corrupt is treated as blank (stale,
            // copied whole from its partner) if its partner's metadata is sound.
            Err(Error::Metadata(e @ superblock::MetadataError::Checksum { .. })) if mirror => {
                unusable.push((i, e));
                slots.push(None);
                found.push(None);
            }
            Err(e) => {
                return Err(Error::Component {
                    component: i,
                    volume_sector: None,
                    source: Box::new(e),
                });
            }
        }
    }
    for (i, e) in unusable {
        if found[s.partner(i)].is_none() {
            return Err(Error::Component {
                component: i,
                volume_sector: None,
                source: Box::new(Error::Metadata(e)),
            });
        }
        tracing::warn!(
            target: "tagstripe::mirror",
            volume = %s.info().name,
            component = i,
            error = %e,
            "both metadata copies are unusable: the side is stale, copied back from its partner"
        );
    }
    let fingerprint = superblock::fingerprint(s.geometry());
    let half = s.components().len() / 2;
    let largest = s
        .components()
        .iter()
        .map(|c| area(c.as_ref()))
        .max()
        .unwrap_or(0);
    let fresh = || {
        if mirror {
            Bitmap::for_sectors(largest)
        } else {
            Bitmap::none()
        }
    };
    let mut plan = Plan::default();
    let assembly = superblock::assemble(&found, fingerprint)?;
    if s.info().read_only {
        open_read_only(s, &assembly, assume_clean);
        return Ok(plan);
    }
    match assembly {
        superblock::Assembly::New => {
            s.keep(
                Keeper::new(new_uuid(), fingerprint, 0, fresh(), 0)
                    .with_delay(delay)
                    .with_slots(slots),
            );
            if mirror && !assume_clean {
                // A new mirror: the second half copied from the first (written from now
                // on, and given the volume's metadata, but not read until copied).
                for i in half..s.components().len() {
                    s.set_side(i, Side::Resyncing);
                }
                plan.targets = (half..s.components().len()).collect();
                plan.whole = true;
            }
        }
        superblock::Assembly::Existing {
            uuid,
            events,
            stale,
            whole,
            bitmap,
            cleared,
        } => {
            if !stale.is_empty() && !mirror {
                return Err(Error::Metadata(superblock::MetadataError::Invalid {
                    field: "sides",
                    what: format!(
                        "components {stale:?} are stale, and a volume without a mirror has no other copy"
                    ),
                }));
            }
            for &i in &stale {
                s.mark_failed(i);
                tracing::warn!(
                    target: "tagstripe::mirror",
                    volume = %s.info().name,
                    component = i,
                    "component is stale (its metadata is behind the volume's): not read"
                );
                s.emit(crate::MirrorEvent::Stale { component: i });
            }
            // Metadata from before bitmaps (or of another bitmap size): nothing it says of
            // the stale sides can be trusted, they are copied whole.
            let expect = fresh();
            let usable =
                bitmap.chunk_sectors() == expect.chunk_sectors() && bitmap.bits() == expect.bits();
            let bitmap = if usable { bitmap } else { expect };
            let clean = bitmap.is_clear();
            s.keep(
                Keeper::new(uuid, fingerprint, events, bitmap, cleared)
                    .with_delay(delay)
                    .with_slots(slots),
            );
            if mirror {
                plan.targets = stale.clone();
                plan.whole = !whole.is_empty() || (!usable && !stale.is_empty());
                if stale.is_empty() && !clean {
                    // Writes were in flight when the volume stopped: where the bitmap says,
                    // the second half is copied again from the first.
                    plan.targets = (half..s.components().len()).collect();
                }
            }
        }
    }
    // Write the state found (or the new volume's first copies) before serving. A mirror
    // side that cannot take it is dropped (recorded on its partner) as a failed write would
    // be; with no side left to record on, the volume does not open.
    let Some(k) = s.keeper() else {
        return Ok(plan);
    };
    if plan.whole {
        k.set_all();
    }
    k.persist(s).await?;
    plan.targets.retain(|&t| s.readable(s.partner(t)));
    Ok(plan)
}
