//! md's raid5, raid6 and raid10 served from their members: reads from the data, degraded
//! reads rebuilt from parity (XOR for P; raid6's Q over GF(2^8), two failures), writes by
//! read-modify-write or reconstruct-write (whichever reads less), full-stripe writes with no
//! read at all, a write-through stripe cache (a sequential writer's second and later chunks
//! of a stripe read nothing), raid10's copies, and a member rebuilt in place.
//!
//! The layouts are `tagstripe_striping::md`'s, exact with md's, so the member images of an
//! md array (from its data offset on) are read and written as md would.
//!
//! The write hole (a crash between a stripe's data and parity writes leaves parity that
//! disagrees, and a later degraded read would rebuild wrong bytes) is closed as md closes it
//! without a bitmap: an array assembled from md members is marked dirty on every member
//! before its first write and clean at a clean stop, and a dirty array is resynced
//! ([`Raid::resync_parity`]) before it serves. An array built by hand ([`Raid::parity`])
//! has no superblocks: call `resync_parity` after a crash.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tagstripe_scheduler::IoClass;
use tagstripe_striping::md::{
    FEATURE_RECOVERY_OFFSET, MdGeometry, Parity, ParityPiece, ROLE_FAULTY, Raid10, StripeMap,
    Superblock1, gf,
};

use crate::{BlockDevice, Caps, DeviceInfo, DynBlockDevice, Error, IoOpts, Result};

/// Stripe lock shards: writes to one stripe, and degraded reads of it, are serialized.
const SHARDS: usize = 64;

/// An md raid5, raid6 or raid10 array over its members; itself a [`BlockDevice`].
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use tagstripe::striping::md::{Parity, ParityLayout};
/// use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MemDevice, Raid};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let members: Vec<Arc<dyn DynBlockDevice>> =
///     (0..4).map(|i| Arc::new(MemDevice::new(&format!("m{i}"), 2048)) as _).collect();
/// let geo = Parity::new(5, ParityLayout::LeftSymmetric, 4, 128, 2048)?;
/// let a = Raid::parity("md0", geo, members.clone())?;
/// a.write(0, Bytes::from(vec![7u8; 192 << 10]), IoOpts::new()).await?; // one full stripe
/// a.fail(1); // a member dies: its chunks are rebuilt from the others and P
/// assert_eq!(a.read(0, 384, IoOpts::new()).await?, vec![7u8; 192 << 10]);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Raid {
    info: DeviceInfo,
    geo: MdGeometry,
    members: Vec<parking_lot::RwLock<Arc<dyn DynBlockDevice>>>,
    failed: Vec<AtomicBool>,
    locks: Vec<tokio::sync::Mutex<()>>,
    /// Each member's data offset.
    offsets: Vec<u64>,
    /// An array assembled from md superblocks keeps them as md does.
    md: Option<MdState>,
    /// Recently written stripes' whole chunk rows (data members), written through.
    cache: parking_lot::Mutex<std::collections::VecDeque<(u64, Row)>>,
    /// A rebuild under way or paused: the member, sectors done, sectors in all. Writes
    /// below the sectors done reach the member either way.
    rebuilding: parking_lot::Mutex<Option<(usize, u64, u64)>>,
    /// The rebuild is paused (its future was dropped, or the array was assembled with a
    /// member partly rebuilt): [`Raid::resume_rebuild`] takes it up.
    paused: AtomicBool,
    /// Members sit behind tagged queues (a rebuilt member's device is put behind one too).
    queued: Option<tagstripe_scheduler::FairConfig>,
    /// Where member events go.
    events: Option<crate::layers::mirror::resync::EventSink>,
}

/// Stripes the write-through cache keeps.
const CACHED_STRIPES: usize = 32;

/// The superblocks of an array assembled from md members, kept as md keeps them: marked
/// dirty (`resync_offset` 0) before the first write, clean again at a clean stop, a failed
/// member recorded as faulty before any write that failed it is acknowledged.
#[derive(Debug)]
struct MdState {
    /// Each role's superblock (`None`: no device holds the role).
    sbs: tokio::sync::Mutex<Vec<Option<Superblock1>>>,
    /// What the superblocks on the members say: dirty.
    dirty: AtomicBool,
    /// The failed members the superblocks record.
    recorded: parking_lot::Mutex<Vec<usize>>,
}

/// The buffers of one stripe row range, per member (`None`: not read, or failed).
type Row = Vec<Option<Vec<u8>>>;

impl Raid {
    /// A raid5 or raid6 array with `geometry` over `members` (member sector 0 is md's data
    /// offset).
    ///
    /// # Errors
    /// [`Error::BadLength`] for a member count other than the geometry's, or a member too
    /// small for it, or a chunk that is not whole logical blocks of the members.
    pub fn parity(
        name: &str,
        geometry: Parity,
        members: Vec<Arc<dyn DynBlockDevice>>,
    ) -> Result<Self> {
        Self::new(name, MdGeometry::Parity(geometry), members)
    }

    /// A raid10 array with `geometry` over `members`.
    ///
    /// # Errors
    /// As [`Raid::parity`].
    pub fn raid10(
        name: &str,
        geometry: Raid10,
        members: Vec<Arc<dyn DynBlockDevice>>,
    ) -> Result<Self> {
        Self::new(name, MdGeometry::Raid10(geometry), members)
    }

    /// An md array of either kind (`geo`) over `members`: [`Raid::parity`] or
    /// [`Raid::raid10`].
    ///
    /// # Errors
    /// As [`Raid::parity`].
    pub fn new(name: &str, geo: MdGeometry, members: Vec<Arc<dyn DynBlockDevice>>) -> Result<Self> {
        let (disks, need, total, chunk) = (
            geo.disks(),
            geo.member_sectors(),
            geo.total_sectors(),
            geo.chunk(),
        );
        let io_opt = geo.io_opt();
        let bad = |what: String| Error::BadLength {
            device: name.to_owned(),
            what,
        };
        if members.len() != disks {
            return Err(bad(format!(
                "{} members given, the array has {disks}",
                members.len()
            )));
        }
        let mut lbs = 512;
        for (i, m) in members.iter().enumerate() {
            let mi = m.info();
            if mi.sectors < need {
                return Err(bad(format!(
                    "member {i} ({}) has {} sectors, the array needs {need}",
                    mi.name, mi.sectors
                )));
            }
            lbs = lbs.max(mi.limits.logical_block_size);
        }
        if (chunk * 512) % u64::from(lbs) != 0 {
            return Err(bad(format!(
                "a chunk of {chunk} sectors is not whole {lbs}-byte blocks"
            )));
        }
        let mut info = DeviceInfo::new(name, total);
        info.limits.logical_block_size = lbs;
        info.limits.physical_block_size = lbs;
        info.limits.io_opt = u32::try_from(io_opt).unwrap_or(0);
        info.read_only = members.iter().any(|m| m.info().read_only);
        let mut caps = Caps::stack(members.iter().map(|m| m.caps()));
        // Discards and fast zeroing would have to keep parity: not offered.
        caps.trim = false;
        caps.fast_zero = false;
        caps.zeroing = crate::Zeroing::Emulated;
        caps.allocation = false;
        info.caps = caps;
        info.set_discard(false);
        Ok(Self {
            info,
            geo,
            failed: members.iter().map(|_| AtomicBool::new(false)).collect(),
            members: members.into_iter().map(parking_lot::RwLock::new).collect(),
            locks: (0..SHARDS).map(|_| tokio::sync::Mutex::new(())).collect(),
            offsets: vec![0; disks],
            md: None,
            cache: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            rebuilding: parking_lot::Mutex::new(None),
            paused: AtomicBool::new(false),
            queued: None,
            events: None,
        })
    }

