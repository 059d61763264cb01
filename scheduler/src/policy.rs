//! Dispatch policies: which class goes to the device next. Pure strategies over a snapshot
//! of the queue, so they can be swapped and compared in one harness.

use crate::{Dir, IoClass, Meta, Nanos, TagKind, Ticket};

/// The oldest dispatchable request of one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Its ticket (submission order).
    pub ticket: Ticket,
    /// When it was submitted.
    pub submitted: Nanos,
    /// Read or write.
    pub dir: Dir,
    /// Its size in sectors (0 if unknown).
    pub sectors: u64,
}

/// What a policy sees when asked to choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// The caller's clock.
    pub now: Nanos,
    /// Commands the device may hold now.
    pub openings: u32,
    /// Commands at the device, per class.
    pub active: [u32; 4],
    /// Requests waiting in the host queue, per class.
    pub pending: [usize; 4],
    /// The head of each class that may be dispatched now (ordering rules allowing).
    pub heads: [Option<Head>; 4],
    /// When the oldest interactive command at the device was dispatched.
    pub oldest_interactive_at_device: Option<Nanos>,
    /// When the oldest command of a lower class at the device was dispatched (filled in
    /// only when an interactive head may be dispatched past them; `None` otherwise).
    pub oldest_lower_at_device: Option<Nanos>,
}

impl View {
    /// Commands at the device.
    #[must_use]
    pub fn active_total(&self) -> u32 {
        self.active.iter().sum()
    }
}

/// A policy's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Dispatch the head of this class, with its own tag kind or promoted to `promote`
    /// (an ordered barrier, or head-of-queue). A request submitted ordered stays ordered.
    Dispatch {
        /// Which class.
        class: IoClass,
        /// A stronger tag kind to send it with.
        promote: Option<TagKind>,
    },
    /// Dispatch nothing now; ask again at `until` (or at the next event).
    Wait {
        /// When something may change without an event.
        until: Option<Nanos>,
    },
}

/// How a dispatched request left the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Completed; `device_ns` from dispatch to completion.
    Done {
        /// Time at the device.
        device_ns: Nanos,
    },
    /// Failed.
    Failed,
    /// Handed back (QUEUE FULL or BUSY) and queued again.
    Requeued,
}

/// A dispatch policy. Implementations are deterministic state machines like the queue.
pub trait Policy: std::fmt::Debug {
    /// A short name for reports.
    fn name(&self) -> &'static str;

    /// Chooses what to dispatch, given that at least one opening is free.
    fn choose(&mut self, view: &View) -> Choice;

    /// A request was submitted.
    fn on_submit(&mut self, _now: Nanos, _meta: &Meta) {}

    /// A request went to the device with tag kind `kind`.
    fn on_dispatch(&mut self, _now: Nanos, _meta: &Meta, _kind: TagKind) {}

    /// A dispatched request came back.
    fn on_release(&mut self, _now: Nanos, _meta: &Meta, _kind: TagKind, _how: Release) {}

    /// The largest piece, in sectors, a request with `meta` submitted now should be cut into
    /// (smaller pieces wait less behind each other), or `None` for no limit. The queue does
    /// not cut requests itself: the layer that submits them does.
    fn piece_limit(&self, _now: Nanos, _meta: &Meta) -> Option<u64> {
        None
    }

    /// Whether [`piece_limit`](Self::piece_limit) can ever limit requests of `class` (so a
    /// caller need not ask for the others).
    fn limits_pieces(&self, _class: IoClass) -> bool {
        false
    }

    /// How the policy shapes bulk I/O now, if it does ([`crate::Event::Shaped`] reports
    /// changes).
    fn shape(&self) -> Option<Shape> {
        None
    }

    /// The parts of [`shape`](Self::shape) whose changes are reported as
    /// [`crate::Event::Shaped`]: the budget, the piece size and whether a drain floor is set.
    /// The queue asks for it after every completion, so a policy whose `shape` takes work
    /// may answer it more cheaply; the default asks `shape`.
    fn shape_key(&self) -> Option<ShapeKey> {
        self.shape().map(|s| ShapeKey::of(&s))
    }
}

/// The part of a [`Shape`] whose changes are reported: see [`Policy::shape_key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeKey {
    /// [`Shape::budget_sectors`].
    pub budget_sectors: u64,
    /// [`Shape::piece_sectors`].
    pub piece_sectors: u64,
    /// Whether [`Shape::drain_floor_sectors`] is set.
    pub draining: bool,
}

impl ShapeKey {
    /// The key of `shape`.
    ///
    /// ```
    /// use tagstripe_scheduler::{Fair, FairConfig, Policy, ShapeKey};
    /// let p = Fair::new(FairConfig::default());
    /// let shape = p.shape().unwrap();
    /// assert_eq!(p.shape_key(), Some(ShapeKey::of(&shape)));
    /// ```
    #[must_use]
    pub fn of(shape: &Shape) -> Self {
        Self {
            budget_sectors: shape.budget_sectors,
            piece_sectors: shape.piece_sectors,
            draining: shape.drain_floor_sectors.is_some(),
        }
    }
}

