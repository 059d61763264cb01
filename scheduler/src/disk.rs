//! A deterministic model of a disk with a tagged command window, for measuring schedulers
//! a virtual clock in nanoseconds, a tag window with QUEUE
//! FULL and BUSY, internal reordering (FIFO, shortest-positioning-time-first with optional
//! aging, C-LOOK), seek + rotation + transfer, a write-back cache with destage and flush,
//! ordered and head-of-queue task attributes, an optional mod-15 write fault, and an SSD mode
//! with dies.
//!
//! The model is driven by its caller: [`DiskModel::submit`] delivers a command,
//! [`DiskModel::next_event`] says when the disk next has something to report, and
//! [`DiskModel::advance`] runs it up to a time and returns the completions.

use std::collections::{BTreeMap, VecDeque};

use crate::{Error, Nanos, TagKind};

/// How the drive picks the next command for the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOrder {
    /// In arrival order.
    Fifo,
    /// Shortest positioning time (seek + rotation) first. With `aging`, a command older
    /// than that goes first (modern drives: 1-4 s); without, a far command can starve.
    Sptf {
        /// Age after which the oldest command is forced.
        aging: Option<Nanos>,
    },
    /// Circular LOOK: the next LBA at or above the head, wrapping to the lowest.
    CLook,
}

/// The drive's write cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// Writes complete when on the media.
    WriteThrough,
    /// Writes complete when in the cache; dirty data is destaged by the head, first when a
    /// write is waiting for space or a flush is pending, otherwise when nothing else needs
    /// the head.
    WriteBack {
        /// Cache size in bytes.
        bytes: u64,
    },
}

/// A named set of disk parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// A 1998 SCSI disk: 64 tags, greedy SPTF with no aging, 7200 rpm, 12 MB/s media,
    /// 40 MB/s Ultra SCSI bus, 512 KiB write-back cache, ordered tags honoured.
    Hdd1998,
    /// A current SATA disk: 32 NCQ tags (no ordered attribute), SPTF with 2 s aging,
    /// 7200 rpm, 200 MB/s media, 600 MB/s bus, 256 MiB cache.
    HddModern,
    /// An SSD: 8 dies, 4 KiB reads 80 µs, programs 400 µs with program suspend for reads,
    /// 32 NCQ tags.
    Ssd,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 3] = [Profile::Hdd1998, Profile::HddModern, Profile::Ssd];

    /// `"hdd-1998"`, `"hdd-modern"` or `"ssd"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Hdd1998 => "hdd-1998",
            Self::HddModern => "hdd-modern",
            Self::Ssd => "ssd",
        }
    }

    /// Parses a name as [`Profile::name`] gives it.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The profile's parameters.
    #[must_use]
    pub fn config(self) -> DiskConfig {
        match self {
            Self::Hdd1998 => DiskConfig {
                capacity_sectors: 9_000_000_000 / 512,
                window: 64,
                queue_full_at: None,
                busy_during: None,
                order: DeviceOrder::Sptf { aging: None },
                orders_tags: true,
                seek_min: 2_000_000,
                seek_full: 15_000_000,
                rpm: 7200,
                sectors_per_track: 195,
                bus_bytes_per_sec: 40_000_000,
                cache: CacheMode::WriteBack { bytes: 512 << 10 },
                mod15_fault: false,
                ssd: None,
                turnaround: 50_000,
                destage_delay: 2_000_000,
            },
            Self::HddModern => DiskConfig {
                capacity_sectors: 4_000_000_000_000 / 512,
                window: 32,
                queue_full_at: None,
                busy_during: None,
                order: DeviceOrder::Sptf {
                    aging: Some(2_000_000_000),
                },
                orders_tags: false,
                seek_min: 1_000_000,
                seek_full: 12_000_000,
                rpm: 7200,
                sectors_per_track: 3255,
                bus_bytes_per_sec: 600_000_000,
                cache: CacheMode::WriteBack { bytes: 256 << 20 },
                mod15_fault: false,
                ssd: None,
                turnaround: 20_000,
                destage_delay: 2_000_000,
            },
            Self::Ssd => DiskConfig {
                capacity_sectors: 1_000_000_000_000 / 512,
                window: 32,
                queue_full_at: None,
                busy_during: None,
                order: DeviceOrder::Fifo,
                orders_tags: false,
                seek_min: 0,
                seek_full: 0,
                rpm: 0,
                sectors_per_track: 1,
                bus_bytes_per_sec: 600_000_000,
                cache: CacheMode::WriteThrough,
                mod15_fault: false,
                ssd: Some(SsdConfig {
                    dies: 8,
                    page_sectors: 8,
                    read_ns: 80_000,
                    program_ns: 400_000,
                    suspend_ns: 20_000,
                }),
                turnaround: 5_000,
                destage_delay: 0,
            },
        }
    }
}

