//! Queue: a device's tagged queue, driven on tokio.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tagstripe_scheduler::{
    Dir, Event, Fair, FairConfig, IoClass, Meta, Outcome, Policy, QueueConfig, Shape, Submitted,
    Tag, TagKind, TagQueue,
};
use tokio::sync::{broadcast, oneshot};
use tokio::time::Instant;

use crate::device::Parts;
use crate::stats::{OpKind, Stats};
use crate::{BlockDevice, DeviceInfo, Error, IoOpts, Result};
use futures_util::future::Either;

/// Permission to issue a request: the tag it holds and the tag kind to send. A grant that
/// is never taken up (its request was cancelled after it was sent) gives the tag back when
/// dropped, so openings are never lost.
struct Grant {
    tag: Tag,
    kind: TagKind,
    release: Option<Arc<Mutex<Inner>>>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant").field("tag", &self.tag).finish()
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(inner) = self.release.take() {
            let mut g = inner.lock();
            let now = g.now();
            let _ = g.q.handle_completion(now, self.tag, Outcome::Failed);
            pump(&inner, &mut g, now);
        }
    }
}

/// Room in a pool's host queue, which holds at most `max_pending` requests: a request that
/// finds it full waits here for room (as a Linux submitter sleeps for a free request)
/// instead of failing. A 1 MiB write to a device that takes 4 KiB at a time is 256 requests
/// here, so a few writers fill it.
///
/// Requests of every class but interactive may hold at most three quarters of the room
/// between them (as Linux's Kyber keeps async requests to 75% of its tags,
/// `KYBER_ASYNC_PERCENT` in block/kyber-iosched.c): an interactive request finds room at
/// once, and never queues behind a backlog of bulk submitters. Those who wait are let in
/// first come, first served, interactive ones first.
///
/// Kept under the queue's lock with the tags (a request is admitted in the same critical
/// section that submits it, and leaves in the one that completes it), not in semaphores of
/// its own: two semaphores cost a request four atomic updates and two locks more.
struct Room {
    /// Requests admitted and not yet finished: of every class, and of the classes other
    /// than interactive.
    all: usize,
    lower: usize,
    /// The most of each.
    max_all: usize,
    max_lower: usize,
    /// Submitters waiting for room, in order of arrival: interactive ones, then the others.
    waiting: [std::collections::VecDeque<oneshot::Sender<Handed>>; 2],
}

impl Room {
    fn new(max_pending: usize) -> Self {
        let max_all = max_pending.max(4);
        Self {
            all: 0,
            lower: 0,
            max_all,
            max_lower: max_all / 4 * 3,
            waiting: Default::default(),
        }
    }

    /// Whether a request of `class` may come in now: room for it, and nobody of its kind
    /// waiting before it.
    fn may_enter(&self, lower: bool) -> bool {
        self.all < self.max_all
            && (!lower || (self.lower < self.max_lower && self.waiting[1].is_empty()))
            && self.waiting[0].is_empty()
    }

    fn enter(&mut self, lower: bool) {
        self.all += 1;
        self.lower += usize::from(lower);
    }

    fn leave(&mut self, lower: bool) {
        self.all = self.all.saturating_sub(1);
        if lower {
            self.lower = self.lower.saturating_sub(1);
        }
    }

    /// Lets in as many waiting submitters as there is room for (interactive ones first),
    /// each handed its room; one who gave up is passed over, its room kept.
    #[inline]
    fn hand_out(&mut self, shared: &Arc<Mutex<Inner>>) {
        if self
            .waiting
            .iter()
            .all(std::collections::VecDeque::is_empty)
        {
            return;
        }
        self.hand_out_waiting(shared);
    }

    /// [`hand_out`](Self::hand_out) with someone waiting.
    fn hand_out_waiting(&mut self, shared: &Arc<Mutex<Inner>>) {
        loop {
            let lower = if self.all >= self.max_all {
                return;
            } else if !self.waiting[0].is_empty() {
                false
            } else if self.lower < self.max_lower && !self.waiting[1].is_empty() {
                true
            } else {
                return;
            };
            let Some(tx) = self.waiting[usize::from(lower)].pop_front() else {
                return;
            };
            self.enter(lower);
            let handed = Handed {
                lower,
                release: Some(Arc::clone(shared)),
            };
            if let Err(mut handed) = tx.send(handed) {
                // Gone before its turn: the room stays (the lock is held, so not given back
                // through the token's drop).
                handed.release = None;
                self.leave(lower);
            }
        }
    }
}

/// Room handed to a submitter that waited for it. Dropped without being taken up (its
/// submitter cancelled after it was sent), it gives the room back.
struct Handed {
    lower: bool,
    release: Option<Arc<Mutex<Inner>>>,
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(inner) = self.release.take() {
            let mut g = inner.lock();
            g.room.leave(self.lower);
            g.room.hand_out(&inner);
        }
    }
}

/// A request's room in the host queue, given back when dropped (or, as it completes, in
/// the same critical section: [`Queue::release`]).
struct Admitted<'a> {
    inner: &'a Arc<Mutex<Inner>>,
    lower: bool,
    held: bool,
}

impl Admitted<'_> {
    /// Gives the room back under the lock the caller holds.
    fn leave(&mut self, g: &mut Inner) {
        if std::mem::take(&mut self.held) {
            g.room.leave(self.lower);
            g.room.hand_out(self.inner);
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if self.held {
            let mut g = self.inner.lock();
            self.leave(&mut g);
        }
    }
}

/// Who to tell when a request gets its tag: nobody yet (the submitter is still holding the
/// lock and looks at the dispatches itself), or a channel it waits on.
enum Waiter {
    Inline,
    Channel(oneshot::Sender<Grant>),
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Inline => "Inline",
            Self::Channel(_) => "Channel",
        })
    }
}

