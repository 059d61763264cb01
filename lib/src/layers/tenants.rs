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

use std::collections::HashMap;
use std::sync::Arc;
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
    in_flight: usize,
    /// Interactive requests let through past the depth, at the device now (not counted in
    /// `in_flight`, nor in the depth's windows).
    past: usize,
    depth: Depth,
    /// A wake-up is set for this time (a limit holds every tenant with work back).
    timer: Option<Nanos>,
    /// When each tenant last sent a request.
    last_sent: Vec<Option<Nanos>>,
    /// Each tenant's requests waiting here or at the device.
    outstanding: Vec<usize>,
    /// Each tenant's counters, kept under this lock (taken anyway when a request ends).
    tallies: Vec<Tally>,
}

impl<D: BlockDevice + 'static> State<D> {
    /// At most one tenant is busy: has requests waiting or at the device, or sent one in
    /// the last [`BUSY_FOR`].
    fn alone(&self, now: Nanos) -> bool {
        self.last_sent
            .iter()
            .zip(&self.outstanding)
            .filter(|&(t, &n)| n > 0 || t.is_some_and(|t| now.saturating_sub(t) < BUSY_FOR))
            .count()
            <= 1
    }

    /// How many requests may be at the device now: every tag while one tenant is busy
    /// alone, else the adaptive depth.
    fn cap(&self, now: Nanos) -> usize {
        self.cap_if(self.alone(now))
    }

    /// [`cap`](Self::cap) with [`alone`](Self::alone) known.
    fn cap_if(&self, alone: bool) -> usize {
        if alone {
            self.depth.max
        } else {
            self.depth.cur
        }
    }

    /// The count a request let through is in: `past` the depth, or within it.
    fn count_of(&mut self, past: bool) -> &mut usize {
        if past {
            &mut self.past
        } else {
            &mut self.in_flight
        }
    }

    /// One of `tenant`'s requests is done here (served, failed or given up).
    fn finished(&mut self, tenant: TenantId) {
        if let Some(n) = self.outstanding.get_mut(tenant.0) {
            *n = n.saturating_sub(1);
        }
    }
}

