//! Tenants sharing a device: [`Tenants`] holds the requests of every [`Tenant`] in the pure
//! [`TenantScheduler`](tagstripe_scheduler::TenantScheduler) (mClock's reservations,
//! weights and limits) and lets through only as many as keep the device busy: requests wait
//! here, where the policy decides, not in the device's queue, where every policy is FIFO.
//!
//! How many go through is adaptive (the device's own queue as short as it can be without
//! losing throughput): a hill climb on the throughput of windows of 256 completions, which
//! settles where one more request at the device stops paying (see `Depth`). The depth is
//! reported in [`Tenants::depth`]. A tenant's interactive request is let through past the
//! depth (up to the device's tags; reservations, weights and limits still apply): below, a
//! fair queue (a [`crate::Volume`]'s, or `serve`'s over a shared component) serves it ahead
//! of the bulk it finds there, where held here it would wait for a bulk write to finish.
//!
//! A tenant busy alone that is owed no reservation and held to no limit goes past the
//! scheduler (whose choice among one tenant is that tenant's next request) and past the
//! depth (the device's own tags bound it): its requests count themselves in their worker's
//! shard of its counts and take no shared lock, so a tenant alone costs little more than the
//! device without `Tenants`. When another tenant comes, both are tagged from virtual time, as
//! mClock tags a tenant back from idle.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};

use crate::shard::{Padded, SHARDS, shard};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tagstripe_scheduler::{Idle, IoClass, Nanos, TenantCounters, TenantId, TenantScheduler};
pub use tagstripe_scheduler::{TenantError, TenantSpec};
use tokio::sync::oneshot;

use crate::stats::{OpKind, Tally};
use crate::{BlockDevice, DeviceInfo, Error, Extent, IoOpts, Result, StatsSnapshot, Zeroes};

/// The first depth, before any completion was measured.
const START_DEPTH: usize = 8;
/// The most requests let through at once (or the device's tags, if fewer).
const MAX_DEPTH: usize = 128;
/// Completions a depth window counts.
const WINDOW: u32 = 256;
/// How long a tenant counts as busy after it last sent a request (ns). While one tenant
/// alone is busy no other one waits on the device's queue, so its requests get every tag
/// the device has (work-conserving: through a depth cut for sharing, a disk that reorders
/// by position lost 15-30% of a lone tenant's random reads on the disk models).
const BUSY_FOR: Nanos = 100_000_000;

/// What [`Tenants::stats`] reports of a tenant.
#[derive(Clone, Debug)]
pub struct TenantStats {
    /// Its name.
    pub name: String,
    /// What it is owed and allowed now.
    pub spec: TenantSpec,
    /// Its requests' counts, bytes and latencies (from submission, the wait here included).
    pub io: StatsSnapshot,
    /// Served to meet its reservation, by weight, bytes, time held back by its limit.
    pub served: TenantCounters,
}

/// The adaptive depth: a hill climb on throughput. Each window of 256 completions with the
/// depth in full use is compared with the last: 3% more throughput, one more step the same
/// way; 3% less, turn around; about the same, one slot less (no gain, so a shorter queue at
/// the device). It settles at the knee where more requests at the device stop paying. (A
/// climb that moved up whenever a window fell 3% under the best one seen was tried: through
/// NBD, whose windows vary by more than that, it climbed to the device's every tag and the
/// weights were lost.)
#[derive(Debug)]
struct Depth {
    cur: usize,
    /// The most the device takes (its tags).
    max: usize,
    /// +1 or -1: the way the last step went.
    dir: isize,
    count: u32,
    since: Instant,
    last: f64,
    full: bool,
    /// Restarted: the next completion opens a new window.
    stale: bool,
}

impl Depth {
    /// The window so far was not at this depth: the next completion starts a new one.
    fn restart(&mut self) {
        self.stale = true;
    }