/// How a request got into the host queue: admitted and queued, or waiting for room.
enum Entered<'a> {
    Now(Admitted<'a>, Acquired),
    Wait(oneshot::Receiver<Handed>),
}

/// How a request got (or will get) its tag.
enum Acquired {
    Now(Tag, TagKind),
    Wait(oneshot::Receiver<Grant>),
}

// In declaration order (`repr(C)`): the tag queue's own state first (see `TagQueue`'s
// layout), beside the lock, then the rest of what every request touches; the name and the
// event channel, which only events read, last.
#[repr(C)]
struct Inner {
    q: TagQueue<Waiter, Box<dyn Policy + Send>>,
    /// The latest time the queue used (nanoseconds from `epoch`): a request issued before it
    /// (its time read by a volume above, see `crate::times`) is submitted at it, so the
    /// scheduler's time never goes back.
    last: u64,
    epoch: Instant,
    timer_at: Option<u64>,
    /// Room in the host queue, shared by the pool's queues.
    room: Room,
    /// Whether anyone ever subscribed (until then no event is sent).
    subscribed: bool,
    /// The device's name, for events.
    name: String,
    /// The queue's events go to whoever subscribed ([`QueueHandle::subscribe`]).
    events: broadcast::Sender<Event>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("openings", &self.q.openings())
            .field("active", &self.q.active_total())
            .field("pending", &self.q.pending_len())
            .finish()
    }
}

impl Inner {
    /// The clock, read now.
    fn now(&mut self) -> u64 {
        self.time(Instant::now())
    }

    /// `at` in nanoseconds from `epoch`, never before a time already used.
    fn time(&mut self, at: Instant) -> u64 {
        let ns =
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.last = self.last.max(ns);
        self.last
    }
}

/// Holds a tag until the request completes; if the caller's future is dropped first, the
/// tag is given back as failed so the queue never leaks openings.
struct TagGuard<'a> {
    inner: &'a Arc<Mutex<Inner>>,
    tag: Option<Tag>,
}

impl Drop for TagGuard<'_> {
    fn drop(&mut self) {
        if let Some(tag) = self.tag.take() {
            let mut g = self.inner.lock();
            let now = g.now();
            let _ = g.q.handle_completion(now, tag, Outcome::Failed);
            let _ = pump(self.inner, &mut g, now);
        }
    }
}

/// Dispatches whatever the queue allows, hands the grants out, and arms the timer. A grant
/// for the request submitted in this same critical section (`Waiter::Inline`) is returned.
/// `now` is the queue's clock, read by the caller under the same lock.
fn pump(shared: &Arc<Mutex<Inner>>, g: &mut Inner, now: u64) -> Option<(Tag, TagKind)> {
    let mut inline = None;
    while let Some(d) = g.q.poll_dispatch(now) {
        let tx = match d.req {
            Waiter::Inline => {
                inline = Some((d.tag, d.kind));
                continue;
            }
            Waiter::Channel(tx) => tx,
        };
        let grant = Grant {
            tag: d.tag,
            kind: d.kind,
            release: Some(Arc::clone(shared)),
        };
        if let Err(mut grant) = tx.send(grant) {
            // The caller gave up before its turn came: release the tag here (the lock is
            // held, so not through the grant's drop).
            grant.release = None;
            let _ = g.q.handle_completion(now, d.tag, Outcome::Failed);
        }
    }
    while let Some(e) = g.q.poll_event() {
        match e {
            Event::Openings { openings } => tracing::info!(
                target: "tagstripe::queue",
                device = %g.name,
                openings,
                "tag openings changed"
            ),
            Event::Shaped(s) => tracing::debug!(
                target: "tagstripe::queue",
                device = %g.name,
                budget_sectors = s.budget_sectors,
                piece_sectors = s.piece_sectors,
                target_us = s.target_ns / 1000,
                drain_floor_sectors = ?s.drain_floor_sectors,
                "bulk shaping changed"
            ),
            Event::Barrier { ticket } => tracing::debug!(
                target: "tagstripe::queue",
                device = %g.name,
                ticket = ticket.0,
                "ordered tag sent to stop an interactive request's starvation"
            ),
            _ => {}
        }
        // (Not `receiver_count`, which takes the channel's lock: for every completion.)
        if g.subscribed {
            let _ = g.events.send(e);
        }
    }
    if let Some(t) = g.q.poll_timeout() {
        if g.timer_at.is_none_or(|armed| t < armed) {
            g.timer_at = Some(t);
            let shared = Arc::clone(shared);
            let at = g.epoch + Duration::from_nanos(t);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    tokio::time::sleep_until(at).await;
                    let mut g = shared.lock();
                    g.timer_at = None;
                    let now = g.now();
                    g.q.handle_timeout(now);
                    let _ = pump(&shared, &mut g, now);
                });
            }
        }
    }
    inline
}

/// Puts a device behind a CAM-like tagged queue: each request (each piece, under a
/// [`crate::Split`]) waits for a tag opening and the policy's turn, QUEUE FULL and BUSY from
/// the device are retried as the queue decides, and the tag kind the policy chose (a
/// barrier, head-of-queue) reaches the device in [`IoOpts::kind`]. The host queue holds at
/// most 4,096 requests; a request that finds it full waits for room and is never refused,
/// and requests of classes other than interactive fill at most three quarters of it, so an
/// interactive request always finds room at once.
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, Queue};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let q = Queue::new(MemDevice::new("mem0", 1024));
/// q.write(0, Bytes::from(vec![3u8; 512]), IoOpts::new()).await?;
/// assert_eq!(q.read(0, 1, IoOpts::new()).await?[0], 3);
/// assert_eq!(q.stats().snapshot().transfers(), 2);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Queue<D> {
    dev: D,
    inner: Arc<Mutex<Inner>>,
    stats: Arc<Stats>,
    /// Per class, whether the policy may cut its requests into pieces.
    cuts: [bool; 4],
}

