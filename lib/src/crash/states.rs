//! Crash states: which of a log's writes are on the disk after a power cut at a given
//! point, pure and deterministic (no I/O: the log's events in, write numbers out).
//!
//! The rules, per device (a flush on one device makes nothing durable on another):
//! - a write that completed before a flush was *submitted*, that flush having completed,
//!   is durable (dm-log-writes: "a flush covers only what had completed when it was
//!   issued");
//! - a write with FUA is durable once it completes;
//! - every other write submitted before the crash (completed but not yet flushed, in
//!   flight, or failed) may or may not be on the disk, whole.
//!
//! Where writes overlap, the one that landed last wins. Each write lands at some moment
//! between its submission and its completion (or the crash), so a write that completed
//! before another was submitted always lands first: a state never shows old data over new
//! when the device could not have reordered them.
//!
//! The modes:
//! - [`Mode::Prefix`] (dm-log-writes' `replay-log --check fua`): at every flush's submission
//!   and after every FUA write, everything that had completed, in completion order. One
//!   state a point, no randomness.
//! - [`Mode::Subset`] (CrashMonkey): a random crash point in a random epoch (the stretch
//!   between two completed flushes); every durable write, and each of the others (earlier
//!   epochs' unflushed writes included, and those in flight) kept with probability 1/2,
//!   landing in a random order the rules allow.
//! - [`Mode::Torn`] (LazyFS's `torn-op`): a subset state in which one of the writes that may
//!   land lands only in part: a random, non-empty, proper subset of its 512-byte or 4 KiB
//!   blocks.
//!
//! A state's [`StateId`] (`prefix:K`, `subset:SEED:K`, `torn:SEED:K`) rebuilds it exactly
//! from the same log.

use std::fmt;
use std::str::FromStr;

use super::log::{CrashLog, LogEvent, LogOp};

/// Landing moments are event positions times this, plus a fraction.
const SCALE: u64 = 1 << 20;

/// How crash states are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// At every flush and FUA write, what had completed (dm-log-writes).
    Prefix,
    /// Earlier epochs whole, a random subset of the rest (CrashMonkey).
    Subset,
    /// A subset state with one write torn (LazyFS).
    Torn,
}

impl Mode {
    /// `prefix`, `subset` or `torn`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::Subset => "subset",
            Self::Torn => "torn",
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "prefix" => Ok(Self::Prefix),
            "subset" => Ok(Self::Subset),
            "torn" => Ok(Self::Torn),
            _ => Err(format!("{s:?}: expected prefix, subset or torn")),
        }
    }
}

/// Names a crash state of a log: `prefix:K`, `subset:SEED:K` or `torn:SEED:K`.
///
/// ```
/// use tagstripe::crash::{Mode, StateId};
/// let id: StateId = "subset:42:17".parse().unwrap();
/// assert_eq!((id.mode, id.seed, id.index), (Mode::Subset, 42, 17));
/// assert_eq!(id.to_string(), "subset:42:17");
/// assert!("prefix:x".parse::<StateId>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateId {
    /// How the state was chosen.
    pub mode: Mode,
    /// The seed (0 for prefix states).
    pub seed: u64,
    /// Which state.
    pub index: u64,
}

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            Mode::Prefix => write!(f, "prefix:{}", self.index),
            m => write!(f, "{}:{}:{}", m.name(), self.seed, self.index),
        }
    }
}

impl FromStr for StateId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: a state is prefix:K, subset:SEED:K or torn:SEED:K");
        let parts: Vec<&str> = s.split(':').collect();
        let num = |p: &str| p.parse::<u64>().map_err(|_| bad());
        match parts.as_slice() {
            ["prefix", k] => Ok(Self {
                mode: Mode::Prefix,
                seed: 0,
                index: num(k)?,
            }),
            [m, seed, k] if *m == "subset" || *m == "torn" => Ok(Self {
                mode: m.parse()?,
                seed: num(seed)?,
                index: num(k)?,
            }),
            _ => Err(bad()),
        }
    }
}

/// Where a write's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// From the log, at this byte offset.
    Log(u64),
    /// Zeroes (a write-zeroes or a trim).
    Zero,
}