impl<P: Policy + ?Sized> Policy for Box<P> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn choose(&mut self, view: &View) -> Choice {
        (**self).choose(view)
    }
    fn on_submit(&mut self, now: Nanos, meta: &Meta) {
        (**self).on_submit(now, meta);
    }
    fn on_dispatch(&mut self, now: Nanos, meta: &Meta, kind: TagKind) {
        (**self).on_dispatch(now, meta, kind);
    }
    fn on_release(&mut self, now: Nanos, meta: &Meta, kind: TagKind, how: Release) {
        (**self).on_release(now, meta, kind, how);
    }
    fn piece_limit(&self, now: Nanos, meta: &Meta) -> Option<u64> {
        (**self).piece_limit(now, meta)
    }
    fn limits_pieces(&self, class: IoClass) -> bool {
        (**self).limits_pieces(class)
    }
    fn shape(&self) -> Option<Shape> {
        (**self).shape()
    }
    fn shape_key(&self) -> Option<ShapeKey> {
        (**self).shape_key()
    }
}

/// First come, first served across classes: the oldest dispatchable request goes next.
/// What a plain host queue does (CAM in 1998, blk-mq `none`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fifo;

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn choose(&mut self, view: &View) -> Choice {
        match oldest(view.heads.iter().flatten().copied(), view) {
            Some(class) => Choice::Dispatch {
                class,
                promote: None,
            },
            None => Choice::Wait { until: None },
        }
    }
}

fn oldest(heads: impl Iterator<Item = Head>, view: &View) -> Option<IoClass> {
    let ticket = heads.min_by_key(|h| h.ticket)?.ticket;
    IoClass::ALL
        .into_iter()
        .find(|c| view.heads[c.index()].is_some_and(|h| h.ticket == ticket))
}

/// FIFO plus an ordered tag every `interval` while commands are outstanding: FreeBSD da(4)'s
/// `send_ordered` (every 15 s, a quarter of the 60 s command timeout), which bounds how long
/// a reordering device can starve a command.
#[derive(Clone, Copy, Debug)]
pub struct PeriodicOrdered {
    interval: Nanos,
    last: Nanos,
}

impl PeriodicOrdered {
    /// da(4)'s default: every 15 s.
    pub const DA_INTERVAL: Nanos = 15_000_000_000;

    /// Sends an ordered tag at most every `interval`.
    #[must_use]
    pub fn new(interval: Nanos) -> Self {
        Self { interval, last: 0 }
    }
}

impl Policy for PeriodicOrdered {
    fn name(&self) -> &'static str {
        "cam1998"
    }

    fn choose(&mut self, view: &View) -> Choice {
        let Some(class) = oldest(view.heads.iter().flatten().copied(), view) else {
            return Choice::Wait { until: None };
        };
        let due = view.now.saturating_sub(self.last) >= self.interval;
        let ordered = due && view.active_total() > 0;
        if ordered {
            self.last = view.now;
        }
        Choice::Dispatch {
            class,
            promote: ordered.then_some(TagKind::Ordered),
        }
    }
}

/// mq-deadline's idea at the host: reads are preferred, each direction has an expiry
/// (reads 500 ms, writes 5 s), and writes are not passed over more than `writes_starved`
/// times in a row. It orders the host queue only; it cannot stop a device from reordering
/// what it already holds, which is what the fairness simulation shows.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// Read expiry.
    pub read_expire: Nanos,
    /// Write expiry.
    pub write_expire: Nanos,
    /// Reads chosen over pending writes before a write must go.
    pub writes_starved: u32,
    starved: u32,
}

impl Default for Deadline {
    fn default() -> Self {
        Self {
            read_expire: 500_000_000,
            write_expire: 5_000_000_000,
            writes_starved: 2,
            starved: 0,
        }
    }
}

impl Policy for Deadline {
    fn name(&self) -> &'static str {
        "deadline"
    }

    fn choose(&mut self, view: &View) -> Choice {
        let heads = view.heads.iter().flatten().copied();
        let expire = |h: &Head| match h.dir {
            Dir::Read => self.read_expire,
            Dir::Write => self.write_expire,
        };
        let expired = heads
            .clone()
            .filter(|h| view.now.saturating_sub(h.submitted) >= expire(h));
        let reads = heads.clone().filter(|h| h.dir == Dir::Read);
        let writes = heads.clone().filter(|h| h.dir == Dir::Write);
        let pick = if let Some(class) = oldest(expired, view) {
            Some(class)
        } else if reads.clone().next().is_some()
            && (writes.clone().next().is_none() || self.starved < self.writes_starved)
        {
            if writes.clone().next().is_some() {
                self.starved += 1;
            }
            oldest(reads, view)
        } else {
            self.starved = 0;
            oldest(writes, view)
        };
        match pick {
            Some(class) => Choice::Dispatch {
                class,
                promote: None,
            },
            None => Choice::Wait { until: None },
        }
    }
}

/// How [`Fair`] shapes bulk I/O at a moment: what its latency controller has settled on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Bulk sectors at the device now.
    pub bulk_sectors: u64,
    /// Bulk sectors allowed at the device at once (one request always may go).
    pub budget_sectors: u64,
    /// The largest bulk piece, in sectors, while shaping.
    pub piece_sectors: u64,
    /// The interactive latency at the device the controller holds bulk to.
    pub target_ns: Nanos,
    /// Interactive latency at the device with no bulk there (learned), if known.
    pub baseline_ns: Option<Nanos>,
    /// While draining ahead of a regular reader ([`FairConfig::drain_ahead`]): the bulk
    /// sectors left at the device when its next request is due (the budget is not used
    /// then). `None` while the budget shapes bulk.
    pub drain_floor_sectors: Option<u64>,
}