#[derive(Debug)]
struct Shared<D: BlockDevice + 'static> {
    dev: D,
    epoch: Instant,
    state: Mutex<State<D>>,
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
                state: Mutex::new(State {
                    sched: TenantScheduler::new(),
                    waiters: HashMap::new(),
                    next_ticket: 0,
                    in_flight: 0,
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
                    last_sent: Vec::new(),
                    outstanding: Vec::new(),
                    tallies: Vec::new(),
                }),
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
        let id = {
            let mut st = self.shared.state.lock();
            let id = st.sched.add(spec).map_err(bad)?;
            st.last_sent.push(None);
            st.outstanding.push(0);
            st.tallies.push(Tally::default());
            id
        };
        names.push(name.to_owned());
        let mut info = self.shared.dev.info().clone();
        info.name = format!("{}:{name}", info.name);
        Ok(Tenant {
            shared: Arc::clone(&self.shared),
            id,
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
        // A tenant's name, tally and count are added together, under both locks.
        names
            .iter()
            .zip(st.tallies.iter().zip(&st.outstanding))
            .enumerate()
            .map(|(i, (name, (tally, &outstanding)))| TenantStats {
                name: name.clone(),
                spec: st.sched.spec(TenantId(i)).unwrap_or_default(),
                io: tally.snapshot(outstanding as u64),
                served: st.sched.counters(TenantId(i)).unwrap_or_default(),
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

    /// Lets requests through while the depth allows; sets a wake-up when limits hold every
    /// waiting tenant back.
    fn pump(self: &Arc<Self>, st: &mut State<D>) {
        let now = self.now();
        let cap = st.cap(now);
        self.pump_at(st, now, cap);
    }

    /// The scheduler chose request `req` of `tenant`: its slot goes to its waiter.
    /// `past`: let through past the depth (an interactive request).
    fn deliver(self: &Arc<Self>, st: &mut State<D>, tenant: TenantId, req: u64, past: bool) {
        if let Some(tx) = st.waiters.remove(&req) {
            *st.count_of(past) += 1;
            let slot = Admitted {
                shared: Some(Arc::clone(self)),
                tenant,
                past,
            };
            if let Err(mut slot) = tx.send(slot) {
                // Cancelled while it waited: the slot goes back at once.
                slot.shared = None;
                *st.count_of(past) -= 1;
                st.finished(tenant);
            }
        }
    }

    /// [`pump`](Self::pump) at `now`, with up to `cap` requests at the device.
    fn pump_at(self: &Arc<Self>, st: &mut State<D>, now: Nanos, cap: usize) {
        while st.in_flight < cap {
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
        while st.in_flight >= cap && st.in_flight + st.past < st.depth.max {
            match st.sched.next_interactive(now) {
                Ok(d) => self.deliver(st, d.tenant, d.req, true),
                // Held by a limit, or none: the next completion pumps again.
                Err(_) => break,
            }
        }
        if st.in_flight >= st.depth.cur {
            st.depth.full = true;
        }
    }

    /// One of `tenant`'s requests left the device; `ended`: how it went, counted in the
    /// tenant's figures (none for a request whose caller gave up).
    fn done(self: &Arc<Self>, tenant: TenantId, ended: Option<Ended>, past: bool) {
        // The clock read before the lock: the lock is held as briefly as it can be (every
        // request's admission and completion take it, from every worker).
        let now = self.now();
        let mut st = self.state.lock();
        let n = st.count_of(past);
        *n = n.saturating_sub(1);
        st.finished(tenant);
        if let (Some(e), Some(t)) = (ended, st.tallies.get_mut(tenant.0)) {
            let latency = now.saturating_sub(self.at(e.t0));
            t.record(e.op, e.class, e.bytes, latency, e.ok);
        }
        let alone = st.alone(now);
        if alone {
            // The depth is climbed only where it is used: with tenants sharing.
            st.depth.restart();
        } else if !past {
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

/// A request's slot at the device: [`finish`](Self::finish)ed, or dropped (the request
/// cancelled, even before it saw the slot), it frees the slot.
#[derive(Debug)]
struct Admitted<D: BlockDevice + 'static> {
    shared: Option<Arc<Shared<D>>>,
    tenant: TenantId,
    /// Let through past the depth (counted in `past`, not `in_flight`).
    past: bool,
}

impl<D: BlockDevice + 'static> Admitted<D> {
    /// The request is done: the slot freed and how it went counted.
    fn finish(mut self, ended: Ended) {
        if let Some(s) = self.shared.take() {
            s.done(self.tenant, Some(ended), self.past);
        }
    }
}

impl<D: BlockDevice + 'static> Drop for Admitted<D> {
    fn drop(&mut self) {
        if let Some(s) = self.shared.take() {
            s.done(self.tenant, None, self.past);
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
    info: DeviceInfo,
}

impl<D: BlockDevice + 'static> Tenant<D> {
    /// Waits for the scheduler to let a request of `bytes` through.
    async fn admit(&self, bytes: u64, class: IoClass, t0: Instant) -> Result<Admitted<D>> {
        let (rx, ticket) = {
            let mut st = self.shared.state.lock();
            let ticket = st.next_ticket;
            st.next_ticket += 1;
            let now = self.shared.at(t0);
            if let Some(t) = st.last_sent.get_mut(self.id.0) {
                *t = Some(now);
            }
            if st.sched.submit(now, self.id, ticket, bytes, class).is_err() {
                return Err(Error::Closed {
                    device: self.info.name.clone(),
                });
            }
            if let Some(n) = st.outstanding.get_mut(self.id.0) {
                *n += 1;
            }
            // Nothing else waits and there is room: through at once (the scheduler still
            // tags and counts it), without a hand-off.
            let cap = st.cap(now);
            if st.sched.len() == 1 && st.in_flight < cap {
                match st.sched.next(now) {
                    Ok(d) if d.req == ticket => {
                        st.in_flight += 1;
                        if st.in_flight >= st.depth.cur {
                            st.depth.full = true;
                        }
                        return Ok(Admitted {
                            shared: Some(Arc::clone(&self.shared)),
                            tenant: self.id,
                            past: false,
                        });
                    }
                    // Another's (none should wait when this one is alone, but if one
                    // did it has a waiter): it gets its slot.
                    Ok(d) => self.shared.deliver(&mut st, d.tenant, d.req, false),
                    // Held by its limit: it waits below, the pump sets the wake-up.
                    Err(_) => {}
                }
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.insert(ticket, tx);
            self.shared.pump_at(&mut st, now, cap);
            (rx, ticket)
        };
        // Given up while waiting (the caller's future dropped): out of the scheduler, so it
        // costs its tenant nothing.
        let waiting = Waiting {
            shared: &self.shared,
            tenant: self.id,
            ticket,
        };
        let slot = rx.await.map_err(|_| Error::Closed {
            device: self.info.name.clone(),
        });
        std::mem::forget(waiting);
        slot
    }

    /// Runs `io` as one of this tenant's requests, counted in its stats.
    async fn run<T>(
        &self,
        op: OpKind,
        bytes: u64,
        opts: IoOpts,
        io: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let t0 = Instant::now();
        let admitted = self.admit(bytes, opts.class, t0).await?;
        let r = io.await;
        admitted.finish(Ended {
            op,
            class: opts.class,
            bytes,
            ok: r.is_ok(),
            t0,
        });
        r
    }
}

impl<D: BlockDevice + 'static> BlockDevice for Tenant<D> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        self.run(OpKind::Read, sectors * 512, opts, async {
            self.shared.dev.read(start, sectors, opts).await
        })
        .await
    }

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let bytes = buf.len() as u64;
        self.run(OpKind::Read, bytes, opts, async {
            self.shared.dev.read_into(start, buf, opts).await
        })
        .await
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let bytes = data.len() as u64;
        self.run(OpKind::Write, bytes, opts, async {
            self.shared.dev.write(start, data, opts).await
        })
        .await
    }

    async fn write_vectored(&self, start: u64, parts: Vec<Bytes>, opts: IoOpts) -> Result<()> {
        let bytes = parts.iter().map(|p| p.len() as u64).sum();
        self.run(OpKind::Write, bytes, opts, async {
            self.shared.dev.write_vectored(start, parts, opts).await
        })
        .await
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.shared.dev.flush(opts).await
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.run(OpKind::Discard, 0, opts, async {
            self.shared.dev.discard(start, sectors, opts).await
        })
        .await
    }

    async fn write_zeroes(&self, start: u64, sectors: u64, z: Zeroes, opts: IoOpts) -> Result<()> {
        self.run(OpKind::Write, 0, opts, async {
            self.shared.dev.write_zeroes(start, sectors, z, opts).await
        })
        .await
    }

    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<Extent>> {
        self.shared.dev.allocation(start, sectors).await
    }
}