/// SSD parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsdConfig {
    /// Independent dies; pages are striped over them.
    pub dies: u32,
    /// Sectors per page.
    pub page_sectors: u64,
    /// Reading one page.
    pub read_ns: Nanos,
    /// Programming one page.
    pub program_ns: Nanos,
    /// How long a read waits for a program in progress to suspend.
    pub suspend_ns: Nanos,
}

/// The model's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// Size in sectors.
    pub capacity_sectors: u64,
    /// Tag window: a command arriving when this many are held gets QUEUE FULL.
    pub window: u32,
    /// Spurious QUEUE FULL at this occupancy (the Quantum Atlas quirk); `None` = never.
    pub queue_full_at: Option<u32>,
    /// BUSY for commands arriving in `[from, to)`.
    pub busy_during: Option<(Nanos, Nanos)>,
    /// Head scheduling.
    pub order: DeviceOrder,
    /// Whether ordered and head-of-queue attributes are honoured (SCSI) or ignored (NCQ,
    /// where the host drains instead).
    pub orders_tags: bool,
    /// Track-to-track seek.
    pub seek_min: Nanos,
    /// Extra time for a full-stroke seek: seek(d) = min + full · sqrt(d / tracks).
    pub seek_full: Nanos,
    /// Spindle speed (0 for an SSD).
    pub rpm: u32,
    /// Sectors per track; with the rpm this sets the media rate.
    pub sectors_per_track: u64,
    /// Host bus rate, for transfers into and out of the cache.
    pub bus_bytes_per_sec: u64,
    /// Write cache.
    pub cache: CacheMode,
    /// Writes of `n` sectors with `n % 15 == 1` (n > 1) fail (sata_sil's MOD15WRITE).
    pub mod15_fault: bool,
    /// SSD mode.
    pub ssd: Option<SsdConfig>,
    /// Host turnaround each way (interrupt, driver), used by the simulation harness.
    pub turnaround: Nanos,
    /// Background destage starts only after the head has been idle this long (drives
    /// wait for idleness before background work); destage for a waiting write or a flush
    /// starts at once.
    pub destage_delay: Nanos,
}

impl DiskConfig {
    /// Media transfer rate in bytes per second (HDD).
    #[must_use]
    pub fn media_bytes_per_sec(&self) -> u64 {
        if self.rpm == 0 {
            return 0;
        }
        self.sectors_per_track * 512 * u64::from(self.rpm) / 60
    }
}

/// A command as the disk sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskCommand {
    /// First sector.
    pub lba: u64,
    /// Length in sectors (0 for a flush).
    pub sectors: u64,
    /// Read, write or flush.
    pub op: DiskOp,
    /// Task attribute.
    pub kind: TagKind,
}

/// What a command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskOp {
    /// Read.
    Read,
    /// Write.
    Write,
    /// Synchronize cache: completes when nothing dirty is left.
    Flush,
}

/// What the disk says about a delivered command or a finished one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskEvent {
    /// Accepted into the window.
    Queued,
    /// QUEUE FULL: not accepted.
    QueueFull,
    /// BUSY: not accepted.
    Busy,
    /// Finished at `at`; `ok` false for a failed command.
    Completed {
        /// The tag.
        tag: u32,
        /// When.
        at: Nanos,
        /// Success.
        ok: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In the window, not started.
    Waiting,
    /// A write moving into the cache over the bus, or a read served from it.
    Bus,
    /// Using the head (or dies).
    Head,
}

#[derive(Clone, Copy, Debug)]
struct Cmd {
    tag: u32,
    cmd: DiskCommand,
    arrival: Nanos,
    seq: u64,
    state: State,
    done_at: Nanos,
}

#[derive(Clone, Copy, Debug)]
enum HeadOp {
    Command,
    Destage { sectors: u64 },
}