/// Settings of [`Fair`], tagstripe's policy.
///
/// Bulk is shaped only while interactive I/O is active, by a latency controller in the manner
/// of Kyber and io.latency: interactive completions are gathered in windows (`window`
/// completions, or `window_time` with at least 4), and a window's tail is its latency at the
/// device near p97 (the second slowest of 32 or more, else the slowest). Above the target,
/// bulk's budget of sectors at the device is cut in proportion to the overshoot, by half at
/// most; a cut that did not lower the next window's tail by a tenth is undone, and no cut is
/// made for `cut_cooldown` windows. Below 80% of the target, while bulk wanted more than the
/// budget let it send, the budget grows by an eighth (at least `piece_min`).
/// Bulk pieces are a quarter of the budget (Linux's `max_sectors_kb` lesson: smaller pieces
/// wait less behind each other). The target is a multiple of the interactive latency seen
/// with no bulk at the device, which the controller learns by itself and refreshes by holding
/// bulk back briefly when it has not seen such a sample for a while, so it needs to know
/// nothing of the device. A read that comes after a pause over 8 times the reader's shortest
/// recent think time is no such sample: a device gone cold serves it slowly, whatever bulk
/// does.
///
/// A reader that comes back at a regular pause (a login's keystrokes, fio's `--thinktime`)
/// is also drained ahead of (`drain_ahead`): bulk fills the device between its requests and
/// drains to a small floor by the time the next one is due, instead of sitting at the budget
/// when it comes. While that shapes bulk, the budget waits, unchanged, for a reader that
/// strays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairConfig {
    /// Tags kept free for interactive requests while interactive I/O is active.
    pub reserved: u32,
    /// A fixed interactive latency target at the device; 0 (the default) learns it as
    /// `target_percent` of the unloaded latency.
    pub target: Nanos,
    /// The learned target as a percentage of the unloaded interactive latency.
    pub target_percent: u32,
    /// The learned target is never below this.
    pub target_floor: Nanos,
    /// Interactive completions per control window.
    pub window: u32,
    /// A window closes after this long if it holds at least 4 completions.
    pub window_time: Nanos,
    /// Bulk's budget of sectors at the device when shaping starts.
    pub budget_start: u64,
    /// The smallest budget (one bulk request may always go, whatever its size).
    pub budget_min: u64,
    /// The largest budget.
    pub budget_max: u64,
    /// The smallest bulk piece while shaping, in sectors.
    pub piece_min: u64,
    /// The largest bulk piece while shaping, in sectors.
    pub piece_max: u64,
    /// How often bulk is held back briefly to sample interactive latency with the device
    /// quiet (the baseline; BBR's ProbeRTT idea).
    pub probe_every: Nanos,
    /// How long the device must have been free of bulk before an interactive request that
    /// goes then counts as unloaded (a device may go on working after it answers).
    pub probe_quiet: Nanos,
    /// The longest hold of a probe.
    pub probe_max: Nanos,
    /// Unloaded samples a probe takes before bulk goes again.
    pub probe_samples: u32,
    /// Bulk is held back (while an interactive request is at the device, during a probe or
    /// an anticipation) at most this share, in percent, of any `hold_period`: under a
    /// constant stream of interactive requests bulk still gets the device's time.
    pub hold_percent: u32,
    /// The period of `hold_percent`.
    pub hold_period: Nanos,
    /// Windows without cuts after a cut that did not lower the tail by a tenth (it is
    /// undone): a tail that bulk does not cause does not starve bulk.
    pub cut_cooldown: u32,
    /// An interactive command at the device longer than this makes the next bulk command
    /// ordered (da(4)'s barrier, driven by latency instead of a 15 s timer).
    pub age: Nanos,
    /// Interactive I/O counts as active this long after its last request.
    pub idle_after: Nanos,
    /// The longest wait for an interactive reader's next request after one completes (BFQ's
    /// `slice_idle`): bulk is held that long only while the reader's measured think time is
    /// shorter than both this and its requests' time at the device, as in a chain of
    /// dependent reads (a login); a reader that thinks longer is not waited for.
    pub anticipate: Nanos,
    /// Drain ahead of a regular interactive reader (one whose last 8 think times are within
    /// a factor of two of each other, as a reader with a fixed pause). Its next request is
    /// due at its last completion plus the shortest of those think times. Until then bulk
    /// may fill the device, but no more than bulk's measured drain rate (sectors completed
    /// per time with bulk at the device) clears by then, less a floor
    /// (`drain_floor_percent`). So the request finds about the floor at the device, not the
    /// budget, and bulk is shaped by the drain, not the budget (which is neither grown nor
    /// used meanwhile). A reader later than twice its think time past its last completion is
    /// not coming as foreseen: the budget applies again until it comes. Bulk pieces are
    /// then twice the floor, rounded down to a power of two (within `piece_min` and
    /// `piece_max`). It assumes one reader at a time: a think time is taken only when no
    /// interactive request is out.
    pub drain_ahead: bool,
    /// The bulk left at the device when a regular reader's request is due (with
    /// `drain_ahead`), as a percentage of the bulk the device drains while it serves one
    /// unloaded interactive request: enough to keep the device busy while the request is
    /// served and bulk is held, and while new bulk reaches the device after it.
    pub drain_floor_percent: u32,
    /// Per-class deadlines: a head older than its class's deadline goes before
    /// higher classes (no class starves). Indexed by [`IoClass::index`].
    pub deadlines: [Nanos; 4],
    /// Interactive commands sent head-of-queue that may be at the device at once; 0 for no
    /// limit (the default). A device that honours head-of-queue tags (SCSI's task set)
    /// puts each one before everything it holds, earlier head-of-queue commands too, so a
    /// burst of interactive reads is served newest first and the oldest waits for all the
    /// others. 2 keeps them in order: the one the device serves and the one that goes next
    /// (already there when the head is free, before the device turns to its own work, such
    /// as destaging its write cache); a third waits in the host queue. Holding back even
    /// the second is worse (the device starts its own work in the gap). Devices that ignore
    /// tag kinds (files, NVMe) need no limit, and a limit would only cap interactive
    /// parallelism while bulk is at the device.
    pub head_of_queue_max: u32,
}

