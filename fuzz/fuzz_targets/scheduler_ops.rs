//! Arbitrary operation sequences on a tagged queue under every policy: nothing panics, no
//! tag is out twice, dispatch never exceeds the openings, every request finishes exactly
//! once after a drain.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tagstripe_scheduler::{
    Deadline, Dir, Event, Fair, FairConfig, Fifo, IoClass, Meta, Outcome, PeriodicOrdered, Policy,
    QueueConfig, Tag, TagKind, TagQueue,
};

#[derive(Arbitrary, Debug)]
enum Op {
    Submit { class: u8, kind: u8, write: bool },
    Dispatch,
    Complete { pick: u16, outcome: u8 },
    CompleteTag { tag: u32 },
    Advance { ns: u32 },
    SetOpenings { n: u8 },
    SetBusyDelay { ns: u32 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    policy: u8,
    max_tags: u8,
    min_tags: u8,
    device_orders: bool,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let policy: Box<dyn Policy> = match input.policy % 4 {
        0 => Box::new(Fifo),
        1 => Box::new(Deadline::default()),
        2 => Box::new(PeriodicOrdered::new(1_000_000)),
        _ => Box::new(Fair::new(FairConfig::default())),
    };
    let cfg = QueueConfig {
        max_tags: u32::from(input.max_tags),
        min_tags: u32::from(input.min_tags),
        device_orders: input.device_orders,
        max_pending: 256,
        busy_delay: 1_000,
        ramp_quiet: 10_000,
    };
    let mut q = TagQueue::new(cfg, policy);
    let mut now = 0u64;
    let mut out: Vec<(Tag, u64)> = Vec::new();
    let mut submitted = 0u64;
    let mut finished: HashMap<u64, u32> = HashMap::new();
    let step = |q: &mut TagQueue<u64, Box<dyn Policy>>, out: &mut Vec<(Tag, u64)>, now: u64| {
        while let Some(d) = q.poll_dispatch(now) {
            assert!(!out.iter().any(|(t, _)| *t == d.tag), "tag out twice");
            assert!(q.active_total() <= q.openings().max(out.len() as u32 + 1));
            out.push((d.tag, d.req));
        }
    };
    for op in input.ops.into_iter().take(500) {
        match op {
            Op::Submit { class, kind, write } => {
                let kind = match kind % 4 {
                    0 => TagKind::Ordered,
                    1 => TagKind::HeadOfQueue,
                    _ => TagKind::Simple,
                };
                let meta = Meta::new(
                    IoClass::ALL[usize::from(class % 4)],
                    if write { Dir::Write } else { Dir::Read },
                )
                .with_kind(kind);
                if q.submit(now, submitted, meta).is_ok() {
                    submitted += 1;
                }
            }
            Op::Dispatch => step(&mut q, &mut out, now),
            Op::Complete { pick, outcome } => {
                if out.is_empty() {
                    continue;
                }
                let (tag, req) = out.remove(usize::from(pick) % out.len());
                let o = match outcome % 4 {
                    0 | 1 => Outcome::Done,
                    2 => Outcome::QueueFull(req),
                    _ => Outcome::Busy(req),
                };
                assert!(q.handle_completion(now, tag, o).is_ok());
            }
            Op::CompleteTag { tag } => {
                if !out.iter().any(|(t, _)| t.0 == tag) {
                    assert!(q.handle_completion(now, Tag(tag), Outcome::Done).is_err());
                }
            }
            Op::Advance { ns } => {
                now += u64::from(ns);
                q.handle_timeout(now);
            }
            Op::SetOpenings { n } => q.set_openings(u32::from(n)),
            Op::SetBusyDelay { ns } => q.set_busy_delay(u64::from(ns)),
        }
        while let Some(e) = q.poll_event() {
            if let Event::Completed { ticket, .. } | Event::Failed { ticket } = e {
                *finished.entry(ticket.0).or_default() += 1;
            }
        }
    }
    // Drain.
    for _ in 0..100_000 {
        step(&mut q, &mut out, now);
        if let Some((tag, _)) = out.pop() {
            assert!(q.handle_completion(now, tag, Outcome::Done).is_ok());
        } else if q.pending_len() == 0 {
            break;
        } else {
            now += 1_000_000_000;
            q.handle_timeout(now);
        }
        while let Some(e) = q.poll_event() {
            if let Event::Completed { ticket, .. } | Event::Failed { ticket } = e {
                *finished.entry(ticket.0).or_default() += 1;
            }
        }
    }
    assert_eq!(finished.len() as u64, submitted, "every request finishes");
    assert!(finished.values().all(|&n| n == 1));
});
