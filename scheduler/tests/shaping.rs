//! The fair policy's bulk shaping against a simple device model, in simulated time: it is
//! work-conserving (no interactive I/O: bulk fills every opening), it never starves bulk
//! (bulk completes requests in every half second under any interactive load), it never
//! starves interactive requests (they reach the device within one service time), its
//! budget and piece size stay within their bounds, and slow reads that are the device's
//! own, not bulk's doing, do not keep bulk's budget down.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use proptest::prelude::*;
use tagstripe_scheduler::{
    Dir, Event, Fair, FairConfig, IoClass, Meta, Nanos, Outcome, Policy, QueueConfig, TagKind,
    TagQueue,
};

/// A device with `par` commands in service at once, the rest waiting in order (a
/// head-of-queue command first); each takes `base + sectors * per_sector` ns.
struct Device {
    par: usize,
    base: Nanos,
    per_sector: Nanos,
    waiting: Vec<(u32, u64, bool)>,
    busy: usize,
    done: BinaryHeap<Reverse<(Nanos, u32)>>,
}

impl Device {
    fn submit(&mut self, now: Nanos, tag: u32, sectors: u64, hoq: bool) {
        if hoq {
            self.waiting.insert(0, (tag, sectors, hoq));
        } else {
            self.waiting.push((tag, sectors, hoq));
        }
        self.start(now);
    }

