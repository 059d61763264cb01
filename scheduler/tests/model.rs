//! The queue against a reference model: random operation sequences under every policy,
//! checked after every step.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use tagstripe_scheduler::{
    Deadline, Dir, Event, Fair, FairConfig, Fifo, IoClass, Meta, Outcome, PeriodicOrdered, Policy,
    QueueConfig, Submitted, TagKind, TagQueue,
};

#[derive(Clone, Debug)]
enum Op {
    Submit(u8, u8, bool),
    Dispatch,
    Complete(usize, u8),
    Advance(u64),
    SetOpenings(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..10, any::<bool>()).prop_map(|(c, k, w)| Op::Submit(c, k, w)),
        3 => Just(Op::Dispatch),
        3 => (any::<usize>(), 0u8..10).prop_map(|(i, o)| Op::Complete(i, o)),
        1 => (0u64..3_000_000_000).prop_map(Op::Advance),
        1 => (0u32..20).prop_map(Op::SetOpenings),
    ]
}

fn policy(n: u8) -> Box<dyn Policy> {
    match n % 4 {
        0 => Box::new(Fifo),
        1 => Box::new(Deadline::default()),
        2 => Box::new(PeriodicOrdered::new(1_000_000_000)),
        _ => Box::new(Fair::new(FairConfig::default())),
    }
}

/// The queue both properties run: `max_tags` tags, a quarter of them kept after QUEUE
/// FULL, BUSY and ramp-up times short enough for the ops' clock steps.
fn config(max_tags: u32, device_orders: bool) -> QueueConfig {
    QueueConfig {
        max_tags,
        min_tags: 1 + max_tags / 4,
        device_orders,
        busy_delay: 1_000_000,
        ramp_quiet: 10_000_000,
        ..QueueConfig::default()
    }
}

/// The request an [`Op::Submit`] names: class `c`, tag kind `k` (ordered, head-of-queue,
/// else simple), a write if `w`.
fn meta(c: u8, k: u8, w: bool) -> Meta {
    let kind = match k {
        0 => TagKind::Ordered,
        1 => TagKind::HeadOfQueue,
        _ => TagKind::Simple,
    };
    Meta::new(
        IoClass::ALL[c as usize],
        if w { Dir::Write } else { Dir::Read },
    )
    .with_kind(kind)
}

/// The device's answer an [`Op::Complete`] names for request `t`.
fn outcome(o: u8, t: u64) -> Outcome<u64> {
    match o {
        0..=5 => Outcome::Done,
        6 => Outcome::Failed,
        7 | 8 => Outcome::QueueFull(t),
        _ => Outcome::Busy(t),
    }
}

/// What the reference model knows of one request.
#[derive(Clone, Copy, Debug)]
struct Known {
    ordered: bool,
    done: bool,
    out: bool,
}

struct Harness {
    q: TagQueue<u64, Box<dyn Policy>>,
    device_orders: bool,
    now: u64,
    known: BTreeMap<u64, Known>,
    active: Vec<(tagstripe_scheduler::Tag, u64)>,
    finished: HashMap<u64, u32>,
}

impl Harness {
    fn dispatch(&mut self) -> Result<(), TestCaseError> {
        loop {
            let before = self.q.active_total();
            let openings = self.q.openings();
            let Some(d) = self.q.poll_dispatch(self.now) else {
                return Ok(());
            };
            prop_assert!(
                before < openings,
                "dispatched with {} active of {} openings",
                before,
                openings
            );
            prop_assert!(
                !self.active.iter().any(|(t, _)| *t == d.tag),
                "tag {:?} dispatched twice",
                d.tag
            );
            let t = d.ticket.0;
            prop_assert_eq!(d.req, t);
            let k = self.known[&t];
            prop_assert!(
                !k.done && !k.out,
                "ticket {} dispatched while done or out",
                t
            );
            // Ordered rules, against submission order.
            for (&o, ko) in self.known.range(..t) {
                if ko.ordered {
                    prop_assert!(
                        ko.done || (self.device_orders && ko.out),
                        "ticket {} passed ordered {}",
                        t,
                        o
                    );
                }
                if k.ordered {
                    prop_assert!(
                        ko.done || (self.device_orders && ko.out),
                        "ordered {} went before {} finished",
                        t,
                        o
                    );
                }
            }
            if k.ordered && !self.device_orders {
                prop_assert!(
                    self.active.is_empty(),
                    "ordered {} dispatched with commands out",
                    t
                );
            }
            if !self.device_orders && self.active.iter().any(|(_, a)| self.known[a].ordered) {
                prop_assert!(false, "{} dispatched while an ordered command is out", t);
            }
            if let Some(x) = self.known.get_mut(&t) {
                x.out = true;
            }
            self.active.push((d.tag, t));
        }
    }

