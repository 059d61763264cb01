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

/// Settings of [`Fair`], tagstripe's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairConfig {
    /// Tags kept free for interactive requests while interactive I/O is active.
    pub reserved: u32,
    /// The fewest device tags bulk may hold while interactive I/O is active.
    pub bulk_min: u32,
    /// The most device tags bulk may hold while interactive I/O is active.
    pub bulk_max: u32,
    /// Interactive time at the device above which bulk's share halves.
    pub target: Nanos,
    /// An interactive command at the device longer than this makes the next bulk command
    /// ordered (da(4)'s barrier, driven by latency instead of a 15 s timer).
    pub age: Nanos,
    /// Interactive I/O counts as active this long after its last request.
    pub idle_after: Nanos,
    /// Bulk tags allowed while an interactive request is queued or at the device (0: bulk
    /// waits, as BFQ idles for a synchronous reader).
    pub bulk_in_flight: u32,
    /// After an interactive request completes, bulk keeps to `bulk_in_flight` this long
    /// more, so a reader's next dependent request finds the device free (BFQ's
    /// `slice_idle` idea; a login is a chain of such reads).
    pub anticipate: Nanos,
    /// Per-class deadlines: a head older than its class's deadline goes before
    /// higher classes (no class starves). Indexed by [`IoClass::index`].
    pub deadlines: [Nanos; 4],
    /// After bulk's limit was cut, it may grow back only to one below the value that was
    /// too many; that ceiling rises by one tag per `probe` (a slow probe of the device).
    pub probe: Nanos,
}

impl Default for FairConfig {
    fn default() -> Self {
        Self {
            reserved: 1,
            bulk_min: 1,
            bulk_max: 16,
            target: 50_000_000,
            age: 200_000_000,
            idle_after: 5_000_000_000,
            bulk_in_flight: 0,
            anticipate: 2_000_000,
            deadlines: [0, 500_000_000, 2_000_000_000, 10_000_000_000],
            probe: 30_000_000_000,
        }
    }
}

/// tagstripe's policy: interactive first, with reserved tags; bulk's share of the device's
/// tag window is bounded (adaptively, from interactive latency at the device) while
/// interactive I/O is active and unbounded when it is not (work-conserving); per-class
/// deadlines age requests so no class starves; and an interactive command waiting too long
/// at the device makes the next bulk command ordered.
///
/// ```
/// use tagstripe_scheduler::{Fair, FairConfig, Policy};
/// let p = Fair::new(FairConfig::default());
/// assert_eq!(p.name(), "tagstripe");
/// assert_eq!(p.bulk_limit(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct Fair {
    cfg: FairConfig,
    bulk_limit: u32,
    ceiling: u32,
    ceiling_since: Nanos,
    good: u32,
    last_interactive: Option<Nanos>,
    last_interactive_done: Option<Nanos>,
    barrier_out: bool,
}

impl Fair {
    /// A policy with these settings.
    #[must_use]
    pub fn new(cfg: FairConfig) -> Self {
        Self {
            bulk_limit: cfg.bulk_min.max(1),
            ceiling: cfg.bulk_max.max(1),
            ceiling_since: 0,
            cfg,
            good: 0,
            last_interactive: None,
            last_interactive_done: None,
            barrier_out: false,
        }
    }

    /// Bulk's current tag limit while interactive I/O is active.
    #[must_use]
    pub fn bulk_limit(&self) -> u32 {
        self.bulk_limit
    }

    fn interactive_active(&self, view: &View) -> bool {
        let i = IoClass::Interactive.index();
        view.pending[i] > 0
            || view.active[i] > 0
            || self
                .last_interactive
                .is_some_and(|t| view.now.saturating_sub(t) < self.cfg.idle_after)
    }
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
            // Lower classes hold tags at the device: ask the device to run this next.
            return Choice::Dispatch {
                class: IoClass::Interactive,
                promote: (lower_at_device > 0).then_some(TagKind::HeadOfQueue),
            };
        }
        let active = self.interactive_active(view);
        let i = IoClass::Interactive.index();
        let anticipating = self
            .last_interactive_done
            .map(|t| t.saturating_add(self.cfg.anticipate))
            .filter(|&t| t > now);
        let in_flight = view.pending[i] > 0 || view.active[i] > 0 || anticipating.is_some();
        let others: u32 = view.active[1..].iter().sum();
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
            if view.heads[class.index()].is_none() || others >= room {
                continue;
            }
            let limit = match class {
                IoClass::Bulk if in_flight => self.cfg.bulk_in_flight,
                IoClass::Bulk if active => self.bulk_limit,
                IoClass::Idle if active || view.pending[..3].iter().any(|&n| n > 0) => 0,
                _ => u32::MAX,
            };
            if view.active[class.index()] >= limit {
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
        // Nothing may go now: ask again when a deadline or the idle window passes.
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
        let until = [deadline, idle_end, anticipating]
            .into_iter()
            .flatten()
            .min();
        Choice::Wait { until }
    }

    fn on_submit(&mut self, now: Nanos, meta: &Meta) {
        if meta.class == IoClass::Interactive {
            self.last_interactive = Some(now);
        }
    }

    fn on_release(&mut self, now: Nanos, meta: &Meta, kind: TagKind, how: Release) {
        if kind == TagKind::Ordered && meta.kind != TagKind::Ordered {
            self.barrier_out = false;
        }
        if meta.class != IoClass::Interactive {
            return;
        }
        self.last_interactive = Some(now);
        if matches!(how, Release::Done { .. } | Release::Failed) {
            self.last_interactive_done = Some(now);
        }
        let floor = self.cfg.bulk_min.max(1);
        if let Release::Done { device_ns } = how {
            if device_ns > self.cfg.target {
                // Too many bulk tags: cut, and remember that this many was too many.
                self.ceiling = self.bulk_limit.saturating_sub(1).max(floor);
                self.ceiling_since = now;
                self.bulk_limit = (self.bulk_limit / 2).max(floor);
                self.good = 0;
            } else if device_ns < self.cfg.target / 2 {
                self.good += 1;
                let max = self.cfg.bulk_max.max(1);
                if now.saturating_sub(self.ceiling_since) >= self.cfg.probe && self.ceiling < max {
                    self.ceiling += 1;
                    self.ceiling_since = now;
                }
                if self.good >= 16 {
                    self.good = 0;
                    self.bulk_limit = (self.bulk_limit + 1).min(self.ceiling);
                }
            }
        }
    }
}