impl Default for FairConfig {
    fn default() -> Self {
        Self {
            reserved: 1,
            target: 0,
            target_percent: 400,
            target_floor: 50_000,
            window: 64,
            window_time: 100_000_000,
            budget_start: 2048,
            budget_min: 8,
            budget_max: 32768,
            piece_min: 128,
            piece_max: 2048,
            probe_every: 500_000_000,
            probe_quiet: 1_000_000,
            probe_max: 10_000_000,
            probe_samples: 2,
            hold_percent: 50,
            hold_period: 100_000_000,
            cut_cooldown: 8,
            age: 200_000_000,
            idle_after: 5_000_000_000,
            anticipate: 2_000_000,
            drain_ahead: true,
            drain_floor_percent: 300,
            deadlines: [0, 500_000_000, 2_000_000_000, 10_000_000_000],
            head_of_queue_max: 0,
        }
    }
}

/// tagstripe's policy: interactive first, with reserved tags; while interactive I/O is
/// active, bulk's sectors at the device and its piece size are shaped by a latency controller
/// (see [`FairConfig`]), and when it is not, bulk runs free (work-conserving); per-class
/// deadlines age requests so no class starves; an interactive command waiting too long at the
/// device makes the next bulk command ordered.
///
/// ```
/// use tagstripe_scheduler::{Fair, FairConfig, Policy};
/// let p = Fair::new(FairConfig::default());
/// assert_eq!(p.name(), "tagstripe");
/// let shape = p.shape().unwrap();
/// assert_eq!(shape.budget_sectors, 2048);
/// assert_eq!(shape.baseline_ns, None, "no interactive I/O seen yet");
/// assert_eq!(shape.drain_floor_sectors, None, "no regular reader to drain ahead of");
/// ```
#[derive(Clone, Debug)]
pub struct Fair {
    cfg: FairConfig,
    /// Bulk sectors at the device.
    bulk_sectors: u64,
    /// Interactive requests submitted and not yet back.
    interactive_out: u32,
    /// For each interactive command at the device, in dispatch order: whether it went to a
    /// quiet device (an unloaded sample).
    quiet: std::collections::VecDeque<bool>,
    /// The last unloaded samples, and their median (the baseline).
    unloaded: std::collections::VecDeque<Nanos>,
    unloaded_median: Option<Nanos>,
    /// The fastest interactive completion lately, standing in until unloaded samples exist.
    fastest: Option<Nanos>,
    last_bulk_done: Option<Nanos>,
    probe_since: Option<Nanos>,
    probe_taken: u32,
    next_probe: Nanos,
    /// Since when bulk has been held back, the time held in this period, and its start.
    held_since: Option<Nanos>,
    held: Nanos,
    period_start: Nanos,
    window: Vec<Nanos>,
    window_start: Nanos,
    /// Bulk was held back by the budget during this window (so growing it is tested).
    bulk_wanted: bool,
    budget: u64,
    piece: u64,
    /// The budget before the last window's cut, and the tail that caused it.
    last_cut: Option<(u64, Nanos)>,
    /// Windows left in which no cut is made (after a cut that bought nothing).
    cooldown: u32,
    think: Option<Nanos>,
    /// The last think times, for draining ahead of a regular reader.
    thinks: std::collections::VecDeque<Nanos>,
    /// The next interactive request comes after a pause over 8 times the reader's shortest
    /// recent think time: it is no unloaded sample.
    resumed: bool,
    /// Bulk's drain rate at the device, in picoseconds a sector (smoothed), and the sectors
    /// completed and the time with bulk at the device gathered for its next sample since
    /// `bulk_event`.
    drain_ps: Option<u64>,
    drain_sectors: u64,
    drain_busy: Nanos,
    bulk_event: Nanos,
    last_interactive: Option<Nanos>,
    last_interactive_done: Option<Nanos>,
    barrier_out: bool,
    /// Interactive commands at the device that were sent head-of-queue.
    hoq_out: u32,
}