impl<D: BlockDevice> Queue<D> {
    /// A queue with the device's tag limits and tagstripe's fair policy.
    pub fn new(dev: D) -> Self {
        Self::with_policy(dev, Box::new(Fair::new(FairConfig::default())))
    }

    /// A queue with another policy.
    pub fn with_policy(dev: D, policy: Box<dyn Policy + Send>) -> Self {
        let (inner, cuts) = pool(&[dev.info()], policy);
        Self {
            cuts,
            inner,
            dev,
            stats: Arc::new(Stats::default()),
        }
    }

    /// Queues over devices that share one physical device (files on one filesystem, say):
    /// one tag pool and one policy for them all, so that what the policy does for one
    /// device's interactive requests (holding bulk back while a read is at the device,
    /// shaping bulk to the latency it sees) covers the bulk sent to the others, which
    /// compete for the same disk. The pool's openings are the devices' `max_tags` summed
    /// (at most 1,024): as many commands in flight as separate queues would allow. Each
    /// queue keeps its own statistics; their handles all reach the one pool. Empty for no
    /// devices.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::scheduler::{Fair, FairConfig};
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice, Queue};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let devs = vec![MemDevice::new("a", 1024), MemDevice::new("b", 1024)];
    /// let qs = Queue::group(devs, Box::new(Fair::new(FairConfig::default())));
    /// assert!(qs[0].handle().same_queue(&qs[1].handle()));
    /// assert_eq!(qs[1].openings(), 128, "64 tags each");
    /// qs[1].write(0, Bytes::from(vec![1u8; 512]), IoOpts::new()).await?;
    /// assert_eq!(qs[0].read(0, 1, IoOpts::new()).await?[0], 0, "each queue its own device");
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn group(devs: Vec<D>, policy: Box<dyn Policy + Send>) -> Vec<Self> {
        if devs.is_empty() {
            return Vec::new();
        }
        let infos: Vec<&DeviceInfo> = devs.iter().map(BlockDevice::info).collect();
        let (inner, cuts) = pool(&infos, policy);
        devs.into_iter()
            .map(|dev| Self {
                cuts,
                inner: Arc::clone(&inner),
                dev,
                stats: Arc::new(Stats::default()),
            })
            .collect()
    }

    /// The device's statistics, as seen at the queue.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The statistics, shared: they stay readable after the queue is wrapped in other
    /// layers (how [`crate::Volume::component_stats`] sees each component).
    pub fn stats_handle(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Sets the openings at run time (`camcontrol tags -N`).
    pub fn set_openings(&self, openings: u32) {
        self.handle().set_openings(openings);
    }

    /// The current openings.
    pub fn openings(&self) -> u32 {
        self.inner.lock().q.openings()
    }

    /// Sets how long the queue pauses after BUSY when nothing completes first (see
    /// [`QueueHandle::set_busy_delay`]).
    pub fn set_busy_delay(&self, delay: Duration) {
        self.handle().set_busy_delay(delay);
    }

    /// A handle on this queue that stays usable after the queue is wrapped in other layers
    /// (how [`crate::Volume::queues`] reaches each component's queue).
    pub fn handle(&self) -> QueueHandle {
        QueueHandle {
            name: self.dev.info().name.clone(),
            inner: Arc::clone(&self.inner),
        }
    }

    /// Admits a request (of a class other than interactive if `lower`) to the host queue and
    /// queues it with this metadata, in one critical section: admitted at once (the common
    /// case), or told to wait for room (a full host queue is waited for, never an error).
    /// The request's submit time: when it was issued if a volume above read the clock for
    /// it (see `crate::times`), else the clock read just before the lock is taken.
    fn enter(&self, meta: Meta, lower: bool) -> Result<(Entered<'_>, u64)> {
        // Read before the lock is taken, as in `release`.
        let issued = crate::times::issued().unwrap_or_else(Instant::now);
        let mut g = self.inner.lock();
        let now = g.time(issued);
        if !g.room.may_enter(lower) {
            let (tx, rx) = oneshot::channel();
            g.room.waiting[usize::from(lower)].push_back(tx);
            return Ok((Entered::Wait(rx), now));
        }
        g.room.enter(lower);
        let mut admitted = Admitted {
            inner: &self.inner,
            lower,
            held: true,
        };
        match self.acquire_locked(&mut g, now, meta) {
            Ok(acq) => Ok((Entered::Now(admitted, acq), now)),
            Err(e) => {
                admitted.leave(&mut g);
                Err(e)
            }
        }
    }

    /// Queues a request with this metadata (under the lock `g`, the clock read as `now`):
    /// either it is dispatched at once (the common case with free openings: no channel at
    /// all) or it waits on a channel for its grant.
    fn acquire_locked(&self, g: &mut Inner, now: u64, meta: Meta) -> Result<Acquired> {
        // Admission keeps the host queue from filling, so a refusal here is not expected.
        let submitted =
            g.q.submit_now(now, Waiter::Inline, meta)
                .map_err(|_| Error::QueueFull {
                    device: self.dev.info().name.clone(),
                })?;
        let ticket = match submitted {
            // Alone and let through at once (nothing else waited, so nothing else goes):
            // the queue's events and timer seen to as after any dispatch.
            Submitted::Dispatched(d) => {
                let _ = pump(&self.inner, g, now);
                return Ok(Acquired::Now(d.tag, d.kind));
            }
            Submitted::Queued(ticket) => ticket,
        };
        if let Some((tag, kind)) = pump(&self.inner, g, now) {
            return Ok(Acquired::Now(tag, kind));
        }
        let (tx, rx) = oneshot::channel();
        match g.q.pending_mut(ticket) {
            Some(w) => *w = Waiter::Channel(tx),
            // Not pending and not dispatched to us: cannot happen (the queue only removes a
            // request by dispatching it); fail rather than wait forever.
            None => {
                return Err(self.closed());
            }
        }
        Ok(Acquired::Wait(rx))
    }

    /// The error for a queue that can no longer answer (a grant or room that cannot come).
    fn closed(&self) -> Error {
        Error::Closed {
            device: self.dev.info().name.clone(),
        }
    }

    /// Takes up a grant: from here a guard gives the tag back if the caller is cancelled.
    async fn wait(&self, acquired: Acquired) -> Result<(TagGuard<'_>, Tag, TagKind)> {
        let rx = match acquired {
            Acquired::Now(tag, kind) => {
                let guard = TagGuard {
                    inner: &self.inner,
                    tag: Some(tag),
                };
                return Ok((guard, tag, kind));
            }
            Acquired::Wait(rx) => rx,
        };
        let Ok(mut grant) = rx.await else {
            return Err(self.closed());
        };
        // The guard takes over from the grant's own release.
        grant.release = None;
        let guard = TagGuard {
            inner: &self.inner,
            tag: Some(grant.tag),
        };
        Ok((guard, grant.tag, grant.kind))
    }

    /// Reports how the device answered; `Some` with a new receiver if the queue retries.
    /// Else the request is done, and gives back its room in the host queue (`admitted`)
    /// under the same lock.
    fn release<T>(
        &self,
        mut guard: TagGuard<'_>,
        tag: Tag,
        res: &Result<T>,
        admitted: Option<&mut Admitted<'_>>,
    ) -> (Option<Acquired>, u64) {
        guard.tag = None;
        // The clock is read before the lock is taken (the lock held no longer than its
        // bookkeeping needs: the other workers' requests wait on it); `time` keeps the
        // queue's clock from going back if another completion took the lock in between.
        let at = Instant::now();
        // The volume above, if any, ends its request at its last command's completion.
        crate::times::completed(at);
        let mut g = self.inner.lock();
        let now = g.time(at);
        let again = match res {
            Err(e) if e.is_retryable() => {
                tracing::info!(
                    target: "tagstripe::queue",
                    device = %g.name,
                    in_flight = g.q.active_total(),
                    "{}: backing off",
                    if matches!(e, Error::Busy { .. }) { "BUSY" } else { "QUEUE FULL" }
                );
                let (tx, rx) = oneshot::channel();
                let outcome = match e {
                    Error::Busy { .. } => Outcome::Busy(Waiter::Channel(tx)),
                    _ => Outcome::QueueFull(Waiter::Channel(tx)),
                };
                let _ = g.q.handle_completion(now, tag, outcome);
                Some(Acquired::Wait(rx))
            }
            Ok(_) => {
                let _ = g.q.handle_completion(now, tag, Outcome::Done);
                None
            }
            Err(_) => {
                let _ = g.q.handle_completion(now, tag, Outcome::Failed);
                None
            }
        };
        if again.is_none() {
            if let Some(a) = admitted {
                a.leave(&mut g);
            }
        }
        // Nothing here was submitted inline, so `pump` hands out no inline grant.
        let _ = pump(&self.inner, &mut g, now);
        (again, now)
    }

    /// A read into bytes of the device's (`send`: its `read_to_send`), or into one buffer
    /// when the policy cuts it into pieces.
    /// (An `async move` block, not an `async fn`: see `write_through_parts`.)
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future keeps its arguments twice"
    )]
    fn read_bytes(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
        send: bool,
    ) -> impl Future<Output = Result<Bytes>> + Send + '_ {
        async move {
            self.dev.info().check(start, sectors)?;
            if self.pieces(OpKind::Read, opts, sectors).is_some() {
                // Boxed: the rare path kept out of the common one's future.
                return Box::pin(async move {
                    let mut v = vec![0u8; sectors as usize * 512];
                    self.read_into(start, &mut v, opts).await?;
                    Ok(Bytes::from(v))
                })
                .await;
            }
            self.run(OpKind::Read, sectors * 512, opts, |k| {
                crate::device::read_or_send(&self.dev, start, sectors, with_kind(opts, k), send)
            })
            .await
        }
    }

    fn meta(op: OpKind, opts: IoOpts, sectors: u64) -> Meta {
        let dir = if op == OpKind::Read {
            Dir::Read
        } else {
            Dir::Write
        };
        let kind = if op == OpKind::Flush {
            TagKind::Ordered
        } else {
            opts.kind
        };
        Meta::new(opts.class, dir)
            .with_kind(kind)
            .with_sectors(sectors)
    }

    /// The pieces (in sectors) the policy wants a request cut into now: `None` to send it
    /// whole. Pieces stay whole logical blocks.
    fn pieces(&self, op: OpKind, opts: IoOpts, sectors: u64) -> Option<u64> {
        if !self.cuts[opts.class.index()] {
            return None;
        }
        let at = Instant::now();
        let mut g = self.inner.lock();
        let now = g.time(at);
        let limit = g.q.piece_limit(now, &Self::meta(op, opts, sectors))?;
        let lbs = u64::from(self.dev.info().limits.logical_block_size / 512).max(1);
        let piece = (limit / lbs).max(1) * lbs;
        (piece < sectors).then_some(piece)
    }

    /// Starts a request through the queue: room in the host queue, then a tag (at once, or
    /// a grant to wait for in [`Request::attempt`]).
    async fn begin(&self, op: OpKind, bytes: u64, opts: IoOpts) -> Result<Request<'_, D>> {
        let meta = Self::meta(op, opts, bytes / 512);
        // Times come from the queue's clock, read under its lock anyway; a request that
        // waited for room counts its latency from before it waited.
        let lower = opts.class != IoClass::Interactive;
        let (admitted, acq, started) = match self.enter(meta, lower)? {
            (Entered::Now(admitted, acq), now) => (admitted, acq, now),
            (Entered::Wait(rx), from) => {
                let Ok(mut handed) = rx.await else {
                    return Err(self.closed());
                };
                // The guard takes over from the token's own release.
                handed.release = None;
                let admitted = Admitted {
                    inner: &self.inner,
                    lower: handed.lower,
                    held: true,
                };
                let acq = {
                    let mut g = self.inner.lock();
                    let now = g.now();
                    self.acquire_locked(&mut g, now, meta)
                };
                // (On an error the room is given back as `admitted` drops, the lock free.)
                (admitted, acq?, from)
            }
        };
        Ok(Request {
            queue: self,
            op,
            bytes,
            class: opts.class,
            counted: Some(self.stats.begin()),
            admitted: Some(admitted),
            next: Some(acq),
            held: None,
            started,
            ended: started,
        })
    }

    /// One request through the queue, `f` called with the tag kind to send for every
    /// attempt (again while the device answers QUEUE FULL or BUSY).
    ///
    /// (A function that returns an `async move` block, not an `async fn`: an `async fn`'s
    /// future keeps room for its arguments twice, as it took them and as its body's
    /// locals, and every layer above holds this future inline.)
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future keeps its arguments twice"
    )]
    fn run<T, F, Fut>(
        &self,
        op: OpKind,
        bytes: u64,
        opts: IoOpts,
        f: F,
    ) -> impl Future<Output = Result<T>>
    where
        F: Fn(TagKind) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        async move {
            let mut r = self.begin(op, bytes, opts).await?;
            loop {
                // The attempt's result is not held while the device works (awaited inside a
                // `match` on it, it would be: an error's room in every request's future).
                let kind = match r.attempt().await {
                    Ok(kind) => kind,
                    Err(e) => match r.answer(Err(e)) {
                        Some(done) => return done,
                        None => continue,
                    },
                };
                let res = f(kind).await;
                if let Some(done) = r.answer(res) {
                    return done;
                }
            }
        }
    }
}

