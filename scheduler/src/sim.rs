//! The fairness simulation: a [`TagQueue`] in front of a
//! [`DiskModel`] on a virtual clock, one sequential 64 KiB writer at QD 64, QD-1 4 KiB random
//! reads (Poisson) and 20-read "login" chains, under each scheduler. Deterministic: the same
//! seed gives the same numbers.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use crate::disk::{DiskCommand, DiskEvent, DiskOp};
use crate::{
    Deadline, Dir, DiskConfig, DiskModel, Event, Fair, FairConfig, Fifo, IoClass, Meta, Nanos,
    Outcome, PeriodicOrdered, Policy, Profile, QueueConfig, Rng, Tag, TagKind, TagQueue,
};

/// A 4 KiB-aligned read command (for examples and tests).
#[must_use]
pub fn read(lba: u64, sectors: u64) -> DiskCommand {
    DiskCommand {
        lba,
        sectors,
        op: DiskOp::Read,
        kind: TagKind::Simple,
    }
}

/// A write command.
#[must_use]
pub fn write(lba: u64, sectors: u64) -> DiskCommand {
    DiskCommand {
        lba,
        sectors,
        op: DiskOp::Write,
        kind: TagKind::Simple,
    }
}

/// The schedulers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheduler {
    /// FIFO host queue, 64 tags: the no-fairness baseline.
    Fifo,
    /// FIFO plus an ordered tag every 15 s: FreeBSD CAM in 1998 (da(4) `send_ordered`).
    Cam1998,
    /// The quirk fix of 1999: FIFO with 2 tags.
    MaxTags2,
    /// A host deadline policy (mq-deadline-like: reads 500 ms, writes 5 s) with 64 tags.
    Deadline,
    /// tagstripe's [`Fair`] policy with 64 tags.
    Tagstripe,
}

impl Scheduler {
    /// Every loaded scheduler, in report order.
    pub const ALL: [Scheduler; 5] = [
        Scheduler::Fifo,
        Scheduler::Cam1998,
        Scheduler::MaxTags2,
        Scheduler::Deadline,
        Scheduler::Tagstripe,
    ];

    /// `"fifo"`, `"cam1998"`, `"maxtags2"`, `"deadline"` or `"tagstripe"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Cam1998 => "cam1998",
            Self::MaxTags2 => "maxtags2",
            Self::Deadline => "deadline",
            Self::Tagstripe => "tagstripe",
        }
    }
}

/// What runs in a simulation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scenario {
    /// The disk.
    pub profile: Profile,
    /// Simulated seconds, including the warm-up.
    pub seconds: u64,
    /// Seconds dropped at the start.
    pub warmup: u64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Run the sequential writer.
    pub bulk: bool,
    /// Run the Poisson reader.
    pub reader: bool,
    /// Run the login chains.
    pub chains: bool,
    /// Writer requests outstanding.
    pub bulk_depth: usize,
    /// Writer request size in sectors.
    pub bulk_sectors: u64,
    /// Reader arrivals per second.
    pub read_rate: f64,
    /// A login chain starts this often.
    pub chain_every: Nanos,
    /// Reads per chain.
    pub chain_len: u32,
    /// The disk's parameters, if not the profile's own.
    pub disk: Option<DiskConfig>,
}

impl Scenario {
    /// The standard scenario for a profile: writer at QD 64 with 64 KiB writes, reads at 10/s on
    /// disks and 1000/s on SSDs, a 20-read chain every 2 s, 60 s with 5 s warm-up.
    #[must_use]
    pub fn standard(profile: Profile, seconds: u64, seed: u64) -> Self {
        Self {
            profile,
            seconds,
            warmup: 5.min(seconds / 2),
            seed,
            bulk: true,
            reader: true,
            chains: true,
            bulk_depth: 64,
            bulk_sectors: 128,
            read_rate: if profile == Profile::Ssd {
                1000.0
            } else {
                10.0
            },
            chain_every: 2_000_000_000,
            chain_len: 20,
            disk: None,
        }
    }
}