    fn completed(&mut self) {
        if self.stale {
            self.stale = false;
            self.count = 0;
            self.since = Instant::now();
            self.full = false;
            return;
        }
        self.count += 1;
        if self.count < WINDOW {
            return;
        }
        let secs = self.since.elapsed().as_secs_f64().max(1e-9);
        let x = f64::from(self.count) / secs;
        if self.full {
            if x > self.last * 1.03 {
                // Better: on the same way.
            } else if x < self.last * 0.97 {
                self.dir = -self.dir;
            } else {
                self.dir = -1;
            }
            self.cur = self.cur.saturating_add_signed(self.dir).clamp(2, self.max);
            self.last = x;
        }
        self.count = 0;
        self.since = Instant::now();
        self.full = false;
    }
}

#[derive(Debug)]
struct State<D: BlockDevice + 'static> {
    sched: TenantScheduler<u64>,
    /// Each waiting request's way to get its slot (the slot itself travels, so a request
    /// cancelled after it was let through gives it back when dropped).
    waiters: HashMap<u64, oneshot::Sender<Admitted<D>>>,
    next_ticket: u64,
    /// Interactive requests let through past the depth, at the device now (not counted in
    /// [`Shared::in_flight`], nor in the depth's windows).
    past: usize,
    depth: Depth,
    /// A wake-up is set for this time (a limit holds every tenant with work back).
    timer: Option<Nanos>,
    /// Each tenant's counts (its handle holds the same).
    cells: Vec<Arc<Cell>>,
}

/// One shard of a tenant's counts.
#[derive(Debug, Default)]
struct CellShard {
    /// Its requests submitted minus those done, as this shard saw them (below zero where
    /// requests ended on another thread than the one that sent them; the sum is the count).
    outstanding: AtomicIsize,
    /// When it last sent a request, on the scheduler's clock, plus one (0: never).
    last_sent: AtomicU64,
    /// What ended here (a lock taken by this shard's thread alone, but for `stats`).
    counts: Mutex<Counts>,
}

/// What a shard counts when requests end.
#[derive(Debug, Default)]
struct Counts {
    /// Its requests' counters (allocated at the shard's first request).
    tally: Option<Tally>,
    /// Requests let through without the scheduler (the tenant busy alone, owed no
    /// reservation and held to no limit: see [`Flags::solo`]), and their bytes.
    solo_served: u64,
    solo_bytes: u64,
}

/// A tenant's counts, kept apart from the shared state in shards: a request of a tenant
/// busy alone, with nothing waiting, is let through and ends without the shared lock.
#[derive(Debug, Default)]
struct Cell {
    shards: [Padded<CellShard>; SHARDS],
}

impl Cell {
    /// A request sent at `now`, counted in shard `k`.
    fn sent(&self, k: usize, now: Nanos) {
        let s = &self.shards[k];
        s.outstanding.fetch_add(1, Ordering::Relaxed);
        s.last_sent.store(now.saturating_add(1), Ordering::Relaxed);
    }

    /// One of its requests is done here (served, failed or given up), counted in shard `k`.
    fn finished(&self, k: usize) {
        self.shards[k].outstanding.fetch_sub(1, Ordering::Relaxed);
    }

    /// Its requests waiting here or at the device.
    fn outstanding(&self) -> usize {
        let n: isize = self
            .shards
            .iter()
            .map(|s| s.outstanding.load(Ordering::Relaxed))
            .sum();
        n.max(0).unsigned_abs()
    }