    /// Assembles an md array from its members' version-1 superblocks (1.2, 1.1 or 1.0), as
    /// `mdadm --assemble` would, with no md driver: the level, layout, chunk, size, each
    /// member's role and data offset from the superblocks, `devices` in any order. A member
    /// the newest superblock records as faulty is stale and not read, as md kicks it; a
    /// role no device holds is missing. Both are served degraded while the array's
    /// redundancy allows. An array not stopped cleanly is resynced before it serves (its
    /// parity recomputed, as md does without a bitmap), or refused if it is also degraded.
    ///
    /// # Errors
    /// [`Error::Component`] naming a device whose superblock cannot be read or belongs to
    /// another array; [`Error::Geometry`] for a level or layout not laid out here;
    /// [`Error::Resync`] when more members are missing or stale than the redundancy.
    pub async fn assemble_md(name: &str, devices: Vec<Arc<dyn DynBlockDevice>>) -> Result<Self> {
        let mut found = Vec::with_capacity(devices.len());
        for (i, d) in devices.iter().enumerate() {
            let sb = read_md_superblock(d.as_ref())
                .await
                .map_err(|e| Error::Component {
                    component: i,
                    volume_sector: None,
                    source: Box::new(e),
                })?;
            found.push(sb);
        }
        let Some(newest) = found.iter().max_by_key(|s| s.events).cloned() else {
            return Err(Error::BadLength {
                device: name.to_owned(),
                what: "no members given".to_owned(),
            });
        };
        for (i, sb) in found.iter().enumerate() {
            let same = sb.set_uuid == newest.set_uuid
                && (sb.level, sb.layout, sb.chunk, sb.raid_disks)
                    == (newest.level, newest.layout, newest.chunk, newest.raid_disks);
            if !same {
                return Err(Error::Component {
                    component: i,
                    volume_sector: None,
                    source: Box::new(Error::Geometry(tagstripe_striping::Error::MdSuperblock {
                        what: format!(
                            "{} belongs to another array (uuid or geometry differs from {})",
                            devices[i].info().name,
                            devices[found
                                .iter()
                                .position(|s| s.events == newest.events)
                                .unwrap_or(0)]
                            .info()
                            .name
                        ),
                    })),
                });
            }
        }
        let geometry = newest.geometry()?;
        let disks = newest.raid_disks as usize;
        let need = geometry.member_sectors();
        let mut members: Vec<Option<(usize, u64)>> = vec![None; disks];
        let mut stale = Vec::new();
        for (i, sb) in found.iter().enumerate() {
            let Some(role) = sb.role().filter(|&r| r < disks) else {
                continue;
            };
            // Stale is what the newest superblock says: a member md failed is recorded
            // faulty there (its own superblock still claims the role). A member merely
            // behind on events, still in its role there, missed only a superblock update
            // cut short (all of them are written before any data): it is current.
            if newest.role_of(sb.dev_number as usize) != Some(role) {
                stale.push(role);
                continue;
            }
            if sb.events < newest.events {
                tracing::info!(target: "tagstripe::raid", array = name, member = role, events = sb.events, newest = newest.events, "superblock behind the newest, still in its role: included");
            }
            if members[role].is_some_and(|(j, _)| found[j].events >= sb.events) {
                continue;
            }
            members[role] = Some((i, sb.data_offset));
        }
        // A member md (or tagstripe) was rebuilding when the array stopped: in its role,
        // current below its recovery offset only.
        let recovering: Vec<(usize, u64)> = members
            .iter()
            .enumerate()
            .filter_map(|(role, m)| {
                let (i, _) = (*m)?;
                found[i]
                    .recovering()
                    .filter(|&at| at < need)
                    .map(|at| (role, at))
            })
            .collect();
        let mut failed = Vec::new();
        let mut devs = Vec::with_capacity(disks);
        let mut offsets = Vec::with_capacity(disks);
        for (role, m) in members.iter().enumerate() {
            match m {
                Some((i, off)) => {
                    devs.push(Arc::clone(&devices[*i]));
                    offsets.push(*off);
                }
                None => {
                    failed.push(role);
                    devs.push(Arc::new(Missing::new(role, need)) as Arc<dyn DynBlockDevice>);
                    offsets.push(0);
                }
            }
        }
        let raid = Self::new(name, geometry, devs)?.with_data_offsets(offsets)?;
        if failed.len() > raid.redundancy() {
            return Err(Error::Resync {
                component: failed[0],
                what: format!(
                    "members {failed:?} are missing or stale ({stale:?} stale): more than the array's redundancy ({})",
                    raid.redundancy()
                ),
            });
        }
        let mut raid = raid;
        for &(role, at) in &recovering {
            raid.fail_for(
                role,
                &format!(
                    "partly rebuilt (up to member sector {at} of {need}): the rebuild resumes there"
                ),
            );
            *raid.rebuilding.lock() = Some((role, at, need));
            raid.paused.store(true, Ordering::Release);
            failed.push(role);
        }
        if failed.len() > raid.redundancy() {
            return Err(Error::Resync {
                component: failed[0],
                what: format!(
                    "members {failed:?} are missing, stale or partly rebuilt: more than the array's redundancy ({})",
                    raid.redundancy()
                ),
            });
        }
        for &f in failed
            .iter()
            .filter(|f| !recovering.iter().any(|r| r.0 == **f))
        {
            raid.fail_for(
                f,
                if stale.contains(&f) {
                    "stale: the newest superblock records it faulty"
                } else {
                    "missing: no device holds its role"
                },
            );
        }
        let mut sbs: Vec<Option<Superblock1>> = vec![None; disks];
        for (role, m) in members.iter().enumerate() {
            if let Some((i, _)) = m {
                sbs[role] = Some(found[*i].clone());
            }
        }
        raid.md = Some(MdState {
            sbs: tokio::sync::Mutex::new(sbs),
            dirty: AtomicBool::new(!newest.clean()),
            recorded: parking_lot::Mutex::new(failed.clone()),
        });
        if !newest.clean() {
            if !failed.is_empty() {
                if !raid.info.read_only {
                    return Err(Error::Resync {
                        component: failed[0],
                        what: format!(
                            "the array was not stopped cleanly and members {failed:?} are missing or stale: \
                             its parity cannot be trusted to rebuild them (md refuses to start a dirty \
                             degraded array); open it read-only, or bring the members back"
                        ),
                    });
                }
                tracing::warn!(target: "tagstripe::raid", array = name, "dirty and degraded: served read-only, parity unchecked");
            } else if !raid.info.read_only {
                tracing::warn!(target: "tagstripe::raid", array = name, "not stopped cleanly: resyncing parity before serving");
                raid.resync_parity().await?;
                raid.md_record(false).await?;
            }
        }
        Ok(raid)
    }

