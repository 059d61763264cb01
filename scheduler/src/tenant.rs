//! Tenants: reservations, weights and limits, scheduled by mClock's tags (Gulati, Merchant,
//! Varman, "mClock: Handling Throughput Variability for Hypervisor IO Scheduling", OSDI 2010),
//! with dmClock's ρ/δ for requests that are parts of larger ones. Sans-IO: time is passed in.
//!
//! Each tenant has a [`TenantSpec`]: a reservation (a minimum, in IOPS and/or bytes/s), a
//! weight (its share of what is left) and a limit (a maximum, IOPS and/or bytes/s, with a
//! burst). Every queued request carries three tags, as in mClock:
//! - **R** (reservation): `max(R_prev + cost_r, now)`, where `cost_r` is the larger of
//!   `1 / reserve_iops` and `bytes / reserve_bps` seconds;
//! - **L** (limit): `max(L_prev + cost_l, now)`, likewise from the limit;
//! - **P** (proportional share): `max(P_prev + cost_p / weight, V)`, with `cost_p` the
//!   request's cost in I/Os, `1 + bytes / 64 KiB` (a 64 KiB transfer costs as much as one
//!   more I/O: the shape of blk-iocost's linear model), and `V` the P tag of the last
//!   request served by weight: virtual time, as start-time fair queueing keeps it, where
//!   mClock uses real time (which lets the tags of a busy tenant fall back to `now` and lose
//!   their spacing when the device is faster than the weights' scale).
//!
//! [`TenantScheduler::next`] serves first any request whose R tag is due (the earliest),
//! so reservations are met; otherwise, among tenants under their limit (L tag not past
//! `now + burst`), the smallest P tag; a request served by weight moves its tenant's later
//! R tags back by its `cost_r` (mClock: weight-phase service does not count toward the
//! reservation). When every tenant with work is at its limit it answers when to ask again.
//!
//! A tenant that was idle comes back with R and L tags from `now` and a P tag from `V`: no
//! credit for the time it was away, and no penalty against the tenants already busy (mClock's
//! idle-tenant rule).
//!
//! dmClock (same paper, §4) spreads a client's I/O over several servers: each request carries
//! ρ (reservation-phase completions elsewhere since its last request here, plus one) and δ
//! (all completions elsewhere, plus one), and the tags advance by ρ and δ times the costs.
//! [`TenantScheduler::submit_with`] takes them; [`submit`](TenantScheduler::submit) is ρ = δ
//! = 1 (one scheduler for the whole volume, before requests fan out to its components).
//!
//! What differs from the paper: costs in two dimensions (I/Os and bytes, the tighter one
//! counts), where mClock counts I/Os; limits with a burst (a token bucket's depth) where
//! mClock's are strict; requests within a tenant served interactive class first (each
//! tenant's queue is per class, FIFO in a class), so a tenant's interactive reads are not
//! stuck behind its own bulk writes.
//!
//! ```
//! use tagstripe_scheduler::{IoClass, TenantScheduler, TenantSpec};
//! let mut s = TenantScheduler::new();
//! let db = s.add(TenantSpec::new().weight(3))?;
//! let backup = s.add(TenantSpec::new().weight(1))?;
//! for i in 0..400u64 {
//!     s.submit(0, db, i, 4096, IoClass::BestEffort);
//!     s.submit(0, backup, 1000 + i, 4096, IoClass::Bulk);
//! }
//! // Both busy: three of the database's for each of the backup's.
//! let served: Vec<u64> = (0..400).filter_map(|_| s.next(0).ok().map(|d| d.req)).collect();
//! let db_share = served.iter().filter(|&&r| r < 1000).count();
//! assert!((295..=305).contains(&db_share), "{db_share}");
//! # Ok::<(), tagstripe_scheduler::TenantError>(())
//! ```

use std::collections::VecDeque;

use crate::{IoClass, Nanos};

const SEC: f64 = 1e9;
/// Bytes that cost one more I/O in the proportional-share cost.
const COST_BYTES: f64 = 65_536.0;

/// A request's cost in the proportional share (its P tag advances by this over its weight):
/// one I/O plus one more for every 64 KiB it moves, the shape of blk-iocost's linear model.
/// Weights divide this, so two saturating tenants at weights 3 and 1 are served costs 3:1.
///
/// ```
/// use tagstripe_scheduler::weight_cost;
/// assert_eq!(weight_cost(0), 1.0);
/// assert_eq!(weight_cost(64 << 10), 2.0);
/// assert_eq!(weight_cost(1 << 20), 17.0);
/// ```
#[must_use]
pub fn weight_cost(bytes: u64) -> f64 {
    1.0 + bytes as f64 / COST_BYTES
}