    /// When it last sent a request.
    fn last_sent(&self) -> Option<Nanos> {
        let t = self
            .shards
            .iter()
            .map(|s| s.last_sent.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        t.checked_sub(1)
    }

    /// Busy: requests waiting or at the device, or one sent in the last [`BUSY_FOR`].
    fn busy(&self, now: Nanos) -> bool {
        self.outstanding() > 0
            || self
                .last_sent()
                .is_some_and(|t| now.saturating_sub(t) < BUSY_FOR)
    }

    /// Counts in shard `k` how a request ended (`how`: none for one given up), and (`solo`)
    /// the bytes of one let through without the scheduler.
    fn ended(&self, k: usize, how: Option<(&Ended, Nanos)>, solo: Option<u64>) {
        let mut c = self.shards[k].counts.lock();
        if let Some((e, latency)) = how {
            c.tally
                .get_or_insert_with(Tally::default)
                .record(e.op, e.class, e.bytes, latency, e.ok);
        }
        if let Some(bytes) = solo {
            c.solo_served += 1;
            c.solo_bytes += bytes;
        }
    }

    /// Its figures: every shard's tally, merged.
    fn figures(&self) -> StatsSnapshot {
        let mut all = Tally::default();
        for s in &self.shards {
            if let Some(t) = &s.counts.lock().tally {
                all.add(t);
            }
        }
        all.snapshot(self.outstanding() as u64)
    }

    /// Requests let through without the scheduler, and their bytes.
    fn solo(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(n, b), s| {
            let c = s.counts.lock();
            (n + c.solo_served, b + c.solo_bytes)
        })
    }
}

impl<D: BlockDevice + 'static> State<D> {
    /// The busy tenants at `now`: `Some(None)` none, `Some(Some(id))` `id` alone, `None`
    /// several.
    fn busy(&self, now: Nanos) -> Option<Option<TenantId>> {
        let mut busy = self.cells.iter().enumerate().filter(|(_, c)| c.busy(now));
        match (busy.next(), busy.next()) {
            (None, _) => Some(None),
            (Some((i, _)), None) => Some(Some(TenantId(i))),
            _ => None,
        }
    }

    /// How many requests may be at the device: every tag while at most one tenant is busy,
    /// else the adaptive depth.
    fn cap_if(&self, alone: bool) -> usize {
        if alone {
            self.depth.max
        } else {
            self.depth.cur
        }
    }

    /// One of `tenant`'s requests is done here (served, failed or given up).
    fn finished(&self, tenant: TenantId) {
        if let Some(c) = self.cells.get(tenant.0) {
            c.finished(shard());
        }
    }
}

/// What the last look at the state found, read by requests without the lock.
#[derive(Debug, Default)]
struct Flags {
    /// At most one tenant busy: a completion has no depth window to count.
    alone: AtomicBool,
    /// The one tenant busy, plus one (0: none, or several), if it is owed no reservation
    /// and held to no limit: its requests go through without the scheduler (whose choice
    /// among one tenant is that tenant's next request). The scheduler sees its tags as
    /// those of a tenant that was idle: when another tenant comes, both start from
    /// virtual time, mClock's rule for a tenant back from idle (no credit, no penalty).
    solo: AtomicUsize,
}

#[derive(Debug)]
struct Shared<D: BlockDevice + 'static> {
    dev: D,
    epoch: Instant,
    state: Padded<Mutex<State<D>>>,
    /// Requests let through within the depth, at the device now, counted in the shard of
    /// the thread that let each through or ended it (the sum is the count). Raised only
    /// under the state lock (where the depth is checked) or by a tenant busy alone; lowered
    /// by a completion without the lock.
    in_flight: [Padded<AtomicIsize>; SHARDS],
    /// Requests waiting in the scheduler for a slot (`State::waiters`' length). Raised
    /// before `in_flight` is read, read after it is lowered, all sequentially consistent:
    /// a completion that finds none cannot miss a request that found no slot.
    waiting: Padded<AtomicUsize>,
    flags: Padded<Flags>,
    /// The tenants' names, in the order they were added (a tenant's id is its index).
    tenants: Mutex<Vec<String>>,
}

