//! The tagged-command queue: a sans-IO state machine in quinn's style.

use std::collections::VecDeque;

use crate::policy::{Choice, Head, Policy, Release, Shape, ShapeKey, View};
use crate::{
    Dispatch, Error, Event, IoClass, Meta, Nanos, Outcome, Refusal, SubmitError, Submitted, Tag,
    TagKind, Ticket,
};

/// Settings of a [`TagQueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// Tags the device takes (CAM's maxtags; 1 = untagged). Openings start here.
    pub max_tags: u32,
    /// Openings never shrink below this after QUEUE FULL (CAM's mintags).
    pub min_tags: u32,
    /// Most requests waiting in the host queue; further submits are refused
    /// ([`Refusal::Full`]), and the caller decides what that means: the `tagstripe` crate's
    /// `Queue` layer never lets it happen, its submitters wait for room instead.
    pub max_pending: usize,
    /// After this long without QUEUE FULL, each completion may raise the openings by one.
    pub ramp_quiet: Nanos,
    /// After BUSY, dispatch resumes at the next completion or after this delay (CAM: 1 s).
    pub busy_delay: Nanos,
    /// Whether the device enforces ordered tags itself (SCSI). If not (SATA NCQ, files,
    /// NVMe), the queue drains before an ordered request and holds later ones until it
    /// completes.
    pub device_orders: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            max_tags: 64,
            min_tags: 2,
            max_pending: 4096,
            ramp_quiet: 1_000_000_000,
            busy_delay: 1_000_000_000,
            device_orders: false,
        }
    }
}

#[derive(Debug)]
struct Pending<R> {
    ticket: Ticket,
    req: R,
    meta: Meta,
    submitted: Nanos,
    epoch: u64,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    ticket: Ticket,
    meta: Meta,
    kind: TagKind,
    submitted: Nanos,
    dispatched: Nanos,
    epoch: u64,
}

/// A device's tagged-command queue: requests are submitted with a class and tag kind,
/// dispatched to the device under a tag when the policy and the openings allow, and
/// completed by tag. Time is passed in; nothing here does I/O.
///
/// How to drive it: after [`submit`](Self::submit), [`handle_completion`](Self::handle_completion)
/// or [`handle_timeout`](Self::handle_timeout), call [`poll_dispatch`](Self::poll_dispatch)
/// until it returns `None`, drain [`poll_event`](Self::poll_event), and arm a timer for
/// [`poll_timeout`](Self::poll_timeout).
///
/// ```
/// use tagstripe_scheduler::{Dir, Fair, FairConfig, IoClass, Meta, Outcome, QueueConfig, TagQueue};
///
/// let mut q = TagQueue::new(QueueConfig::default(), Fair::new(FairConfig::default()));
/// let t = q.submit(0, "read block 7", Meta::new(IoClass::Interactive, Dir::Read)).unwrap();
/// let d = q.poll_dispatch(0).unwrap();
/// assert_eq!((d.ticket, d.req), (t, "read block 7"));
/// q.handle_completion(5_000_000, d.tag, Outcome::Done).unwrap();
/// assert!(matches!(q.poll_event(), Some(tagstripe_scheduler::Event::Completed { latency: 5_000_000, .. })));
/// ```
// Laid out in declaration order (`repr(C)`), what every request reads and writes first:
// a queue shared by the workers of a runtime moves its state between their cores at each
// request, a cache line at a time, so the fields of the common path (a request let through
// at once, its completion) share as few lines as they can, next to the lock of whoever
// holds the queue; what only a waiting request, a barrier or BUSY touches comes after.
#[derive(Debug)]
#[repr(C)]
pub struct TagQueue<R, P> {
    openings: u32,
    active_ordered: u32,
    active: [u32; 4],
    /// Requests waiting in the host queue (`pending` and `head_of_queue` together).
    queued: usize,
    next_ticket: u64,
    epoch: u64,
    busy_until: Option<Nanos>,
    wait_until: Option<Nanos>,
    drain_for: Option<IoClass>,
    closed: bool,
    /// Whether completions and failures are reported as events.
    completion_events: bool,
    free: Vec<u32>,
    slots: Vec<Option<Slot>>,
    events: VecDeque<Event>,
    policy: P,
    cfg: QueueConfig,
    pending: [VecDeque<Pending<R>>; 4],
    head_of_queue: VecDeque<Pending<R>>,
    /// When the BUSY pause in progress began.
    busy_from: Nanos,
    last_full: Option<Nanos>,
    last_ramp: Nanos,
    /// The policy's shaping as last reported (budget, piece, whether draining ahead).
    last_shape: Option<ShapeKey>,
}