/// Exact percentiles of a set of samples, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: Nanos,
    /// 99th percentile.
    pub p99: Nanos,
    /// Largest.
    pub max: Nanos,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples`.
    ///
    /// ```
    /// use tagstripe_scheduler::sim::Percentiles;
    /// let p = Percentiles::of((1..=100).collect());
    /// assert_eq!((p.p50, p.p99, p.max), (50, 99, 100));
    /// ```
    #[must_use]
    pub fn of(mut samples: Vec<Nanos>) -> Self {
        samples.sort_unstable();
        let n = samples.len();
        let at = |p: f64| {
            let rank = ((p * n as f64).ceil() as usize).clamp(1, n.max(1));
            samples.get(rank - 1).copied().unwrap_or(0)
        };
        Self {
            count: n,
            p50: at(0.50),
            p99: at(0.99),
            max: samples.last().copied().unwrap_or(0),
        }
    }
}

/// One simulation's results.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// Scheduler name.
    pub scheduler: &'static str,
    /// Interactive (Poisson reader) latency, submission to completion; reads still
    /// outstanding at the end count with the time they had waited.
    pub interactive: Percentiles,
    /// Time interactive reads spent at the device, dispatch to completion.
    pub interactive_device: Percentiles,
    /// Login chain times, first submission to last completion.
    pub chains: Percentiles,
    /// Bulk bytes completed per second after the warm-up.
    pub bulk_bytes_per_sec: f64,
    /// Ordered tags the policy added.
    pub barriers: u64,
    /// Changes of how the policy shapes bulk ([`Event::Shaped`]).
    pub shape_changes: u64,
    /// The fewest openings seen (QUEUE FULL back-off).
    pub min_openings: u32,
    /// Events the simulation processed (arrivals, commands to and from the disk, the
    /// queue's timer): what the run cost, which grows in proportion to its length.
    pub events: u64,
}

#[derive(Clone, Copy, Debug)]
enum Source {
    /// A bulk write of this many sectors.
    Bulk(u64),
    Reader,
    Chain(u32),
}

#[derive(Debug)]
struct Req {
    cmd: DiskCommand,
}

#[derive(Debug)]
enum Ev {
    ReadArrival,
    ChainStart(u32),
    ToDevice { tag: u32, req: Req },
    FromDevice { tag: u32, outcome: Outcome<Req> },
    Timer,
}