impl Fair {
    /// A policy with these settings.
    #[must_use]
    pub fn new(cfg: FairConfig) -> Self {
        let budget = cfg
            .budget_start
            .clamp(cfg.budget_min.max(1), cfg.budget_max.max(1));
        Self {
            piece: piece_for(&cfg, budget),
            budget,
            last_cut: None,
            cooldown: 0,
            cfg,
            bulk_sectors: 0,
            interactive_out: 0,
            quiet: std::collections::VecDeque::new(),
            unloaded: std::collections::VecDeque::new(),
            unloaded_median: None,
            fastest: None,
            last_bulk_done: None,
            probe_since: None,
            probe_taken: 0,
            next_probe: 0,
            held_since: None,
            held: 0,
            period_start: 0,
            window: Vec::new(),
            window_start: 0,
            bulk_wanted: false,
            think: None,
            thinks: std::collections::VecDeque::new(),
            resumed: false,
            drain_ps: None,
            drain_sectors: 0,
            drain_busy: 0,
            bulk_event: 0,
            last_interactive: None,
            last_interactive_done: None,
            barrier_out: false,
            hoq_out: 0,
        }
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &FairConfig {
        &self.cfg
    }

    /// Bulk's current budget of sectors at the device while interactive I/O is active.
    #[must_use]
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The interactive latency target at the device now.
    #[must_use]
    pub fn target(&self) -> Nanos {
        if self.cfg.target > 0 {
            return self.cfg.target;
        }
        let base = self.baseline().unwrap_or(0);
        (base.saturating_mul(u64::from(self.cfg.target_percent)) / 100).max(self.cfg.target_floor)
    }

    /// Interactive latency at the device with no bulk there: the median of the last
    /// unloaded samples (or, before there are any, the fastest completion seen).
    #[must_use]
    pub fn baseline(&self) -> Option<Nanos> {
        self.unloaded_median.or(self.fastest)
    }

    /// Whether bulk may be held back now: not past its share of this period.
    fn may_hold(&mut self, now: Nanos) -> bool {
        self.roll_period(now);
        let since = *self.held_since.get_or_insert(now);
        let held = self.held.saturating_add(now.saturating_sub(since));
        let cap = self.cfg.hold_period / 100 * u64::from(self.cfg.hold_percent.min(100));
        held < cap
    }

    /// Bulk went (or has nothing to send): a hold in progress ends.
    fn end_hold(&mut self, now: Nanos) {
        self.roll_period(now);
        if let Some(since) = self.held_since.take() {
            self.held = self.held.saturating_add(now.saturating_sub(since));
        }
    }

    fn roll_period(&mut self, now: Nanos) {
        if now.saturating_sub(self.period_start) >= self.cfg.hold_period.max(1) {
            self.period_start = now;
            self.held = 0;
            if self.held_since.is_some() {
                self.held_since = Some(now);
            }
        }
    }

    /// Whether a probe holds bulk back now; starts one when it is due.
    fn probing(&mut self, now: Nanos) -> bool {
        if let Some(since) = self.probe_since {
            if now.saturating_sub(since) < self.cfg.probe_max
                && self.probe_taken < self.cfg.probe_samples.max(1)
            {
                return true;
            }
            self.probe_since = None;
            self.next_probe = now.saturating_add(self.cfg.probe_every);
            return false;
        }
        if now >= self.next_probe {
            self.probe_since = Some(now);
            self.probe_taken = 0;
            return true;
        }
        false
    }

    fn active_at(&self, now: Nanos) -> bool {
        self.interactive_out > 0
            || self
                .last_interactive
                .is_some_and(|t| now.saturating_sub(t) < self.cfg.idle_after)
    }

    /// Until when bulk waits for a dependent interactive request, if it does now.
    fn anticipating(&self, now: Nanos) -> Option<Nanos> {
        let done = self.last_interactive_done?;
        let think = self.think.unwrap_or(0);
        let service = self.baseline().unwrap_or(Nanos::MAX);
        if think >= self.cfg.anticipate || think >= service {
            return None;
        }
        Some(done.saturating_add(self.cfg.anticipate)).filter(|&t| t > now)
    }

    /// The shortest of a regular reader's last think times, if it is one and drain-ahead is
    /// on and bulk's drain rate is known (see [`FairConfig::drain_ahead`]); with it, bulk's
    /// drain rate (picoseconds a sector) and the floor: `drain_floor_percent` of the sectors
    /// bulk drains while one unloaded interactive request is served.
    fn regular(&self) -> Option<(Nanos, u64, u64)> {
        if !self.cfg.drain_ahead || self.thinks.len() < 4 {
            return None;
        }
        let ps = self.drain_ps.filter(|&p| p > 0)?;
        let lo = self.thinks.iter().copied().min()?;
        let hi = self.thinks.iter().copied().max()?;
        if hi > lo.saturating_mul(2) {
            // Not a regular reader: its next request cannot be foreseen.
            return None;
        }
        let one = sectors_in(self.baseline()?, ps);
        let floor = (u128::from(one) * u128::from(self.cfg.drain_floor_percent) / 100)
            .clamp(8, u128::from(self.cfg.budget_max.max(8)));
        let floor = u64::try_from(floor).unwrap_or(u64::MAX);
        Some((lo, ps, floor))
    }

    /// Bulk sectors allowed at the device now (interactive I/O being active): the budget,
    /// or while a regular reader is foreseen, the floor plus what bulk drains before its
    /// next request is due.
    fn bulk_allowance(&self, now: Nanos) -> (u64, bool) {
        let Some((lo, ps, floor)) = self.regular() else {
            return (self.budget, true);
        };
        let max = self.cfg.budget_max.max(1);
        if self.interactive_out > 0 {
            // Its next request comes no sooner than its think time from now.
            return (floor.saturating_add(sectors_in(lo, ps)).min(max), false);
        }
        let Some(done) = self.last_interactive_done else {
            return (self.budget, true);
        };
        let due = done.saturating_add(lo);
        if now >= due.saturating_add(lo) {
            // Later than foreseen: the budget until it comes.
            return (self.budget, true);
        }
        let ahead = floor.saturating_add(sectors_in(due.saturating_sub(now), ps));
        (ahead.min(max), false)
    }

    /// Bulk at the device changes now: gathers its drain rate (sectors completed per time
    /// with bulk at the device) before `bulk_sectors` changes, adding `completed` sectors.
    fn note_bulk(&mut self, now: Nanos, completed: u64) {
        if self.bulk_sectors > 0 {
            self.drain_busy = self
                .drain_busy
                .saturating_add(now.saturating_sub(self.bulk_event));
        }
        self.bulk_event = now;
        self.drain_sectors = self.drain_sectors.saturating_add(completed);
        // A sample every millisecond of bulk at the device at least.
        if self.drain_busy >= 1_000_000 && self.drain_sectors > 0 {
            let sample = self.drain_busy.saturating_mul(1000) / self.drain_sectors;
            self.drain_ps = Some(match self.drain_ps {
                Some(old) => old.saturating_mul(3).saturating_add(sample) / 4,
                None => sample,
            });
            self.drain_busy = 0;
            self.drain_sectors = 0;
        }
    }

    /// The largest bulk piece now, interactive I/O being active: twice the floor (rounded
    /// down to a power of two) while draining ahead of a regular reader, else a quarter of
    /// the budget.
    fn piece_now(&self) -> u64 {
        self.piece_for(self.regular())
    }

    /// [`piece_now`](Self::piece_now) for what [`regular`](Self::regular) says.
    fn piece_for(&self, regular: Option<(Nanos, u64, u64)>) -> u64 {
        match regular {
            Some((_, _, floor)) => {
                // A power of two (whole pages from 8 sectors up), so the piece size does not
                // change with every new sample of the drain rate.
                let p = 1u64 << floor.saturating_mul(2).max(1).ilog2();
                let lo = self.cfg.piece_min.max(1);
                p.clamp(lo, self.cfg.piece_max.max(lo))
            }
            None => self.piece,
        }
    }

    /// Closes the window: cut the budget if interactive latency is above target, grow it if
    /// well below and bulk wanted more.
    fn evaluate(&mut self, now: Nanos) {
        let n = self.window.len();
        self.window_start = now;
        if n == 0 {
            return;
        }
        self.window.sort_unstable();
        // The window's tail: its second slowest completion (p97 of 64), or its slowest if
        // it holds fewer than 32.
        let tail = self.window[if n >= 32 { n - 2 } else { n - 1 }];
        self.window.clear();
        if self.regular().is_some() {
            // Draining ahead of a regular reader shapes bulk, not the budget: it is kept for
            // when the reader strays, neither cut nor grown for windows it did not shape.
            self.last_cut = None;
            self.bulk_wanted = false;
            return;
        }
        let target = self.target().max(1);
        let (min, max) = (self.cfg.budget_min.max(1), self.cfg.budget_max.max(1));
        let last_cut = self.last_cut.take();
        if tail > target {
            if let Some((before, tail_before)) = last_cut {
                if tail.saturating_mul(10) > tail_before.saturating_mul(9) {
                    // The last cut bought no latency (the tail comes from elsewhere, such as
                    // the device's own write-back): undo it and leave bulk alone a while, so
                    // bulk is not starved for nothing (work-conserving).
                    self.budget = before;
                    self.cooldown = self.cfg.cut_cooldown;
                }
            } else if self.cooldown > 0 {
                self.cooldown -= 1;
            } else {
                // Cut in proportion to the overshoot, by half at most.
                let keep = (u128::from(self.budget) * u128::from(target) / u128::from(tail))
                    .max(u128::from(self.budget / 2));
                let cut = u64::try_from(keep).unwrap_or(u64::MAX).max(min);
                if cut < self.budget {
                    self.last_cut = Some((self.budget, tail));
                    self.budget = cut;
                }
            }
        } else if tail.saturating_mul(10) < target.saturating_mul(8)
            && self.bulk_wanted
            && (self.cfg.target > 0 || !self.unloaded.is_empty())
        {
            // Grown only against a measured target: the fastest loaded completion that
            // stands in before the first unloaded sample is no reason to give bulk more.
            let step = (self.budget / 8).max(self.cfg.piece_min.max(1));
            self.budget = self.budget.saturating_add(step).min(max);
        }
        self.bulk_wanted = false;
        self.piece = piece_for(&self.cfg, self.budget);
    }

    /// Whether the head of bulk (`sectors` long) may go to the device now, interactive I/O
    /// being active.
    fn bulk_may_go(&mut self, now: Nanos, sectors: u64, interactive_at_device: bool) -> bool {
        // CAM's lesson: a device that reorders serves the bulk it is fed before a read it
        // already holds, so none is fed while a read is there (it is there briefly).
        let hold = interactive_at_device || self.anticipating(now).is_some() || self.probing(now);
        if !hold {
            self.end_hold(now);
        } else if self.may_hold(now) {
            return false;
        }
        let (allowance, by_budget) = self.bulk_allowance(now);
        if self.bulk_sectors > 0 && self.bulk_sectors.saturating_add(sectors) > allowance {
            // Only the budget's refusals grow it: while draining ahead, the drain limits bulk,
            // and a budget grown then would flood the device when the reader next strays.
            self.bulk_wanted |= by_budget;
            return false;
        }
        true
    }
}

/// The sectors bulk drains in `ns` at `ps` picoseconds a sector.
fn sectors_in(ns: Nanos, ps: u64) -> u64 {
    u64::try_from(u128::from(ns) * 1000 / u128::from(ps.max(1))).unwrap_or(u64::MAX)
}

/// Bulk pieces while shaping: a quarter of the budget, within the configured bounds, and a
/// whole number of 4 KiB pages when it is at least one (so the pieces of a page-aligned
/// buffer stay aligned for `O_DIRECT`, and need no copy).
fn piece_for(cfg: &FairConfig, budget: u64) -> u64 {
    let lo = cfg.piece_min.max(1);
    let p = (budget / 4).clamp(lo, cfg.piece_max.max(lo));
    let pages = p / 8 * 8;
    if pages >= lo { pages } else { p }
}

impl Policy for Fair {
    fn name(&self) -> &'static str {
        "tagstripe"
    }