impl<R, P: Policy> TagQueue<R, P> {
    /// A queue with openings at `cfg.max_tags` (at least 1) and the given policy.
    pub fn new(cfg: QueueConfig, policy: P) -> Self {
        let max = cfg.max_tags.max(1);
        let cfg = QueueConfig {
            max_tags: max,
            min_tags: cfg.min_tags.clamp(1, max),
            ..cfg
        };
        Self {
            cfg,
            policy,
            openings: max,
            slots: Vec::new(),
            free: Vec::new(),
            pending: Default::default(),
            head_of_queue: VecDeque::new(),
            events: VecDeque::new(),
            active: [0; 4],
            active_ordered: 0,
            next_ticket: 0,
            epoch: 0,
            busy_until: None,
            busy_from: 0,
            last_full: None,
            last_ramp: 0,
            wait_until: None,
            drain_for: None,
            closed: false,
            last_shape: None,
            queued: 0,
            completion_events: true,
        }
    }

    /// Whether [`Event::Completed`] and [`Event::Failed`] are queued for each command that
    /// comes back (on by default). A caller that drops them unread turns them off: they are
    /// the only events made for every request.
    ///
    /// ```
    /// use tagstripe_scheduler::{Dir, Event, Fair, FairConfig, IoClass, Meta, Outcome, QueueConfig, TagQueue};
    ///
    /// let completions = |on: bool| {
    ///     let mut q = TagQueue::new(QueueConfig::default(), Fair::new(FairConfig::default()));
    ///     q.set_completion_events(on);
    ///     q.submit(0, (), Meta::new(IoClass::BestEffort, Dir::Read)).unwrap();
    ///     let d = q.poll_dispatch(0).unwrap();
    ///     q.handle_completion(1_000, d.tag, Outcome::Done).unwrap();
    ///     std::iter::from_fn(|| q.poll_event())
    ///         .filter(|e| matches!(e, Event::Completed { .. }))
    ///         .count()
    /// };
    /// assert_eq!((completions(true), completions(false)), (1, 0));
    /// ```
    pub fn set_completion_events(&mut self, on: bool) {
        self.completion_events = on;
    }

    /// Queues a request.
    ///
    /// # Errors
    /// [`Refusal::Full`] when `max_pending` requests wait, [`Refusal::Closed`] after
    /// [`close`](Self::close); the request is handed back in the error.
    pub fn submit(&mut self, now: Nanos, req: R, meta: Meta) -> Result<Ticket, SubmitError<R>> {
        let p = self.admit(now, req, meta)?;
        let ticket = p.ticket;
        self.enqueue(p);
        Ok(ticket)
    }