#[derive(Debug)]
struct Scheduled {
    at: Nanos,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Sim {
    scn: Scenario,
    queue: TagQueue<Req, Box<dyn Policy>>,
    disk: DiskModel,
    rng: Rng,
    events: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    turnaround: Nanos,
    end: Nanos,
    warmup: Nanos,
    next_bulk_lba: u64,
    bulk_lo: u64,
    bulk_hi: u64,
    tickets: HashMap<u64, (Source, Nanos)>,
    dispatched: HashMap<u32, Nanos>,
    device_times: HashMap<u64, Nanos>,
    at_device: HashMap<u32, u64>,
    chain_start: HashMap<u32, (Nanos, u32)>,
    interactive: Vec<Nanos>,
    interactive_device: Vec<Nanos>,
    chains: Vec<Nanos>,
    bulk_bytes: u64,
    barriers: u64,
    shape_changes: u64,
    min_openings: u32,
    /// When the pending timer events fire (a wake is scheduled only when none is pending
    /// at or before it, so stale wakes do not pile up in the event heap).
    timers: BTreeSet<Nanos>,
    events_done: u64,
}

impl Sim {
    fn at(&mut self, at: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            ev,
        }));
    }

    fn submit(&mut self, now: Nanos, cmd: DiskCommand, source: Source) {
        let meta = match source {
            Source::Bulk(_) => Meta::new(IoClass::Bulk, Dir::Write),
            Source::Reader | Source::Chain(_) => Meta::new(IoClass::Interactive, Dir::Read),
        }
        .with_sectors(cmd.sectors);
        if let Ok(t) = self.queue.submit(now, Req { cmd }, meta) {
            self.tickets.insert(t.0, (source, now));
        }
    }

    fn random_read(&mut self) -> DiskCommand {
        let cap = self.disk.config().capacity_sectors;
        let lba = self.rng.below(cap / 8 - 1) * 8;
        read(lba, 8)
    }

    fn submit_bulk(&mut self, now: Nanos) {
        // The writer's commands are cut to the policy's piece size while it shapes bulk, as
        // the library's queue layer cuts requests.
        let meta = Meta::new(IoClass::Bulk, Dir::Write).with_sectors(self.scn.bulk_sectors);
        let n = self
            .queue
            .piece_limit(now, &meta)
            .map_or(self.scn.bulk_sectors, |p| p.clamp(1, self.scn.bulk_sectors));
        if self.next_bulk_lba + n > self.bulk_hi {
            self.next_bulk_lba = self.bulk_lo;
        }
        let cmd = write(self.next_bulk_lba, n);
        self.next_bulk_lba += n;
        self.submit(now, cmd, Source::Bulk(n));
    }

    fn pump(&mut self, now: Nanos) {
        // Events may submit new requests (the writer's next write, a chain's next read),
        // which may dispatch at once: go round until nothing moves.
        loop {
            let mut moved = false;
            while let Some(e) = self.queue.poll_event() {
                moved = true;
                self.handle_event(now, e);
            }
            while let Some(d) = self.queue.poll_dispatch(now) {
                moved = true;
                let mut req = d.req;
                req.cmd.kind = d.kind;
                self.dispatched.insert(d.tag.0, now);
                self.at_device.insert(d.tag.0, d.ticket.0);
                self.at(now + self.turnaround, Ev::ToDevice { tag: d.tag.0, req });
            }
            if !moved {
                break;
            }
        }
        if let Some(t) = self.queue.poll_timeout() {
            if self.timers.first().is_none_or(|&first| first > t) {
                self.timers.insert(t);
                self.at(t, Ev::Timer);
            }
        }
    }

    fn handle_event(&mut self, now: Nanos, e: Event) {
        match e {
            Event::Completed { ticket, .. } | Event::Failed { ticket } => {
                let Some((source, submitted)) = self.tickets.remove(&ticket.0) else {
                    return;
                };
                let device = self.device_times.remove(&ticket.0).unwrap_or(0);
                let latency = now - submitted;
                match source {
                    Source::Bulk(sectors) => {
                        if now >= self.warmup {
                            self.bulk_bytes += sectors * 512;
                        }
                        self.submit_bulk(now);
                    }
                    Source::Reader => {
                        if submitted >= self.warmup {
                            self.interactive.push(latency);
                            self.interactive_device.push(device);
                        }
                    }
                    Source::Chain(id) => {
                        let Some(&(start, done)) = self.chain_start.get(&id) else {
                            return;
                        };
                        if done + 1 >= self.scn.chain_len {
                            self.chain_start.remove(&id);
                            if start >= self.warmup {
                                self.chains.push(now - start);
                            }
                        } else {
                            self.chain_start.insert(id, (start, done + 1));
                            let cmd = self.random_read();
                            self.submit(now, cmd, Source::Chain(id));
                        }
                    }
                }
            }
            Event::Openings { openings } => self.min_openings = self.min_openings.min(openings),
            Event::Barrier { .. } => self.barriers += 1,
            Event::Shaped(_) => self.shape_changes += 1,
        }
    }

    fn run(mut self) -> RunResult {
        if self.scn.bulk {
            for _ in 0..self.scn.bulk_depth {
                self.submit_bulk(0);
            }
        }
        if self.scn.reader {
            let gap = self.rng.exp(1e9 / self.scn.read_rate) as Nanos;
            self.at(gap, Ev::ReadArrival);
        }
        if self.scn.chains {
            self.at(self.scn.chain_every / 2, Ev::ChainStart(0));
        }
        self.pump(0);
        loop {
            let next_ev = self.events.peek().map(|Reverse(s)| s.at);
            let next_disk = self.disk.next_event();
            let now = match (next_ev, next_disk) {
                (None, None) => break,
                (a, b) => a.unwrap_or(Nanos::MAX).min(b.unwrap_or(Nanos::MAX)),
            };
            if now >= self.end {
                break;
            }
            if next_disk == Some(now) {
                for d in self.disk.advance(now) {
                    if let DiskEvent::Completed { tag, at, ok } = d {
                        let outcome = if ok { Outcome::Done } else { Outcome::Failed };
                        self.at(at + self.turnaround, Ev::FromDevice { tag, outcome });
                    }
                }
                continue;
            }
            let Some(Reverse(s)) = self.events.pop() else {
                break;
            };
            self.events_done += 1;
            match s.ev {
                Ev::ReadArrival => {
                    let cmd = self.random_read();
                    self.submit(now, cmd, Source::Reader);
                    let gap = self.rng.exp(1e9 / self.scn.read_rate) as Nanos;
                    self.at(now + gap.max(1), Ev::ReadArrival);
                }
                Ev::ChainStart(id) => {
                    self.chain_start.insert(id, (now, 0));
                    let cmd = self.random_read();
                    self.submit(now, cmd, Source::Chain(id));
                    self.at(now + self.scn.chain_every, Ev::ChainStart(id + 1));
                }
                Ev::ToDevice { tag, req } => match self.disk.submit(now, tag, req.cmd) {
                    Ok(DiskEvent::Queued) => {}
                    Ok(DiskEvent::Busy) => {
                        let outcome = Outcome::Busy(req);
                        self.at(now + self.turnaround, Ev::FromDevice { tag, outcome });
                    }
                    _ => {
                        let outcome = Outcome::QueueFull(req);
                        self.at(now + self.turnaround, Ev::FromDevice { tag, outcome });
                    }
                },
                Ev::FromDevice { tag, outcome } => {
                    if let (Outcome::Done, Some(t), Some(&ticket)) = (
                        &outcome,
                        self.dispatched.get(&tag),
                        self.at_device.get(&tag),
                    ) {
                        self.device_times.insert(ticket, now - t);
                    }
                    self.dispatched.remove(&tag);
                    self.at_device.remove(&tag);
                    let _ = self.queue.handle_completion(now, Tag(tag), outcome);
                }
                Ev::Timer => {
                    self.timers.remove(&s.at);
                    self.queue.handle_timeout(now);
                }
            }
            self.pump(now);
        }
        // Reads still waiting at the end count with the time they have waited so far.
        let end = self.end;
        for &(source, submitted) in self.tickets.values() {
            if matches!(source, Source::Reader) && submitted >= self.warmup {
                self.interactive.push(end - submitted);
            }
        }
        for &(start, _) in self.chain_start.values() {
            if start >= self.warmup {
                self.chains.push(end - start);
            }
        }
        let measured = (self.end - self.warmup) as f64 / 1e9;
        RunResult {
            scheduler: self.queue.policy().name(),
            interactive: Percentiles::of(self.interactive),
            interactive_device: Percentiles::of(self.interactive_device),
            chains: Percentiles::of(self.chains),
            bulk_bytes_per_sec: self.bulk_bytes as f64 / measured.max(1e-9),
            barriers: self.barriers,
            shape_changes: self.shape_changes,
            min_openings: self.min_openings,
            events: self.events_done,
        }
    }
}