    fn choose(&mut self, view: &View) -> Choice {
        let now = view.now;
        // Aging: the most overdue head of a lower class goes first.
        let overdue = IoClass::ALL[1..]
            .iter()
            .filter_map(|&c| {
                let h = view.heads[c.index()]?;
                let late = now
                    .saturating_sub(h.submitted)
                    .checked_sub(self.cfg.deadlines[c.index()])?;
                Some((late, c))
            })
            .max_by_key(|&(late, c)| (late, std::cmp::Reverse(c)));
        if let Some((_, class)) = overdue {
            return Choice::Dispatch {
                class,
                promote: None,
            };
        }
        let lower_at_device: u32 = view.active[1..].iter().sum();
        if view.heads[IoClass::Interactive.index()].is_some() {
            // Lower classes hold tags at the device: ask the device to run this next, unless
            // one of them has waited there past `age` (head-of-queue tags would keep passing
            // it: a device serving them first starves what it already holds).
            let lower_starving = view
                .oldest_lower_at_device
                .is_some_and(|t| now.saturating_sub(t) >= self.cfg.age);
            let promote = (lower_at_device > 0 && !lower_starving).then_some(TagKind::HeadOfQueue);
            // A head-of-queue command goes before everything the device holds, earlier
            // head-of-queue commands too: a burst of them is served newest first, and the
            // oldest waits for all the others. Hence `head_of_queue_max` (see there).
            let max = self.cfg.head_of_queue_max;
            if promote.is_none() || max == 0 || self.hoq_out < max {
                return Choice::Dispatch {
                    class: IoClass::Interactive,
                    promote,
                };
            }
        }
        let i = IoClass::Interactive.index();
        let active = self.active_at(now) || view.pending[i] > 0 || view.active[i] > 0;
        let room = if active {
            view.openings
                .saturating_sub(self.cfg.reserved.min(view.openings.saturating_sub(1)))
        } else {
            view.openings
        };
        let starving = view
            .oldest_interactive_at_device
            .is_some_and(|t| now.saturating_sub(t) >= self.cfg.age);
        for class in [IoClass::BestEffort, IoClass::Bulk, IoClass::Idle] {
            let Some(head) = view.heads[class.index()] else {
                continue;
            };
            if lower_at_device >= room {
                break;
            }
            let may = match class {
                IoClass::Bulk if active => self.bulk_may_go(now, head.sectors, view.active[i] > 0),
                IoClass::Idle => !active && view.pending[..3].iter().all(|&n| n == 0),
                _ => true,
            };
            if !may {
                continue;
            }
            let ordered = starving && !self.barrier_out;
            if ordered {
                self.barrier_out = true;
            }
            return Choice::Dispatch {
                class,
                promote: ordered.then_some(TagKind::Ordered),
            };
        }
        // Nothing may go now: ask again when a deadline, the anticipation or the idle window
        // passes.
        let deadline = IoClass::ALL[1..]
            .iter()
            .filter_map(|&c| {
                let h = view.heads[c.index()]?;
                Some(h.submitted.saturating_add(self.cfg.deadlines[c.index()]))
            })
            .min();
        let idle_end = self
            .last_interactive
            .map(|t| t.saturating_add(self.cfg.idle_after))
            .filter(|&t| t > now);
        let probe_end = self
            .probe_since
            .map(|t| t.saturating_add(self.cfg.probe_max))
            .filter(|&t| t > now);
        if view.heads[IoClass::Bulk.index()].is_none() {
            self.end_hold(now);
        }
        let cap = self.cfg.hold_period / 100 * u64::from(self.cfg.hold_percent.min(100));
        let hold_end = self
            .held_since
            .map(|since| since.saturating_add(cap.saturating_sub(self.held)))
            .filter(|&t| t > now);
        let until = [
            deadline,
            idle_end,
            self.anticipating(now),
            probe_end,
            hold_end,
        ]
        .into_iter()
        .flatten()
        .min();
        Choice::Wait { until }
    }