/// A write, write-zeroes or trim of the log, with where it sits in the log's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// The device.
    pub dev: u16,
    /// First sector.
    pub start: u64,
    /// Length in sectors.
    pub sectors: u64,
    /// Its bytes.
    pub src: Source,
    /// With FUA.
    pub fua: bool,
    /// Position of its submit record among the log's events.
    pub sub: u32,
    /// Position of its successful completion; `None` if it never completed or failed.
    pub comp: Option<u32>,
}

/// The part of a write a state lands: all of it, or (torn) some of its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlay {
    /// The write (an index into [`Timeline::writes`]).
    pub write: usize,
    /// When it lands; the latest landing wins where writes overlap.
    pub landing: u64,
    /// For a torn write, the sector ranges `(start, sectors)` that land; `None`: all.
    pub kept: Option<Vec<(u64, u64)>>,
}

/// Which writes a state's base holds: the monotone part a working image moves forward
/// through, state after state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaseRule {
    /// Every write completed before the point (prefix states).
    Completed,
    /// Every write durable at the point (subset and torn states).
    Durable,
}

/// One crash state: the crash point, the rule for its base, and the writes that land on top
/// of the base, in landing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashState {
    /// Its name.
    pub id: StateId,
    /// The crash point: the number of log events that happened before the power cut.
    pub point: u32,
    /// Which writes the base holds.
    pub base: BaseRule,
    /// The writes that land beyond the base, by landing.
    pub overlay: Vec<Overlay>,
}

/// A log's writes and flushes laid out for choosing crash states.
#[derive(Clone, Debug)]
pub struct Timeline {
    writes: Vec<Write>,
    /// Per device: successful flushes as (completion, submission), by completion.
    flushes: Vec<Vec<(u32, u32)>>,
    /// Per device: writes that completed, by completion.
    by_comp: Vec<Vec<usize>>,
    /// Per device: writes that never completed successfully.
    never: Vec<Vec<usize>>,
    /// FUA writes that completed, by completion.
    fua: Vec<usize>,
    /// Writes that completed, by completion.
    completed: Vec<usize>,
    /// The longest a completed write was in flight, in events.
    max_span: u32,
    /// Epoch boundaries: 0, one past each successful flush completion, the end.
    epochs: Vec<u32>,
    /// Prefix points.
    prefix: Vec<u32>,
    events: u32,
}

impl Timeline {
    /// Lays out a log's events.
    ///
    /// # Panics
    /// Never for a log [`CrashLog::open`] accepted (more than 2^32 events are refused
    /// there by size); positions saturate otherwise.
    #[must_use]
    pub fn new(log: &CrashLog) -> Self {
        Self::from_events(log.devices().len(), log.events())
    }