    /// Writes every member's superblock: `dirty` or clean, the failed members faulty, the
    /// event count one up. A member that cannot take it is failed (recorded on the others
    /// in the same pass).
    async fn md_record(&self, dirty: bool) -> Result<()> {
        let Some(md) = &self.md else { return Ok(()) };
        let mut sbs = md.sbs.lock().await;
        loop {
            let failed = self.recorded_failed();
            let rebuilding = *self.rebuilding.lock();
            let events = sbs.iter().flatten().map(|s| s.events).max().unwrap_or(0) + 1;
            let mut writes = Vec::new();
            for (role, sb) in sbs.iter_mut().enumerate() {
                let Some(sb) = sb else { continue };
                sb.events = events;
                sb.resync_offset = if dirty { 0 } else { u64::MAX };
                match rebuilding {
                    Some((r, done, _)) if r == role => {
                        sb.feature_map |= FEATURE_RECOVERY_OFFSET;
                        sb.recovery_offset = done;
                    }
                    _ => {
                        sb.feature_map &= !FEATURE_RECOVERY_OFFSET;
                        sb.recovery_offset = 0;
                    }
                }
                for dev in 0..sb.dev_roles.len() {
                    if sb.role_of(dev).is_some_and(|r| failed.contains(&r)) {
                        sb.dev_roles[dev] = ROLE_FAULTY;
                    }
                }
                if !failed.contains(&role) {
                    writes.push((role, sb.super_offset, Bytes::from(sb.encode())));
                }
            }
            let issued = writes.into_iter().map(|(role, at, b)| async move {
                let r = self
                    .member(role)
                    .write(at, b, IoOpts::new().fua(true))
                    .await;
                (role, r)
            });
            let mut again = false;
            for (role, r) in futures_util::future::join_all(issued).await {
                if let Err(e) = r {
                    self.member_error(role, e)?;
                    again = true;
                }
            }
            if !again {
                *md.recorded.lock() = failed;
                md.dirty.store(dirty, Ordering::Release);
                return Ok(());
            }
        }
    }

    /// The failed members the superblocks record: the failed ones, less a member being
    /// rebuilt (in its role, with its recovery offset).
    fn recorded_failed(&self) -> Vec<usize> {
        let rebuilding = self.rebuilding.lock().map(|(r, ..)| r);
        self.failed()
            .into_iter()
            .filter(|&f| Some(f) != rebuilding)
            .collect()
    }

    /// Writes member `role`'s own superblock with how far its rebuild has come (md's
    /// recovery checkpoint), so that the next assembly takes the rebuild up there.
    async fn md_checkpoint(&self, role: usize, done: u64) -> Result<()> {
        let Some(md) = &self.md else { return Ok(()) };
        let mut sbs = md.sbs.lock().await;
        let Some(sb) = sbs.get_mut(role).and_then(Option::as_mut) else {
            return Ok(());
        };
        sb.feature_map |= FEATURE_RECOVERY_OFFSET;
        sb.recovery_offset = done;
        let (at, b) = (sb.super_offset, Bytes::from(sb.encode()));
        drop(sbs);
        self.member(role)
            .write(at, b, IoOpts::new().fua(true))
            .await
    }

    /// An md array's rebuilt member `role` gets a superblock of its own (a new device
    /// number, the role's data offset, version 1.2 at sector 8), and every member records
    /// it.
    async fn md_adopt(&self, role: usize) -> Result<()> {
        let Some(md) = &self.md else { return Ok(()) };
        {
            let mut sbs = md.sbs.lock().await;
            let Some(template) = sbs.iter().flatten().next().cloned() else {
                return Ok(());
            };
            let dev_number = template.dev_roles.len();
            let role16 = u16::try_from(role).unwrap_or(u16::MAX);
            for sb in sbs.iter_mut().flatten() {
                sb.dev_roles.push(role16);
            }
            let mut sb = template;
            sb.dev_roles.push(role16);
            sb.dev_number = u32::try_from(dev_number).unwrap_or(u32::MAX);
            sb.data_offset = self.offsets[role];
            // Version 1.2's place (sector 8) when the data starts past it, else 1.0's at
            // the end; neither may overlap the data.
            let end = self.member(role).info().sectors.saturating_sub(16) & !7;
            sb.super_offset = if sb.data_offset >= 16 {
                8
            } else if end >= sb.data_offset + self.member_sectors() {
                end
            } else {
                tracing::warn!(target: "tagstripe::raid", array = %self.info.name, role, "no room for a superblock on the rebuilt member: it is not recorded");
                return Ok(());
            };
            sbs[role] = Some(sb);
        }
        // Recorded in its role, with its recovery offset while the rebuild goes.
        let dirty = md.dirty.load(Ordering::Acquire);
        self.md_record(dirty).await
    }

    /// Before a write: an md array is marked dirty on its members first (once).
    async fn md_before_write(&self) -> Result<()> {
        match &self.md {
            Some(md) if !md.dirty.load(Ordering::Acquire) => self.md_record(true).await,
            _ => Ok(()),
        }
    }

    /// After a write, before it is acknowledged: a member it failed is recorded as faulty.
    async fn md_after_write(&self) -> Result<()> {
        match &self.md {
            Some(md) if *md.recorded.lock() != self.recorded_failed() => self.md_record(true).await,
            _ => Ok(()),
        }
    }

    /// A clean stop: flushes the members and, for an array assembled from md members,
    /// marks them clean, so the next assembly owes no resync. Call it when no more writes
    /// come.
    ///
    /// # Errors
    /// The flush's, or a superblock write's.
    pub async fn close(&self) -> Result<()> {
        if self.info.read_only {
            return Ok(());
        }
        self.flush(IoOpts::new()).await?;
        let rebuilding = *self.rebuilding.lock();
        match (&self.md, rebuilding) {
            (Some(md), _) if md.dirty.load(Ordering::Acquire) => self.md_record(false).await,
            // A rebuild under way or paused: how far it came, for the next assembly.
            (Some(_), Some((role, done, _))) => self.md_checkpoint(role, done).await,
            _ => Ok(()),
        }
    }

    /// How many members may fail with the data still whole (raid5 1, raid6 2, raid10 its
    /// copies less one, at best).
    fn redundancy(&self) -> usize {
        self.geo.redundancy()
    }

    /// Calls `f` for each event of the array's members, as they happen (the mirror's
    /// [`crate::MirrorEvent`]s, for the array's members: `Dropped` for a member failed,
    /// `Stale` for one found behind at assembly, `Resync*` for a rebuild, a member at a
    /// time, and for a parity resync, every member). The same events go to `tracing` under
    /// `tagstripe::raid`.
    #[must_use]
    pub fn on_event(mut self, f: impl Fn(&crate::MirrorEvent) + Send + Sync + 'static) -> Self {
        self.events = Some(crate::layers::mirror::resync::EventSink(Arc::new(f)));
        self
    }

    fn emit(&self, e: &crate::MirrorEvent) {
        if let Some(sink) = &self.events {
            (sink.0)(e);
        }
    }

    /// Marks `member` failed: never read again, no longer written, until rebuilt.
    pub fn fail(&self, member: usize) {
        self.fail_for(member, "marked failed");
    }

    fn fail_for(&self, member: usize, why: &str) {
        if let Some(f) = self.failed.get(member) {
            if !f.swap(true, Ordering::AcqRel) {
                tracing::warn!(target: "tagstripe::raid", array = %self.info.name, member, why, "member failed: served degraded");
                self.emit(&crate::MirrorEvent::Dropped {
                    component: member,
                    error: why.to_owned(),
                });
            }
        }
    }

    /// The failed members, ascending.
    #[must_use]
    pub fn failed(&self) -> Vec<usize> {
        (0..self.failed.len())
            .filter(|&i| self.is_failed(i))
            .collect()
    }

    /// Whether member `i` holds current data up to member sector `end`: not failed, or
    /// being rebuilt and rebuilt past `end` already (md's recovery offset).
    fn usable(&self, i: usize, end: u64) -> bool {
        !self.is_failed(i)
            || matches!(*self.rebuilding.lock(), Some((r, done, _)) if r == i && end <= done)
    }