    fn complete(&mut self, i: usize, o: u8) -> Result<(), TestCaseError> {
        if self.active.is_empty() {
            return Ok(());
        }
        let (tag, t) = self.active.remove(i % self.active.len());
        let outcome = outcome(o, t);
        let back = matches!(outcome, Outcome::QueueFull(_) | Outcome::Busy(_));
        prop_assert!(self.q.handle_completion(self.now, tag, outcome).is_ok());
        prop_assert!(
            self.q
                .handle_completion(self.now, tag, Outcome::Done)
                .is_err(),
            "second completion accepted"
        );
        if let Some(x) = self.known.get_mut(&t) {
            x.out = false;
            x.done = !back;
        }
        Ok(())
    }

    fn events(&mut self) -> Result<(), TestCaseError> {
        while let Some(e) = self.q.poll_event() {
            match e {
                Event::Completed { ticket, .. } | Event::Failed { ticket } => {
                    *self.finished.entry(ticket.0).or_default() += 1;
                }
                Event::Openings { openings } => {
                    let c = self.q.config();
                    prop_assert!(openings >= c.min_tags && openings <= c.max_tags);
                }
                Event::Barrier { .. } => {}
                Event::Shaped(shape) => {
                    prop_assert!(shape.budget_sectors >= 1);
                    prop_assert!(shape.piece_sectors >= 1);
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn queue_matches_reference_model(
        ops in prop::collection::vec(op(), 1..200),
        p in any::<u8>(),
        device_orders in any::<bool>(),
        max_tags in 1u32..12,
    ) {
        let cfg = config(max_tags, device_orders);
        let mut h = Harness {
            q: TagQueue::new(cfg, policy(p)),
            device_orders,
            now: 0,
            known: BTreeMap::new(),
            active: Vec::new(),
            finished: HashMap::new(),
        };
        for op in ops {
            match op {
                Op::Submit(c, k, w) => {
                    let meta = meta(c, k, w);
                    let t = h.known.len() as u64;
                    let got = h.q.submit(h.now, t, meta).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(got.0, t);
                    h.known.insert(t, Known { ordered: meta.kind == TagKind::Ordered, done: false, out: false });
                }
                Op::Dispatch => h.dispatch()?,
                Op::Complete(i, o) => h.complete(i, o)?,
                Op::Advance(dt) => {
                    h.now += dt;
                    h.q.handle_timeout(h.now);
                }
                Op::SetOpenings(n) => h.q.set_openings(n),
            }
            // What waits in the host queue: every request neither at the device nor done
            // (requeued ones too).
            let waiting = h.known.values().filter(|k| !k.done && !k.out).count();
            prop_assert_eq!(h.q.pending_len(), waiting);
            h.events()?;
        }
        // Drain: everything submitted completes exactly once.
        let mut rounds = 0;
        while h.known.values().any(|k| !k.done) {
            rounds += 1;
            prop_assert!(rounds < 100_000, "queue does not drain");
            h.dispatch()?;
            if h.active.is_empty() {
                h.now += 1_000_000_000;
                h.q.handle_timeout(h.now);
                continue;
            }
            h.complete(0, 0)?;
            h.now += 1_000;
            h.events()?;
        }
        h.events()?;
        let all: BTreeSet<u64> = h.known.keys().copied().collect();
        let finished: BTreeSet<u64> = h.finished.keys().copied().collect();
        prop_assert_eq!(all, finished);
        prop_assert!(h.finished.values().all(|&n| n == 1), "a ticket finished twice");
        prop_assert_eq!(h.q.pending_len(), 0);
    }
}

/// Every dispatch `poll_dispatch` gives until it gives none: (ticket, tag, kind).
fn drain(q: &mut TagQueue<u64, Box<dyn Policy>>, now: u64) -> Vec<(u64, u32, TagKind)> {
    std::iter::from_fn(|| q.poll_dispatch(now))
        .map(|d| (d.ticket.0, d.tag.0, d.kind))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// `submit_now` decides as `submit` then `poll_dispatch` do: two queues driven in
    /// lockstep, one each way, dispatch the same requests under the same tags and kinds,
    /// and report the same events, waits and timeouts, under every policy.
    #[test]
    fn submit_now_is_submit_then_dispatch(
        ops in prop::collection::vec(op(), 1..200),
        p in any::<u8>(),
        device_orders in any::<bool>(),
        max_tags in 1u32..12,
        sectors in prop::collection::vec(1u64..4096, 4),
    ) {
        let cfg = config(max_tags, device_orders);
        let mut a: TagQueue<u64, Box<dyn Policy>> = TagQueue::new(cfg, policy(p));
        let mut b: TagQueue<u64, Box<dyn Policy>> = TagQueue::new(cfg, policy(p));
        let (mut now, mut next) = (0u64, 0u64);
        let mut active: Vec<(tagstripe_scheduler::Tag, u64)> = Vec::new();
        for op in ops {
            let (da, db) = match op {
                Op::Submit(c, k, w) => {
                    let meta = meta(c, k, w).with_sectors(sectors[c as usize]);
                    let t = next;
                    next += 1;
                    a.submit(now, t, meta).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let da = drain(&mut a, now);
                    let mut db = Vec::new();
                    match b.submit_now(now, t, meta).map_err(|e| TestCaseError::fail(e.to_string()))? {
                        Submitted::Dispatched(d) => {
                            prop_assert_eq!(d.req, t);
                            db.push((d.ticket.0, d.tag.0, d.kind));
                        }
                        Submitted::Queued(ticket) => prop_assert_eq!(ticket.0, t),
                    }
                    db.extend(drain(&mut b, now));
                    (da, db)
                }
                Op::Dispatch => (drain(&mut a, now), drain(&mut b, now)),
                Op::Complete(i, o) => {
                    if !active.is_empty() {
                        let (tag, t) = active.remove(i % active.len());
                        prop_assert!(a.handle_completion(now, tag, outcome(o, t)).is_ok());
                        prop_assert!(b.handle_completion(now, tag, outcome(o, t)).is_ok());
                    }
                    (Vec::new(), Vec::new())
                }
                Op::Advance(dt) => {
                    now += dt;
                    a.handle_timeout(now);
                    b.handle_timeout(now);
                    (Vec::new(), Vec::new())
                }
                Op::SetOpenings(n) => {
                    a.set_openings(n);
                    b.set_openings(n);
                    (Vec::new(), Vec::new())
                }
            };
            prop_assert_eq!(&da, &db);
            active.extend(da.iter().map(|&(t, tag, _)| (tagstripe_scheduler::Tag(tag), t)));
            prop_assert_eq!(a.pending_len(), b.pending_len());
            prop_assert_eq!(a.poll_timeout(), b.poll_timeout());
            prop_assert_eq!(a.shape(), b.shape());
            let ea: Vec<Event> = std::iter::from_fn(|| a.poll_event()).collect();
            let eb: Vec<Event> = std::iter::from_fn(|| b.poll_event()).collect();
            prop_assert_eq!(ea, eb);
        }
    }
}

/// A request alone on an idle queue goes to the device in the one call, under every policy
/// (the case `submit_now` is for).
#[test]
fn a_lone_request_is_dispatched_in_the_call() {
    for p in 0..4 {
        for (t, class) in IoClass::ALL.into_iter().enumerate() {
            let mut q: TagQueue<u64, Box<dyn Policy>> =
                TagQueue::new(QueueConfig::default(), policy(p));
            let meta = Meta::new(class, Dir::Write).with_sectors(8);
            match q.submit_now(0, t as u64, meta) {
                Ok(Submitted::Dispatched(d)) => {
                    assert_eq!(d.req, t as u64);
                    q.handle_completion(1_000, d.tag, Outcome::Done)
                        .expect("its tag");
                }
                other => panic!("policy {p}, {class:?}: {other:?}"),
            }
            assert_eq!(q.pending_len(), 0);
        }
    }
}