/// One request on its way through a [`Queue`]: its room in the host queue, its tag while
/// it is at the device, and its place in the statistics. The caller alternates
/// [`attempt`](Self::attempt) (the tag kind to send) and [`answer`](Self::answer) (the
/// device's answer) until `answer` gives the result; dropped earlier (cancelled), it gives
/// the tag and the room back.
struct Request<'q, D> {
    queue: &'q Queue<D>,
    op: OpKind,
    bytes: u64,
    class: IoClass,
    /// Its place among the requests in flight, until it is counted.
    counted: Option<crate::stats::InFlight<'q>>,
    admitted: Option<Admitted<'q>>,
    /// How the next attempt gets its tag.
    next: Option<Acquired>,
    /// The tag of the attempt at the device.
    held: Option<(TagGuard<'q>, Tag)>,
    started: u64,
    ended: u64,
}

impl<D: BlockDevice> Request<'_, D> {
    /// Waits for this attempt's tag; the tag kind to send it with.
    async fn attempt(&mut self) -> Result<TagKind> {
        let acq = self.next.take().ok_or_else(|| self.queue.closed())?;
        let (guard, tag, kind) = self.queue.wait(acq).await?;
        self.held = Some((guard, tag));
        Ok(kind)
    }

    /// Reports the device's answer to the attempt (or the attempt's own failure): `None`
    /// if the queue retries it (then [`attempt`](Self::attempt) again), else the request's
    /// result, counted in the statistics.
    fn answer<T>(&mut self, res: Result<T>) -> Option<Result<T>> {
        if let Some((guard, tag)) = self.held.take() {
            let (again, at) = self.queue.release(guard, tag, &res, self.admitted.as_mut());
            self.ended = at;
            if again.is_some() {
                self.next = again;
                return None;
            }
        }
        self.admitted = None;
        let took = Duration::from_nanos(self.ended.saturating_sub(self.started));
        slow(self.queue.dev.info(), self.op, took);
        if let Some(counted) = self.counted.take() {
            counted.end(self.op, self.class, self.bytes, took, res.is_ok());
        }
        Some(res)
    }
}