    fn is_failed(&self, i: usize) -> bool {
        self.failed[i].load(Ordering::Acquire)
    }

    fn member(&self, i: usize) -> Arc<dyn DynBlockDevice> {
        Arc::clone(&self.members[i].read())
    }

    /// Reads member `i`'s sectors `[at, at + n)` counted from its data offset.
    async fn mread(&self, i: usize, at: u64, n: u64, opts: IoOpts) -> Result<Bytes> {
        self.member(i).read(self.offsets[i] + at, n, opts).await
    }

    /// As [`mread`](Self::mread), into `buf`.
    async fn mread_into(&self, i: usize, at: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        self.member(i)
            .read_into(self.offsets[i] + at, buf, opts)
            .await
    }

    /// Writes member `i` at sector `at` counted from its data offset.
    async fn mwrite(&self, i: usize, at: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        self.member(i).write(self.offsets[i] + at, data, opts).await
    }

    /// Each member's data offset (md's `data_offset`: where member sector 0 of the layout
    /// is on the device); all 0 unless set. Members whose offsets differ are md's normal
    /// case (each member's superblock records its own).
    ///
    /// # Errors
    /// [`Error::BadLength`] for a count other than the members', or a member too small
    /// for the array past its offset.
    pub fn with_data_offsets(mut self, offsets: Vec<u64>) -> Result<Self> {
        let need = self.member_sectors();
        if offsets.len() != self.members.len() {
            return Err(Error::BadLength {
                device: self.info.name.clone(),
                what: format!(
                    "{} data offsets for {} members",
                    offsets.len(),
                    self.members.len()
                ),
            });
        }
        for (i, &o) in offsets.iter().enumerate() {
            let have = self.member(i).info().sectors;
            if have < o.saturating_add(need) {
                return Err(Error::BadLength {
                    device: self.info.name.clone(),
                    what: format!(
                        "member {i} has {have} sectors, the array needs {need} after its data offset {o}"
                    ),
                });
            }
        }
        self.offsets = offsets;
        Ok(self)
    }

    /// Puts each member behind a CAM-like tagged queue with the I/O classes' fairness, as
    /// a [`crate::Volume`] does (members on one physical device share one queue), so a
    /// rebuild or resync in the idle class gives way to clients' requests at the devices.
    #[must_use]
    pub fn with_queues(self, fair: tagstripe_scheduler::FairConfig) -> Self {
        let devs: Vec<Arc<dyn DynBlockDevice>> =
            (0..self.members.len()).map(|i| self.member(i)).collect();
        let queues = super::queues_for(&devs, true, fair);
        for (slot, q) in self.members.iter().zip(queues) {
            if let Some(q) = q {
                *slot.write() = Arc::new(q);
            }
        }
        Self {
            queued: Some(fair),
            ..self
        }
    }

    /// A rebuild under way: `(member, sectors done, sectors in all)`.
    #[must_use]
    pub fn rebuild_progress(&self) -> Option<(usize, u64, u64)> {
        *self.rebuilding.lock()
    }

    /// The sectors of each member the layout uses (past the data offset).
    #[must_use]
    pub fn member_sectors(&self) -> u64 {
        self.geo.member_sectors()
    }

    /// A member's I/O failed: it is failed, if the array can spare it; the error is then
    /// absorbed (the caller goes on degraded), else returned.
    fn member_error(&self, i: usize, e: Error) -> Result<()> {
        if e.is_retryable() {
            return Err(e);
        }
        let others = self.failed().iter().filter(|&&f| f != i).count();
        if others >= self.redundancy() {
            return Err(Error::Component {
                component: i,
                volume_sector: None,
                source: Box::new(e),
            });
        }
        tracing::warn!(target: "tagstripe::raid", array = %self.info.name, member = i, error = %e, "member I/O failed");
        self.fail_for(i, &e.to_string());
        Ok(())
    }