/// A bad [`TenantSpec`], refused with what is wrong.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TenantError {
    /// A weight outside 1..=10000.
    #[error("weight {0} is outside 1..=10000")]
    Weight(u32),
    /// A rate that is negative or not a number.
    #[error("{what} {value} is not a rate (a non-negative number)")]
    Rate {
        /// Which.
        what: &'static str,
        /// What was given.
        value: f64,
    },
    /// A reservation above the limit of the same dimension.
    #[error("{what}: the reservation {reserve} is above the limit {limit}")]
    ReserveAboveLimit {
        /// `iops` or `bytes/s`.
        what: &'static str,
        /// The reservation.
        reserve: f64,
        /// The limit.
        limit: f64,
    },
    /// No such tenant.
    #[error("no tenant {0}")]
    NoTenant(usize),
}

/// What a tenant is owed and allowed. Rates of 0 mean none (no reservation, no limit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantSpec {
    /// Minimum I/Os per second.
    pub reserve_iops: f64,
    /// Minimum bytes per second.
    pub reserve_bps: f64,
    /// Share of what the reservations leave, against the other tenants' weights (1-10000).
    pub weight: u32,
    /// Maximum I/Os per second.
    pub limit_iops: f64,
    /// Maximum bytes per second.
    pub limit_bps: f64,
    /// How far ahead of its limit a tenant may run (a token bucket's depth, in time at the
    /// limit's rate).
    pub burst: Nanos,
}

impl Default for TenantSpec {
    fn default() -> Self {
        Self::new()
    }
}

impl TenantSpec {
    /// Weight 100, no reservation, no limit, a 10 ms burst.
    #[must_use]
    pub fn new() -> Self {
        Self {
            reserve_iops: 0.0,
            reserve_bps: 0.0,
            weight: 100,
            limit_iops: 0.0,
            limit_bps: 0.0,
            burst: 10_000_000,
        }
    }

    /// The same with another weight.
    #[must_use]
    pub fn weight(mut self, w: u32) -> Self {
        self.weight = w;
        self
    }

    /// The same with a reservation in I/Os per second.
    #[must_use]
    pub fn reserve_iops(mut self, v: f64) -> Self {
        self.reserve_iops = v;
        self
    }

    /// The same with a reservation in bytes per second.
    #[must_use]
    pub fn reserve_bps(mut self, v: f64) -> Self {
        self.reserve_bps = v;
        self
    }

    /// The same with a limit in I/Os per second.
    #[must_use]
    pub fn limit_iops(mut self, v: f64) -> Self {
        self.limit_iops = v;
        self
    }

    /// The same with a limit in bytes per second.
    #[must_use]
    pub fn limit_bps(mut self, v: f64) -> Self {
        self.limit_bps = v;
        self
    }

    /// Checks the spec.
    ///
    /// # Errors
    /// [`TenantError`] naming what is wrong: a weight outside 1..=10000, a rate that is not a
    /// non-negative number, a reservation above its limit.
    pub fn check(&self) -> Result<(), TenantError> {
        if !(1..=10_000).contains(&self.weight) {
            return Err(TenantError::Weight(self.weight));
        }
        for (what, value) in [
            ("reserve-iops", self.reserve_iops),
            ("reserve-bps", self.reserve_bps),
            ("limit-iops", self.limit_iops),
            ("limit-bps", self.limit_bps),
        ] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(TenantError::Rate { what, value });
            }
        }
        for (what, reserve, limit) in [
            ("iops", self.reserve_iops, self.limit_iops),
            ("bytes/s", self.reserve_bps, self.limit_bps),
        ] {
            if limit > 0.0 && reserve > limit {
                return Err(TenantError::ReserveAboveLimit {
                    what,
                    reserve,
                    limit,
                });
            }
        }
        Ok(())
    }

    /// Seconds (as ns) a request of `bytes` uses of a pair of rates: the tighter one.
    fn cost(iops: f64, bps: f64, bytes: u64) -> f64 {
        let a = if iops > 0.0 { SEC / iops } else { 0.0 };
        let b = if bps > 0.0 {
            bytes as f64 * SEC / bps
        } else {
            0.0
        };
        a.max(b)
    }

    /// A reservation is set (in IOPS or bytes/s).
    ///
    /// ```
    /// use tagstripe_scheduler::TenantSpec;
    /// assert!(TenantSpec::new().reserve_iops(500.0).has_reservation());
    /// assert!(!TenantSpec::new().has_reservation());
    /// ```
    #[must_use]
    pub fn has_reservation(&self) -> bool {
        self.reserve_iops > 0.0 || self.reserve_bps > 0.0
    }

    /// A limit is set (in IOPS or bytes/s).
    ///
    /// ```
    /// use tagstripe_scheduler::TenantSpec;
    /// assert!(TenantSpec::new().limit_bps(50e6).has_limit());
    /// assert!(!TenantSpec::new().weight(3).has_limit());
    /// ```
    #[must_use]
    pub fn has_limit(&self) -> bool {
        self.limit_iops > 0.0 || self.limit_bps > 0.0
    }
}