/// The disk model; see the module docs.
///
/// ```
/// use tagstripe_scheduler::{DiskEvent, DiskModel, Profile};
/// use tagstripe_scheduler::sim::read;
/// let mut d = DiskModel::new(Profile::Hdd1998.config());
/// d.submit(0, 0, read(1_000_000, 8))?;
/// let mut done = Vec::new();
/// while let Some(t) = d.next_event() {
///     done.extend(d.advance(t));
/// }
/// let [DiskEvent::Completed { tag: 0, at, ok: true }] = done[..] else { panic!("{done:?}") };
/// assert!(at > 2_000_000 && at < 40_000_000, "one random read: seek + rotation + transfer");
/// # Ok::<(), tagstripe_scheduler::Error>(())
/// ```
#[derive(Debug)]
pub struct DiskModel {
    cfg: DiskConfig,
    now: Nanos,
    window: Vec<Cmd>,
    seq: u64,
    head_track: u64,
    head: Option<(HeadOp, Nanos)>,
    background_at: Option<Nanos>,
    bus_free: Nanos,
    dirty: VecDeque<(u64, u64)>,
    /// The same extents by start sector (with a count for repeated writes), for cache hits.
    dirty_index: BTreeMap<(u64, u64), u32>,
    dirty_bytes: u64,
    dies_free: Vec<Nanos>,
    tracks: u64,
    done: Vec<DiskEvent>,
}

impl DiskModel {
    /// A disk with these parameters, idle at time 0 with the head at track 0.
    #[must_use]
    pub fn new(cfg: DiskConfig) -> Self {
        let dies = cfg.ssd.map_or(0, |s| s.dies as usize);
        Self {
            tracks: (cfg.capacity_sectors / cfg.sectors_per_track.max(1)).max(1),
            cfg,
            now: 0,
            window: Vec::new(),
            seq: 0,
            head_track: 0,
            head: None,
            background_at: None,
            bus_free: 0,
            dirty: VecDeque::new(),
            dirty_index: BTreeMap::new(),
            dirty_bytes: 0,
            dies_free: vec![0; dies],
            done: Vec::new(),
        }
    }

    /// The parameters.
    #[must_use]
    pub fn config(&self) -> &DiskConfig {
        &self.cfg
    }

    /// Commands held (waiting or in progress).
    #[must_use]
    pub fn held(&self) -> usize {
        self.window.len()
    }

    /// Dirty bytes in the write cache.
    #[must_use]
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    /// Delivers a command at `now` (not before the last call's time) under `tag`.
    ///
    /// # Errors
    /// [`Error::TagInUse`] if the tag is held; [`Error::OutOfRange`] for a command past the
    /// end or a read/write of zero sectors. Nothing changes then.
    pub fn submit(&mut self, now: Nanos, tag: u32, cmd: DiskCommand) -> Result<DiskEvent, Error> {
        if self.window.iter().any(|c| c.tag == tag) {
            return Err(Error::TagInUse { tag });
        }
        let in_range = cmd
            .lba
            .checked_add(cmd.sectors)
            .is_some_and(|end| end <= self.cfg.capacity_sectors);
        if !in_range || (cmd.op != DiskOp::Flush && cmd.sectors == 0) {
            return Err(Error::OutOfRange {
                lba: cmd.lba,
                sectors: cmd.sectors,
                capacity: self.cfg.capacity_sectors,
            });
        }
        self.run_until(now);
        if self
            .cfg
            .busy_during
            .is_some_and(|(from, to)| now >= from && now < to)
        {
            return Ok(DiskEvent::Busy);
        }
        let held = self.window.len() as u32;
        if held >= self.cfg.window || self.cfg.queue_full_at.is_some_and(|k| held >= k) {
            return Ok(DiskEvent::QueueFull);
        }
        let cmd = DiskCommand {
            kind: if self.cfg.orders_tags {
                cmd.kind
            } else {
                TagKind::Simple
            },
            ..cmd
        };
        self.seq += 1;
        self.window.push(Cmd {
            tag,
            cmd,
            arrival: now,
            seq: self.seq,
            state: State::Waiting,
            done_at: 0,
        });
        self.schedule(now);
        Ok(DiskEvent::Queued)
    }

    /// When the disk next changes state on its own (a command or a destage finishing).
    #[must_use]
    pub fn next_event(&self) -> Option<Nanos> {
        if !self.done.is_empty() {
            return Some(self.now);
        }
        self.next_internal()
    }