    /// The lock of `stripe`'s shard, held while the stripe's data and parity change (see
    /// [`at_once`]).
    async fn stripe_lock(&self, stripe: u64) -> tokio::sync::MutexGuard<'_, ()> {
        at_once(&self.locks[(stripe % SHARDS as u64) as usize]).await
    }

    fn too_degraded(&self) -> Error {
        Error::Resync {
            component: self.failed().first().copied().unwrap_or(0),
            what: format!(
                "members {:?} have failed: more than the array's redundancy ({})",
                self.failed(),
                self.redundancy()
            ),
        }
    }

    /// Reads `[at, at + len)` sectors of every member of a parity stripe that has not
    /// failed; a member whose read fails is failed and left out.
    async fn read_row(&self, s: &StripeMap, at: u64, len: u64, opts: IoOpts) -> Result<Row> {
        let n = s.data.len() + 1 + usize::from(s.q.is_some());
        let reads = (0..n).map(|m| async move {
            if self.is_failed(m) {
                return (m, None);
            }
            (m, Some(self.mread(m, at, len, opts).await))
        });
        let mut row: Row = vec![None; n];
        for (m, r) in futures_util::future::join_all(reads).await {
            match r {
                Some(Ok(b)) => row[m] = Some(b.to_vec()),
                Some(Err(e)) => self.member_error(m, e)?,
                None => {}
            }
        }
        Ok(row)
    }

    /// Fills every missing data chunk of `row` from the survivors and P (and Q), in place.
    fn recover_data(&self, s: &StripeMap, row: &mut Row) -> Result<()> {
        let order = s.syndrome_order();
        let missing: Vec<usize> = s
            .data
            .iter()
            .copied()
            .filter(|&m| row[m].is_none())
            .collect();
        match missing.as_slice() {
            [] => Ok(()),
            [x] if row[s.p].is_some() => {
                let mut d = row[s.p].clone().unwrap_or_default();
                for &m in &s.data {
                    if m != *x {
                        if let Some(b) = &row[m] {
                            gf::mul_acc(&mut d, 1, b);
                        }
                    }
                }
                row[*x] = Some(d);
                Ok(())
            }
            [x] => {
                // P is gone too: Q alone gives it back.
                let q =
                    s.q.and_then(|q| row[q].clone())
                        .ok_or_else(|| self.too_degraded())?;
                let mut d = q;
                let mut cx = 0;
                for (c, &m) in order.iter().enumerate() {
                    if m == *x {
                        cx = c;
                    } else if let Some(b) = &row[m] {
                        gf::mul_acc(&mut d, gf::pow2(c), b);
                    }
                }
                gf::scale(&mut d, gf::inv(gf::pow2(cx)));
                row[*x] = Some(d);
                Ok(())
            }
            [x, y] => {
                let (Some(p), Some(q)) = (row[s.p].clone(), s.q.and_then(|q| row[q].clone()))
                else {
                    return Err(self.too_degraded());
                };
                // Pxy = P + the survivors, Qxy = Q + theirs: Dx + Dy = Pxy and
                // g^cx Dx + g^cy Dy = Qxy.
                let (mut pxy, mut qxy) = (p, q);
                let (mut cx, mut cy) = (0, 0);
                for (c, &m) in order.iter().enumerate() {
                    if m == *x {
                        cx = c;
                    } else if m == *y {
                        cy = c;
                    } else if let Some(b) = &row[m] {
                        gf::mul_acc(&mut pxy, 1, b);
                        gf::mul_acc(&mut qxy, gf::pow2(c), b);
                    }
                }
                let (gx, gy) = (gf::pow2(cx), gf::pow2(cy));
                // Dx = (Qxy + g^cy Pxy) / (g^cx + g^cy).
                let mut dx = qxy;
                gf::mul_acc(&mut dx, gy, &pxy);
                gf::scale(&mut dx, gf::inv(gx ^ gy));
                let mut dy = pxy;
                gf::mul_acc(&mut dy, 1, &dx);
                row[*x] = Some(dx);
                row[*y] = Some(dy);
                Ok(())
            }
            _ => Err(self.too_degraded()),
        }
    }

    /// P and Q from each data member's bytes (`sources[m]`, all `len` long).
    fn parity_from(
        s: &StripeMap,
        sources: &[Option<&[u8]>],
        len: usize,
    ) -> (Vec<u8>, Option<Vec<u8>>) {
        if s.q.is_none() {
            let data: Vec<&[u8]> = s.data.iter().filter_map(|&m| sources[m]).collect();
            return (gf::xor_sum_new(&data, len), None);
        }
        // raid6: P and Q in one pass, the data in syndrome order.
        let order: Vec<Option<&[u8]>> = s.syndrome_order().iter().map(|&m| sources[m]).collect();
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        gf::gen_syndrome(&order, &mut p, &mut q);
        (p, Some(q))
    }

    /// P and Q of a row whose data chunks are all present.
    fn parity_of(s: &StripeMap, row: &Row, len: usize) -> (Vec<u8>, Option<Vec<u8>>) {
        let sources: Vec<Option<&[u8]>> = row.iter().map(Option::as_deref).collect();
        Self::parity_from(s, &sources, len)
    }

    /// One parity piece read, degraded if its member has failed or fails now.
    async fn read_parity_piece(&self, p: ParityPiece, out: &mut [u8], opts: IoOpts) -> Result<()> {
        if !self.is_failed(p.comp) {
            match self.mread_into(p.comp, p.cblk, out, opts).await {
                Ok(()) => return Ok(()),
                Err(e) => self.member_error(p.comp, e)?,
            }
        }
        let MdGeometry::Parity(g) = &self.geo else {
            unreachable!("parity pieces come from a parity geometry")
        };
        let s = g.stripe(p.stripe);
        let _stripe = self.stripe_lock(p.stripe).await;
        let mut row = self.read_row(&s, p.cblk, p.count, opts).await?;
        self.recover_data(&s, &mut row)?;
        let d = row[p.comp].take().ok_or_else(|| self.too_degraded())?;
        out.copy_from_slice(&d);
        Ok(())
    }

    /// Takes stripe `stripe`'s cached rows, if kept (the caller holds its lock).
    fn cache_take(&self, stripe: u64) -> Option<Row> {
        let mut c = self.cache.lock();
        let i = c.iter().position(|(s, _)| *s == stripe)?;
        c.remove(i).map(|(_, r)| r)
    }

    /// Keeps stripe `stripe`'s rows, the oldest let go past the cache's size.
    fn cache_put(&self, stripe: u64, row: Row) {
        let mut c = self.cache.lock();
        c.push_back((stripe, row));
        while c.len() > CACHED_STRIPES {
            c.pop_front();
        }
    }

    /// Writes the new data `pieces` (all in stripe `stripe`) and the stripe's parity.
    async fn write_stripe(
        &self,
        g: &Parity,
        stripe: u64,
        pieces: &[(ParityPiece, Bytes)],
        opts: IoOpts,
    ) -> Result<()> {
        let s = g.stripe(stripe);
        let lo = pieces.iter().map(|(p, _)| p.cblk).min().unwrap_or(0);
        let hi = pieces
            .iter()
            .map(|(p, _)| p.cblk + p.count)
            .max()
            .unwrap_or(0);
        let len = ((hi - lo) * 512) as usize;
        let _stripe = self.stripe_lock(stripe).await;
        let n = s.data.len() + 1 + usize::from(s.q.is_some());
        let degraded = (0..n).any(|m| !self.usable(m, hi));
        let covered = |m: usize| {
            pieces
                .iter()
                .filter(|(p, _)| p.comp == m)
                .map(|(p, _)| p.count)
                .sum::<u64>()
        };
        // Reads each way: read-modify-write reads what it overwrites and the parity;
        // reconstruct-write reads every data chunk it does not wholly overwrite.
        let rmw: u64 = pieces.iter().map(|(p, _)| p.count).sum::<u64>()
            + (hi - lo) * (1 + u64::from(s.q.is_some()));
        let rcw: u64 = s
            .data
            .iter()
            .filter(|&&m| covered(m) < hi - lo)
            .map(|_| hi - lo)
            .sum();
        let row_start = stripe * g.chunk();
        let full_row = lo == row_start && hi == row_start + g.chunk();
        let cached = if degraded {
            self.cache.lock().clear();
            None
        } else {
            self.cache_take(stripe)
        };
        let (p_new, q_new, data): (Vec<u8>, Option<Vec<u8>>, Option<Row>) =
            if let Some(mut entry) = cached {
                // The stripe's data is in the cache (written through a moment ago): nothing
                // to read, the parity from memory.
                for (p, new) in pieces {
                    let at = ((p.cblk - row_start) * 512) as usize;
                    if let Some(b) = &mut entry[p.comp] {
                        b[at..at + new.len()].copy_from_slice(new);
                    }
                }
                let (a, b) = (
                    ((lo - row_start) * 512) as usize,
                    ((hi - row_start) * 512) as usize,
                );
                let sources: Vec<Option<&[u8]>> = entry
                    .iter()
                    .map(|e| e.as_deref().map(|x| &x[a..b]))
                    .collect();
                let (pb, qb) = Self::parity_from(&s, &sources, len);
                (pb, qb, Some(entry))
            } else if !degraded && rmw < rcw {
                // Read-modify-write: P' = P + old + new, Q' = Q + g^c (old + new).
                let reads = pieces.iter().map(|(p, _)| async move {
                    (p.comp, self.mread(p.comp, p.cblk, p.count, opts).await)
                });
                let parity_reads = std::iter::once(s.p)
                    .chain(s.q)
                    .map(|m| async move { (m, self.mread(m, lo, hi - lo, opts).await) });
                let (olds, pars) = futures_util::future::join(
                    futures_util::future::join_all(reads),
                    futures_util::future::join_all(parity_reads),
                )
                .await;
                let mut fail = None;
                let mut par: Row = vec![None; n];
                for (m, r) in pars {
                    match r {
                        Ok(b) => par[m] = Some(b.to_vec()),
                        Err(e) => fail = Some((m, e)),
                    }
                }
                let mut old = Vec::with_capacity(olds.len());
                for (m, r) in olds {
                    match r {
                        Ok(b) => old.push(b),
                        Err(e) => fail = Some((m, e)),
                    }
                }
                if let Some((m, e)) = fail {
                    // Fall back to the degraded path with this member gone.
                    self.member_error(m, e)?;
                    drop(_stripe);
                    return Box::pin(self.write_stripe(g, stripe, pieces, opts)).await;
                }
                let order = s.syndrome_order();
                let mut pbuf = par[s.p].take().unwrap_or_default();
                let mut qbuf = s.q.and_then(|q| par[q].take());
                for ((p, new), old) in pieces.iter().zip(&old) {
                    let at = ((p.cblk - lo) * 512) as usize;
                    let mut delta = old.to_vec();
                    gf::mul_acc(&mut delta, 1, new);
                    gf::mul_acc(&mut pbuf[at..at + delta.len()], 1, &delta);
                    if let Some(q) = &mut qbuf {
                        let c = order.iter().position(|&m| m == p.comp).unwrap_or(0);
                        gf::mul_acc(&mut q[at..at + delta.len()], gf::pow2(c), &delta);
                    }
                }
                (pbuf, qbuf, None)
            } else {
                // Reconstruct-write (degraded: every survivor read and the missing data
                // recovered first): whole data chunks over [lo, hi), then P and Q from them.
                let mut row: Row = if degraded {
                    let mut r = self.read_row(&s, lo, hi - lo, opts).await?;
                    self.recover_data(&s, &mut r)?;
                    r
                } else {
                    let need: Vec<usize> = s
                        .data
                        .iter()
                        .copied()
                        .filter(|&m| covered(m) < hi - lo)
                        .collect();
                    let reads = need
                        .iter()
                        .map(|&m| async move { (m, self.mread(m, lo, hi - lo, opts).await) });
                    let mut r: Row = vec![None; n];
                    for (m, res) in futures_util::future::join_all(reads).await {
                        match res {
                            Ok(b) => r[m] = Some(b.to_vec()),
                            Err(e) => {
                                self.member_error(m, e)?;
                                drop(_stripe);
                                return Box::pin(self.write_stripe(g, stripe, pieces, opts)).await;
                            }
                        }
                    }
                    r
                };
                for (p, new) in pieces {
                    let at = ((p.cblk - lo) * 512) as usize;
                    if let Some(b) = &mut row[p.comp] {
                        b[at..at + new.len()].copy_from_slice(new);
                    }
                }
                // A member the new data covers whole is taken from it as it is (no copy): a
                // full-stripe write reads nothing and copies nothing before the parity.
                let sources: Vec<Option<&[u8]>> = (0..n)
                    .map(|m| {
                        row[m].as_deref().or_else(|| {
                            pieces
                                .iter()
                                .find(|(p, _)| p.comp == m)
                                .map(|(_, d)| &d[..])
                        })
                    })
                    .collect();
                let (pb, qb) = Self::parity_from(&s, &sources, len);
                // A small write that read the rest of a whole chunk row leaves the row
                // known: kept, so the next write to the stripe (a sequential writer's) reads
                // nothing. A full-stripe write is not kept (the next one goes elsewhere).
                let keep = !degraded && full_row && pieces.len() < s.data.len();
                let entry = keep.then(|| {
                    (0..n)
                        .map(|m| {
                            if s.data.contains(&m) {
                                sources[m].map(<[u8]>::to_vec)
                            } else {
                                None
                            }
                        })
                        .collect::<Row>()
                });
                (pb, qb, entry)
            };
        // The new data, then P and Q, to every member that has not failed.
        let mut writes: Vec<(usize, u64, Bytes)> = pieces
            .iter()
            .map(|(p, d)| (p.comp, p.cblk, d.clone()))
            .collect();
        writes.push((s.p, lo, Bytes::from(p_new)));
        if let (Some(q), Some(qb)) = (s.q, q_new) {
            writes.push((q, lo, Bytes::from(qb)));
        }
        let issued = writes
            .into_iter()
            .filter(|(m, _, _)| self.usable(*m, hi))
            .map(|(m, at, d)| async move { (m, self.mwrite(m, at, d, opts).await) });
        let mut all_written = true;
        for (m, r) in futures_util::future::join_all(issued).await {
            if let Err(e) = r {
                all_written = false;
                self.cache.lock().clear();
                self.member_error(m, e)?;
            }
        }
        if let (true, Some(entry)) = (all_written, data) {
            self.cache_put(stripe, entry);
        }
        Ok(())
    }

    /// Rebuilds member `member` onto `device` (a replacement, or the same member once its
    /// fault is fixed) stripe by stripe from the others, in the idle class, while the array
    /// serves; the member is read again once it is whole. In an md array the member is
    /// recorded in its role from the start, with md's recovery offset written as the rebuild
    /// goes (and at [`close`](Self::close)): if the rebuild's future is dropped, or the
    /// process stops, the next assembly (or [`resume_rebuild`](Self::resume_rebuild)) takes
    /// it up where it was.
    ///
    /// # Errors
    /// [`Error::BadLength`] for a device smaller than the member, [`Error::Resync`] if the
    /// others cannot rebuild it (more failures than the redundancy), I/O errors writing it.
    pub async fn rebuild(&self, member: usize, device: Arc<dyn DynBlockDevice>) -> Result<()> {
        let need = self.geo.member_sectors();
        if member >= self.members.len()
            || device.info().sectors < self.offsets[member].saturating_add(need)
        {
            return Err(Error::BadLength {
                device: device.info().name.clone(),
                what: format!("cannot stand in for member {member} ({need} sectors needed)"),
            });
        }
        self.fail(member);
        let device: Arc<dyn DynBlockDevice> = match self.queued {
            Some(fair) => super::queues_for(&[Arc::clone(&device)], false, fair)
                .pop()
                .flatten()
                .map_or(device, |q| Arc::new(q) as Arc<dyn DynBlockDevice>),
            None => device,
        };
        *self.members[member].write() = Arc::clone(&device);
        *self.rebuilding.lock() = Some((member, 0, need));
        self.paused.store(false, Ordering::Release);
        if let Err(e) = self.md_adopt(member).await {
            *self.rebuilding.lock() = None;
            return Err(e);
        }
        self.rebuild_from(member, 0).await
    }

    /// Takes up a paused rebuild (one whose future was dropped, or a member the array was
    /// assembled with partly rebuilt, by md or by tagstripe) where it stopped, onto the
    /// member's device. `Ok(false)`: no rebuild was paused.
    ///
    /// # Errors
    /// As [`rebuild`](Self::rebuild).
    pub async fn resume_rebuild(&self) -> Result<bool> {
        let Some((member, done, _)) = *self.rebuilding.lock() else {
            return Ok(false);
        };
        if !self.paused.swap(false, Ordering::AcqRel) {
            return Ok(false);
        }
        tracing::info!(target: "tagstripe::raid", array = %self.info.name, member, done, "rebuild taken up");
        self.rebuild_from(member, done).await.map(|()| true)
    }

    /// The rebuild of `member` from member sector `from` to the end, then the member back in
    /// service.
    async fn rebuild_from(&self, member: usize, from: u64) -> Result<()> {
        let (need, chunk) = (self.geo.member_sectors(), self.geo.chunk());
        let device = self.member(member);
        // Dropped before the end: paused where it is (writes below it keep reaching the
        // member, and close records it).
        let pause = PauseOnDrop(&self.paused);
        let started = std::time::Instant::now();
        self.emit(&crate::MirrorEvent::ResyncStarted {
            components: vec![member],
            sectors: need - from,
            whole: from == 0,
        });
        let opts = IoOpts::new().class(IoClass::Idle);
        let copied = self
            .rebuild_rows(member, &device, from, need, chunk, opts)
            .await;
        if let Err(e) = copied {
            std::mem::forget(pause);
            *self.rebuilding.lock() = None;
            self.emit(&crate::MirrorEvent::ResyncFailed {
                components: vec![member],
                error: e.to_string(),
            });
            return Err(e);
        }
        // In sync: read again, and recorded as a whole member.
        std::mem::forget(pause);
        self.failed[member].store(false, Ordering::Release);
        *self.rebuilding.lock() = None;
        if let Some(md) = &self.md {
            let dirty = md.dirty.load(Ordering::Acquire);
            self.md_record(dirty).await?;
        }
        tracing::info!(target: "tagstripe::raid", array = %self.info.name, member, "member rebuilt: in sync");
        self.emit(&crate::MirrorEvent::ResyncComplete {
            components: vec![member],
            sectors: need - from,
            elapsed: started.elapsed(),
        });
        Ok(())
    }

    /// Writes member `member`'s every row onto `device` from the others (see
    /// [`rebuild`](Self::rebuild)), progress reported every 32 MiB.
    async fn rebuild_rows(
        &self,
        member: usize,
        device: &Arc<dyn DynBlockDevice>,
        from: u64,
        need: u64,
        chunk: u64,
        opts: IoOpts,
    ) -> Result<()> {
        // md's checkpoints: the recovery offset written every 1/8 of the member (at most
        // every 32 MiB), so a stop loses little of the rebuild.
        let step = (need / 8).clamp(chunk, 64 << 10);
        let mut at = from;
        while at < need {
            // A background loop over every row: it spends the task's budget a row (the
            // stripe lock, taken at once, no longer does), so that it yields now and then.
            tokio::task::coop::consume_budget().await;
            let n = chunk.min(need - at);
            // The stripe (raid10: the chunk) stays locked from its read to the rebuilt
            // member's write and the progress that makes writers write it too: a client's
            // write to it lands before or after, never between.
            let key = match &self.geo {
                MdGeometry::Parity(_) => Some(at / chunk),
                MdGeometry::Raid10(r) => r.volume_sector(member, at).map(|l| l / chunk),
            };
            let _stripe = match key {
                Some(k) => Some(self.stripe_lock(k).await),
                None => None,
            };
            let data = match &self.geo {
                MdGeometry::Parity(g) => {
                    let s = g.stripe(at / chunk);
                    let mut row = self.read_row(&s, at, n, opts).await?;
                    self.recover_data(&s, &mut row)?;
                    let len = (n * 512) as usize;
                    let (p, q) = Self::parity_of(&s, &row, len);
                    if member == s.p {
                        p
                    } else if Some(member) == s.q {
                        q.unwrap_or_default()
                    } else {
                        row[member].take().ok_or_else(|| self.too_degraded())?
                    }
                }
                MdGeometry::Raid10(r) => match r.volume_sector(member, at) {
                    Some(l) => self.read_copy(r, l, n, Some(member), opts).await?,
                    // Past the array's data: nothing to copy.
                    None => vec![0u8; (n * 512) as usize],
                },
            };
            device
                .write(self.offsets[member] + at, Bytes::from(data), opts)
                .await?;
            let before = at;
            at += n;
            *self.rebuilding.lock() = Some((member, at, need));
            if at / step != before / step && at < need {
                device.flush(opts).await?;
                self.md_checkpoint(member, at).await?;
            }
            // Every 32 MiB (65,536 sectors).
            if at / (64 << 10) != before / (64 << 10) && at < need {
                self.emit(&crate::MirrorEvent::ResyncProgress {
                    components: vec![member],
                    done: at,
                    total: need,
                });
            }
        }
        device.flush(opts).await
    }

    /// Recomputes every stripe's P (and Q) from its data, as md's resync after an unclean
    /// stop does: afterwards parity agrees with the data wherever a crash cut a stripe's
    /// writes in two. Runs in the idle class while the array serves. raid10: copies every
    /// chunk's first readable copy over the others.
    ///
    /// # Errors
    /// [`Error::Resync`] on a degraded array (a parity resync needs every member), I/O errors.
    pub async fn resync_parity(&self) -> Result<()> {
        if !self.failed().is_empty() {
            return Err(self.too_degraded());
        }
        let opts = IoOpts::new().class(IoClass::Idle);
        let all: Vec<usize> = (0..self.members.len()).collect();
        let started = std::time::Instant::now();
        self.emit(&crate::MirrorEvent::ResyncStarted {
            components: all.clone(),
            sectors: self.member_sectors(),
            whole: true,
        });
        let done = self.resync_rows(opts).await;
        match &done {
            Ok(()) => self.emit(&crate::MirrorEvent::ResyncComplete {
                components: all,
                sectors: self.member_sectors(),
                elapsed: started.elapsed(),
            }),
            Err(e) => self.emit(&crate::MirrorEvent::ResyncFailed {
                components: all,
                error: e.to_string(),
            }),
        }
        done
    }

    /// [`resync_parity`](Self::resync_parity)'s copying.
    async fn resync_rows(&self, opts: IoOpts) -> Result<()> {
        match &self.geo {
            MdGeometry::Parity(g) => {
                for stripe in 0..g.stripes() {
                    // A row's budget, as in `rebuild_rows`.
                    tokio::task::coop::consume_budget().await;
                    let s = g.stripe(stripe);
                    let _stripe = self.stripe_lock(stripe).await;
                    let at = stripe * g.chunk();
                    let row = self.read_row(&s, at, g.chunk(), opts).await?;
                    if s.data.iter().any(|&m| row[m].is_none()) {
                        return Err(self.too_degraded());
                    }
                    let (p, q) = Self::parity_of(&s, &row, (g.chunk() * 512) as usize);
                    self.mwrite(s.p, at, Bytes::from(p), opts).await?;
                    if let (Some(qm), Some(q)) = (s.q, q) {
                        self.mwrite(qm, at, Bytes::from(q), opts).await?;
                    }
                }
            }
            MdGeometry::Raid10(r) => {
                let mut l = 0;
                while l < r.total_sectors() {
                    tokio::task::coop::consume_budget().await;
                    let _stripe = self.stripe_lock(l / r.chunk()).await;
                    let d = Bytes::from(self.read_copy(r, l, r.chunk(), None, opts).await?);
                    for (m, at) in r.copies(l).into_iter().skip(1) {
                        self.mwrite(m, at, d.clone(), opts).await?;
                    }
                    l += r.chunk();
                }
            }
        }
        Ok(())
    }

    /// raid10: `sectors` from volume sector `lblk` (inside one chunk), from the first copy
    /// that reads (not from `skip`).
    async fn read_copy(
        &self,
        r: &Raid10,
        lblk: u64,
        sectors: u64,
        skip: Option<usize>,
        opts: IoOpts,
    ) -> Result<Vec<u8>> {
        for (m, at) in r.copies(lblk) {
            if Some(m) == skip || self.is_failed(m) {
                continue;
            }
            match self.mread(m, at, sectors, opts).await {
                Ok(b) => return Ok(b.to_vec()),
                Err(e) => self.member_error(m, e)?,
            }
        }
        Err(self.too_degraded())
    }
}