/// A tenant's handle in a [`TenantScheduler`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub usize);

/// A request handed out by [`TenantScheduler::next`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantDispatch<T> {
    /// Whose.
    pub tenant: TenantId,
    /// The caller's request.
    pub req: T,
    /// Served to meet the reservation (`true`), or by weight.
    pub reserved: bool,
    /// When it was submitted.
    pub submitted: Nanos,
}

/// Why [`TenantScheduler::next`] has nothing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// No request is queued.
    Empty,
    /// Every tenant with work is at its limit: ask again at this time.
    Until(Nanos),
}

#[derive(Clone, Copy, Debug)]
struct Queued<T> {
    req: T,
    bytes: u64,
    at: Nanos,
    rho: u32,
    delta: u32,
}

/// A tenant's state: its spec, its queues (per class), its last tags.
#[derive(Clone, Debug)]
struct Tenant<T> {
    spec: TenantSpec,
    queues: [VecDeque<Queued<T>>; 4],
    /// The head request's tags, when it has one (ns, fractional).
    r: f64,
    l: f64,
    p: f64,
    /// Tags of the last request served (the next head's start from them).
    last_r: f64,
    last_l: f64,
    last_p: f64,
    tagged: bool,
    /// Since when its head request has been held back by its limit.
    held_since: Option<Nanos>,
    stats: TenantCounters,
}

/// What a tenant was served, counted by the scheduler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCounters {
    /// Requests served.
    pub served: u64,
    /// Of them, to meet the reservation.
    pub reserved: u64,
    /// Bytes served.
    pub bytes: u64,
    /// Time it had work held back by its limit (and nothing of it could go), in ns.
    pub throttled: Nanos,
}

impl<T> Tenant<T> {
    fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    fn head(&self) -> Option<&Queued<T>> {
        self.queues.iter().find_map(VecDeque::front)
    }

    fn pop(&mut self) -> Option<Queued<T>> {
        self.queues.iter_mut().find_map(VecDeque::pop_front)
    }
}

/// The tenants of one device (or volume) and their queued requests. Generic over the
/// caller's request handle `T`.
#[derive(Clone, Debug)]
pub struct TenantScheduler<T> {
    tenants: Vec<Tenant<T>>,
    queued: usize,
    /// Virtual time: the P tag of the last request served by weight.
    vtime: f64,
}

impl<T: Copy> Default for TenantScheduler<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> TenantScheduler<T> {
    /// No tenants yet.
    #[must_use]
    pub fn new() -> Self {
        Self {
            tenants: Vec::new(),
            queued: 0,
            vtime: 0.0,
        }
    }

    /// Adds a tenant.
    ///
    /// # Errors
    /// [`TenantError`] for a bad spec.
    pub fn add(&mut self, spec: TenantSpec) -> Result<TenantId, TenantError> {
        spec.check()?;
        self.tenants.push(Tenant {
            spec,
            queues: Default::default(),
            r: 0.0,
            l: 0.0,
            p: 0.0,
            last_r: f64::NEG_INFINITY,
            last_l: f64::NEG_INFINITY,
            last_p: f64::NEG_INFINITY,
            tagged: false,
            held_since: None,
            stats: TenantCounters::default(),
        });
        Ok(TenantId(self.tenants.len() - 1))
    }

    /// Changes a tenant's spec, at once (queued requests are tagged anew).
    ///
    /// # Errors
    /// [`TenantError`] for a bad spec or an unknown tenant.
    pub fn set(&mut self, id: TenantId, spec: TenantSpec) -> Result<(), TenantError> {
        spec.check()?;
        let t = self
            .tenants
            .get_mut(id.0)
            .ok_or(TenantError::NoTenant(id.0))?;
        t.spec = spec;
        t.tagged = false;
        Ok(())
    }