/// One tag pool and policy for devices `infos` (at least one): their tags summed (at most
/// 1,024), the largest of their minimums; named after them all.
fn pool(infos: &[&DeviceInfo], policy: Box<dyn Policy + Send>) -> (Arc<Mutex<Inner>>, [bool; 4]) {
    let max_tags = infos
        .iter()
        .map(|i| u64::from(i.limits.max_tags.max(1)))
        .sum::<u64>()
        .clamp(1, 1024) as u32;
    let min_tags = infos
        .iter()
        .map(|i| i.limits.min_tags.max(1))
        .max()
        .unwrap_or(1)
        .min(max_tags);
    let cfg = QueueConfig {
        max_tags,
        min_tags,
        ..QueueConfig::default()
    };
    let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
    let cuts = IoClass::ALL.map(|c| policy.limits_pieces(c));
    let mut q = TagQueue::new(cfg, policy);
    // Every request's completion event, made only once someone subscribes to read it.
    q.set_completion_events(false);
    let inner = Arc::new(Mutex::new(Inner {
        name: names.join(", "),
        q,
        epoch: Instant::now(),
        last: 0,
        timer_at: None,
        room: Room::new(cfg.max_pending),
        events: broadcast::channel(EVENTS).0,
        subscribed: false,
    }));
    (inner, cuts)
}

/// Requests slower than this are reported (`tracing` warning).
const SLOW: Duration = Duration::from_secs(1);

fn slow(info: &DeviceInfo, op: OpKind, took: Duration) {
    if took >= SLOW {
        tracing::warn!(
            target: "tagstripe::queue",
            device = %info.name,
            op = ?op,
            ms = took.as_millis() as u64,
            "slow request"
        );
    }
}

fn with_kind(opts: IoOpts, kind: TagKind) -> IoOpts {
    IoOpts { kind, ..opts }
}

impl<D: BlockDevice> BlockDevice for Queue<D> {
    fn info(&self) -> &DeviceInfo {
        self.dev.info()
    }

