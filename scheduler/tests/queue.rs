//! The tagged queue's rules, one by one.

use tagstripe_scheduler::{
    Dir, Dispatch, Error, Event, Fair, FairConfig, Fifo, IoClass, Meta, Outcome, Policy,
    QueueConfig, Refusal, Tag, TagKind, TagQueue,
};

fn cfg(max: u32, min: u32) -> QueueConfig {
    QueueConfig {
        max_tags: max,
        min_tags: min,
        ..QueueConfig::default()
    }
}

fn bulk() -> Meta {
    Meta::new(IoClass::Bulk, Dir::Write)
}

fn read() -> Meta {
    Meta::new(IoClass::Interactive, Dir::Read)
}

fn drain<R, P: Policy>(q: &mut TagQueue<R, P>, now: u64) -> Vec<Dispatch<R>> {
    std::iter::from_fn(|| q.poll_dispatch(now)).collect()
}

fn events<R, P: Policy>(q: &mut TagQueue<R, P>) -> Vec<Event> {
    std::iter::from_fn(|| q.poll_event()).collect()
}

#[test]
fn openings_cap_dispatch_and_tags_are_unique() {
    let mut q = TagQueue::new(cfg(4, 2), Fifo);
    for i in 0..10 {
        q.submit(0, i, bulk()).unwrap();
    }
    let d = drain(&mut q, 0);
    assert_eq!(d.len(), 4);
    let mut tags: Vec<u32> = d.iter().map(|d| d.tag.0).collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), 4);
    assert_eq!(
        d.iter().map(|d| d.req).collect::<Vec<_>>(),
        [0, 1, 2, 3],
        "fifo order"
    );
}