    fn on_submit(&mut self, now: Nanos, meta: &Meta) {
        if meta.class == IoClass::Interactive {
            if self.interactive_out == 0 {
                // Think time: from the last completion to this request, with none out.
                if let Some(done) = self.last_interactive_done {
                    let t = now.saturating_sub(done);
                    // A reader back from a pause far beyond its habit finds a device that
                    // has gone cold (the first read after a pause runs slow on many): its
                    // read tells nothing of the unloaded latency.
                    let habit = self
                        .thinks
                        .iter()
                        .copied()
                        .min()
                        .filter(|_| self.thinks.len() >= 4);
                    self.resumed = habit.is_some_and(|h| t > h.saturating_mul(8));
                    if self.thinks.len() >= 8 {
                        self.thinks.pop_front();
                    }
                    self.thinks.push_back(t);
                    self.think = Some(match self.think {
                        Some(old) => (old * 7 + t) / 8,
                        None => t,
                    });
                }
            }
            if !self.active_at(now) {
                self.window.clear();
                self.window_start = now;
            }
            self.interactive_out += 1;
            self.last_interactive = Some(now);
        }
    }

    fn on_dispatch(&mut self, now: Nanos, meta: &Meta, kind: TagKind) {
        if meta.class == IoClass::Interactive && kind == TagKind::HeadOfQueue {
            self.hoq_out += 1;
        }
        match meta.class {
            IoClass::Bulk => {
                self.note_bulk(now, 0);
                self.bulk_sectors = self.bulk_sectors.saturating_add(meta.sectors.max(1));
                self.end_hold(now);
            }
            IoClass::Interactive => {
                let quiet = self.bulk_sectors == 0
                    && !std::mem::take(&mut self.resumed)
                    && self
                        .last_bulk_done
                        .is_none_or(|t| now.saturating_sub(t) >= self.cfg.probe_quiet);
                self.quiet.push_back(quiet);
            }
            _ => {}
        }
    }