    // `read_to_send`: each attempt the device's `read_to_send` (a request cut into pieces
    // by the policy is read into one buffer, a copy).
    crate::device::read_through_bytes!(|self| read_bytes);

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let sectors = crate::device::sectors_of(self.dev.info(), buf.len())?;
        self.dev.info().check(start, sectors)?;
        if let Some(piece) = self.pieces(OpKind::Read, opts, sectors) {
            // Shaped: smaller pieces, each queued on its own (they wait less behind each
            // other, and interactive requests less behind them).
            let reads = buf
                .chunks_mut(piece as usize * 512)
                .enumerate()
                .map(|(i, part)| self.read_piece(start + i as u64 * piece, part, opts));
            crate::device::all(reads).await?;
            return Ok(());
        }
        self.read_piece(start, buf, opts).await
    }

    async fn read_vectored_into(
        &self,
        start: u64,
        mut bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> Result<()> {
        let sectors = crate::device::check_bufs(self.dev.info(), start, &bufs)?;
        if self.pieces(OpKind::Read, opts, sectors).is_some() {
            // Shaped into pieces: read whole through them, then laid out.
            let mut whole = vec![0u8; sectors as usize * 512];
            self.read_into(start, &mut whole, opts).await?;
            crate::device::scatter(&whole, bufs);
            return Ok(());
        }
        // One command, the buffers lent to each attempt (again after QUEUE FULL or BUSY).
        let mut r = self.begin(OpKind::Read, sectors * 512, opts).await?;
        loop {
            let res = match r.attempt().await {
                Ok(kind) => {
                    let lent: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut **b).collect();
                    self.dev
                        .read_vectored_into(start, lent, with_kind(opts, kind))
                        .await
                }
                Err(e) => Err(e),
            };
            if let Some(done) = r.answer(res) {
                return done;
            }
        }
    }

    crate::device::write_through_parts!(|self| write_parts);

    /// As the device does: a piped payload goes to the device in the pipe where the
    /// device writes from pipes (see [`write_piped`](Self::write_piped)).
    fn takes_piped_writes(&self) -> bool {
        self.dev.takes_piped_writes()
    }

    /// Through the queue as a write of the same size (its tag, its class, its statistics).
    /// The pipe's bytes can be sent to the device once: a write the queue would cut into
    /// pieces (bulk shaping), or a device that does not write from pipes, takes them in
    /// memory, and a device that answers QUEUE FULL to a piped write fails it (a device
    /// that writes from pipes has no such answer: the io_uring and file backends).
    async fn write_piped(&self, start: u64, data: crate::Piped, opts: IoOpts) -> Result<()> {
        let sectors = self.dev.info().check_write(start, data.len())?;
        if !self.dev.takes_piped_writes() || self.pieces(OpKind::Write, opts, sectors).is_some() {
            return crate::device::write_piped_from_memory(self, start, data, opts).await;
        }
        let data = Mutex::new(Some(data));
        self.run(OpKind::Write, sectors * 512, opts, |k| {
            let data = data.lock().take();
            async move {
                let Some(data) = data else {
                    return Err(Error::Io {
                        device: self.dev.info().name.clone(),
                        op: "write",
                        start,
                        sectors,
                        source: std::io::Error::other(
                            "the device asked for the write again, and its piped payload was sent already",
                        ),
                    });
                };
                self.dev.write_piped(start, data, with_kind(opts, k)).await
            }
        })
        .await
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.run(OpKind::Flush, 0, opts, |k| {
            self.dev.flush(with_kind(opts, k))
        })
        .await
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        crate::device::check_zeroes(self.dev.info(), start, sectors)?;
        // A write at the device as far as the queue is concerned (no bytes moved).
        self.run(OpKind::Write, 0, opts, |k| {
            self.dev.write_zeroes(start, sectors, z, with_kind(opts, k))
        })
        .await
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.dev.info().check_discard(start, sectors)?;
        self.run(OpKind::Discard, 0, opts, |k| {
            self.dev.discard(start, sectors, with_kind(opts, k))
        })
        .await
    }

    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        // Metadata, not a command at the device: it takes no tag.
        self.dev.allocation(start, sectors).await
    }
}

impl<D: BlockDevice> Queue<D> {
    /// One read through the queue, whole.
    async fn read_piece(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let mut r = self.begin(OpKind::Read, buf.len() as u64, opts).await?;
        loop {
            let res = match r.attempt().await {
                Ok(kind) => self.dev.read_into(start, buf, with_kind(opts, kind)).await,
                Err(e) => Err(e),
            };
            if let Some(done) = r.answer(res) {
                return done;
            }
        }
    }

    /// A write of `parts` (checked: `sectors` long): one command, or pieces of the size
    /// the policy wants now, each queued on its own. (The future the policy's choice
    /// gives, not an `async fn`'s wrapped around it: see `write_through_parts`.)
    fn write_parts(
        &self,
        start: u64,
        sectors: u64,
        parts: Parts,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send + '_ {
        let len = parts.len();
        match self.pieces(OpKind::Write, opts, sectors) {
            // Boxed: the rare path (bulk cut into pieces) kept out of the common one's
            // future.
            Some(piece) => Either::Left(Box::pin(async move {
                let step = piece as usize * 512;
                let writes = (0..len).step_by(step).map(|off| {
                    let part = parts.slice(off, step.min(len - off));
                    self.write_piece(start + off as u64 / 512, part, opts)
                });
                crate::device::all(writes).await?;
                Ok(())
            })),
            None => Either::Right(self.write_piece(start, parts, opts)),
        }
    }

    /// One write through the queue, whole: one command at the device, the data as it came
    /// (one buffer as one, parts gathered), sent again as it is after QUEUE FULL or BUSY.
    fn write_piece(
        &self,
        start: u64,
        parts: Parts,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send + '_ {
        let bytes = parts.len() as u64;
        self.run(OpKind::Write, bytes, opts, move |k| {
            parts.clone().write_to(&self.dev, start, with_kind(opts, k))
        })
    }
}