    fn next_internal(&self) -> Option<Nanos> {
        let cmds = self
            .window
            .iter()
            .filter(|c| c.state != State::Waiting)
            .map(|c| c.done_at);
        let head = self.head.map(|(_, t)| t);
        cmds.chain(head).chain(self.background_at).min()
    }

    /// Runs the disk up to `now` and returns the commands that finished (also those
    /// finished during earlier [`submit`](Self::submit) calls), in time order.
    pub fn advance(&mut self, now: Nanos) -> Vec<DiskEvent> {
        self.run_until(now);
        std::mem::take(&mut self.done)
    }

    fn run_until(&mut self, now: Nanos) {
        while let Some(t) = self.next_internal().filter(|&t| t <= now) {
            self.now = self.now.max(t);
            // Finish the head operation.
            if self.background_at.is_some_and(|b| b <= t) && self.head.is_some() {
                self.background_at = None;
            }
            if let Some((op, end)) = self.head {
                if end <= t {
                    self.head = None;
                    if let HeadOp::Destage { sectors } = op {
                        if let Some(extent) = self.dirty.pop_front() {
                            if let Some(n) = self.dirty_index.get_mut(&extent) {
                                *n -= 1;
                                if *n == 0 {
                                    self.dirty_index.remove(&extent);
                                }
                            }
                        }
                        self.dirty_bytes = self.dirty_bytes.saturating_sub(sectors * 512);
                    }
                }
            }
            // Report finished commands.
            let mut i = 0;
            while i < self.window.len() {
                let c = self.window[i];
                if c.state != State::Waiting && c.done_at <= t {
                    self.window.remove(i);
                    let ok = !(self.cfg.mod15_fault
                        && c.cmd.op == DiskOp::Write
                        && c.cmd.sectors > 1
                        && c.cmd.sectors % 15 == 1);
                    self.done.push(DiskEvent::Completed {
                        tag: c.tag,
                        at: c.done_at,
                        ok,
                    });
                } else {
                    i += 1;
                }
            }
            self.schedule(t);
        }
        self.now = self.now.max(now);
    }

    /// The window's ordering facts, computed once per scheduling pass.
    fn order_facts(&self) -> (u64, u64) {
        let first = self.window.iter().map(|c| c.seq).min().unwrap_or(0);
        let first_ordered = self
            .window
            .iter()
            .filter(|c| c.cmd.kind == TagKind::Ordered)
            .map(|c| c.seq)
            .min()
            .unwrap_or(u64::MAX);
        (first, first_ordered)
    }

    /// Whether `c` may start under the ordered and head-of-queue rules, given
    /// [`order_facts`](Self::order_facts).
    fn eligible(c: &Cmd, (first, first_ordered): (u64, u64)) -> bool {
        match c.cmd.kind {
            TagKind::HeadOfQueue => true,
            TagKind::Ordered => c.seq == first,
            TagKind::Simple => c.seq < first_ordered,
        }
    }

    fn bus_time(&self, sectors: u64) -> Nanos {
        sectors * 512 * 1_000_000_000 / self.cfg.bus_bytes_per_sec.max(1)
    }

    fn track(&self, lba: u64) -> u64 {
        lba / self.cfg.sectors_per_track.max(1)
    }

    fn seek(&self, to: u64) -> Nanos {
        let d = self.head_track.abs_diff(to);
        if d == 0 {
            return 0;
        }
        let frac = (d as f64 / self.tracks as f64).sqrt();
        self.cfg.seek_min + (self.cfg.seek_full as f64 * frac) as Nanos
    }

    fn rev(&self) -> Nanos {
        60_000_000_000 / u64::from(self.cfg.rpm.max(1))
    }

    /// Seek plus rotational wait to reach `lba` starting at `now`.
    fn positioning(&self, now: Nanos, lba: u64) -> Nanos {
        let seek = self.seek(self.track(lba));
        let rev = self.rev();
        let spt = self.cfg.sectors_per_track.max(1);
        let angle_at = (now + seek) % rev;
        let target = (lba % spt) * rev / spt;
        seek + (target + rev - angle_at) % rev
    }

    fn transfer(&self, sectors: u64) -> Nanos {
        sectors * self.rev() / self.cfg.sectors_per_track.max(1)
    }