impl BlockDevice for Raid {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn caps(&self) -> Caps {
        self.info.caps
    }

    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        let mut buf = vec![0u8; usize::try_from(sectors * 512).unwrap_or(usize::MAX)];
        self.read_into(start, &mut buf, opts).await?;
        Ok(Bytes::from(buf))
    }

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let sectors = crate::device::sectors_of(&self.info, buf.len())?;
        self.info.check(start, sectors)?;
        match &self.geo {
            MdGeometry::Parity(g) => {
                let pieces = g.map(start, sectors)?;
                let mut rest = buf;
                let mut parts = Vec::with_capacity(pieces.len());
                for p in pieces {
                    let (a, b) = rest.split_at_mut((p.count * 512) as usize);
                    parts.push(self.read_parity_piece(p, a, opts));
                    rest = b;
                }
                crate::device::all(parts).await?;
            }
            MdGeometry::Raid10(r) => {
                let pieces = r.map(start, sectors)?;
                let mut rest = buf;
                let mut parts = Vec::with_capacity(pieces.len());
                for p in pieces {
                    let (a, b) = rest.split_at_mut((p.count * 512) as usize);
                    parts.push(async move {
                        let d = self.read_copy(r, p.lblk, p.count, None, opts).await?;
                        a.copy_from_slice(&d);
                        Ok(())
                    });
                    rest = b;
                }
                crate::device::all(parts).await?;
            }
        }
        Ok(())
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        self.md_before_write().await?;
        self.write_geo(start, sectors, data, opts).await?;
        self.md_after_write().await
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.flush_members(opts).await
    }

    async fn discard(&self, _start: u64, _sectors: u64, _opts: IoOpts) -> Result<()> {
        Err(Error::Unsupported {
            device: self.info.name.clone(),
            op: "discard (parity and copies would have to follow)",
        })
    }
}