/// Runs one scenario under one policy and queue configuration.
#[must_use]
pub fn run_with(scn: &Scenario, cfg: QueueConfig, policy: Box<dyn Policy>) -> RunResult {
    let disk_cfg = scn.disk.unwrap_or_else(|| scn.profile.config());
    let cap = disk_cfg.capacity_sectors;
    let sim = Sim {
        scn: *scn,
        queue: TagQueue::new(cfg, policy),
        disk: DiskModel::new(disk_cfg),
        rng: Rng::new(scn.seed),
        events: BinaryHeap::new(),
        seq: 0,
        turnaround: disk_cfg.turnaround,
        end: scn.seconds * 1_000_000_000,
        warmup: scn.warmup * 1_000_000_000,
        next_bulk_lba: cap / 10,
        bulk_lo: cap / 10,
        bulk_hi: cap / 10 * 9,
        tickets: HashMap::new(),
        dispatched: HashMap::new(),
        device_times: HashMap::new(),
        at_device: HashMap::new(),
        chain_start: HashMap::new(),
        interactive: Vec::new(),
        interactive_device: Vec::new(),
        chains: Vec::new(),
        bulk_bytes: 0,
        barriers: 0,
        shape_changes: 0,
        min_openings: cfg.max_tags,
        timers: BTreeSet::new(),
        events_done: 0,
    };
    sim.run()
}

/// The queue and policy a named scheduler uses on this profile. `fair` sets tagstripe's
/// policy.
#[must_use]
pub fn scheduler_setup(
    sched: Scheduler,
    profile: Profile,
    fair: FairConfig,
) -> (QueueConfig, Box<dyn Policy>) {
    let base = QueueConfig {
        max_tags: 64,
        min_tags: 2,
        device_orders: profile.config().orders_tags,
        ..QueueConfig::default()
    };
    match sched {
        Scheduler::Fifo => (base, Box::new(Fifo)),
        Scheduler::Cam1998 => (
            base,
            Box::new(PeriodicOrdered::new(PeriodicOrdered::DA_INTERVAL)),
        ),
        Scheduler::MaxTags2 => (
            QueueConfig {
                max_tags: 2,
                min_tags: 2,
                ..base
            },
            Box::new(Fifo),
        ),
        Scheduler::Deadline => (base, Box::new(Deadline::default())),
        Scheduler::Tagstripe => (base, Box::new(Fair::new(fair))),
    }
}