    /// Queues a request and, when nothing waits in the host queue before it, dispatches it
    /// in the same call if the openings, the ordering rules and the policy allow: what
    /// [`submit`](Self::submit) then [`poll_dispatch`](Self::poll_dispatch) would do, the
    /// same decision from the same view, without the request passing through the host
    /// queue (the common case of a device that is not saturated, made cheap).
    ///
    /// [`Submitted::Queued`] when it waits: drive the queue as after
    /// [`submit`](Self::submit) (poll for dispatches, events and the timeout). After
    /// [`Submitted::Dispatched`], events and the timeout may have changed too.
    ///
    /// ```
    /// use tagstripe_scheduler::{Dir, Fair, FairConfig, IoClass, Meta, QueueConfig, Submitted, TagQueue};
    ///
    /// let mut q = TagQueue::new(QueueConfig { max_tags: 1, ..QueueConfig::default() }, Fair::new(FairConfig::default()));
    /// let meta = Meta::new(IoClass::BestEffort, Dir::Write);
    /// let Ok(Submitted::Dispatched(d)) = q.submit_now(0, "first", meta) else { panic!() };
    /// assert_eq!(d.req, "first");
    /// // The one tag is taken: the second waits, as it would after `submit`.
    /// assert!(matches!(q.submit_now(0, "second", meta), Ok(Submitted::Queued(_))));
    /// assert!(q.poll_dispatch(0).is_none());
    /// # Ok::<(), tagstripe_scheduler::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`submit`](Self::submit).
    pub fn submit_now(
        &mut self,
        now: Nanos,
        req: R,
        meta: Meta,
    ) -> Result<Submitted<R>, SubmitError<R>> {
        // Alone in the host queue, and nothing that `poll_dispatch` checks before the
        // policy stops it.
        let alone = self.queued == 0
            && meta.kind != TagKind::HeadOfQueue
            && self.drain_for.is_none()
            && self.busy_until.is_none()
            && self.active_total() < self.openings;
        let p = self.admit(now, req, meta)?;
        let ticket = p.ticket;
        // The lowest epoch waiting is its own.
        if !alone || !self.eligible(&p, p.epoch) {
            self.enqueue(p);
            return Ok(Submitted::Queued(ticket));
        }
        let class = meta.class;
        let mut heads = [None; 4];
        heads[class.index()] = Some(Head {
            ticket,
            submitted: now,
            dir: meta.dir,
            sectors: meta.sectors,
        });
        let mut pending = [0; 4];
        pending[class.index()] = 1;
        let view = self.view(now, heads, pending);
        self.wait_until = None;
        match self.policy.choose(&view) {
            Choice::Dispatch { class: c, promote } if c == class => {
                let ordered = promote == Some(TagKind::Ordered);
                if ordered && !self.cfg.device_orders && self.active_total() > 0 {
                    self.drain_for = Some(class);
                    self.enqueue(p);
                    return Ok(Submitted::Queued(ticket));
                }
                let kind = match (p.meta.kind, promote) {
                    (TagKind::Ordered, _) | (_, None) => p.meta.kind,
                    (_, Some(k)) => k,
                };
                // (Counted as queued for the moment `dispatch` takes it off.)
                self.queued += 1;
                let d = self.dispatch(now, p, kind);
                if ordered && d.meta.kind != TagKind::Ordered {
                    self.events.push_back(Event::Barrier { ticket: d.ticket });
                }
                Ok(Submitted::Dispatched(d))
            }
            // A class with nothing to send: nothing goes, as in `poll_dispatch`.
            Choice::Dispatch { .. } => {
                self.enqueue(p);
                Ok(Submitted::Queued(ticket))
            }
            Choice::Wait { until } => {
                self.wait_until = until.filter(|&t| t > now);
                self.enqueue(p);
                Ok(Submitted::Queued(ticket))
            }
        }
    }