impl Raid {
    async fn write_geo(&self, start: u64, sectors: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        match &self.geo {
            MdGeometry::Parity(g) => {
                let pieces = g.map(start, sectors)?;
                let mut by_stripe: Vec<(u64, Vec<(ParityPiece, Bytes)>)> = Vec::new();
                for p in pieces {
                    let at = ((p.lblk - start) * 512) as usize;
                    let d = data.slice(at..at + (p.count * 512) as usize);
                    match by_stripe.last_mut() {
                        Some((s, v)) if *s == p.stripe => v.push((p, d)),
                        _ => by_stripe.push((p.stripe, vec![(p, d)])),
                    }
                }
                crate::device::all(
                    by_stripe
                        .iter()
                        .map(|(s, v)| self.write_stripe(g, *s, v, opts)),
                )
                .await?;
            }
            MdGeometry::Raid10(r) => {
                let pieces = r.map(start, sectors)?;
                let writes = pieces.into_iter().map(|p| {
                    let at = ((p.lblk - start) * 512) as usize;
                    let d = data.slice(at..at + (p.count * 512) as usize);
                    async move {
                        let _stripe = self.stripe_lock(p.lblk / r.chunk()).await;
                        let mut wrote = 0;
                        let copies = p
                            .copies
                            .iter()
                            .filter(|&&(m, c)| self.usable(m, c + p.count))
                            .map(|&(m, c)| {
                                let d = d.clone();
                                async move { (m, self.mwrite(m, c, d, opts).await) }
                            });
                        for (m, res) in futures_util::future::join_all(copies).await {
                            match res {
                                Ok(()) => wrote += 1,
                                Err(e) => self.member_error(m, e)?,
                            }
                        }
                        if wrote == 0 {
                            return Err(self.too_degraded());
                        }
                        Ok(())
                    }
                });
                crate::device::all(writes).await?;
            }
        }
        Ok(())
    }