    /// Lays out events of `devices` devices (what [`new`](Self::new) does with a log's).
    #[must_use]
    pub fn from_events(devices: usize, events: &[LogEvent]) -> Self {
        let pos = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        let mut t = Self {
            writes: Vec::new(),
            flushes: vec![Vec::new(); devices],
            by_comp: vec![Vec::new(); devices],
            never: vec![Vec::new(); devices],
            fua: Vec::new(),
            completed: Vec::new(),
            max_span: 0,
            epochs: vec![0],
            prefix: Vec::new(),
            events: pos(events.len()),
        };
        // seq -> (write index or flush (dev, sub)).
        let mut open = std::collections::HashMap::new();
        for (i, e) in events.iter().enumerate() {
            match *e {
                LogEvent::Submit(s) if s.op == LogOp::Flush => {
                    open.insert(s.seq, Err((s.dev, pos(i))));
                    t.prefix.push(pos(i));
                }
                LogEvent::Submit(s) => {
                    open.insert(s.seq, Ok(t.writes.len()));
                    t.writes.push(Write {
                        dev: s.dev,
                        start: s.start,
                        sectors: s.sectors,
                        src: if s.op == LogOp::Write {
                            Source::Log(s.data_at)
                        } else {
                            Source::Zero
                        },
                        fua: s.fua,
                        sub: pos(i),
                        comp: None,
                    });
                }
                LogEvent::Complete { seq, ok } => match open.remove(&seq) {
                    Some(Ok(w)) if ok => {
                        let wr = &mut t.writes[w];
                        wr.comp = Some(pos(i));
                        t.max_span = t.max_span.max(pos(i) - wr.sub);
                        t.by_comp[usize::from(wr.dev)].push(w);
                        t.completed.push(w);
                        if wr.fua {
                            t.fua.push(w);
                            t.prefix.push(pos(i) + 1);
                        }
                    }
                    Some(Err((dev, sub))) if ok => {
                        t.flushes[usize::from(dev)].push((pos(i), sub));
                        t.epochs.push(pos(i) + 1);
                    }
                    _ => {}
                },
            }
        }
        for (d, n) in t.never.iter_mut().enumerate() {
            n.extend(
                t.writes
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| usize::from(w.dev) == d && w.comp.is_none())
                    .map(|(i, _)| i),
            );
        }
        t.prefix.push(t.events);
        t.prefix.sort_unstable();
        t.prefix.dedup();
        if t.epochs.last() != Some(&t.events) {
            t.epochs.push(t.events);
        }
        t
    }

    /// The writes, write-zeroes and trims, in submission order.
    #[must_use]
    pub fn writes(&self) -> &[Write] {
        &self.writes
    }

    /// How many prefix states the log has (one a flush and a FUA write, and the end).
    #[must_use]
    pub fn prefix_states(&self) -> u64 {
        self.prefix.len() as u64
    }

    /// The newest submission position of a flush on `dev` completed before `point`: the
    /// writes completed before it are durable at `point`.
    fn flushed_before(&self, dev: usize, point: u32) -> Option<u32> {
        let f = &self.flushes[dev];
        let n = f.partition_point(|&(comp, _)| comp < point);
        f[..n].iter().map(|&(_, sub)| sub).max()
    }

    /// Whether write `w` is in the base of a state at `point` under `rule`.
    #[must_use]
    pub fn in_base(&self, rule: BaseRule, point: u32, w: usize) -> bool {
        let wr = &self.writes[w];
        let Some(comp) = wr.comp else { return false };
        match rule {
            BaseRule::Completed => comp < point,
            BaseRule::Durable => {
                (wr.fua && comp < point)
                    || self
                        .flushed_before(usize::from(wr.dev), point)
                        .is_some_and(|f| comp < f)
            }
        }
    }

    /// When a write of the base lands: its completion.
    #[must_use]
    pub fn base_landing(&self, w: usize) -> u64 {
        u64::from(self.writes[w].comp.unwrap_or(0)) * SCALE
    }

    /// A cursor over the base as the crash point moves forward.
    #[must_use]
    pub fn cursor(&self, rule: BaseRule) -> BaseCursor {
        BaseCursor {
            rule,
            point: 0,
            all: 0,
            fua: 0,
            dev: vec![0; self.by_comp.len()],
            included: vec![false; self.writes.len()],
        }
    }

    /// The writes that may have landed at `point` beyond its durable base.
    fn maybe(&self, point: u32) -> Vec<usize> {
        let mut out = Vec::new();
        for d in 0..self.by_comp.len() {
            let flushed = self.flushed_before(d, point);
            let list = &self.by_comp[d];
            // Not durable by a flush: completed at or after the flush's submission.
            let from = flushed.map_or(0, |f| {
                list.partition_point(|&w| self.writes[w].comp.unwrap_or(0) < f)
            });
            for &w in &list[from..] {
                let wr = &self.writes[w];
                let comp = wr.comp.unwrap_or(0);
                if comp >= point.saturating_add(self.max_span) {
                    break;
                }
                if wr.sub < point && !(wr.fua && comp < point) {
                    out.push(w);
                }
            }
            out.extend(
                self.never[d]
                    .iter()
                    .copied()
                    .filter(|&w| self.writes[w].sub < point),
            );
        }
        out.sort_unstable();
        out
    }

    /// The state `id` names, or `None` if there is no such state (a prefix index past the
    /// last, for one).
    #[must_use]
    pub fn state(&self, id: StateId) -> Option<CrashState> {
        match id.mode {
            Mode::Prefix => {
                let point = *self.prefix.get(usize::try_from(id.index).ok()?)?;
                Some(CrashState {
                    id,
                    point,
                    base: BaseRule::Completed,
                    overlay: Vec::new(),
                })
            }
            Mode::Subset | Mode::Torn => Some(self.random_state(id)),
        }
    }

    /// `n` prefix states spread over the log's points (all of them if `n` is at least their
    /// number), by index.
    #[must_use]
    pub fn prefix_ids(&self, n: u64) -> Vec<StateId> {
        let total = self.prefix_states();
        let id = |index| StateId {
            mode: Mode::Prefix,
            seed: 0,
            index,
        };
        if n >= total {
            return (0..total).map(id).collect();
        }
        // Evenly spread, the last point (everything completed) always in.
        let mut v: Vec<u64> = (1..=n).map(|k| k * total / n - 1).collect();
        v.dedup();
        v.into_iter().map(id).collect()
    }

    /// The states a check runs through: `n` of `mode` from `seed` (prefix: `n` spread over
    /// the log's points, all of them if it has no more), in the order of their crash points
    /// (the order in which [`Images`](super::Images) moves forward without rebuilding).
    #[must_use]
    pub fn states(&self, mode: Mode, n: u64, seed: u64) -> Vec<CrashState> {
        let ids: Vec<StateId> = match mode {
            Mode::Prefix => self.prefix_ids(n),
            m => (0..n)
                .map(|index| StateId {
                    mode: m,
                    seed,
                    index,
                })
                .collect(),
        };
        let mut v: Vec<CrashState> = ids.into_iter().filter_map(|id| self.state(id)).collect();
        v.sort_by_key(|s| (s.point, s.id.index));
        v
    }

    /// What a state holds, in words: the crash point, how many writes its base holds, which
    /// others land, and the torn one.
    ///
    /// ```
    /// use tagstripe::crash::{Mode, StateId, Timeline};
    /// let t = Timeline::from_events(1, &[]);
    /// let s = t.state(StateId { mode: Mode::Prefix, seed: 0, index: 0 }).unwrap();
    /// assert_eq!(t.describe(&s), "prefix:0: crash after 0 of 0 events; 0 writes completed before it, nothing else lands");
    /// ```
    #[must_use]
    pub fn describe(&self, s: &CrashState) -> String {
        let base = (0..self.writes.len())
            .filter(|&w| self.in_base(s.base, s.point, w))
            .count();
        let mut out = format!(
            "{}: crash after {} of {} events; {base} writes {} before it",
            s.id,
            s.point,
            self.events,
            match s.base {
                BaseRule::Completed => "completed",
                BaseRule::Durable => "durable",
            }
        );
        let maybe = self.maybe(s.point).len();
        if s.base == BaseRule::Durable {
            out.push_str(&format!(
                ", {} of the {maybe} that may land do",
                s.overlay.len()
            ));
        } else {
            out.push_str(", nothing else lands");
        }
        for o in &s.overlay {
            if let Some(kept) = &o.kept {
                let w = &self.writes[o.write];
                let ranges: Vec<String> = kept
                    .iter()
                    .map(|(a, n)| format!("{a}..{}", a + n))
                    .collect();
                out.push_str(&format!(
                    "; torn: the write of {} sectors at {} on device {} lands only sectors {}",
                    w.sectors,
                    w.start,
                    w.dev,
                    ranges.join(", ")
                ));
            }
        }
        out
    }

    fn random_state(&self, id: StateId) -> CrashState {
        let mut rng = Rng::new(id.seed, id.index);
        // A random epoch with events in it, then a random point inside it.
        let spans: Vec<(u32, u32)> = self
            .epochs
            .windows(2)
            .map(|w| (w[0], w[1]))
            .filter(|(a, b)| b > a)
            .collect();
        let point = match spans.as_slice() {
            [] => 0,
            s => {
                let (a, b) = s[rng.below(s.len() as u64) as usize];
                a + 1 + rng.below(u64::from(b - a)) as u32
            }
        };
        let maybe = self.maybe(point);
        let mut chosen: Vec<usize> = maybe.iter().copied().filter(|_| rng.coin()).collect();
        let mut torn = None;
        if id.mode == Mode::Torn && !maybe.is_empty() {
            let unit: u64 = if rng.coin() { 1 } else { 8 };
            let units = |w: &Write| (w.start + w.sectors).div_ceil(unit) - w.start / unit;
            let multi: Vec<usize> = maybe
                .iter()
                .copied()
                .filter(|&w| units(&self.writes[w]) >= 2)
                .collect();
            let pool = if multi.is_empty() { &maybe } else { &multi };
            let w = pool[rng.below(pool.len() as u64) as usize];
            if !chosen.contains(&w) {
                chosen.push(w);
            }
            let wr = &self.writes[w];
            let n = units(wr);
            let mut keep: Vec<bool> = (0..n).map(|_| rng.coin()).collect();
            if n == 1 {
                // One block: it cannot be torn, it lands whole.
                keep[0] = true;
            } else {
                let k = rng.below(n) as usize;
                if keep.iter().all(|&b| b) {
                    keep[k] = false;
                } else if !keep.iter().any(|&b| b) {
                    keep[k] = true;
                }
            }
            let first = wr.start / unit;
            let mut kept: Vec<(u64, u64)> = Vec::new();
            for (i, &k) in keep.iter().enumerate() {
                if !k {
                    continue;
                }
                let s = ((first + i as u64) * unit).max(wr.start);
                let e = ((first + i as u64 + 1) * unit).min(wr.start + wr.sectors);
                match kept.last_mut() {
                    Some((ls, ln)) if *ls + *ln == s => *ln += e - s,
                    _ => kept.push((s, e - s)),
                }
            }
            torn = Some((w, kept));
        }
        chosen.sort_unstable();
        let mut overlay: Vec<Overlay> = chosen
            .into_iter()
            .map(|w| {
                let wr = &self.writes[w];
                let end = wr.comp.map_or(point, |c| c.min(point));
                let span = u64::from(end.saturating_sub(wr.sub)) * SCALE;
                Overlay {
                    write: w,
                    landing: u64::from(wr.sub) * SCALE + rng.below(span + 1),
                    kept: torn
                        .as_ref()
                        .filter(|(t, _)| *t == w)
                        .map(|(_, k)| k.clone()),
                }
            })
            .collect();
        overlay.sort_by_key(|o| (o.landing, o.write));
        CrashState {
            id,
            point,
            base: BaseRule::Durable,
            overlay,
        }
    }
}