    /// A request's entry in the host queue (its ticket and epoch, the policy told), not
    /// yet in it.
    fn admit(&mut self, now: Nanos, req: R, meta: Meta) -> Result<Pending<R>, SubmitError<R>> {
        if self.closed {
            return Err(SubmitError {
                reason: Refusal::Closed,
                req,
            });
        }
        if self.pending_len() >= self.cfg.max_pending {
            return Err(SubmitError {
                reason: Refusal::Full {
                    max: self.cfg.max_pending,
                },
                req,
            });
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        // An ordered request is an epoch of its own: everything before it goes first,
        // everything after it waits.
        let epoch = if meta.kind == TagKind::Ordered {
            self.epoch += 1;
            let e = self.epoch;
            self.epoch += 1;
            e
        } else {
            self.epoch
        };
        self.policy.on_submit(now, &meta);
        Ok(Pending {
            ticket,
            req,
            meta,
            submitted: now,
            epoch,
        })
    }

    /// Puts an admitted request at the back of its host queue.
    fn enqueue(&mut self, p: Pending<R>) {
        if p.meta.kind == TagKind::HeadOfQueue {
            self.head_of_queue.push_back(p);
        } else {
            self.pending[p.meta.class.index()].push_back(p);
        }
        self.queued += 1;
    }

    /// The next request to send to the device, if the openings, the ordering rules and the
    /// policy allow one now.
    #[must_use]
    pub fn poll_dispatch(&mut self, now: Nanos) -> Option<Dispatch<R>> {
        if self.queued == 0 || self.busy_until.is_some() || self.active_total() >= self.openings {
            return None;
        }
        let low = self.lowest_pending_epoch()?;
        if let Some(class) = self.drain_for {
            // A barrier on a device that does not order: send it alone, once drained.
            if self.active_total() > 0 {
                return None;
            }
            self.drain_for = None;
            if self.pending[class.index()]
                .front()
                .is_some_and(|p| self.eligible(p, low))
            {
                let p = self.pending[class.index()].pop_front()?;
                let d = self.dispatch(now, p, TagKind::Ordered);
                if d.meta.kind != TagKind::Ordered {
                    self.events.push_back(Event::Barrier { ticket: d.ticket });
                }
                return Some(d);
            }
        }
        if self
            .head_of_queue
            .front()
            .is_some_and(|p| self.eligible(p, low))
        {
            let p = self.head_of_queue.pop_front()?;
            let kind = TagKind::HeadOfQueue;
            return Some(self.dispatch(now, p, kind));
        }
        let mut heads = [None; 4];
        for c in IoClass::ALL {
            if let Some(p) = self.pending[c.index()].front() {
                if self.eligible(p, low) {
                    heads[c.index()] = Some(Head {
                        ticket: p.ticket,
                        submitted: p.submitted,
                        dir: p.meta.dir,
                        sectors: p.meta.sectors,
                    });
                }
            }
        }
        let view = self.view(now, heads, std::array::from_fn(|i| self.pending[i].len()));
        self.wait_until = None;
        match self.policy.choose(&view) {
            Choice::Dispatch { class, promote } => {
                heads[class.index()]?;
                let ordered = promote == Some(TagKind::Ordered);
                if ordered && !self.cfg.device_orders && self.active_total() > 0 {
                    self.drain_for = Some(class);
                    return None;
                }
                let p = self.pending[class.index()].pop_front()?;
                let kind = match (p.meta.kind, promote) {
                    (TagKind::Ordered, _) | (_, None) => p.meta.kind,
                    (_, Some(k)) => k,
                };
                let d = self.dispatch(now, p, kind);
                if ordered && d.meta.kind != TagKind::Ordered {
                    self.events.push_back(Event::Barrier { ticket: d.ticket });
                }
                Some(d)
            }
            Choice::Wait { until } => {
                self.wait_until = until.filter(|&t| t > now);
                None
            }
        }
    }

    /// What the policy sees: the queue's state, with these heads and pending counts.
    fn view(&self, now: Nanos, heads: [Option<Head>; 4], pending: [usize; 4]) -> View {
        View {
            now,
            openings: self.openings,
            active: self.active,
            pending,
            heads,
            oldest_interactive_at_device: if self.active[IoClass::Interactive.index()] == 0 {
                None
            } else {
                self.slots
                    .iter()
                    .flatten()
                    .filter(|s| s.meta.class == IoClass::Interactive)
                    .map(|s| s.dispatched)
                    .min()
            },
            // Only asked for when an interactive request may go past lower classes there.
            oldest_lower_at_device: if heads[IoClass::Interactive.index()].is_some()
                && self.active[1..].iter().any(|&n| n > 0)
            {
                self.slots
                    .iter()
                    .flatten()
                    .filter(|s| s.meta.class != IoClass::Interactive)
                    .map(|s| s.dispatched)
                    .min()
            } else {
                None
            },
        }
    }

    /// Records the device's answer for the command holding `tag`.
    ///
    /// # Errors
    /// [`Error::UnknownTag`] if no command holds `tag` (never dispatched, or already
    /// completed). The queue is unchanged then.
    pub fn handle_completion(
        &mut self,
        now: Nanos,
        tag: Tag,
        outcome: Outcome<R>,
    ) -> Result<(), Error> {
        let slot = self
            .slots
            .get_mut(tag.0 as usize)
            .and_then(Option::take)
            .ok_or(Error::UnknownTag { tag: tag.0 })?;
        self.free.push(tag.0);
        let class = slot.meta.class.index();
        self.active[class] = self.active[class].saturating_sub(1);
        if slot.kind == TagKind::Ordered {
            self.active_ordered = self.active_ordered.saturating_sub(1);
        }
        let requeue = |q: &mut Self, req: R| {
            let p = Pending {
                ticket: slot.ticket,
                req,
                meta: slot.meta,
                submitted: slot.submitted,
                epoch: slot.epoch,
            };
            // Back in ticket order, so each queue stays sorted and its front has the
            // lowest epoch (several requests may come back out of order).
            let queue = if slot.meta.kind == TagKind::HeadOfQueue {
                &mut q.head_of_queue
            } else {
                &mut q.pending[class]
            };
            let at = queue.partition_point(|x| x.ticket < p.ticket);
            queue.insert(at, p);
            q.queued += 1;
        };
        match outcome {
            Outcome::Done | Outcome::Failed => {
                let done = matches!(outcome, Outcome::Done);
                if self.completion_events {
                    self.events.push_back(if done {
                        Event::Completed {
                            ticket: slot.ticket,
                            latency: now.saturating_sub(slot.submitted),
                        }
                    } else {
                        Event::Failed {
                            ticket: slot.ticket,
                        }
                    });
                }
                let how = if done {
                    Release::Done {
                        device_ns: now.saturating_sub(slot.dispatched),
                    }
                } else {
                    Release::Failed
                };
                self.policy.on_release(now, &slot.meta, slot.kind, how);
                self.note_shape();
                self.busy_until = None;
                self.maybe_ramp(now);
            }
            Outcome::QueueFull(req) => {
                let others = self.active_total();
                requeue(self, req);
                self.policy
                    .on_release(now, &slot.meta, slot.kind, Release::Requeued);
                if others == 0 {
                    // QUEUE FULL with nothing else outstanding is BUSY (CAM).
                    self.busy(now);
                } else {
                    self.last_full = Some(now);
                    self.set_openings_inner(others.max(self.cfg.min_tags));
                }
            }
            Outcome::Busy(req) => {
                requeue(self, req);
                self.policy
                    .on_release(now, &slot.meta, slot.kind, Release::Requeued);
                self.busy(now);
            }
        }
        Ok(())
    }

    /// Lets timers fire: BUSY back-off ends, policy waits expire. Call at or after
    /// [`poll_timeout`](Self::poll_timeout), then poll for dispatches again.
    pub fn handle_timeout(&mut self, now: Nanos) {
        if self.busy_until.is_some_and(|t| t <= now) {
            self.busy_until = None;
        }
        if self.wait_until.is_some_and(|t| t <= now) {
            self.wait_until = None;
        }
    }

    /// The next event, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next, if anything is waiting
    /// on time alone.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Nanos> {
        match (self.busy_until, self.wait_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sets the openings at run time (what `camcontrol tags -N` does), clamped to
    /// `[min_tags, max_tags]`. Commands already at the device stay there.
    pub fn set_openings(&mut self, openings: u32) {
        self.set_openings_inner(openings);
    }

    /// Sets how long dispatch pauses after BUSY (or QUEUE FULL with nothing else at the
    /// device) when no command completes first ([`QueueConfig::busy_delay`]; CAM's 1 s
    /// suits a disk spinning up, not a device whose BUSY is brief back-pressure). A pause
    /// in progress then ends `delay` after it began: at once if that has passed (call
    /// [`poll_timeout`](Self::poll_timeout) again to see the new time).
    pub fn set_busy_delay(&mut self, delay: Nanos) {
        self.cfg.busy_delay = delay;
        if self.busy_until.is_some() {
            self.busy_until = Some(self.busy_from.saturating_add(delay));
        }
    }

    fn busy(&mut self, now: Nanos) {
        self.busy_from = now;
        self.busy_until = Some(now.saturating_add(self.cfg.busy_delay));
    }

    /// Refuses further submits; queued requests still dispatch.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// The current openings.
    #[must_use]
    pub fn openings(&self) -> u32 {
        self.openings
    }

    /// Commands at the device.
    #[must_use]
    pub fn active_total(&self) -> u32 {
        self.active.iter().sum()
    }

    /// Commands at the device of one class.
    #[must_use]
    pub fn active(&self, class: IoClass) -> u32 {
        self.active[class.index()]
    }

    /// Requests waiting in the host queue.
    #[must_use]
    pub fn pending_len(&self) -> usize {
        self.queued
    }

    /// The request of a still-pending ticket, to change it in place (e.g. to attach a way
    /// to notify its submitter once it turns out it has to wait).
    pub fn pending_mut(&mut self, ticket: Ticket) -> Option<&mut R> {
        self.pending
            .iter_mut()
            .chain(std::iter::once(&mut self.head_of_queue))
            .flat_map(|q| q.iter_mut())
            .find(|p| p.ticket == ticket)
            .map(|p| &mut p.req)
    }

    /// The largest piece, in sectors, the policy wants a request with `meta` cut into if it
    /// is submitted now ([`Policy::piece_limit`]); `None` for no limit.
    #[must_use]
    pub fn piece_limit(&self, now: Nanos, meta: &Meta) -> Option<u64> {
        self.policy.piece_limit(now, meta)
    }

    /// How the policy shapes bulk now ([`Policy::shape`]).
    #[must_use]
    pub fn shape(&self) -> Option<Shape> {
        self.policy.shape()
    }

    /// Queues an [`Event::Shaped`] if the policy's shaping changed.
    fn note_shape(&mut self) {
        let key = self.policy.shape_key();
        if key != self.last_shape {
            self.last_shape = key;
            if let Some(s) = self.policy.shape() {
                self.events.push_back(Event::Shaped(s));
            }
        }
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    fn set_openings_inner(&mut self, openings: u32) {
        let n = openings.clamp(self.cfg.min_tags, self.cfg.max_tags);
        if n != self.openings {
            self.openings = n;
            self.events.push_back(Event::Openings { openings: n });
        }
    }

    fn maybe_ramp(&mut self, now: Nanos) {
        let Some(full) = self.last_full else { return };
        let quiet = self.cfg.ramp_quiet;
        if self.openings < self.cfg.max_tags
            && now.saturating_sub(full) >= quiet
            && now.saturating_sub(self.last_ramp) >= quiet
        {
            self.last_ramp = now;
            self.set_openings_inner(self.openings + 1);
        }
    }

    fn lowest_pending_epoch(&self) -> Option<u64> {
        self.pending
            .iter()
            .chain(std::iter::once(&self.head_of_queue))
            .filter_map(|q| q.front().map(|p| p.epoch))
            .min()
    }

    /// Whether `p` may go to the device now under the ordering rules.
    fn eligible(&self, p: &Pending<R>, low: u64) -> bool {
        if p.epoch != low {
            return false;
        }
        if self.cfg.device_orders {
            return true;
        }
        if p.meta.kind == TagKind::Ordered {
            self.active_total() == 0
        } else {
            self.active_ordered == 0
        }
    }

    /// Sends `p` (just taken off its host queue) to the device under a free tag.
    fn dispatch(&mut self, now: Nanos, p: Pending<R>, kind: TagKind) -> Dispatch<R> {
        self.queued -= 1;
        let tag = match self.free.pop() {
            Some(t) => t,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        if let Some(s) = self.slots.get_mut(tag as usize) {
            *s = Some(Slot {
                ticket: p.ticket,
                meta: p.meta,
                kind,
                submitted: p.submitted,
                dispatched: now,
                epoch: p.epoch,
            });
        }
        self.active[p.meta.class.index()] += 1;
        if kind == TagKind::Ordered {
            self.active_ordered += 1;
        }
        self.policy.on_dispatch(now, &p.meta, kind);
        Dispatch {
            tag: Tag(tag),
            ticket: p.ticket,
            kind,
            meta: p.meta,
            req: p.req,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layout the common path relies on (see the comment on [`TagQueue`]): its counters,
    /// free-tag list and slots within the struct's first three cache lines (136 bytes), the
    /// host queue's class queues (touched only by requests that wait) after them.
    #[test]
    fn the_common_paths_fields_come_first() {
        type Q = TagQueue<(), Box<dyn Policy + Send>>;
        let hot_end = [
            offset_of!(Q, openings) + size_of::<u32>(),
            offset_of!(Q, active) + size_of::<[u32; 4]>(),
            offset_of!(Q, queued) + size_of::<usize>(),
            offset_of!(Q, next_ticket) + size_of::<u64>(),
            offset_of!(Q, busy_until) + size_of::<Option<Nanos>>(),
            offset_of!(Q, free) + size_of::<Vec<u32>>(),
            offset_of!(Q, slots) + size_of::<Vec<Option<Slot>>>(),
        ]
        .into_iter()
        .max()
        .unwrap_or(usize::MAX);
        assert!(
            hot_end <= 192,
            "the common path's fields end at byte {hot_end}"
        );
        assert!(offset_of!(Q, pending) >= hot_end);
        assert!(offset_of!(Q, head_of_queue) >= hot_end);
    }
}