    fn cache_bytes(&self) -> u64 {
        match self.cfg.cache {
            CacheMode::WriteThrough => 0,
            CacheMode::WriteBack { bytes } => bytes,
        }
    }

    fn read_hits_cache(&self, c: &DiskCommand) -> bool {
        let end = c.lba + c.sectors;
        // The extent starting closest below the read; extents a writer leaves do not
        // overlap, so that is the one that could hold it.
        self.dirty_index
            .range(..=(c.lba, u64::MAX))
            .next_back()
            .is_some_and(|(&(l, n), _)| end <= l + n)
    }

    /// Starts whatever can start at `now`.
    fn schedule(&mut self, now: Nanos) {
        if self.cfg.ssd.is_some() {
            self.schedule_ssd(now);
            return;
        }
        let cache = self.cache_bytes();
        let mut facts = self.order_facts();
        // Writes into the cache and reads served from it, in arrival order.
        let mut order: Vec<usize> = (0..self.window.len()).collect();
        order.sort_by_key(|&i| self.window[i].seq);
        for i in order {
            let c = self.window[i];
            if c.state != State::Waiting || !Self::eligible(&c, facts) {
                continue;
            }
            let bytes = c.cmd.sectors * 512;
            let fits = cache > 0 && bytes <= cache;
            let start = now.max(self.bus_free);
            let done = match c.cmd.op {
                DiskOp::Write if fits && self.dirty_bytes + bytes <= cache => {
                    self.dirty.push_back((c.cmd.lba, c.cmd.sectors));
                    *self
                        .dirty_index
                        .entry((c.cmd.lba, c.cmd.sectors))
                        .or_insert(0) += 1;
                    self.dirty_bytes += bytes;
                    Some(start + self.bus_time(c.cmd.sectors))
                }
                DiskOp::Read if self.read_hits_cache(&c.cmd) => {
                    Some(start + self.bus_time(c.cmd.sectors))
                }
                DiskOp::Flush if self.dirty_bytes == 0 && !self.head_busy_with_command() => {
                    Some(now)
                }
                _ => None,
            };
            if let Some(done) = done {
                self.bus_free = done;
                let w = &mut self.window[i];
                w.state = State::Bus;
                w.done_at = done;
            }
        }
        if self.head.is_some() {
            return;
        }
        facts = self.order_facts();
        // The head: a head-of-queue command goes next; then destage when a write waits for
        // space or a flush is pending; then the device's choice among host commands; then
        // background destage once the head has been idle for `destage_delay`.
        let candidates: Vec<usize> = (0..self.window.len())
            .filter(|&i| {
                let c = &self.window[i];
                c.state == State::Waiting
                    && Self::eligible(c, facts)
                    && match c.cmd.op {
                        DiskOp::Read => true,
                        DiskOp::Write => c.cmd.sectors * 512 > cache,
                        DiskOp::Flush => false,
                    }
            })
            .collect();
        let hoq = candidates
            .iter()
            .any(|&i| self.window[i].cmd.kind == TagKind::HeadOfQueue);
        let urgent = self.window.iter().any(|c| {
            c.state == State::Waiting
                && Self::eligible(c, facts)
                && match c.cmd.op {
                    DiskOp::Write => c.cmd.sectors * 512 <= cache,
                    DiskOp::Flush => true,
                    DiskOp::Read => false,
                }
        });
        // A command past the drive's aging limit goes before destage too.
        let aged = match self.cfg.order {
            DeviceOrder::Sptf { aging: Some(a) } => candidates
                .iter()
                .any(|&i| now.saturating_sub(self.window[i].arrival) >= a),
            _ => false,
        };
        if !hoq && !aged && urgent && self.start_destage(now) {
            return;
        }
        if let Some(i) = self.pick(now, &candidates) {
            self.background_at = None;
            let c = self.window[i];
            let end = now + self.positioning(now, c.cmd.lba) + self.transfer(c.cmd.sectors);
            let done = match c.cmd.op {
                DiskOp::Read => end.max(self.bus_free) + self.bus_time(c.cmd.sectors),
                _ => end,
            };
            self.head_track = self.track(c.cmd.lba + c.cmd.sectors.saturating_sub(1));
            self.head = Some((HeadOp::Command, end));
            let w = &mut self.window[i];
            w.state = State::Head;
            w.done_at = done;
            return;
        }
        if self.dirty.is_empty() {
            self.background_at = None;
            return;
        }
        match self.background_at {
            Some(t) if t <= now => {
                self.start_destage(now);
            }
            Some(_) => {}
            None if self.cfg.destage_delay == 0 => {
                self.start_destage(now);
            }
            None => self.background_at = Some(now + self.cfg.destage_delay),
        }
    }