/// tagstripe's policy settings for the simulation, derived from the unloaded run: a barrier age of 4x the unloaded p99 and an anticipation window of half of it (at
/// most the default 2 ms, so fast devices are not held idle). The latency target is learned
/// (as on live devices). On a seeking disk with a write cache the device holds a read behind
/// whatever it already has, so bulk is kept to a small budget of 16 KiB pieces while
/// interactive I/O is active, and is held back for as long as a read is at the device (its
/// starvation guard is its deadline). The modelled disks honour head-of-queue tags, so at
/// most two interactive reads go head-of-queue at once (`head_of_queue_max`): a burst of
/// them is otherwise served newest first. The same settings serve every profile.
#[must_use]
pub fn fair_config_from(unloaded: &RunResult) -> FairConfig {
    let p99 = unloaded.interactive.p99.max(1);
    let d = FairConfig::default();
    FairConfig {
        target: 0,
        age: 4 * p99,
        anticipate: (p99 / 2).min(d.anticipate),
        hold_percent: 100,
        piece_min: 32,
        piece_max: 32,
        budget_start: 128,
        budget_max: 128,
        head_of_queue_max: 2,
        ..d
    }
}

/// One scheduler's row of the fairness report.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Scheduler name.
    pub scheduler: &'static str,
    /// Writer plus the Poisson reader: interactive latency and bulk throughput.
    pub with_reader: RunResult,
    /// Writer plus the login chains.
    pub with_chains: RunResult,
    /// The writer alone: bulk bytes per second.
    pub bulk_idle_bytes_per_sec: f64,
}

/// Every run of the fairness report.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The scenario.
    pub scenario: Scenario,
    /// The Poisson reader alone.
    pub unloaded: RunResult,
    /// The login chains alone.
    pub unloaded_chains: RunResult,
    /// One row per [`Scheduler`].
    pub rows: Vec<Row>,
}

/// Runs the comparison: the reader and the chains unloaded, then every [`Scheduler`]
/// with the writer plus the reader, the writer plus the chains, and the writer alone. The
/// two interactive variants run separately so each one's cost to bulk is measured alone.
///
/// ```
/// use tagstripe_scheduler::{Profile, sim};
/// let r = sim::report(Profile::Hdd1998, 12, 1);
/// assert_eq!(r.rows.len(), 5);
/// assert!(r.unloaded.interactive.count > 0);
/// ```
#[must_use]
pub fn report(profile: Profile, seconds: u64, seed: u64) -> Report {
    let scn = Scenario::standard(profile, seconds, seed);
    let reader = Scenario {
        chains: false,
        ..scn
    };
    let chains = Scenario {
        reader: false,
        ..scn
    };
    let idle = Scenario {
        reader: false,
        chains: false,
        ..scn
    };
    let run = |s: Scheduler, scn: &Scenario, fair: FairConfig| {
        let (cfg, policy) = scheduler_setup(s, profile, fair);
        let mut r = run_with(scn, cfg, policy);
        r.scheduler = s.name();
        r
    };
    let default = FairConfig::default();
    let mut unloaded = run(
        Scheduler::Fifo,
        &Scenario {
            bulk: false,
            ..reader
        },
        default,
    );
    unloaded.scheduler = "unloaded";
    let mut unloaded_chains = run(
        Scheduler::Fifo,
        &Scenario {
            bulk: false,
            ..chains
        },
        default,
    );
    unloaded_chains.scheduler = "unloaded";
    let fair = fair_config_from(&unloaded);
    let rows = Scheduler::ALL
        .iter()
        .map(|&s| Row {
            scheduler: s.name(),
            with_reader: run(s, &reader, fair),
            with_chains: run(s, &chains, fair),
            bulk_idle_bytes_per_sec: run(s, &idle, fair).bulk_bytes_per_sec,
        })
        .collect();
    Report {
        scenario: scn,
        unloaded,
        unloaded_chains,
        rows,
    }
}