    async fn flush_members(&self, opts: IoOpts) -> Result<()> {
        let flushes = (0..self.members.len())
            .filter(|&m| !self.is_failed(m))
            .map(|m| async move { (m, self.member(m).flush(opts).await) });
        for (m, r) in futures_util::future::join_all(flushes).await {
            if let Err(e) = r {
                self.member_error(m, e)?;
            }
        }
        Ok(())
    }
}

/// The first md version-1 superblock found on `d` (1.2, then 1.1, then 1.0).
///
/// # Errors
/// [`Error::Geometry`] with what each location held, I/O errors.
pub async fn read_md_superblock(d: &dyn DynBlockDevice) -> Result<Superblock1> {
    let sectors = d.info().sectors;
    let mut why = Vec::new();
    for (at, version) in Superblock1::locations(sectors) {
        if at + 8 > sectors {
            continue;
        }
        let b = d.read(at, 8, IoOpts::new()).await?;
        match Superblock1::parse(&b) {
            Ok(sb) if sb.super_offset == at => return Ok(sb),
            Ok(sb) => why.push(format!(
                "{version} at sector {at}: says it is at {}",
                sb.super_offset
            )),
            Err(e) => why.push(format!("{version} at sector {at}: {e}")),
        }
    }
    Err(Error::Geometry(tagstripe_striping::Error::MdSuperblock {
        what: format!("none on {} ({})", d.info().name, why.join("; ")),
    }))
}

/// Clears a rebuild's progress when the rebuild ends, however it ends.
/// Marks a rebuild paused when its future is dropped before the end (forgotten at the end,
/// done or failed).
struct PauseOnDrop<'a>(&'a AtomicBool);

impl Drop for PauseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A member no device holds: every request fails; the array serves around it.
#[derive(Debug)]
struct Missing {
    info: DeviceInfo,
}

impl Missing {
    fn new(role: usize, sectors: u64) -> Self {
        Self {
            info: DeviceInfo::new(format!("missing member {role}"), sectors),
        }
    }

    fn gone(&self, op: &'static str, start: u64, sectors: u64) -> Error {
        Error::Io {
            device: self.info.name.clone(),
            op,
            start,
            sectors,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        }
    }
}

impl BlockDevice for Missing {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    async fn read(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<Bytes> {
        Err(self.gone("read", start, sectors))
    }
    async fn write(&self, start: u64, data: Bytes, _opts: IoOpts) -> Result<()> {
        Err(self.gone("write", start, data.len() as u64 / 512))
    }
    async fn flush(&self, _opts: IoOpts) -> Result<()> {
        Err(self.gone("flush", 0, 0))
    }
    async fn discard(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<()> {
        Err(self.gone("discard", start, sectors))
    }
}

/// `lock`, taken at once when free, as nearly always, else waited for (the lock is fair: a
/// waiter queued before takes it first, so `try_lock` fails and this queues after it).
/// Taken at once, it is no scheduling point: the lock's own `lock` spends a unit of the
/// task's budget every time, and a connection that runs out of budget in the middle of a
/// burst yields, and the idle worker takes it over, back and forth (raid5 over 4 files in
/// /dev/shm, 4 KiB random writes served over a Unix socket with one job: 214,000-236,000
/// context switches in 3 s, 2,700-19,000 so; 1.04-1.11x the writes a second at 10-15% less
/// CPU a GiB; the NBD server's write lock did the same, docs/nbd-performance.md).
async fn at_once(lock: &tokio::sync::Mutex<()>) -> tokio::sync::MutexGuard<'_, ()> {
    match lock.try_lock() {
        Ok(g) => g,
        Err(_) => lock.lock().await,
    }
}

#[cfg(test)]
mod tests {
    use super::at_once;

    #[tokio::test]
    async fn a_free_stripe_lock_is_taken_with_the_tasks_budget_spent() {
        use futures_util::FutureExt;
        use tokio::task::coop::{consume_budget, has_budget_remaining};
        let lock = tokio::sync::Mutex::new(());
        // Held: waited for.
        let held = at_once(&lock).now_or_never().unwrap();
        assert!(at_once(&lock).now_or_never().is_none());
        // A waiter queued behind the holder takes it before a newcomer.
        let mut queued = Box::pin(lock.lock());
        assert!((&mut queued).now_or_never().is_none());
        drop(held);
        assert!(at_once(&lock).now_or_never().is_none());
        drop(queued.now_or_never().unwrap());
        // Spend the task's budget, as a connection does over a burst of requests.
        while has_budget_remaining() {
            consume_budget().await;
        }
        // The lock's own `lock` would make the task yield here; a free lock is taken at once.
        assert!(lock.lock().now_or_never().is_none());
        assert!(at_once(&lock).now_or_never().is_some());
    }
}