    fn head_busy_with_command(&self) -> bool {
        matches!(self.head, Some((HeadOp::Command, _)))
    }

    fn start_destage(&mut self, now: Nanos) -> bool {
        let Some(&(lba, sectors)) = self.dirty.front() else {
            return false;
        };
        self.background_at = None;
        let end = now + self.positioning(now, lba) + self.transfer(sectors);
        self.head_track = self.track(lba + sectors.saturating_sub(1));
        self.head = Some((HeadOp::Destage { sectors }, end));
        true
    }

    /// The device's choice among startable commands.
    fn pick(&self, now: Nanos, candidates: &[usize]) -> Option<usize> {
        let hoq = candidates
            .iter()
            .copied()
            .filter(|&i| self.window[i].cmd.kind == TagKind::HeadOfQueue)
            .max_by_key(|&i| self.window[i].seq);
        if hoq.is_some() {
            return hoq;
        }
        let by_arrival = || {
            candidates
                .iter()
                .copied()
                .min_by_key(|&i| self.window[i].seq)
        };
        match self.cfg.order {
            DeviceOrder::Fifo => by_arrival(),
            DeviceOrder::Sptf { aging } => {
                let forced = aging.and_then(|a| {
                    candidates
                        .iter()
                        .copied()
                        .filter(|&i| now.saturating_sub(self.window[i].arrival) >= a)
                        .min_by_key(|&i| self.window[i].seq)
                });
                forced.or_else(|| {
                    candidates.iter().copied().min_by_key(|&i| {
                        (
                            self.positioning(now, self.window[i].cmd.lba),
                            self.window[i].seq,
                        )
                    })
                })
            }
            DeviceOrder::CLook => {
                let head_lba = self.head_track * self.cfg.sectors_per_track;
                let key = |i: usize| {
                    let lba = self.window[i].cmd.lba;
                    (lba < head_lba, lba, self.window[i].seq)
                };
                candidates.iter().copied().min_by_key(|&i| key(i))
            }
        }
    }

    /// SSD: commands go to their dies at once; a die serves its work in arrival order, and
    /// a read suspends a program in progress.
    fn schedule_ssd(&mut self, now: Nanos) {
        let Some(ssd) = self.cfg.ssd else { return };
        let facts = self.order_facts();
        let mut order: Vec<usize> = (0..self.window.len()).collect();
        order.sort_by_key(|&i| self.window[i].seq);
        for i in order {
            let c = self.window[i];
            if c.state != State::Waiting || !Self::eligible(&c, facts) {
                continue;
            }
            let first = c.cmd.lba / ssd.page_sectors;
            let pages = c.cmd.sectors.div_ceil(ssd.page_sectors).max(1);
            let mut done = now;
            if c.cmd.op == DiskOp::Flush {
                done = self.dies_free.iter().copied().max().unwrap_or(now).max(now);
            }
            for p in 0..pages {
                if c.cmd.op == DiskOp::Flush {
                    break;
                }
                let die = ((first + p) % u64::from(ssd.dies)) as usize;
                let Some(free) = self.dies_free.get(die).copied() else {
                    continue;
                };
                let end = match c.cmd.op {
                    DiskOp::Read => {
                        // Program suspend: wait at most suspend_ns, and push the program out.
                        let start = if free > now {
                            now + ssd.suspend_ns.min(free - now)
                        } else {
                            now
                        };
                        let end = start + ssd.read_ns;
                        if free > now {
                            self.dies_free[die] = free + ssd.read_ns + ssd.suspend_ns;
                        } else {
                            self.dies_free[die] = end;
                        }
                        end
                    }
                    _ => {
                        let end = free.max(now) + ssd.program_ns;
                        self.dies_free[die] = end;
                        end
                    }
                };
                done = done.max(end);
            }
            let done = done + self.bus_time(c.cmd.sectors);
            let w = &mut self.window[i];
            w.state = State::Head;
            w.done_at = done;
        }
    }
}