#[test]
fn queue_full_shrinks_openings_to_active_floored_at_min_tags_and_ramps_back() {
    let mut q = TagQueue::new(
        QueueConfig {
            ramp_quiet: 1_000,
            ..cfg(8, 3)
        },
        Fifo,
    );
    for i in 0..20 {
        q.submit(0, i, bulk()).unwrap();
    }
    let mut out = drain(&mut q, 0);
    assert_eq!(out.len(), 8);
    // QUEUE FULL for one command while 7 others are out: openings = 7.
    let x = out.remove(5);
    q.handle_completion(10, x.tag, Outcome::QueueFull(x.req))
        .unwrap();
    assert_eq!(q.openings(), 7);
    assert!(events(&mut q).contains(&Event::Openings { openings: 7 }));
    // More QUEUE FULLs bring it down, never below min_tags.
    while let Some(x) = out.pop() {
        q.handle_completion(20, x.tag, Outcome::QueueFull(x.req))
            .unwrap();
    }
    assert_eq!(q.openings(), 3);
    // Nothing handed back is lost: all 20 come out again, in order.
    let mut seen = Vec::new();
    let mut now = 30;
    while seen.len() < 20 {
        let batch = drain(&mut q, now);
        if batch.is_empty() {
            // The last QUEUE FULL came with nothing else out: that is BUSY, wait it out.
            let t = q.poll_timeout().expect("a BUSY timer");
            now = now.max(t);
            q.handle_timeout(now);
            continue;
        }
        assert!(batch.len() as u32 <= q.openings());
        for d in batch {
            seen.push(d.req);
            q.handle_completion(now, d.tag, Outcome::Done).unwrap();
        }
        now += 400;
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    // After a quiet period, completions ramp the openings up again.
    assert!(q.openings() > 3, "ramped to {}", q.openings());
}

#[test]
fn busy_holds_dispatch_until_a_completion_or_the_delay() {
    let mut q = TagQueue::new(
        QueueConfig {
            busy_delay: 1_000,
            ..cfg(4, 1)
        },
        Fifo,
    );
    for i in 0..4 {
        q.submit(0, i, bulk()).unwrap();
    }
    let mut it = drain(&mut q, 0).into_iter();
    let a = it.next().unwrap();
    q.handle_completion(5, a.tag, Outcome::Busy(a.req)).unwrap();
    assert!(q.poll_dispatch(6).is_none(), "frozen after BUSY");
    assert_eq!(q.poll_timeout(), Some(1_005));
    q.handle_timeout(1_005);
    let retried = q.poll_dispatch(1_005).unwrap();
    assert_eq!(retried.req, 0, "the request handed back goes first");
    // A completion also ends the freeze.
    let b = it.next().unwrap();
    q.handle_completion(1_010, b.tag, Outcome::Busy(b.req))
        .unwrap();
    assert!(q.poll_dispatch(1_010).is_none());
    let c = it.next().unwrap();
    q.handle_completion(1_011, c.tag, Outcome::Done).unwrap();
    assert!(q.poll_dispatch(1_011).is_some());
}

#[test]
fn the_busy_delay_can_be_changed_during_a_pause() {
    let mut q = TagQueue::new(cfg(4, 1), Fifo);
    assert_eq!(q.config().busy_delay, 1_000_000_000, "CAM's 1 s by default");
    q.submit(0, 7, bulk()).unwrap();
    let a = q.poll_dispatch(0).unwrap();
    q.handle_completion(100, a.tag, Outcome::Busy(a.req))
        .unwrap();
    assert_eq!(q.poll_timeout(), Some(1_000_000_100));
    // Shortened: the pause ends 5 ms after it began.
    q.set_busy_delay(5_000_000);
    assert_eq!(q.poll_timeout(), Some(5_000_100));
    assert!(q.poll_dispatch(5_000_099).is_none(), "still paused");
    q.handle_timeout(5_000_100);
    let again = q.poll_dispatch(5_000_100).unwrap();
    assert_eq!(again.req, 7);
    // The next BUSY pauses for the new delay; shortened below what has passed, it ends
    // at the next timeout call.
    q.handle_completion(6_000_000, again.tag, Outcome::Busy(again.req))
        .unwrap();
    assert_eq!(q.poll_timeout(), Some(11_000_000));
    q.set_busy_delay(0);
    assert_eq!(q.poll_timeout(), Some(6_000_000));
    q.handle_timeout(7_000_000);
    assert!(q.poll_dispatch(7_000_000).is_some());
    // Changed with no pause in progress, nothing is paused.
    q.set_busy_delay(1_000);
    assert_eq!(q.poll_timeout(), None);
}

#[test]
fn unknown_or_finished_tags_are_errors() {
    let mut q: TagQueue<u32, Fifo> = TagQueue::new(cfg(4, 1), Fifo);
    assert_eq!(
        q.handle_completion(0, Tag(3), Outcome::Done),
        Err(Error::UnknownTag { tag: 3 })
    );
    q.submit(0, 1, bulk()).unwrap();
    let d = q.poll_dispatch(0).unwrap();
    q.handle_completion(1, d.tag, Outcome::Done).unwrap();
    assert_eq!(
        q.handle_completion(2, d.tag, Outcome::Done),
        Err(Error::UnknownTag { tag: d.tag.0 })
    );
}

#[test]
fn refused_submits_hand_the_request_back() {
    let mut q = TagQueue::new(
        QueueConfig {
            max_pending: 2,
            ..cfg(1, 1)
        },
        Fifo,
    );
    q.submit(0, "a", bulk()).unwrap();
    q.submit(0, "b", bulk()).unwrap();
    let e = q.submit(0, "c", bulk()).unwrap_err();
    assert_eq!(e.reason, Refusal::Full { max: 2 });
    assert_eq!(e.into_inner(), "c");
    q.close();
    assert_eq!(
        q.submit(0, "d", bulk()).unwrap_err().reason,
        Refusal::Closed
    );
}

#[test]
fn ordered_is_a_barrier_both_ways_when_the_device_does_not_order() {
    let mut q = TagQueue::new(cfg(8, 1), Fifo);
    q.submit(0, "w1", bulk()).unwrap();
    q.submit(0, "w2", bulk()).unwrap();
    q.submit(0, "flush", Meta::flush(IoClass::Bulk)).unwrap();
    q.submit(0, "w3", bulk()).unwrap();
    let first = drain(&mut q, 0);
    let names: Vec<_> = first.iter().map(|d| d.req).collect();
    assert_eq!(names, ["w1", "w2"], "nothing passes the barrier");
    for d in first {
        q.handle_completion(1, d.tag, Outcome::Done).unwrap();
    }
    let flush = drain(&mut q, 1);
    let got: Vec<_> = flush.iter().map(|d| (d.req, d.kind)).collect();
    assert_eq!(got, [("flush", TagKind::Ordered)]);
    assert!(
        q.poll_dispatch(2).is_none(),
        "nothing goes while the barrier is out"
    );
    q.handle_completion(2, flush[0].tag, Outcome::Done).unwrap();
    let names: Vec<_> = drain(&mut q, 2).iter().map(|d| d.req).collect();
    assert_eq!(names, ["w3"]);
}

#[test]
fn ordered_keeps_submission_order_when_the_device_orders() {
    let mut q = TagQueue::new(
        QueueConfig {
            device_orders: true,
            ..cfg(8, 1)
        },
        Fifo,
    );
    q.submit(0, "w1", bulk()).unwrap();
    q.submit(0, "o", Meta::flush(IoClass::Bulk)).unwrap();
    q.submit(0, "w2", bulk()).unwrap();
    let names: Vec<_> = drain(&mut q, 0).iter().map(|d| d.req).collect();
    assert_eq!(names, ["w1", "o", "w2"], "the device enforces it");
}

#[test]
fn head_of_queue_goes_first() {
    let mut q = TagQueue::new(cfg(1, 1), Fifo);
    q.submit(0, "a", bulk()).unwrap();
    q.submit(0, "b", bulk()).unwrap();
    q.submit(0, "urgent", read().with_kind(TagKind::HeadOfQueue))
        .unwrap();
    let d = q.poll_dispatch(0).unwrap();
    assert_eq!((d.req, d.kind), ("urgent", TagKind::HeadOfQueue));
}

#[test]
fn set_openings_clamps_to_min_and_max_tags() {
    let mut q: TagQueue<u8, Fifo> = TagQueue::new(cfg(16, 4), Fifo);
    q.set_openings(1);
    assert_eq!(q.openings(), 4);
    q.set_openings(100);
    assert_eq!(q.openings(), 16);
    q.set_openings(9);
    assert_eq!(q.openings(), 9);
}

#[test]
fn fair_bounds_bulk_while_interactive_is_active_and_is_work_conserving_otherwise() {
    let mut q = TagQueue::new(cfg(64, 2), Fair::new(FairConfig::default()));
    for i in 0..100 {
        q.submit(0, i, bulk()).unwrap();
    }
    assert_eq!(
        drain(&mut q, 0).len(),
        64,
        "no interactive load: bulk gets every tag"
    );

    let mut q = TagQueue::new(cfg(64, 2), Fair::new(FairConfig::default()));
    let r = q.submit(0, 1000, read()).unwrap();
    let piece = bulk().with_sectors(128);
    for i in 0..100 {
        q.submit(0, i, piece).unwrap();
    }
    let d = drain(&mut q, 0);
    assert_eq!(d[0].ticket, r, "interactive first");
    assert_eq!(
        d.len(),
        1,
        "bulk waits while the interactive read is at the device"
    );
    q.handle_completion(10_000_000, d[0].tag, Outcome::Done)
        .unwrap();
    // The read went to a quiet device: an unloaded sample, so no probe is due yet.
    let later = drain(&mut q, 20_000_000);
    let budget = q.policy().budget();
    assert_eq!(
        later.len() as u64,
        budget / 128,
        "then bulk holds at most its budget while interactive is recent"
    );
    assert!(later.iter().map(|d| d.meta.sectors).sum::<u64>() <= budget);

    // Half a second on with bulk always at the device, no unloaded sample is fresh: the
    // next interactive request is preceded by a probe that holds bulk back until two reads
    // found the device quiet (or the probe's time is up).
    let mut at_device = later;
    let mut now = 20_000_000;
    while now < 600_000_000 {
        // The device completes the oldest bulk command every 50 us; the queue refills.
        now += 50_000;
        if !at_device.is_empty() {
            let d = at_device.remove(0);
            q.handle_completion(now, d.tag, Outcome::Done).unwrap();
            q.submit(now, d.req, piece).unwrap(); // the writer's next write
        }
        at_device.extend(drain(&mut q, now));
        if at_device.is_empty() {
            break;
        }
    }
    assert!(at_device.is_empty(), "a probe came due and drained bulk");
    assert!(now >= 500_000_000, "not before it was due ({now} ns)");
    let t = now;
    let held = drain(&mut q, t);
    assert!(held.is_empty(), "and holds it: {held:?}");
}

#[test]
fn fair_sends_interactive_head_of_queue_past_bulk_at_the_device() {
    let mut q = TagQueue::new(cfg(64, 2), Fair::new(FairConfig::default()));
    for i in 0..10 {
        q.submit(0, i, bulk()).unwrap();
    }
    assert_eq!(drain(&mut q, 0).len(), 10);
    q.submit(1, 99, read()).unwrap();
    let d = q.poll_dispatch(1).unwrap();
    assert_eq!((d.req, d.kind), (99, TagKind::HeadOfQueue));
}

/// A device that honours head-of-queue tags serves a burst of them newest first; with
/// `head_of_queue_max` 2 the third read waits in the host queue until the first is back, and
/// then goes (in order); with no limit all three go at once.
#[test]
fn fair_keeps_at_most_head_of_queue_max_reads_at_the_device_past_bulk() {
    for (max, at_once) in [(2u32, 2usize), (0, 3)] {
        let fair = FairConfig {
            head_of_queue_max: max,
            ..FairConfig::default()
        };
        let mut q = TagQueue::new(cfg(64, 2), Fair::new(fair));
        for i in 0..4 {
            q.submit(0, i, bulk()).unwrap();
        }
        assert_eq!(drain(&mut q, 0).len(), 4);
        for r in [100, 101, 102] {
            q.submit(1, r, read()).unwrap();
        }
        let reads = drain(&mut q, 1);
        assert_eq!(reads.len(), at_once, "limit {max}: {reads:?}");
        assert!(reads.iter().all(|d| d.kind == TagKind::HeadOfQueue));
        assert_eq!(reads[0].req, 100);
        if at_once == 2 {
            q.handle_completion(2, reads[0].tag, Outcome::Done).unwrap();
            let next = drain(&mut q, 2);
            assert_eq!(next.len(), 1, "{next:?}");
            assert_eq!((next[0].req, next[0].kind), (102, TagKind::HeadOfQueue));
        }
    }
    // Without bulk at the device nothing is promoted, and nothing is limited.
    let fair = FairConfig {
        head_of_queue_max: 1,
        ..FairConfig::default()
    };
    let mut q = TagQueue::new(cfg(64, 2), Fair::new(fair));
    for r in 0..3 {
        q.submit(0, r, read()).unwrap();
    }
    let reads = drain(&mut q, 0);
    assert_eq!(reads.len(), 3);
    assert!(reads.iter().all(|d| d.kind == TagKind::Simple));
}

#[test]
fn fair_ages_bulk_past_its_deadline() {
    let fair = FairConfig {
        deadlines: [0, 500, 1_000, 10_000],
        ..FairConfig::default()
    };
    let mut q = TagQueue::new(cfg(1, 1), Fair::new(fair));
    q.submit(0, "bulk", bulk()).unwrap();
    // A stream of interactive reads on one tag: bulk still goes once overdue.
    let mut now = 0;
    let mut got_bulk = None;
    for _ in 0..100 {
        q.submit(now, "read", read()).unwrap();
        if let Some(d) = q.poll_dispatch(now) {
            if d.req == "bulk" {
                got_bulk = Some(now);
                break;
            }
            now += 100;
            q.handle_completion(now, d.tag, Outcome::Done).unwrap();
        }
    }
    assert!(
        got_bulk.is_some_and(|t| (1_000..=1_100).contains(&t)),
        "bulk dispatched at {got_bulk:?}"
    );
}

/// Found by the reference-model test: two ordered requests handed back (QUEUE FULL) in the
/// opposite order were queued in that order, and the later one passed the earlier barrier.
#[test]
fn requests_handed_back_keep_submission_order() {
    let mut q = TagQueue::new(
        QueueConfig {
            device_orders: true,
            ..cfg(2, 1)
        },
        Fifo,
    );
    let o = Meta::new(IoClass::Interactive, Dir::Read).with_kind(TagKind::Ordered);
    for i in 0..3 {
        q.submit(0, i, o).unwrap();
    }
    let d = drain(&mut q, 0);
    assert_eq!(d.len(), 2);
    let mut d = d.into_iter();
    let (first, second) = (d.next().unwrap(), d.next().unwrap());
    q.handle_completion(1, first.tag, Outcome::QueueFull(first.req))
        .unwrap();
    q.handle_completion(2, second.tag, Outcome::QueueFull(second.req))
        .unwrap();
    q.handle_timeout(u64::MAX);
    let again: Vec<u64> = drain(&mut q, u64::MAX).iter().map(|d| d.req).collect();
    assert_eq!(again.first(), Some(&0));
}