    /// A tenant's spec.
    #[must_use]
    pub fn spec(&self, id: TenantId) -> Option<TenantSpec> {
        self.tenants.get(id.0).map(|t| t.spec)
    }

    /// What a tenant was served so far.
    #[must_use]
    pub fn counters(&self, id: TenantId) -> Option<TenantCounters> {
        self.tenants.get(id.0).map(|t| t.stats)
    }

    /// Requests queued, all tenants.
    #[must_use]
    pub fn len(&self) -> usize {
        self.queued
    }

    /// No request queued.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Queues request `req` of `bytes` for tenant `id` in `class` (ρ = δ = 1). An unknown
    /// tenant's request is queued nowhere and handed back.
    ///
    /// # Errors
    /// The request itself, for a tenant that does not exist.
    pub fn submit(
        &mut self,
        now: Nanos,
        id: TenantId,
        req: T,
        bytes: u64,
        class: IoClass,
    ) -> Result<(), T> {
        self.submit_with(now, id, req, bytes, class, 1, 1)
    }

    /// As [`submit`](Self::submit), with dmClock's ρ and δ (each at least 1): the tags
    /// advance by ρ times the reservation cost and δ times the weight's.
    ///
    /// # Errors
    /// The request itself, for a tenant that does not exist.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_with(
        &mut self,
        now: Nanos,
        id: TenantId,
        req: T,
        bytes: u64,
        class: IoClass,
        rho: u32,
        delta: u32,
    ) -> Result<(), T> {
        let vtime = self.vtime;
        let Some(t) = self.tenants.get_mut(id.0) else {
            return Err(req);
        };
        let was_idle = t.len() == 0;
        t.queues[class.index()].push_back(Queued {
            req,
            bytes,
            at: now,
            rho: rho.max(1),
            delta: delta.max(1),
        });
        self.queued += 1;
        if was_idle || !t.tagged {
            // Back from idle: tags from now and from virtual time (no credit, no penalty).
            Self::tag(t, now, vtime);
        }
        Ok(())
    }

    /// A request's proportional-share cost: I/Os (and bytes, as I/Os) over the weight.
    fn p_cost(spec: &TenantSpec, bytes: u64, delta: u32) -> f64 {
        f64::from(delta) * weight_cost(bytes) / f64::from(spec.weight)
    }

    /// Tags the head request from the last served one's tags.
    fn tag(t: &mut Tenant<T>, now: Nanos, vtime: f64) {
        let Some(h) = t.head().copied() else {
            t.tagged = false;
            return;
        };
        let at = h.at.min(now) as f64;
        let s = &t.spec;
        let r_cost = f64::from(h.rho) * TenantSpec::cost(s.reserve_iops, s.reserve_bps, h.bytes);
        t.r = (t.last_r + r_cost).max(at);
        t.l = (t.last_l + TenantSpec::cost(s.limit_iops, s.limit_bps, h.bytes)).max(at);
        t.p = (t.last_p + Self::p_cost(s, h.bytes, h.delta)).max(vtime);
        t.tagged = true;
    }

    /// Takes a queued request back (its caller gave up waiting): it is never served and
    /// charges its tenant nothing. `false` if it is not queued (served already, or never
    /// submitted).
    pub fn cancel(&mut self, id: TenantId, req: &T) -> bool
    where
        T: PartialEq,
    {
        let Some(t) = self.tenants.get_mut(id.0) else {
            return false;
        };
        for q in &mut t.queues {
            if let Some(i) = q.iter().position(|x| x.req == *req) {
                q.remove(i);
                self.queued -= 1;
                // The head may have changed: tagged again from the last served one's tags.
                t.tagged = false;
                return true;
            }
        }
        false
    }

    /// The next request to send to the device at `now`: a reservation that is due first,
    /// else by weight among tenants under their limits.
    ///
    /// # Errors
    /// [`Idle::Empty`] when nothing is queued, [`Idle::Until`] when every tenant with work
    /// is held back by its limit (the earliest time one is not).
    pub fn next(&mut self, now: Nanos) -> Result<TenantDispatch<T>, Idle> {
        self.pick(now, false)
    }

    /// As [`next`](Self::next), among the tenants whose next request is interactive only
    /// (reservations, weights and limits as ever): what a caller that keeps the device's
    /// queue short sends past its depth, so that an interactive read does not wait for a
    /// bulk write to leave the device when a fair queue below serves it first (as Linux's
    /// Kyber keeps a quarter of its tags from asynchronous requests).
    ///
    /// ```
    /// use tagstripe_scheduler::{Idle, IoClass, TenantScheduler, TenantSpec};
    /// let mut s = TenantScheduler::new();
    /// let (vm, backup) = (s.add(TenantSpec::new())?, s.add(TenantSpec::new())?);
    /// s.submit(0, backup, 1, 1 << 20, IoClass::Bulk).unwrap();
    /// assert!(matches!(s.next_interactive(0), Err(Idle::Empty)), "only bulk waits");
    /// s.submit(0, vm, 2, 4096, IoClass::Interactive).unwrap();
    /// assert_eq!(s.next_interactive(0).unwrap().req, 2);
    /// assert_eq!(s.next(0).unwrap().req, 1);
    /// # Ok::<(), tagstripe_scheduler::TenantError>(())
    /// ```
    ///
    /// # Errors
    /// [`Idle::Empty`] when no tenant's next request is interactive, [`Idle::Until`] when
    /// every such tenant is held back by its limit.
    pub fn next_interactive(&mut self, now: Nanos) -> Result<TenantDispatch<T>, Idle> {
        self.pick(now, true)
    }

    /// The next request, among every tenant with work or (`interactive`) those whose head
    /// request is interactive.
    fn pick(&mut self, now: Nanos, interactive: bool) -> Result<TenantDispatch<T>, Idle> {
        if self.queued == 0 {
            return Err(Idle::Empty);
        }
        let ready = |t: &Tenant<T>| {
            t.len() > 0 && (!interactive || !t.queues[IoClass::Interactive.index()].is_empty())
        };
        if interactive && !self.tenants.iter().any(ready) {
            return Err(Idle::Empty);
        }
        let nowf = now as f64;
        let vtime = self.vtime;
        for t in &mut self.tenants {
            if t.len() > 0 && !t.tagged {
                Self::tag(t, now, vtime);
            }
        }
        // Reservations due: the earliest R tag.
        let due = self
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| ready(t) && t.spec.has_reservation() && t.r <= nowf)
            .min_by(|a, b| a.1.r.total_cmp(&b.1.r))
            .map(|(i, _)| i);
        let (i, reserved) = if let Some(i) = due {
            (i, true)
        } else {
            let under = |t: &Tenant<T>| !t.spec.has_limit() || t.l <= nowf + t.spec.burst as f64;
            for t in &mut self.tenants {
                if ready(t) && !under(t) {
                    t.held_since.get_or_insert(now);
                }
            }
            let pick = self
                .tenants
                .iter()
                .enumerate()
                .filter(|(_, t)| ready(t) && under(t))
                .min_by(|a, b| a.1.p.total_cmp(&b.1.p))
                .map(|(i, _)| i);
            match pick {
                Some(i) => (i, false),
                None => {
                    let until = self
                        .tenants
                        .iter()
                        .filter(|t| ready(t))
                        .map(|t| t.l - t.spec.burst as f64)
                        .fold(f64::INFINITY, f64::min);
                    // Time spent held back, charged to each tenant that waits.
                    return Err(Idle::Until(until.ceil().max(nowf + 1.0) as Nanos));
                }
            }
        };
        let t = &mut self.tenants[i];
        let Some(q) = t.pop() else {
            return Err(Idle::Empty);
        };
        self.queued -= 1;
        let s = t.spec;
        let r_cost = f64::from(q.rho) * TenantSpec::cost(s.reserve_iops, s.reserve_bps, q.bytes);
        t.last_r = if reserved { t.r } else { t.r - r_cost };
        t.last_l = t.l;
        t.last_p = t.p;
        if !reserved {
            self.vtime = self.vtime.max(t.p);
        }
        // Held back by the limit until now.
        if let Some(since) = t.held_since.take() {
            t.stats.throttled += now.saturating_sub(since);
        }
        t.stats.served += 1;
        t.stats.reserved += u64::from(reserved);
        t.stats.bytes += q.bytes;
        t.tagged = false;
        let vtime = self.vtime;
        Self::tag(t, now, vtime);
        Ok(TenantDispatch {
            tenant: TenantId(i),
            req: q.req,
            reserved,
            submitted: q.at,
        })
    }
}