/// Events kept for a subscriber that falls behind (older ones are dropped for it; see
/// [`broadcast`]).
const EVENTS: usize = 1024;

/// A handle on one device's tagged queue: read and set its openings at run time (as
/// `camcontrol tags` does), see what is in flight and how bulk is shaped, and subscribe to
/// its events (completions, openings changes after QUEUE FULL, barriers, shaping changes).
///
/// ```
/// use tagstripe::{MemDevice, Queue};
/// use tagstripe::scheduler::IoClass;
/// let q = Queue::new(MemDevice::new("mem0", 1024));
/// let h = q.handle();
/// h.set_openings(8);
/// assert_eq!(h.openings(), 8);
/// assert_eq!(h.active(IoClass::Bulk), 0);
/// assert!(h.shape().is_some(), "the fair policy shapes bulk");
/// let _events = h.subscribe(); // a tokio broadcast receiver
/// ```
#[derive(Clone)]
pub struct QueueHandle {
    name: String,
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for QueueHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueHandle")
            .field("device", &self.name)
            .field("inner", &*self.inner.lock())
            .finish()
    }
}

impl QueueHandle {
    /// The device's name.
    #[must_use]
    pub fn device(&self) -> &str {
        &self.name
    }

    /// Whether both handles reach the same queue (devices grouped by [`Queue::group`]).
    #[must_use]
    pub fn same_queue(&self, other: &QueueHandle) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The current openings (tags the device may hold).
    #[must_use]
    pub fn openings(&self) -> u32 {
        self.inner.lock().q.openings()
    }

    /// Sets the openings, clamped to the queue's tag limits; commands already at the device
    /// stay there.
    pub fn set_openings(&self, openings: u32) {
        let mut g = self.inner.lock();
        g.q.set_openings(openings);
        let now = g.now();
        let _ = pump(&self.inner, &mut g, now);
    }

    /// How long the queue pauses after the device answers BUSY (or QUEUE FULL with nothing
    /// else in flight) when no other command completes first. CAM's 1 s by default: right
    /// for a disk that is spinning up, a long stall for a device whose BUSY is brief
    /// back-pressure (a network backend, a user's own device).
    #[must_use]
    pub fn busy_delay(&self) -> Duration {
        Duration::from_nanos(self.inner.lock().q.config().busy_delay)
    }

    /// Sets [`busy_delay`](Self::busy_delay), for every queue of the pool. A pause in
    /// progress then ends `delay` after it began (at once if that has passed).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tagstripe::{MemDevice, Queue};
    /// let q = Queue::new(MemDevice::new("mem0", 1024));
    /// assert_eq!(q.handle().busy_delay(), Duration::from_secs(1));
    /// q.handle().set_busy_delay(Duration::from_millis(10));
    /// assert_eq!(q.handle().busy_delay(), Duration::from_millis(10));
    /// ```
    pub fn set_busy_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        let mut g = self.inner.lock();
        g.q.set_busy_delay(nanos);
        let now = g.now();
        let _ = pump(&self.inner, &mut g, now);
    }

    /// Commands of `class` at the device now.
    #[must_use]
    pub fn active(&self, class: IoClass) -> u32 {
        self.inner.lock().q.active(class)
    }

    /// Commands at the device now.
    #[must_use]
    pub fn in_flight(&self) -> u32 {
        self.inner.lock().q.active_total()
    }

    /// Requests waiting in the host queue.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.inner.lock().q.pending_len()
    }

    /// How the policy shapes bulk now (budget and piece size), if it does.
    #[must_use]
    pub fn shape(&self) -> Option<Shape> {
        self.inner.lock().q.shape()
    }

    /// The queue's events from now on. A receiver that falls more than 1,024 events behind
    /// loses the oldest ([`broadcast::error::RecvError::Lagged`]).
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        let mut g = self.inner.lock();
        g.subscribed = true;
        g.q.set_completion_events(true);
        g.events.subscribe()
    }
}

