//! The disk model's sanity checks and the fairness acceptance
//! numbers on every profile. Deterministic: simulated time, fixed seeds.

use tagstripe_scheduler::sim::{self, Scenario, Scheduler};
use tagstripe_scheduler::{DeviceOrder, FairConfig, Profile};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn run(profile: Profile, s: Scheduler, scn: Scenario) -> sim::RunResult {
    let (cfg, policy) = sim::scheduler_setup(s, profile, FairConfig::default());
    sim::run_with(&scn, cfg, policy)
}

fn reader_only(profile: Profile, seconds: u64) -> Scenario {
    Scenario {
        chains: false,
        ..Scenario::standard(profile, seconds, 7)
    }
}

#[test]
fn same_seed_same_result() {
    let a = sim::report(Profile::Hdd1998, 15, 3);
    let b = sim::report(Profile::Hdd1998, 15, 3);
    assert_eq!(a, b);
    let c = sim::report(Profile::Hdd1998, 15, 4);
    assert_ne!(a.unloaded, c.unloaded, "another seed, other reads");
}

#[test]
fn fifo_host_and_greedy_sptf_device_starve_reads() {
    let r = run(
        Profile::Hdd1998,
        Scheduler::Fifo,
        reader_only(Profile::Hdd1998, 40),
    );
    // Reads wait until the writer stops: here, the end of the run.
    assert!(
        r.interactive.max > 25 * S,
        "max {} ms",
        r.interactive.max / MS
    );
}

#[test]
fn ordered_tag_every_15_s_bounds_the_wait_near_15_to_30_s() {
    let r = run(
        Profile::Hdd1998,
        Scheduler::Cam1998,
        reader_only(Profile::Hdd1998, 60),
    );
    assert!(
        r.interactive.max >= 14 * S && r.interactive.max <= 31 * S,
        "max {} ms",
        r.interactive.max / MS
    );
    assert!(r.barriers >= 3);
}

#[test]
fn two_tags_bring_device_latency_near_unloaded() {
    let unloaded = run(
        Profile::Hdd1998,
        Scheduler::Fifo,
        Scenario {
            bulk: false,
            ..reader_only(Profile::Hdd1998, 40)
        },
    );
    let r = run(
        Profile::Hdd1998,
        Scheduler::MaxTags2,
        reader_only(Profile::Hdd1998, 40),
    );
    // Unloaded plus about one bulk service time (a 64 KiB destage with its seek).
    let bound = unloaded.interactive.p99 + 25 * MS;
    assert!(
        r.interactive_device.p99 <= bound,
        "device p99 {} ms vs {} ms",
        r.interactive_device.p99 / MS,
        bound / MS
    );
}

#[test]
fn fifo_device_gives_bounded_but_deep_queue_latency() {
    let mut disk = Profile::Hdd1998.config();
    disk.order = DeviceOrder::Fifo;
    let scn = Scenario {
        disk: Some(disk),
        ..reader_only(Profile::Hdd1998, 30)
    };
    let r = run(Profile::Hdd1998, Scheduler::Fifo, scn);
    // Bounded (the device takes commands in order) but proportional to the depth.
    assert!(
        r.interactive.max < 10 * S,
        "max {} ms",
        r.interactive.max / MS
    );
    assert!(
        r.interactive.p50 > 100 * MS,
        "p50 {} ms",
        r.interactive.p50 / MS
    );
}

#[test]
fn sptf_aging_bounds_starvation_at_the_device() {
    let r = run(
        Profile::HddModern,
        Scheduler::Fifo,
        reader_only(Profile::HddModern, 30),
    );
    // 2 s of device aging, plus the host queue in front.
    assert!(
        r.interactive_device.max <= 2 * S + 200 * MS,
        "device max {} ms",
        r.interactive_device.max / MS
    );
}