    fn start(&mut self, now: Nanos) {
        while self.busy < self.par && !self.waiting.is_empty() {
            let (tag, sectors, _) = self.waiting.remove(0);
            self.busy += 1;
            let t = now + self.base + sectors * self.per_sector;
            self.done.push(Reverse((t, tag)));
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Req {
    Bulk,
    Interactive(Nanos),
}

struct Run {
    bulk_done_at: Vec<Nanos>,
    interactive_waits: Vec<Nanos>,
    max_service: Nanos,
}

/// Runs `secs` of a bulk writer (`bulk_depth` requests of `bulk_sectors`) beside `iq`
/// interactive readers of 8 sectors that think `think` ns between reads.
fn run(
    par: usize,
    base: Nanos,
    per_sector: Nanos,
    bulk_sectors: u64,
    iq: usize,
    think: Nanos,
    secs: u64,
) -> Result<Run, TestCaseError> {
    let cfg = QueueConfig {
        max_tags: 64,
        min_tags: 2,
        ..QueueConfig::default()
    };
    let fair = FairConfig::default();
    let mut q = TagQueue::new(cfg, Fair::new(fair));
    let mut dev = Device {
        par,
        base,
        per_sector,
        waiting: Vec::new(),
        busy: 0,
        done: BinaryHeap::new(),
    };
    let bulk = Meta::new(IoClass::Bulk, Dir::Write).with_sectors(bulk_sectors);
    let read = Meta::new(IoClass::Interactive, Dir::Read).with_sectors(8);
    for _ in 0..128 {
        q.submit(0, Req::Bulk, bulk).unwrap();
    }
    let mut arrivals: BinaryHeap<Reverse<Nanos>> = (0..iq).map(|i| Reverse(i as Nanos)).collect();
    let mut out = Run {
        bulk_done_at: Vec::new(),
        interactive_waits: Vec::new(),
        max_service: base + bulk_sectors.max(8) * per_sector,
    };
    let mut reqs: Vec<Option<(Req, Meta)>> = vec![None; 64];
    let end = secs * 1_000_000_000;
    let mut now = 0;
    while now < end {
        // Dispatch what the queue allows; record interactive host waits.
        while let Some(d) = q.poll_dispatch(now) {
            if let Req::Interactive(at) = d.req {
                out.interactive_waits.push(now - at);
            }
            let slot = d.tag.0 as usize;
            if slot >= reqs.len() {
                reqs.resize(slot + 1, None);
            }
            reqs[slot] = Some((d.req, d.meta));
            dev.submit(now, d.tag.0, d.meta.sectors, d.kind == TagKind::HeadOfQueue);
        }
        if iq == 0 {
            // Work-conserving: with bulk waiting and no interactive I/O, every opening is used.
            prop_assert!(q.pending_len() == 0 || q.active_total() == q.openings());
        }
        while let Some(e) = q.poll_event() {
            if let Event::Shaped(s) = e {
                prop_assert!((fair.budget_min..=fair.budget_max).contains(&s.budget_sectors));
                prop_assert!((fair.piece_min..=fair.piece_max).contains(&s.piece_sectors));
                // Whole 4 KiB pages (the default bounds are): aligned pieces need no copy.
                prop_assert_eq!(s.piece_sectors % 8, 0);
            }
        }
        // The next thing to happen: a completion, a reader's arrival or the queue's timer.
        let next = [
            dev.done.peek().map(|Reverse((t, _))| *t),
            arrivals.peek().map(|Reverse(t)| *t),
            q.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = next else { break };
        now = t.max(now);
        q.handle_timeout(now);
        while let Some(&Reverse((t, tag))) = dev.done.peek() {
            if t > now {
                break;
            }
            dev.done.pop();
            dev.busy -= 1;
            q.handle_completion(now, tagstripe_scheduler::Tag(tag), Outcome::Done)
                .unwrap();
            match reqs[tag as usize].take() {
                Some((Req::Bulk, m)) => {
                    out.bulk_done_at.push(now);
                    q.submit(now, Req::Bulk, m).unwrap();
                }
                Some((Req::Interactive(_), _)) => arrivals.push(Reverse(now + think)),
                None => {}
            }
        }
        dev.start(now);
        while let Some(&Reverse(t)) = arrivals.peek() {
            if t > now {
                break;
            }
            arrivals.pop();
            q.submit(now, Req::Interactive(now), read).unwrap();
        }
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn bulk_and_interactive_both_progress(
        par in 1usize..8,
        base in 10_000u64..2_000_000,
        per_sector in 10u64..1_000,
        bulk_sectors in prop::sample::select(vec![8u64, 128, 2048]),
        iq in 0usize..16,
        think in prop::sample::select(vec![0u64, 100_000, 1_000_000, 20_000_000]),
    ) {
        let r = run(par, base, per_sector, bulk_sectors, iq, think, 3)?;
        // Bulk is never starved: it completes requests in every half second.
        for w in 0..6u64 {
            let (lo, hi) = (w * 500_000_000, (w + 1) * 500_000_000);
            prop_assert!(
                r.bulk_done_at.iter().any(|&t| (lo..hi).contains(&t)),
                "no bulk completed in [{lo}, {hi}) ns"
            );
        }
        // Interactive requests are never starved: each reaches the device before the
        // device's tags have turned over once (at the start bulk holds every tag, and the
        // device serves what it holds in order once bulk there has aged).
        let bound = r.max_service * (64 + iq as u64);
        let worst = r.interactive_waits.iter().copied().max().unwrap_or(0);
        prop_assert!(worst <= bound, "an interactive request waited {worst} ns (bound {bound})");
    }
}

/// Runs `secs` of one interactive reader (8 sectors, thinking 1 ms, 100 µs at the device)
/// beside 16 bulk writes of 2048 sectors (1 ms each) on a device that serves everything at
/// once, so bulk never slows a read; one read in `one_in` (at random) is slow by itself, 20x.
/// Returns the share of the time bulk's budget was below where it started.
fn own_tail_run(fair: FairConfig, one_in: u64, secs: u64, seed: u64) -> f64 {
    let cfg = QueueConfig {
        max_tags: 64,
        min_tags: 2,
        ..QueueConfig::default()
    };
    let mut q = TagQueue::new(cfg, Fair::new(fair));
    let mut rng = tagstripe_scheduler::Rng::new(seed);
    let bulk = Meta::new(IoClass::Bulk, Dir::Write).with_sectors(2048);
    let read = Meta::new(IoClass::Interactive, Dir::Read).with_sectors(8);
    for _ in 0..16 {
        q.submit(0, false, bulk).unwrap();
    }
    let mut done: BinaryHeap<Reverse<(Nanos, u32)>> = BinaryHeap::new();
    let mut kinds: Vec<Option<bool>> = vec![None; 64];
    let mut next_read = Some(0);
    let (mut budget, mut below, mut since) = (fair.budget_start, 0u64, 0u64);
    let end = secs * 1_000_000_000;
    let mut now = 0;
    while now < end {
        while let Some(d) = q.poll_dispatch(now) {
            let slot = d.tag.0 as usize;
            kinds[slot] = Some(d.req);
            let t = if d.req {
                if rng.below(one_in) == 0 {
                    2_000_000
                } else {
                    100_000
                }
            } else {
                1_000_000
            };
            done.push(Reverse((now + t, d.tag.0)));
        }
        while let Some(e) = q.poll_event() {
            if let Event::Shaped(s) = e {
                if budget < fair.budget_start {
                    below += now - since;
                }
                since = now;
                budget = s.budget_sectors;
            }
        }
        let t = [
            done.peek().map(|Reverse((t, _))| *t),
            next_read,
            q.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = t else { break };
        now = t.max(now);
        q.handle_timeout(now);
        while let Some(&Reverse((t, tag))) = done.peek() {
            if t > now {
                break;
            }
            done.pop();
            q.handle_completion(now, tagstripe_scheduler::Tag(tag), Outcome::Done)
                .unwrap();
            match kinds[tag as usize].take() {
                Some(true) => next_read = Some(now + 1_000_000),
                Some(false) => {
                    q.submit(now, false, bulk).unwrap();
                }
                None => {}
            }
        }
        if next_read.is_some_and(|t| t <= now) {
            next_read = None;
            q.submit(now, true, read).unwrap();
        }
    }
    if budget < fair.budget_start {
        below += now - since;
    }
    below as f64 / now as f64
}

/// A device's own slow reads are not bulk's doing: one read in 50 (or 200) at random is 20x
/// slower whatever bulk does, and bulk's budget stays at least where it started 90% of the
/// time (seeds 1-8 over a simulated minute: 95% or more). A cut that buys nothing is undone
/// and not tried again for a while, and a window's tail sets one slow read in 64 aside.
/// (Windows of 256 reads with the tail at their fifth slowest and a target of 500%, tried
/// as a default, kept bulk below its start 58% of the time on seed 3 at one in 50: a cut
/// that happens to precede a fast window stays.)
#[test]
fn the_devices_own_slow_reads_do_not_cut_bulk() {
    for one_in in [50, 200] {
        for seed in 1..=8 {
            let below = own_tail_run(FairConfig::default(), one_in, 60, seed);
            assert!(
                below <= 0.10,
                "one slow read in {one_in} (seed {seed}): bulk's budget below its start {:.1}% of the time",
                below * 100.0
            );
        }
    }
}

/// What [`reader_beside_bulk`] saw.
struct Beside {
    /// Each read's time from its submission to its completion.
    read_latency: Vec<Nanos>,
    /// Bulk sectors at the device when each read went to it.
    bulk_at_read: Vec<u64>,
    /// Bulk sectors completed.
    bulk_done: u64,
    /// `Shaped` events that said the policy drains ahead of the reader.
    draining_events: usize,
}

/// Runs `secs` of one interactive reader (8 sectors, thinking `thinks[i % len]` after its
/// i-th read) beside a bulk writer that keeps 16 requests of 2048 sectors queued, on a
/// device that serves one command at a time in the order it got them, 50 µs plus 500 ns a
/// sector (1 GB/s): a read waits for all the bulk the device holds ahead of it.
fn reader_beside_bulk(fair: FairConfig, thinks: &[Nanos], secs: u64) -> Beside {
    let cfg = QueueConfig {
        max_tags: 64,
        min_tags: 2,
        ..QueueConfig::default()
    };
    let mut q = TagQueue::new(cfg, Fair::new(fair));
    let read = Meta::new(IoClass::Interactive, Dir::Read).with_sectors(8);
    // The writer's requests are cut to the policy's pieces, as the library's queue layer
    // cuts them.
    let write = |q: &mut TagQueue<Option<Nanos>, Fair>, now: Nanos| {
        let bulk = Meta::new(IoClass::Bulk, Dir::Write).with_sectors(2048);
        let n = q.piece_limit(now, &bulk).map_or(2048, |p| p.clamp(1, 2048));
        q.submit(now, None, bulk.with_sectors(n)).unwrap();
    };
    for _ in 0..16 {
        write(&mut q, 0);
    }
    // The device: commands in arrival order, each (tag, the read's submission or `None` for
    // bulk, sectors).
    let mut fifo: std::collections::VecDeque<(u32, Option<Nanos>, u64)> = Default::default();
    let mut busy_until: Option<Nanos> = None;
    let mut bulk_at_device = 0u64;
    let mut out = Beside {
        read_latency: Vec::new(),
        bulk_at_read: Vec::new(),
        bulk_done: 0,
        draining_events: 0,
    };
    let mut next_read = Some(0);
    let mut reads = 0usize;
    let end = secs * 1_000_000_000;
    let mut now = 0;
    while now < end {
        while let Some(d) = q.poll_dispatch(now) {
            if d.req.is_some() {
                out.bulk_at_read.push(bulk_at_device);
            } else {
                bulk_at_device += d.meta.sectors;
            }
            fifo.push_back((d.tag.0, d.req, d.meta.sectors));
            if busy_until.is_none() {
                busy_until = Some(now + 50_000 + d.meta.sectors * 500);
            }
        }
        while let Some(e) = q.poll_event() {
            if let Event::Shaped(s) = e {
                out.draining_events += usize::from(s.drain_floor_sectors.is_some());
            }
        }
        let t = [busy_until, next_read, q.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = t else { break };
        now = t.max(now);
        q.handle_timeout(now);
        if busy_until.is_some_and(|t| t <= now) {
            let (tag, req, sectors) = fifo.pop_front().expect("the device was busy");
            q.handle_completion(now, tagstripe_scheduler::Tag(tag), Outcome::Done)
                .unwrap();
            // The key of a change the queue watches, which Fair works out on its own (without
            // the target and baseline), is its shape's, draining ahead or not.
            let fair: &dyn Policy = q.policy();
            assert_eq!(
                fair.shape_key(),
                fair.shape().map(|s| tagstripe_scheduler::ShapeKey::of(&s))
            );
            match req {
                Some(at) => {
                    out.read_latency.push(now - at);
                    next_read = Some(now + thinks[reads % thinks.len()]);
                    reads += 1;
                }
                None => {
                    bulk_at_device -= sectors;
                    out.bulk_done += sectors;
                    write(&mut q, now);
                }
            }
            busy_until = fifo.front().map(|&(_, _, s)| now + 50_000 + s * 500);
        }
        if next_read.is_some_and(|t| t <= now) {
            next_read = None;
            q.submit(now, Some(now), read).unwrap();
        }
    }
    out
}

fn p99(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() * 99 / 100).copied().unwrap_or(0)
}

/// Draining ahead of a regular reader (one that thinks 1 ms between reads): its reads find
/// no more than about the floor of bulk at the device, whatever the budget, and bulk fills
/// the device between them. On this device (where the budget alone does well) that is a
/// lower read p99 and half as much bulk again (measured: p99 342 µs against 422 µs, the
/// device busy with bulk 81% of the time against 54%).
#[test]
fn a_regular_reader_finds_the_floor_not_the_budget() {
    let secs = 20;
    let on = reader_beside_bulk(FairConfig::default(), &[1_000_000], secs);
    let off = reader_beside_bulk(
        FairConfig {
            drain_ahead: false,
            ..FairConfig::default()
        },
        &[1_000_000],
        secs,
    );
    // The floor: three times the bulk drained while one unloaded read is served (54 µs at
    // 500 ns a sector: 108 sectors); reads find at most twice that.
    // The caller is told: a `Shaped` event says when draining ahead starts.
    assert!(
        on.draining_events > 0,
        "no Shaped event reported draining ahead"
    );
    assert_eq!(off.draining_events, 0);
    let at = p99(&on.bulk_at_read);
    assert!(
        at <= 648,
        "reads found {at} bulk sectors at the device (p99)"
    );
    let (lat_on, lat_off) = (p99(&on.read_latency), p99(&off.read_latency));
    assert!(
        lat_on <= lat_off,
        "read p99 {lat_on} ns draining ahead, {lat_off} ns with the budget alone"
    );
    assert!(
        on.bulk_done * 4 >= off.bulk_done * 5,
        "bulk sectors done: {} draining ahead, {} with the budget alone",
        on.bulk_done,
        off.bulk_done
    );
    // Bulk keeps the device busy: at least 75% of the time goes to its sectors.
    let busy = on.bulk_done * 500;
    assert!(
        busy * 4 >= secs * 1_000_000_000 * 3,
        "bulk had the device {:.0}% of the time",
        busy as f64 / (secs * 10_000_000) as f64
    );
}

/// A reader whose next request cannot be foreseen (its think times alternate between 0.2
/// and 3 ms) is not drained ahead of: bulk is shaped by the budget alone, exactly as with
/// draining ahead off.
#[test]
fn an_irregular_reader_leaves_bulk_to_the_budget() {
    let thinks = [200_000, 3_000_000];
    let on = reader_beside_bulk(FairConfig::default(), &thinks, 10);
    let off = reader_beside_bulk(
        FairConfig {
            drain_ahead: false,
            ..FairConfig::default()
        },
        &thinks,
        10,
    );
    assert!(on.read_latency.len() > 1000);
    assert_eq!(
        on.draining_events, 0,
        "an irregular reader was drained ahead of"
    );
    assert_eq!(on.read_latency, off.read_latency);
    assert_eq!(on.bulk_at_read, off.bulk_at_read);
    assert_eq!(on.bulk_done, off.bulk_done);
}

/// A reader back from a pause far beyond its habit (1 s, after reads 1 ms apart) finds a
/// cold device: its slow first read (3 ms against 100 µs) is no unloaded sample. Here every
/// other read is one, so counted they would be half the samples and the baseline (their
/// median) would be theirs.
#[test]
fn a_read_after_a_long_pause_is_no_unloaded_sample() {
    let mut q = TagQueue::new(QueueConfig::default(), Fair::new(FairConfig::default()));
    let read = Meta::new(IoClass::Interactive, Dir::Read).with_sectors(8);
    let one = |q: &mut TagQueue<(), Fair>, now: &mut Nanos, service: Nanos| {
        q.submit(*now, (), read).unwrap();
        let d = q
            .poll_dispatch(*now)
            .expect("an idle queue sends a read at once");
        *now += service;
        q.handle_completion(*now, d.tag, Outcome::Done).unwrap();
    };
    let mut now = 0;
    for _ in 0..20 {
        one(&mut q, &mut now, 100_000);
        now += 1_000_000_000;
        one(&mut q, &mut now, 3_000_000);
        now += 1_000_000;
    }
    let shape = q.shape().expect("the fair policy shapes");
    assert_eq!(shape.baseline_ns, Some(100_000));
}