/// Each component's queue: one pool for the components on one physical device
/// (`DeviceInfo::media`), unless `share` is off ([`crate::VolumeBuilder::share_queues`]).
pub(crate) fn queues_for(
    components: &[Arc<dyn crate::DynBlockDevice>],
    share: bool,
    fair: FairConfig,
) -> Vec<Option<Queue<Arc<dyn crate::DynBlockDevice>>>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_media = std::collections::HashMap::new();
    for (i, c) in components.iter().enumerate() {
        match c.info().media.filter(|_| share) {
            Some(m) => {
                let g = *by_media.entry(m).or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                });
                groups[g].push(i);
            }
            None => groups.push(vec![i]),
        }
    }
    let mut out: Vec<Option<_>> = components.iter().map(|_| None).collect();
    for g in groups {
        let devs = g.iter().map(|&i| Arc::clone(&components[i])).collect();
        for (&i, q) in g.iter().zip(Queue::group(devs, Box::new(Fair::new(fair)))) {
            out[i] = Some(q);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    /// A pool of one queue whose host queue holds 8 requests (6 of classes other than
    /// interactive).
    fn small_pool() -> Arc<Mutex<Inner>> {
        let dev = MemDevice::new("m", 64);
        let (inner, _) = pool(&[dev.info()], Box::new(Fair::new(FairConfig::default())));
        inner.lock().room = Room::new(8);
        inner
    }

    fn wait(inner: &Arc<Mutex<Inner>>, lower: bool) -> oneshot::Receiver<Handed> {
        let (tx, rx) = oneshot::channel();
        inner.lock().room.waiting[usize::from(lower)].push_back(tx);
        rx
    }

    fn leave(inner: &Arc<Mutex<Inner>>, lower: bool) {
        let mut g = inner.lock();
        g.room.leave(lower);
        g.room.hand_out(inner);
    }

    fn counts(inner: &Arc<Mutex<Inner>>) -> (usize, usize) {
        let g = inner.lock();
        (g.room.all, g.room.lower)
    }

    /// `f` polled as a volume polls a request it issued at `at`: its output and its times.
    async fn issued_at<F: Future>(at: Instant, f: F) -> (F::Output, crate::times::Times) {
        let mut times = crate::times::Times::new(at);
        let mut f = std::pin::pin!(f);
        let out = std::future::poll_fn(|cx| times.poll(f.as_mut(), cx)).await;
        (out, times)
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_issued_above_is_timed_from_then_and_the_clock_never_goes_back() {
        let q = Queue::new(MemDevice::new("m", 64));
        let t0 = Instant::now();
        tokio::time::advance(Duration::from_millis(30)).await;
        let data = Bytes::from(vec![1u8; 512]);
        // Issued 30 ms ago by a volume above (the queue's first request): its latency
        // counts from then, and the volume learns when it completed.
        let (r, times) = issued_at(t0, q.write(0, data.clone(), IoOpts::new())).await;
        r.unwrap();
        let took = q.stats().snapshot().latency_percentile(100.0).unwrap();
        assert!(
            took >= Duration::from_millis(29) && took <= Duration::from_millis(31),
            "{took:?}"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            times.ended(),
            t0 + Duration::from_millis(30),
            "the queue's reading"
        );
        // Read here, on the paused clock, a request takes no time.
        q.write(0, data, IoOpts::new()).await.unwrap();
        assert_eq!(
            q.stats().snapshot().latency_percentile(50.0),
            Some(Duration::from_nanos(0))
        );
        // Never from before a time the queue already used.
        let used = q.inner.lock().now();
        assert_eq!(used, 31_000_000);
        assert_eq!(
            q.inner.lock().time(t0),
            used,
            "issued before the last time used"
        );
        tokio::time::advance(Duration::from_millis(5)).await;
        let mut g = q.inner.lock();
        assert_eq!(g.time(Instant::now()), used + 5_000_000);
        assert_eq!(g.now(), used + 5_000_000);
    }

    #[test]
    fn lower_classes_fill_three_quarters_and_interactive_the_rest() {
        let inner = small_pool();
        let mut g = inner.lock();
        for _ in 0..6 {
            assert!(g.room.may_enter(true));
            g.room.enter(true);
        }
        assert!(
            !g.room.may_enter(true),
            "three quarters for the lower classes"
        );
        assert!(g.room.may_enter(false), "interactive finds room at once");
        g.room.enter(false);
        g.room.enter(false);
        assert!(
            !g.room.may_enter(false),
            "and no more than the host queue holds"
        );
    }

    #[test]
    fn waiters_are_let_in_interactive_first_then_in_order_and_room_is_never_lost() {
        let inner = small_pool();
        {
            let mut g = inner.lock();
            (0..6).for_each(|_| g.room.enter(true));
            (0..2).for_each(|_| g.room.enter(false));
        }
        let mut first = wait(&inner, true);
        let mut second = wait(&inner, true);
        let mut urgent = wait(&inner, false);
        assert!(
            !inner.lock().room.may_enter(true),
            "a newcomer queues behind waiters"
        );

        // An interactive request leaves: room in `all` only, for the interactive waiter.
        leave(&inner, false);
        let handed = urgent
            .try_recv()
            .expect("the interactive waiter goes first");
        assert!(!handed.lower);
        assert!(first.try_recv().is_err() && second.try_recv().is_err());
        assert_eq!(counts(&inner), (8, 6));

        // A lower request leaves: the first lower waiter, not the second.
        leave(&inner, true);
        let got = first.try_recv().expect("first come, first served");
        assert!(got.lower);
        assert!(second.try_recv().is_err());
        assert_eq!(counts(&inner), (8, 6));

        // Room handed to a submitter that gave up before taking it comes back: the token
        // dropped unreceived (with its receiver) gives it back, and the next waiter gets it.
        let mut third = wait(&inner, true);
        drop(got);
        let handed_on = second
            .try_recv()
            .expect("the room went on to the next waiter");
        drop(second);
        assert_eq!(counts(&inner), (8, 6));
        drop(handed_on);
        let last = third.try_recv().expect("and on again");
        drop(third);
        drop(last);
        assert_eq!(counts(&inner), (7, 5), "a room no one waits for is free");

        // A waiter gone before its turn is passed over, its room kept.
        drop(handed);
        assert_eq!(counts(&inner), (6, 5));
        let gone = wait(&inner, true);
        drop(gone);
        leave(&inner, true);
        assert_eq!(counts(&inner), (5, 4));
        assert!(
            inner
                .lock()
                .room
                .waiting
                .iter()
                .all(std::collections::VecDeque::is_empty)
        );
    }

    #[test]
    fn a_request_through_the_queue_gives_its_room_back_done_or_cancelled() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let dev = crate::FaultDevice::new(MemDevice::new("m", 64));
            let q = Queue::new(dev);
            q.write(0, Bytes::from(vec![1u8; 512]), IoOpts::new())
                .await
                .expect("write");
            assert_eq!(counts(&q.inner), (0, 0), "a completed request leaves");
            // Cancelled before its first poll, and while at the device: nothing kept.
            drop(q.write(0, Bytes::from(vec![2u8; 512]), IoOpts::new()));
            q.dev.set_latency(Duration::from_secs(60));
            let mut f = Box::pin(q.read(0, 1, IoOpts::new()));
            assert!(futures_util::FutureExt::now_or_never(f.as_mut()).is_none());
            assert_eq!(counts(&q.inner), (1, 1), "in flight: admitted");
            drop(f);
            assert_eq!(counts(&q.inner), (0, 0));
            assert_eq!(q.handle().in_flight(), 0, "and its tag given back");
        });
    }
}