#[test]
fn mod15_fault_fails_bad_counts() {
    use tagstripe_scheduler::sim::write;
    use tagstripe_scheduler::{DiskEvent, DiskModel};
    let mut cfg = Profile::Hdd1998.config();
    cfg.mod15_fault = true;
    let mut d = DiskModel::new(cfg);
    assert_eq!(d.submit(0, 1, write(0, 16)).unwrap(), DiskEvent::Queued);
    assert_eq!(d.submit(0, 2, write(100, 15)).unwrap(), DiskEvent::Queued);
    let mut done = Vec::new();
    while let Some(t) = d.next_event() {
        done.extend(d.advance(t));
    }
    let ok: Vec<(u32, bool)> = done
        .iter()
        .filter_map(|e| match e {
            DiskEvent::Completed { tag, ok, .. } => Some((*tag, *ok)),
            _ => None,
        })
        .collect();
    assert!(
        ok.contains(&(1, false)) && ok.contains(&(2, true)),
        "{ok:?}"
    );
}

#[test]
fn queue_full_above_the_window() {
    use tagstripe_scheduler::sim::read;
    use tagstripe_scheduler::{DiskEvent, DiskModel, Error};
    let mut cfg = Profile::Ssd.config();
    cfg.window = 2;
    let mut d = DiskModel::new(cfg);
    assert_eq!(d.submit(0, 0, read(0, 8)).unwrap(), DiskEvent::Queued);
    assert_eq!(d.submit(0, 1, read(8, 8)).unwrap(), DiskEvent::Queued);
    assert_eq!(d.submit(0, 2, read(16, 8)).unwrap(), DiskEvent::QueueFull);
    assert_eq!(d.submit(0, 1, read(8, 8)), Err(Error::TagInUse { tag: 1 }));
    assert!(matches!(
        d.submit(0, 5, read(u64::MAX - 4, 8)),
        Err(Error::OutOfRange { .. })
    ));
    cfg.busy_during = Some((0, 10));
    let mut d = DiskModel::new(cfg);
    assert_eq!(d.submit(5, 0, read(0, 8)).unwrap(), DiskEvent::Busy);
}

/// The acceptance numbers for tagstripe on one profile, against the same run's baselines.
fn acceptance(profile: Profile) {
    let r = sim::report(profile, 60, 1);
    let l0 = r.unloaded.interactive;
    let chain0 = r.unloaded_chains.chains.p99;
    let row = |name: &str| r.rows.iter().find(|x| x.scheduler == name).unwrap();
    let (ts, fifo) = (row("tagstripe"), row("fifo"));
    let i = ts.with_reader.interactive;
    let ms = |n: u64| n as f64 / 1e6;
    let why = format!(
        "{}: p99 {:.2} max {:.2} (L0 p99 {:.2}), chain {:.1} (unloaded {:.1}), bulk {:.2} vs fifo {:.2} MB/s, idle {:.2} vs {:.2}",
        profile.name(),
        ms(i.p99),
        ms(i.max),
        ms(l0.p99),
        ms(ts.with_chains.chains.p99),
        ms(chain0),
        ts.with_reader.bulk_bytes_per_sec / 1e6,
        fifo.with_reader.bulk_bytes_per_sec / 1e6,
        ts.bulk_idle_bytes_per_sec / 1e6,
        fifo.bulk_idle_bytes_per_sec / 1e6,
    );
    assert!(i.p99 <= 3 * l0.p99, "{why}");
    assert!(i.max <= 10 * l0.p99, "{why}");
    assert!(ts.with_chains.chains.p99 <= 2 * chain0, "{why}");
    assert!(
        ts.with_reader.bulk_bytes_per_sec >= 0.75 * fifo.with_reader.bulk_bytes_per_sec,
        "{why}"
    );
    assert!(
        ts.bulk_idle_bytes_per_sec >= 0.97 * fifo.bulk_idle_bytes_per_sec,
        "{why}"
    );
    // And the baselines show the problem.
    assert!(fifo.with_reader.interactive.p99 > 10 * l0.p99, "{why}");
}

#[test]
fn tagstripe_meets_the_targets_on_hdd_1998() {
    acceptance(Profile::Hdd1998);
}

#[test]
fn tagstripe_meets_the_targets_on_hdd_modern() {
    acceptance(Profile::HddModern);
}

#[test]
fn tagstripe_meets_the_targets_on_ssd() {
    acceptance(Profile::Ssd);
}