/// Walks a base forward: the writes that join it as the crash point moves on.
#[derive(Clone, Debug)]
pub struct BaseCursor {
    rule: BaseRule,
    point: u32,
    /// Next in `completed` (rule Completed).
    all: usize,
    /// Next in `fua` (rule Durable).
    fua: usize,
    /// Per device, next in `by_comp` (rule Durable).
    dev: Vec<usize>,
    included: Vec<bool>,
}

impl BaseCursor {
    /// The crash point the base is at.
    #[must_use]
    pub fn point(&self) -> u32 {
        self.point
    }

    /// The rule it follows.
    #[must_use]
    pub fn rule(&self) -> BaseRule {
        self.rule
    }

    /// Moves the base to `point` (not before where it is) and returns the writes that
    /// joined it, in completion order.
    #[must_use]
    pub fn advance(&mut self, t: &Timeline, point: u32) -> Vec<usize> {
        let point = point.max(self.point);
        self.point = point;
        let mut new = Vec::new();
        let comp = |w: usize| t.writes[w].comp.unwrap_or(u32::MAX);
        match self.rule {
            BaseRule::Completed => {
                while self.all < t.completed.len() && comp(t.completed[self.all]) < point {
                    new.push(t.completed[self.all]);
                    self.all += 1;
                }
            }
            BaseRule::Durable => {
                while self.fua < t.fua.len() && comp(t.fua[self.fua]) < point {
                    new.push(t.fua[self.fua]);
                    self.fua += 1;
                }
                for d in 0..self.dev.len() {
                    let Some(f) = t.flushed_before(d, point) else {
                        continue;
                    };
                    let list = &t.by_comp[d];
                    while self.dev[d] < list.len() && comp(list[self.dev[d]]) < f {
                        new.push(list[self.dev[d]]);
                        self.dev[d] += 1;
                    }
                }
                new.retain(|&w| !std::mem::replace(&mut self.included[w], true));
                new.sort_by_key(|&w| comp(w));
            }
        }
        new
    }
}

/// SplitMix64: a state's own stream of numbers from its seed and index, so any state can
/// be rebuilt alone.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64, index: u64) -> Self {
        let mut r = Self(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next();
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 for `n == 0`).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    fn coin(&mut self) -> bool {
        self.next() >> 63 == 1
    }
}