/// A device (or volume) shared by tenants, each owed a reservation, a share by weight and
/// held to a limit ([`TenantSpec`]); each tenant's requests go through its own [`Tenant`]
/// handle, a [`BlockDevice`] of its own.
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, TenantSpec, Tenants};
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let shared = Tenants::new(MemDevice::new("disk", 8192));
/// let vm = shared.add("vm", TenantSpec::new().reserve_iops(500.0))?;
/// let backup = shared.add("backup", TenantSpec::new().weight(1).limit_bps(50e6))?;
/// vm.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new()).await?;
/// assert_eq!(backup.read(0, 8, IoOpts::new()).await?[0], 1);
/// // Specs change at run time.
/// shared.set("backup", TenantSpec::new().weight(1).limit_bps(20e6))?;
/// let stats = shared.stats();
/// assert_eq!((stats[0].name.as_str(), stats[0].io.writes), ("vm", 1));
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Tenants<D: BlockDevice + 'static> {
    shared: Arc<Shared<D>>,
}

impl<D: BlockDevice + 'static> Clone for Tenants<D> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<D: BlockDevice + 'static> Tenants<D> {
    /// `dev`, with no tenants yet.
    pub fn new(dev: D) -> Self {
        let tags = dev.info().limits.max_tags as usize;
        let max = if tags == 0 {
            MAX_DEPTH
        } else {
            tags.clamp(2, MAX_DEPTH)
        };
        Self {
            shared: Arc::new(Shared {
                dev,
                epoch: Instant::now(),
                state: Padded(Mutex::new(State {
                    sched: TenantScheduler::new(),
                    waiters: HashMap::new(),
                    next_ticket: 0,
                    past: 0,
                    depth: Depth {
                        cur: START_DEPTH.min(max),
                        max,
                        dir: 1,
                        count: 0,
                        since: Instant::now(),
                        last: 0.0,
                        full: false,
                        stale: false,
                    },
                    timer: None,
                    cells: Vec::new(),
                })),
                in_flight: Default::default(),
                waiting: Padded::default(),
                flags: Padded::default(),
                tenants: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Adds tenant `name` with `spec`; its requests go through the handle returned.
    ///
    /// # Errors
    /// [`Error::Tenant`] for a bad spec or a name already taken.
    pub fn add(&self, name: &str, spec: TenantSpec) -> Result<Tenant<D>> {
        let bad = |e: TenantError| Error::Tenant {
            tenant: name.to_owned(),
            what: e.to_string(),
        };
        let mut names = self.shared.tenants.lock();
        if names.iter().any(|n| n == name) {
            return Err(Error::Tenant {
                tenant: name.to_owned(),
                what: "a tenant of that name exists already".into(),
            });
        }
        let cell = Arc::new(Cell::default());
        let id = {
            let mut st = self.shared.state.lock();
            let id = st.sched.add(spec).map_err(bad)?;
            st.cells.push(Arc::clone(&cell));
            id
        };
        names.push(name.to_owned());
        let mut info = self.shared.dev.info().clone();
        info.name = format!("{}:{name}", info.name);
        Ok(Tenant {
            shared: Arc::clone(&self.shared),
            id,
            cell,
            info,
        })
    }

    /// Changes tenant `name`'s spec, at once.
    ///
    /// # Errors
    /// [`Error::Tenant`] for a bad spec or an unknown name.
    pub fn set(&self, name: &str, spec: TenantSpec) -> Result<()> {
        let id = self.id(name)?;
        let mut st = self.shared.state.lock();
        st.sched.set(id, spec).map_err(|e| Error::Tenant {
            tenant: name.to_owned(),
            what: e.to_string(),
        })?;
        // Its requests go through the scheduler until the state is looked at again (a limit
        // or a reservation set now holds from its next request).
        self.shared.flags.solo.store(0, Ordering::SeqCst);
        self.shared.pump(&mut st);
        Ok(())
    }

    fn id(&self, name: &str) -> Result<TenantId> {
        self.shared
            .tenants
            .lock()
            .iter()
            .position(|n| n == name)
            .map(TenantId)
            .ok_or_else(|| Error::Tenant {
                tenant: name.to_owned(),
                what: "no such tenant".into(),
            })
    }

    /// Every tenant's figures, in the order they were added.
    #[must_use]
    pub fn stats(&self) -> Vec<TenantStats> {
        let names = self.shared.tenants.lock();
        let st = self.shared.state.lock();
        // A tenant's name and cell are added together, under both locks.
        names
            .iter()
            .zip(&st.cells)
            .enumerate()
            .map(|(i, (name, cell))| {
                let mut served = st.sched.counters(TenantId(i)).unwrap_or_default();
                let (n, bytes) = cell.solo();
                served.served += n;
                served.bytes += bytes;
                TenantStats {
                    name: name.clone(),
                    spec: st.sched.spec(TenantId(i)).unwrap_or_default(),
                    io: cell.figures(),
                    served,
                }
            })
            .collect()
    }

    /// How many requests are let through to the device at once now while several tenants
    /// are busy (adaptive; a tenant busy alone gets every tag the device has).
    #[must_use]
    pub fn depth(&self) -> usize {
        self.shared.state.lock().depth.cur
    }

    /// The shared device.
    pub fn device(&self) -> &D {
        &self.shared.dev
    }
}

impl<D: BlockDevice + 'static> Shared<D> {
    fn now(&self) -> Nanos {
        self.at(Instant::now())
    }

    /// `t` on the scheduler's clock.
    fn at(&self, t: Instant) -> Nanos {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Requests at the device within the depth.
    fn in_flight(&self) -> usize {
        let n: isize = self
            .in_flight
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .sum();
        n.max(0).unsigned_abs()
    }

    /// Looks at who is busy at `now`: sets the flags requests read without the lock, and
    /// restarts the depth's window while at most one tenant is busy (the depth is climbed
    /// only where it is used: with tenants sharing). Returns whether at most one is.
    fn look(&self, st: &mut State<D>, now: Nanos) -> bool {
        let busy = st.busy(now);
        // (Not while requests wait here: they go first, in the scheduler's order.)
        let solo = match busy {
            Some(Some(id))
                if st.waiters.is_empty()
                    && st
                        .sched
                        .spec(id)
                        .is_some_and(|s| !s.has_limit() && !s.has_reservation()) =>
            {
                id.0 + 1
            }
            _ => 0,
        };
        self.flags.solo.store(solo, Ordering::SeqCst);
        let alone = busy.is_some();
        self.flags.alone.store(alone, Ordering::Relaxed);
        if alone {
            st.depth.restart();
        }
        alone
    }

    /// Lets requests through while the depth allows; sets a wake-up when limits hold every
    /// waiting tenant back.
    fn pump(self: &Arc<Self>, st: &mut State<D>) {
        let now = self.now();
        let alone = self.look(st, now);
        let cap = st.cap_if(alone);
        self.pump_at(st, now, cap);
    }

    /// The scheduler chose request `req` of `tenant`: its slot goes to its waiter.
    /// `past`: let through past the depth (an interactive request).
    fn deliver(self: &Arc<Self>, st: &mut State<D>, tenant: TenantId, req: u64, past: bool) {
        if let Some(tx) = st.waiters.remove(&req) {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            self.take_slot(st, past);
            let slot = Admitted {
                shared: Some(Arc::clone(self)),
                tenant,
                past,
            };
            if let Err(mut slot) = tx.send(slot) {
                // Cancelled while it waited: the slot goes back at once.
                slot.shared = None;
                self.give_slot(st, past);
                st.finished(tenant);
            }
        }
    }

    /// A request takes a slot: `past` the depth, or within it.
    fn take_slot(&self, st: &mut State<D>, past: bool) {
        if past {
            st.past += 1;
        } else {
            self.in_flight[shard()].fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A slot taken with [`take_slot`](Self::take_slot) comes back.
    fn give_slot(&self, st: &mut State<D>, past: bool) {
        if past {
            st.past = st.past.saturating_sub(1);
        } else {
            self.in_flight[shard()].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// [`pump`](Self::pump) at `now`, with up to `cap` requests at the device.
    fn pump_at(self: &Arc<Self>, st: &mut State<D>, now: Nanos, cap: usize) {
        while self.in_flight() < cap {
            match st.sched.next(now) {
                Ok(d) => self.deliver(st, d.tenant, d.req, false),
                Err(Idle::Empty) => break,
                Err(Idle::Until(t)) => {
                    if st.timer.is_none_or(|at| at > t) {
                        st.timer = Some(t);
                        let me = Arc::clone(self);
                        let wait = Duration::from_nanos(t.saturating_sub(now));
                        if let Ok(rt) = tokio::runtime::Handle::try_current() {
                            rt.spawn(async move {
                                tokio::time::sleep(wait).await;
                                let mut st = me.state.lock();
                                if st.timer == Some(t) {
                                    st.timer = None;
                                }
                                me.pump(&mut st);
                            });
                        }
                    }
                    break;
                }
            }
        }
        // At the depth: a tenant whose next request is interactive still sends it, up to
        // the device's tags. Below, the fair queue (a volume's, or `serve`'s over a shared
        // component) serves it ahead of the bulk there; held here, it would wait for a bulk
        // write to finish first (through NBD on a loop device: a reader's p50 1.2 ms beside
        // a 2 GB/s writer, against 0.3 ms let through).
        loop {
            let n = self.in_flight();
            if n < cap || n + st.past >= st.depth.max {
                break;
            }
            match st.sched.next_interactive(now) {
                Ok(d) => self.deliver(st, d.tenant, d.req, true),
                // Held by a limit, or none: the next completion pumps again.
                Err(_) => break,
            }
        }
        if self.in_flight() >= st.depth.cur {
            st.depth.full = true;
        }
    }

    /// A request of the tenant counted in `cell` left the device; `ended`: how it went,
    /// counted in the tenant's figures (none for a request whose caller gave up).
    ///
    /// With nothing waiting and at most one tenant busy (the common case of a tenant busy
    /// on its own) it takes no shared lock and writes no cache line another worker writes:
    /// its slot and its counts are in this thread's shards. Otherwise the depth's window
    /// counts it and the freed slot goes to the next request.
    fn done(self: &Arc<Self>, cell: &Cell, ended: Option<Ended>, past: bool, solo: Option<u64>) {
        let now = self.now();
        let k = shard();
        let how = ended.map(|e| (e, now.saturating_sub(self.at(e.t0))));
        cell.ended(k, how.as_ref().map(|(e, l)| (e, *l)), solo);
        cell.finished(k);
        if !past {
            self.in_flight[k].fetch_sub(1, Ordering::SeqCst);
            if self.waiting.load(Ordering::SeqCst) == 0 && self.flags.alone.load(Ordering::Relaxed)
            {
                return;
            }
        }
        let mut st = self.state.lock();
        if past {
            st.past = st.past.saturating_sub(1);
        }
        let alone = self.look(&mut st, now);
        if !alone && !past {
            st.depth.completed();
        }
        let cap = st.cap_if(alone);
        self.pump_at(&mut st, now, cap);
    }
}

/// A request waiting for its slot: dropped (its caller gave up), it leaves the scheduler.
struct Waiting<'a, D: BlockDevice + 'static> {
    shared: &'a Arc<Shared<D>>,
    tenant: TenantId,
    ticket: u64,
}

impl<D: BlockDevice + 'static> Drop for Waiting<'_, D> {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock();
        if st.waiters.remove(&self.ticket).is_some() {
            self.shared.waiting.fetch_sub(1, Ordering::SeqCst);
            st.sched.cancel(self.tenant, &self.ticket);
            st.finished(self.tenant);
        }
    }
}

/// How a request ended, for its tenant's figures.
#[derive(Clone, Copy, Debug)]
struct Ended {
    op: OpKind,
    class: IoClass,
    bytes: u64,
    ok: bool,
    /// When it was submitted (its latency includes its wait here).
    t0: Instant,
}

/// A slot handed to a request that waited for it: dropped before it reached its request
/// (the request cancelled), it frees the slot.
#[derive(Debug)]
struct Admitted<D: BlockDevice + 'static> {
    shared: Option<Arc<Shared<D>>>,
    tenant: TenantId,
    /// Let through past the depth (counted in `past`, not `in_flight`).
    past: bool,
}

impl<D: BlockDevice + 'static> Drop for Admitted<D> {
    fn drop(&mut self) {
        if let Some(s) = self.shared.take() {
            let cell = s.state.lock().cells.get(self.tenant.0).cloned();
            if let Some(cell) = cell {
                s.done(&cell, None, self.past, None);
            }
        }
    }
}

/// A request's slot at the device, held while it runs: [`finish`](Self::finish)ed, or
/// dropped (the request cancelled), it frees the slot.
struct Slot<'a, D: BlockDevice + 'static> {
    shared: &'a Arc<Shared<D>>,
    cell: &'a Cell,
    past: bool,
    /// Let through without the scheduler: its bytes (counted as served when it ends).
    solo: Option<u64>,
    live: bool,
}

impl<D: BlockDevice + 'static> Slot<'_, D> {
    /// Counts a request's result `r` (`op`, `bytes` of it in `class`, submitted at `t0`)
    /// in its tenant's stats as the slot is freed, and returns it.
    fn end<T>(
        self,
        op: OpKind,
        class: IoClass,
        bytes: u64,
        t0: Instant,
        r: Result<T>,
    ) -> Result<T> {
        let ok = r.is_ok();
        self.finish(Ended {
            op,
            class,
            bytes,
            ok,
            t0,
        });
        r
    }

    /// The request is done: the slot freed and how it went counted.
    fn finish(mut self, ended: Ended) {
        self.live = false;
        self.shared
            .done(self.cell, Some(ended), self.past, self.solo);
    }
}

impl<D: BlockDevice + 'static> Drop for Slot<'_, D> {
    fn drop(&mut self) {
        if self.live {
            self.shared.done(self.cell, None, self.past, self.solo);
        }
    }
}

/// One tenant's handle on a [`Tenants`] device: a [`BlockDevice`] whose reads, writes,
/// write-zeroes and discards are that tenant's (flushes and allocation queries go straight
/// through).
#[derive(Debug)]
pub struct Tenant<D: BlockDevice + 'static> {
    shared: Arc<Shared<D>>,
    id: TenantId,
    /// Its counts (the state holds the same).
    cell: Arc<Cell>,
    info: DeviceInfo,
}

impl<D: BlockDevice + 'static> Tenant<D> {
    /// A slot for a request of `bytes` at `t0`: at once while this tenant is busy alone
    /// and owed no reservation nor held to a limit, else when the scheduler lets it through.
    async fn admit(&self, bytes: u64, class: IoClass, t0: Instant) -> Result<Slot<'_, D>> {
        let shared = &self.shared;
        let now = shared.at(t0);
        let slot = |past, solo| Slot {
            shared,
            cell: &self.cell,
            past,
            solo,
            live: true,
        };
        let k = shard();
        if shared.flags.solo.load(Ordering::SeqCst) == self.id.0 + 1 {
            self.cell.sent(k, now);
            shared.in_flight[k].fetch_add(1, Ordering::SeqCst);
            return Ok(slot(false, Some(bytes)));
        }
        let (rx, ticket) = {
            let mut st = shared.state.lock();
            let ticket = st.next_ticket;
            st.next_ticket += 1;
            if st.sched.submit(now, self.id, ticket, bytes, class).is_err() {
                return Err(Error::Closed {
                    device: self.info.name.clone(),
                });
            }
            self.cell.sent(k, now);
            let alone = shared.look(&mut st, now);
            let cap = st.cap_if(alone);
            // Nothing else waits and there is room: through at once (the scheduler still
            // tags and counts it), without a hand-off.
            if st.sched.len() == 1 && shared.in_flight() < cap {
                match st.sched.next(now) {
                    Ok(d) if d.req == ticket => {
                        shared.in_flight[k].fetch_add(1, Ordering::SeqCst);
                        if shared.in_flight() >= st.depth.cur {
                            st.depth.full = true;
                        }
                        return Ok(slot(false, None));
                    }
                    // Another's (none should wait when this one is alone, but if one
                    // did it has a waiter): it gets its slot.
                    Ok(d) => shared.deliver(&mut st, d.tenant, d.req, false),
                    // Held by its limit: it waits below, the pump sets the wake-up.
                    Err(_) => {}
                }
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.insert(ticket, tx);
            // Counted waiting before the depth is read again (see `Shared::waiting`).
            shared.waiting.fetch_add(1, Ordering::SeqCst);
            shared.pump_at(&mut st, now, cap);
            (rx, ticket)
        };
        // Given up while waiting (the caller's future dropped): out of the scheduler, so it
        // costs its tenant nothing.
        let waiting = Waiting {
            shared,
            tenant: self.id,
            ticket,
        };
        let got = rx.await;
        std::mem::forget(waiting);
        let mut admitted = got.map_err(|_| Error::Closed {
            device: self.info.name.clone(),
        })?;
        // The slot is this request's now: freed by the `Slot`.
        admitted.shared = None;
        Ok(slot(admitted.past, None))
    }

    /// Admits one of this tenant's requests (`bytes` of it, in `class`): its slot, and when
    /// it was submitted. The caller then awaits the request in place and ends it with
    /// [`Slot::end`] (no wrapper that takes the request's future: a future passed by value
    /// into an `async fn` is copied whole into its state and again into its await).
    async fn enter(&self, bytes: u64, class: IoClass) -> Result<(Slot<'_, D>, Instant)> {
        let t0 = Instant::now();
        Ok((self.admit(bytes, class, t0).await?, t0))
    }
}

impl<D: BlockDevice + 'static> BlockDevice for Tenant<D> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        let bytes = sectors.saturating_mul(512);
        let (slot, t0) = self.enter(bytes, opts.class).await?;
        let r = self.shared.dev.read(start, sectors, opts).await;
        slot.end(OpKind::Read, opts.class, bytes, t0, r)
    }

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let bytes = buf.len() as u64;
        let (slot, t0) = self.enter(bytes, opts.class).await?;
        let r = self.shared.dev.read_into(start, buf, opts).await;
        slot.end(OpKind::Read, opts.class, bytes, t0, r)
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let bytes = data.len() as u64;
        let (slot, t0) = self.enter(bytes, opts.class).await?;
        let r = self.shared.dev.write(start, data, opts).await;
        slot.end(OpKind::Write, opts.class, bytes, t0, r)
    }

    async fn write_vectored(&self, start: u64, parts: Vec<Bytes>, opts: IoOpts) -> Result<()> {
        let bytes = parts.iter().map(|p| p.len() as u64).sum();
        let (slot, t0) = self.enter(bytes, opts.class).await?;
        let r = self.shared.dev.write_vectored(start, parts, opts).await;
        slot.end(OpKind::Write, opts.class, bytes, t0, r)
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.shared.dev.flush(opts).await
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        let (slot, t0) = self.enter(0, opts.class).await?;
        let r = self.shared.dev.discard(start, sectors, opts).await;
        slot.end(OpKind::Discard, opts.class, 0, t0, r)
    }

    async fn write_zeroes(&self, start: u64, sectors: u64, z: Zeroes, opts: IoOpts) -> Result<()> {
        let (slot, t0) = self.enter(0, opts.class).await?;
        let r = self.shared.dev.write_zeroes(start, sectors, z, opts).await;
        slot.end(OpKind::Write, opts.class, 0, t0, r)
    }

    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<Extent>> {
        self.shared.dev.allocation(start, sectors).await
    }
}