fn completion_order(order: DeviceOrder) -> Vec<u32> {
    use tagstripe_scheduler::sim::read;
    use tagstripe_scheduler::{DiskEvent, DiskModel};
    let mut cfg = Profile::Hdd1998.config();
    cfg.order = order;
    let mut d = DiskModel::new(cfg);
    for (tag, lba) in [(0, 100_000), (1, 5_000_000), (2, 50_000), (3, 9_000_000)] {
        d.submit(0, tag, read(lba, 8)).unwrap();
    }
    let mut done = Vec::new();
    while let Some(t) = d.next_event() {
        for e in d.advance(t) {
            if let DiskEvent::Completed { tag, .. } = e {
                done.push(tag);
            }
        }
    }
    done
}

#[test]
fn device_orders_pick_as_named() {
    // The first command starts at once; the others wait for the head.
    assert_eq!(completion_order(DeviceOrder::Fifo), [0, 1, 2, 3]);
    // C-LOOK: upward from the head (near LBA 100 000), then wrap to the lowest.
    assert_eq!(completion_order(DeviceOrder::CLook), [0, 1, 3, 2]);
    // SPTF: the nearest first (LBA 50 000 is next door).
    assert_eq!(
        completion_order(DeviceOrder::Sptf { aging: None })[..2],
        [0, 2]
    );
}

/// The 1999 story's bounds on hdd-1998 for seeds 1 to 24 (not tuned to one), over ten
/// simulated minutes: the login chain and the reader's p99 within 1.3x of unloaded, bulk at
/// least 0.9x FIFO's. Ten minutes give the reader about 6,000 reads, so its p99 is about the
/// 60th slowest; over one minute it is the 6th slowest of about 550 and moves with the
/// seed (seeds 1 to 24 then give 1.08-1.34x, four over 1.3x, where ten minutes give
/// 1.11-1.19x).
#[test]
fn hdd_1998_bounds_hold_across_seeds() {
    let seeds: Vec<u64> = (1..=24).collect();
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let rows: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = seeds
            .chunks(seeds.len().div_ceil(threads))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|&seed| seed_bounds(seed))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let misses: Vec<&String> = rows.iter().filter(|r| r.ends_with("MISS")).collect();
    assert!(misses.is_empty(), "{misses:#?}\nof\n{rows:#?}");
}

/// One seed's figures against the bounds, ending in "MISS" when one is not held.
fn seed_bounds(seed: u64) -> String {
    let r = sim::report(Profile::Hdd1998, 600, seed);
    let row = |name: &str| r.rows.iter().find(|x| x.scheduler == name).unwrap();
    let (ts, fifo) = (row("tagstripe"), row("fifo"));
    let p99 = ts.with_reader.interactive.p99 as f64 / r.unloaded.interactive.p99 as f64;
    let chain = ts.with_chains.chains.p99 as f64 / r.unloaded_chains.chains.p99 as f64;
    let bulk = ts.with_reader.bulk_bytes_per_sec / fifo.with_reader.bulk_bytes_per_sec;
    let held = p99 <= 1.3 && chain <= 1.3 && bulk >= 0.9;
    let why = format!("seed {seed}: p99 {p99:.3}x, chain {chain:.3}x, bulk {bulk:.3}x");
    eprintln!("{why}");
    if held { why } else { format!("{why} MISS") }
}

/// A simulation's cost grows with its length, not with its square: the queue's timer is
/// armed only when it must fire before the one already pending (as the library's `Queue`
/// arms its timer), so stale wakes never pile up. Before, every change of the policy's wake
/// time added a wake and each stale wake added another: a 240 s run processed 8,181 events
/// per simulated second against 2,323 over 60 s, and ten simulated minutes took over a
/// minute.
#[test]
fn a_long_simulation_costs_in_proportion_to_its_length() {
    let per_second = |seconds: u64| {
        let scn = Scenario::standard(Profile::Hdd1998, seconds, 1);
        let r = run(Profile::Hdd1998, Scheduler::Tagstripe, scn);
        r.events as f64 / seconds as f64
    };
    let (short, long) = (per_second(60), per_second(240));
    assert!(
        long <= 1.2 * short,
        "events per simulated second: {short:.0} over 60 s, {long:.0} over 240 s"
    );
}