    fn on_release(&mut self, now: Nanos, meta: &Meta, kind: TagKind, how: Release) {
        if kind == TagKind::Ordered && meta.kind != TagKind::Ordered {
            self.barrier_out = false;
        }
        if meta.class == IoClass::Interactive && kind == TagKind::HeadOfQueue {
            self.hoq_out = self.hoq_out.saturating_sub(1);
        }
        match meta.class {
            IoClass::Bulk => {
                let done = if matches!(how, Release::Done { .. }) {
                    meta.sectors.max(1)
                } else {
                    0
                };
                self.note_bulk(now, done);
                self.bulk_sectors = self.bulk_sectors.saturating_sub(meta.sectors.max(1));
                self.last_bulk_done = Some(now);
                return;
            }
            IoClass::Interactive => {}
            _ => return,
        }
        let quiet = self.quiet.pop_front().unwrap_or(false);
        self.last_interactive = Some(now);
        if matches!(how, Release::Requeued) {
            return;
        }
        self.interactive_out = self.interactive_out.saturating_sub(1);
        self.last_interactive_done = Some(now);
        let Release::Done { device_ns } = how else {
            return;
        };
        if quiet {
            if self.unloaded.len() >= 8 {
                self.unloaded.pop_front();
            }
            self.unloaded.push_back(device_ns);
            let mut v: Vec<Nanos> = self.unloaded.iter().copied().collect();
            v.sort_unstable();
            self.unloaded_median = v.get(v.len() / 2).copied();
            self.probe_taken += 1;
            if self.probe_since.is_none() {
                self.next_probe = now.saturating_add(self.cfg.probe_every);
            }
        } else if self.unloaded.is_empty() {
            self.fastest = Some(self.fastest.map_or(device_ns, |m| m.min(device_ns)));
        }
        self.window.push(device_ns);
        let n = self.window.len() as u32;
        if n >= self.cfg.window.max(1)
            || (n >= 4 && now.saturating_sub(self.window_start) >= self.cfg.window_time)
        {
            self.evaluate(now);
        }
    }

    fn piece_limit(&self, now: Nanos, meta: &Meta) -> Option<u64> {
        (meta.class == IoClass::Bulk && self.active_at(now)).then(|| self.piece_now())
    }

    fn limits_pieces(&self, class: IoClass) -> bool {
        class == IoClass::Bulk
    }

    fn shape(&self) -> Option<Shape> {
        Some(Shape {
            bulk_sectors: self.bulk_sectors,
            budget_sectors: self.budget,
            piece_sectors: self.piece_now(),
            target_ns: self.target(),
            baseline_ns: self.baseline(),
            drain_floor_sectors: self.regular().map(|(_, _, floor)| floor),
        })
    }

    /// Without the target and baseline `shape` works out.
    fn shape_key(&self) -> Option<ShapeKey> {
        let regular = self.regular();
        Some(ShapeKey {
            budget_sectors: self.budget,
            piece_sectors: self.piece_for(regular),
            draining: regular.is_some(),
        })
    }
}
