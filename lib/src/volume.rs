//! The volume builder: components wrapped in `Split<Queue<D>>`, striped by a geometry.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe_quirks::{Mod15, QuirkSet};
use tagstripe_scheduler::FairConfig;
use tagstripe_striping::{Flavor, Geometry, MirrorReads};

use crate::layers::Component;
use crate::stats::{OpKind, Stats};
use crate::times::Times;
use crate::{BlockDevice, DeviceInfo, DynBlockDevice, IoOpts, QueueHandle, Result, Split, Striped};

/// A device a volume can take as a component: an `Arc` of any [`BlockDevice`], or an
/// `Arc<dyn DynBlockDevice>`.
pub trait IntoComponent {
    /// The component, type-erased.
    fn into_component(self) -> Arc<dyn DynBlockDevice>;
}

impl IntoComponent for Arc<dyn DynBlockDevice> {
    fn into_component(self) -> Arc<dyn DynBlockDevice> {
        self
    }
}

impl<T: BlockDevice + 'static> IntoComponent for Arc<T> {
    fn into_component(self) -> Arc<dyn DynBlockDevice> {
        self
    }
}

/// Builds a [`Volume`].
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, Volume};
/// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
/// let comps = (0..4).map(|i| Arc::new(MemDevice::new(&format!("mem{i}"), 8192)));
/// let vol = Volume::builder(comps).interleave(128).build()?;
/// assert_eq!(vol.info().sectors, 4 * 8192);
/// vol.write(100, Bytes::from(vec![1u8; 64 << 10]), IoOpts::new()).await?;
/// assert_eq!(vol.read(100, 128, IoOpts::new()).await?, vec![1u8; 64 << 10]);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct VolumeBuilder {
    name: String,
    components: Vec<Arc<dyn DynBlockDevice>>,
    interleave: u64,
    flavor: Flavor,
    uniform: bool,
    mirror: bool,
    no_offset: bool,
    linux: bool,
    reserved: Option<u64>,
    sector_size: Option<u32>,
    mirror_reads: Option<MirrorReads>,
    quirks: QuirkSet,
    mod15: Mod15,
    fair: FairConfig,
    queue: bool,
    share_queues: bool,
    layers: Layers,
    metadata: bool,
    assume_clean: bool,
    read_only: bool,
    bitmap_delay: std::time::Duration,
    events: Option<crate::layers::mirror::resync::EventSink>,
}

/// A wrapper a volume puts around each of its components (tower's `Layer`, for block
/// devices): given the component's index and the device, it returns the device to use in
/// its place, a fault injector, a throttle, a metrics recorder or anything else that is a
/// [`BlockDevice`]. Layers sit right on the component, under the volume's own split and
/// queue, so they see the requests the device would see; the first layer added is the
/// innermost. Closures `Fn(usize, Arc<dyn DynBlockDevice>) -> Arc<dyn DynBlockDevice>` are layers.
pub trait Layer: Send + Sync + 'static {
    /// The device to use for component `component` in place of `inner`.
    fn layer(&self, component: usize, inner: Arc<dyn DynBlockDevice>) -> Arc<dyn DynBlockDevice>;
}

impl<F> Layer for F
where
    F: Fn(usize, Arc<dyn DynBlockDevice>) -> Arc<dyn DynBlockDevice> + Send + Sync + 'static,
{
    fn layer(&self, component: usize, inner: Arc<dyn DynBlockDevice>) -> Arc<dyn DynBlockDevice> {
        self(component, inner)
    }
}

/// The layers of a builder (shown by count).
#[derive(Default)]
struct Layers(Vec<Box<dyn Layer>>);

impl std::fmt::Debug for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} layers", self.0.len())
    }
}

impl VolumeBuilder {
    /// Keeps metadata at the end of each component (two checksummed copies in its last
    /// 16 sectors, as md's superblock 1.0 sits at the end): the volume's identity, each
    /// component's role and the geometry, which mirror sides are stale, so that after a
    /// restart a side dropped for a failed write is never read, and a mirror's write-intent
    /// bitmap, so that a stale side is resynced by copying only what it missed (see
    /// [`Volume::status`], [`Volume::resync`], [`Volume::replace`]). The geometry is built on
    /// the sizes less those sectors (the data area still starts at sector 0, ccd-exact).
    /// Such a volume is opened with [`open`](Self::open).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use tagstripe::striping::Flavor;
    /// use tagstripe::{BlockDevice, DynBlockDevice, Fault, FaultDevice, FaultKind, FaultOp, IoOpts, MemDevice, Volume};
    /// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
    /// let a = Arc::new(FaultDevice::new(MemDevice::new("a", 4096)));
    /// let b = Arc::new(MemDevice::new("b", 4096));
    /// let mirror = || Volume::builder([a.clone() as Arc<dyn DynBlockDevice>, b.clone()])
    ///     .flavor(Flavor::FreeBsd).mirror(true).metadata(true);
    /// let v = mirror().open().await?;
    /// v.wait_resync().await; // a new mirror: side 1 copied from side 0 first
    /// a.inject(Fault::always(FaultOp::Write, FaultKind::Error));
    /// v.write(0, Bytes::from(vec![2u8; 4096]), IoOpts::new()).await?; // side 0 dropped
    /// drop(v);
    /// a.clear();
    /// let v = mirror().open().await?; // side 0 is known stale: never read, resynced
    /// assert_eq!(v.read(0, 8, IoOpts::new()).await?, vec![2u8; 4096]);
    /// v.wait_resync().await;
    /// assert!(v.degraded().is_empty());
    /// assert_eq!(a.read(16, 8, IoOpts::new()).await?, vec![2u8; 4096]); // side 0 healed
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn metadata(mut self, on: bool) -> Self {
        self.metadata = on;
        self
    }

    /// Builds the volume and opens its metadata (with [`metadata`](Self::metadata) on):
    /// components that carry none make a new volume (its first copies written); otherwise
    /// the highest event count wins and stale sides are never read.
    ///
    /// # Errors
    /// As [`build`](Self::build), and [`crate::Error::Metadata`] for components from
    /// another volume, in another order or of another geometry (named), a stale member
    /// of a volume without a mirror, or a component whose two copies are both torn or
    /// corrupt (in a mirror, only if its partner's are too: otherwise that side is stale
    /// and copied back whole); I/O errors on a component.
    pub async fn open(self) -> Result<Volume> {
        let metadata = self.metadata;
        let assume_clean = self.assume_clean;
        let delay = self.bitmap_delay;
        let vol = self.assemble()?;
        if metadata {
            let plan =
                crate::layers::mirror::metadata::open(&vol.striped, assume_clean, delay).await?;
            // A read-only volume plans nothing: it serves from the sides in sync.
            if !plan.targets.is_empty() {
                vol.start_resync(plan.targets);
            }
        }
        Ok(vol)
    }

    /// How long a chunk of a mirror's write-intent bitmap stays set after its last write,
    /// at least (default 5 s, as md's bitmap delay): a flush clears only chunks idle that
    /// long, so a chunk written again and again costs one metadata write, not one per flush.
    /// [`Volume::close`] clears every idle chunk at once. Zero clears at every flush.
    #[must_use]
    pub fn bitmap_delay(mut self, delay: std::time::Duration) -> Self {
        self.bitmap_delay = delay;
        self
    }

    /// A new mirror's sides are known to be identical (as mdadm's `--assume-clean`): no
    /// first resync of the second half from the first. Only for components that are
    /// blank (all zeroes) or copies of each other.
    #[must_use]
    pub fn assume_clean(mut self, on: bool) -> Self {
        self.assume_clean = on;
        self
    }

    /// Opens the volume read-only, as `mdadm --readonly` and `qemu-nbd -r` do: every
    /// write, zeroing and discard is refused, and nothing is ever written to any component,
    /// not even the metadata (no event count bumped, no bitmap cleared, no resync, no side
    /// dropped on disk). A mirror is then served from the sides its metadata says are in
    /// sync: a stale side, and after an unclean stop every side a resync would have copied
    /// to, is not read. A volume is read-only too when any component is.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use tagstripe::striping::Flavor;
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice, Volume};
    /// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
    /// let (a, b) = (Arc::new(MemDevice::new("a", 4096)), Arc::new(MemDevice::new("b", 4096)));
    /// let v = Volume::builder([a.clone(), b.clone()])
    ///     .flavor(Flavor::FreeBsd).no_offset(true).mirror(true).metadata(true).assume_clean(true)
    ///     .open().await?;
    /// v.write(0, Bytes::from(vec![7u8; 4096]), IoOpts::new()).await?;
    /// v.close().await?;
    /// drop(v);
    /// let before = (a.read(0, 4096, IoOpts::new()).await?, b.read(0, 4096, IoOpts::new()).await?);
    /// let ro = Volume::builder([a.clone(), b.clone()])
    ///     .flavor(Flavor::FreeBsd).no_offset(true).mirror(true).metadata(true).read_only(true)
    ///     .open().await?;
    /// assert_eq!(ro.read(0, 8, IoOpts::new()).await?, vec![7u8; 4096]);
    /// assert!(ro.write(0, Bytes::from(vec![0u8; 512]), IoOpts::new()).await.is_err());
    /// ro.close().await?;
    /// let after = (a.read(0, 4096, IoOpts::new()).await?, b.read(0, 4096, IoOpts::new()).await?);
    /// assert!(before == after, "a read-only open wrote nothing");
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// Calls `f` with every [`MirrorEvent`](crate::MirrorEvent) (a side dropped, a resync's start, progress,
    /// end), as it happens, from the task where it happens: `f` must be quick. The same
    /// events go to `tracing` (target `tagstripe::mirror`).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use tagstripe::striping::Flavor;
    /// use tagstripe::{MemDevice, MirrorEvent, SideStatus, Volume};
    /// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let comps = [Arc::new(MemDevice::new("a", 4096)), Arc::new(MemDevice::new("b", 4096))];
    /// // A new mirror: side 1 is copied from side 0 while the volume serves.
    /// let v = Volume::builder(comps)
    ///     .flavor(Flavor::FreeBsd)
    ///     .mirror(true)
    ///     .metadata(true)
    ///     .on_event(move |e: &MirrorEvent| log.lock().unwrap().push(e.clone()))
    ///     .open()
    ///     .await?;
    /// v.wait_resync().await;
    /// assert_eq!(v.status(), [SideStatus::InSync, SideStatus::InSync]);
    /// let seen = seen.lock().unwrap();
    /// assert!(matches!(seen[0], MirrorEvent::ResyncStarted { whole: true, .. }));
    /// assert!(matches!(seen.last(), Some(MirrorEvent::ResyncComplete { .. })));
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn on_event(mut self, f: impl Fn(&crate::MirrorEvent) + Send + Sync + 'static) -> Self {
        self.events = Some(crate::layers::mirror::resync::EventSink(Arc::new(f)));
        self
    }

    /// Wraps every component in `layer` (see [`Layer`]); called once per component, in
    /// order, when the volume is built.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, DynBlockDevice, Fault, FaultDevice, FaultKind, FaultOp, IoOpts, MemDevice, Volume};
    /// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
    /// let comps = [Arc::new(MemDevice::new("a", 1024)), Arc::new(MemDevice::new("b", 1024))];
    /// // Component 1 fails every write; component 0 is left as it is.
    /// let vol = Volume::builder(comps)
    ///     .interleave(16)
    ///     .no_offset(true)
    ///     .layer(|i: usize, dev: Arc<dyn DynBlockDevice>| -> Arc<dyn DynBlockDevice> {
    ///         if i != 1 {
    ///             return dev;
    ///         }
    ///         let f = FaultDevice::new(dev);
    ///         f.inject(Fault::always(FaultOp::Write, FaultKind::Error));
    ///         Arc::new(f)
    ///     })
    ///     .build()?;
    /// let data = Bytes::from(vec![7u8; 8192]);
    /// assert!(vol.write(0, data.clone(), IoOpts::new()).await.is_ok()); // on component 0
    /// let err = vol.write(16, data, IoOpts::new()).await.unwrap_err(); // on component 1
    /// assert_eq!(err.component(), Some(1));
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn layer(mut self, layer: impl Layer) -> Self {
        self.layers.0.push(Box::new(layer));
        self
    }

    /// The volume's name in messages.
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Interleave in sectors (0 concatenates; the default is 128, 64 KiB).
    #[must_use]
    pub fn interleave(mut self, sectors: u64) -> Self {
        self.interleave = sectors;
        self
    }

    /// ccd / md rules (default NetBSD: no reserved area).
    #[must_use]
    pub fn flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    /// Every component contributes the smallest size.
    #[must_use]
    pub fn uniform(mut self, on: bool) -> Self {
        self.uniform = on;
        self
    }

    /// Mirror the first half onto the second (needs a flavor with mirroring, e.g. FreeBSD).
    #[must_use]
    pub fn mirror(mut self, on: bool) -> Self {
        self.mirror = on;
        self
    }

    /// FreeBSD: no reserved area.
    #[must_use]
    pub fn no_offset(mut self, on: bool) -> Self {
        self.no_offset = on;
        self
    }

    /// FreeBSD's `linux` mode: the interleave is given in KiB (doubled) and no reserved
    /// area is kept (`GeometryBuilder::linux`).
    #[must_use]
    pub fn linux(mut self, on: bool) -> Self {
        self.linux = on;
        self
    }

    /// Sectors reserved at the start of each component (e.g. md's `data_offset`), instead of
    /// the flavor's (`GeometryBuilder::reserved`).
    #[must_use]
    pub fn reserved(mut self, sectors: u64) -> Self {
        self.reserved = Some(sectors);
        self
    }

    /// The sector size in bytes the geometry checks alignment against; default (and never
    /// less than) the largest logical block of the components.
    #[must_use]
    pub fn sector_size(mut self, bytes: u32) -> Self {
        self.sector_size = Some(bytes);
        self
    }

    /// How mirror reads choose a side; default: the flavor's.
    #[must_use]
    pub fn mirror_reads(mut self, policy: MirrorReads) -> Self {
        self.mirror_reads = Some(policy);
        self
    }

    /// The quirk layers to apply to each component (default: the built-in table).
    #[must_use]
    pub fn quirks(mut self, quirks: QuirkSet) -> Self {
        self.quirks = quirks;
        self
    }

    /// The mod-15 policy for drives with the erratum (default Linux's `Cap15`).
    #[must_use]
    pub fn mod15(mut self, mod15: Mod15) -> Self {
        self.mod15 = mod15;
        self
    }

    /// Settings of each component's fair queue.
    #[must_use]
    pub fn fairness(mut self, fair: FairConfig) -> Self {
        self.fair = fair;
        self
    }

    /// Whether components on one physical device ([`DeviceInfo::media`]: files on one
    /// filesystem, say) share one tagged queue (default on, [`crate::Queue::group`]): the fair
    /// policy then sees all the interactive and bulk I/O that competes for that device, not
    /// a component's share of it. Off, each component has its own queue.
    #[must_use]
    pub fn share_queues(mut self, on: bool) -> Self {
        self.share_queues = on;
        self
    }

    /// Whether to put each component behind a tagged queue (default on). Off, requests go
    /// straight to the split layer: for components that queue themselves (another volume).
    #[must_use]
    pub fn queue(mut self, on: bool) -> Self {
        self.queue = on;
        self
    }

    /// Wraps each component in the user's layers, applies quirks, wraps it in
    /// `Split<Queue<D>>`, and stripes.
    ///
    /// # Errors
    /// A geometry ccd refuses ([`crate::Error::Geometry`]), limits that do not validate or
    /// stack ([`crate::Error::Limits`]).
    pub fn build(self) -> Result<Volume> {
        if self.metadata {
            return Err(crate::Error::BadLength {
                device: self.name,
                what: "a volume with metadata must read it first: use open().await".to_owned(),
            });
        }
        self.assemble()
    }

    fn assemble(self) -> Result<Volume> {
        // A mirror with metadata can have a side replaced: each device sits in a slot.
        let replaceable = self.metadata && self.mirror;
        let mut slots = Vec::new();
        // The user's layers first: the volume is built on what they return.
        let layers = &self.layers.0;
        let components: Vec<Arc<dyn DynBlockDevice>> = self
            .components
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let c = if replaceable {
                    let slot = Arc::new(crate::layers::mirror::Slot::new(c));
                    slots.push(Arc::clone(&slot));
                    slot as Arc<dyn DynBlockDevice>
                } else {
                    c
                };
                layers.iter().fold(c, |dev, l| l.layer(i, dev))
            })
            .collect();
        // With metadata, each component gives up its last sectors to it.
        let keep = if self.metadata {
            tagstripe_striping::superblock::RESERVED_SECTORS
        } else {
            0
        };
        let sizes: Vec<u64> = components
            .iter()
            .map(|c| c.info().sectors.saturating_sub(keep))
            .collect();
        let sector_size = components
            .iter()
            .map(|c| c.info().limits.logical_block_size)
            .max()
            .unwrap_or(512)
            .max(self.sector_size.unwrap_or(0));
        let mut gb = Geometry::builder(sizes, self.interleave);
        gb.flavor(self.flavor)
            .uniform(self.uniform)
            .mirror(self.mirror)
            .no_offset(self.no_offset)
            .linux(self.linux)
            .sector_size(sector_size);
        if let Some(r) = self.reserved {
            gb.reserved(r);
        }
        let geometry = gb.build()?;
        let mut wrapped = Vec::with_capacity(components.len());
        let mut component_stats = Vec::new();
        let mut queues = Vec::new();
        let mut queued = if self.queue {
            crate::layers::queues_for(&components, self.share_queues, self.fair)
        } else {
            Vec::new()
        };
        for (i, c) in components.into_iter().enumerate() {
            let info = c.info();
            let applied = self.quirks.apply(&info.identity, &info.limits)?;
            let dev = if let Some(queue) = queued.get_mut(i).and_then(Option::take) {
                component_stats.push(queue.stats_handle());
                queues.push(queue.handle());
                Component::Queued(Arc::new(Split::new(queue, &applied, self.mod15)?))
            } else {
                Component::Direct(Arc::new(Split::new(c, &applied, self.mod15)?))
            };
            wrapped.push(dev);
        }
        let mut striped = Striped::over(&self.name, geometry, wrapped)?;
        if self.read_only {
            striped.set_read_only();
        }
        if let Some(policy) = self.mirror_reads {
            striped.set_mirror_reads(policy);
        }
        if let Some(sink) = self.events {
            striped.set_events(sink);
        }
        let (resyncing, _) = tokio::sync::watch::channel(false);
        Ok(Volume {
            striped: Arc::new(striped),
            stats: Arc::new(Stats::default()),
            component_stats,
            queues,
            resyncing,
            resync_task: parking_lot::Mutex::new(None),
            slots,
        })
    }
}

/// A striped volume of queued, split components; itself a [`BlockDevice`]. See
/// [`Volume::builder`].
#[derive(Debug)]
pub struct Volume {
    striped: Arc<Striped>,
    stats: Arc<Stats>,
    component_stats: Vec<Arc<Stats>>,
    queues: Vec<QueueHandle>,
    /// Whether a resync runs.
    resyncing: tokio::sync::watch::Sender<bool>,
    /// The resync's task, stopped when the volume goes (its bitmap on disk says where a
    /// later open goes on).
    resync_task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Each component's slot (a mirror with metadata; empty otherwise).
    slots: Vec<Arc<crate::layers::mirror::Slot>>,
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Some(t) = self.resync_task.lock().take() {
            t.abort();
        }
    }
}

impl Volume {
    /// Starts a builder over `components`: `Arc`s of one device type, or
    /// `Arc<dyn DynBlockDevice>`s to mix types; no casts needed.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tagstripe::{MemDevice, Volume};
    /// let vol = Volume::builder((0..3).map(|i| Arc::new(MemDevice::new(&format!("m{i}"), 1024))))
    ///     .interleave(16)
    ///     .build()?;
    /// assert_eq!(vol.components().len(), 3);
    /// # Ok::<(), tagstripe::Error>(())
    /// ```
    #[must_use]
    pub fn builder<I>(components: I) -> VolumeBuilder
    where
        I: IntoIterator,
        I::Item: IntoComponent,
    {
        VolumeBuilder {
            name: "volume".to_owned(),
            components: components
                .into_iter()
                .map(IntoComponent::into_component)
                .collect(),
            interleave: 128,
            flavor: Flavor::NetBsd,
            uniform: false,
            mirror: false,
            no_offset: false,
            linux: false,
            reserved: None,
            sector_size: None,
            mirror_reads: None,
            quirks: QuirkSet::builtin(),
            mod15: Mod15::Cap15,
            fair: FairConfig::default(),
            queue: true,
            share_queues: true,
            layers: Layers::default(),
            metadata: false,
            assume_clean: false,
            read_only: false,
            bitmap_delay: std::time::Duration::from_secs(5),
            events: None,
        }
    }

    /// The geometry.
    #[must_use]
    pub fn geometry(&self) -> &Geometry {
        self.striped.geometry()
    }

    /// The volume's statistics.
    #[must_use]
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Each component's statistics as seen at its queue (pieces, not volume requests), in
    /// component order: `iostat -x` per disk. Empty if the volume was built without queues.
    #[must_use]
    pub fn component_stats(&self) -> &[Arc<Stats>] {
        &self.component_stats
    }

    /// Each component's tagged queue, in component order (empty if the volume was built
    /// with `.queue(false)`): openings, what is in flight, how bulk is shaped, events.
    /// Components on one physical device share a queue ([`VolumeBuilder::share_queues`]):
    /// their handles reach the same pool ([`QueueHandle::same_queue`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tagstripe::{BlockDevice, DynBlockDevice, MemDevice, Volume};
    /// let comps: Vec<Arc<dyn DynBlockDevice>> =
    ///     vec![Arc::new(MemDevice::new("a", 1024)), Arc::new(MemDevice::new("b", 1024))];
    /// let vol = Volume::builder(comps).interleave(16).build()?;
    /// assert_eq!(vol.queues().len(), 2);
    /// vol.queues()[1].set_openings(4); // camcontrol tags -N 4, on component 1
    /// assert_eq!(vol.queues()[1].openings(), 4);
    /// # Ok::<(), tagstripe::Error>(())
    /// ```
    #[must_use]
    pub fn queues(&self) -> &[QueueHandle] {
        &self.queues
    }

    /// Which component holds each part of `[start, start + sectors)`, from the geometry
    /// alone: runs of `(sectors, component, mirror partner)` (see
    /// [`Striped::component_map`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tagstripe::{MemDevice, Volume};
    /// let v = Volume::builder([Arc::new(MemDevice::new("a", 64)), Arc::new(MemDevice::new("b", 64))])
    ///     .interleave(16).no_offset(true).build()?;
    /// assert_eq!(v.component_map(8, 16)?, [(8, 0, None), (8, 1, None)]);
    /// # Ok::<(), tagstripe::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::Geometry`] if the range is outside the volume.
    pub fn component_map(
        &self,
        start: u64,
        sectors: u64,
    ) -> Result<Vec<(u64, usize, Option<usize>)>> {
        self.striped.component_map(start, sectors)
    }

    /// The components dropped from a mirror after failing a write (their data is stale);
    /// the volume serves from their partners. Empty when healthy.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use tagstripe::striping::Flavor;
    /// use tagstripe::{BlockDevice, DynBlockDevice, FaultDevice, IoOpts, MemDevice, Volume};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let b = Arc::new(FaultDevice::new(MemDevice::new("b", 1024)));
    /// let comps: Vec<Arc<dyn DynBlockDevice>> = vec![Arc::new(MemDevice::new("a", 1024)), b.clone()];
    /// let vol = Volume::builder(comps).flavor(Flavor::FreeBsd).mirror(true).build()?;
    /// b.kill(); // the mirror side fails for good
    /// vol.write(0, Bytes::from(vec![4u8; 4096]), IoOpts::new()).await?; // still served
    /// assert_eq!(vol.degraded(), [1]);
    /// assert_eq!(vol.read(0, 8, IoOpts::new()).await?, vec![4u8; 4096]);
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn degraded(&self) -> Vec<usize> {
        self.striped.failed_components()
    }

    /// Each component's state: in sync, degraded (dropped from the mirror, or stale at
    /// open) or being resynced with its progress. All in sync without a mirror.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use tagstripe::striping::Flavor;
    /// use tagstripe::{BlockDevice, FaultDevice, IoOpts, MemDevice, SideStatus, Volume};
    /// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
    /// let b = Arc::new(FaultDevice::new(MemDevice::new("b", 4096)));
    /// let v = Volume::builder([Arc::new(FaultDevice::new(MemDevice::new("a", 4096))), b.clone()])
    ///     .flavor(Flavor::FreeBsd).mirror(true).metadata(true).assume_clean(true)
    ///     .open().await?;
    /// b.kill();
    /// v.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new()).await?;
    /// assert_eq!(v.status(), [SideStatus::InSync, SideStatus::Degraded]);
    /// b.clear();
    /// v.resync()?; // side 1 copies back what it missed (the bitmap's chunks)
    /// v.wait_resync().await;
    /// assert_eq!(v.status(), [SideStatus::InSync, SideStatus::InSync]);
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn status(&self) -> Vec<crate::SideStatus> {
        let progress = self.striped.keeper().and_then(|k| k.progress());
        (0..self.striped.components().len())
            .map(|i| match self.striped.side(i) {
                tagstripe_striping::superblock::Side::InSync => crate::SideStatus::InSync,
                tagstripe_striping::superblock::Side::Failed => crate::SideStatus::Degraded,
                tagstripe_striping::superblock::Side::Resyncing => {
                    let (done, total) = progress.unwrap_or((0, 0));
                    crate::SideStatus::Resyncing { done, total }
                }
            })
            .collect()
    }

    /// Starts copying every degraded side back from its partner (once the fault that
    /// dropped it is fixed), while the volume serves: the chunks the write-intent bitmap
    /// holds. Watch it with [`status`](Self::status), [`wait_resync`](Self::wait_resync)
    /// and [`VolumeBuilder::on_event`]; a side that fails again is dropped again.
    ///
    /// # Errors
    /// [`crate::Error::Resync`] without mirror metadata, while a resync runs, or with
    /// nothing to resync.
    pub fn resync(&self) -> Result<()> {
        let refuse = |what: &str| {
            Err(crate::Error::Resync {
                component: 0,
                what: what.to_owned(),
            })
        };
        if self.striped.info().read_only {
            return refuse("the volume is read-only: a resync would write");
        }
        if !self
            .striped
            .keeper()
            .is_some_and(crate::layers::mirror::metadata::Keeper::has_bitmap)
        {
            return refuse("only a mirror with metadata (VolumeBuilder::metadata) can resync");
        }
        if *self.resyncing.borrow() {
            return refuse("a resync is already running");
        }
        let targets: Vec<usize> = self
            .degraded()
            .into_iter()
            .filter(|&t| self.striped.readable(self.striped.partner(t)))
            .collect();
        if targets.is_empty() {
            return refuse("no degraded side with a partner in sync");
        }
        if let Some(k) = self.striped.keeper() {
            if targets.iter().any(|&t| !k.covers(t)) {
                k.set_all();
            }
        }
        self.start_resync(targets);
        Ok(())
    }

    /// Replaces mirror side `component` with `device` (a new disk for a dead one) and
    /// copies it whole from its partner, online: the side is dropped (recorded on its
    /// partner) before the swap, so nothing is read from the new device until it is in
    /// sync. Requests under way on the old device finish there. `device` must be at least
    /// as large as the one it replaces, with the same logical block size.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use bytes::Bytes;
    /// use tagstripe::striping::Flavor;
    /// use tagstripe::{BlockDevice, FaultDevice, IoOpts, MemDevice, SideStatus, Volume};
    /// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
    /// let dying = Arc::new(FaultDevice::new(MemDevice::new("old", 4096)));
    /// let v = Volume::builder([Arc::new(FaultDevice::new(MemDevice::new("a", 4096))), dying.clone()])
    ///     .flavor(Flavor::FreeBsd).no_offset(true).mirror(true).metadata(true).assume_clean(true)
    ///     .open().await?;
    /// v.write(0, Bytes::from(vec![3u8; 4096]), IoOpts::new()).await?;
    /// dying.kill();
    /// let new = Arc::new(MemDevice::new("new", 4096));
    /// v.replace(1, new.clone()).await?;
    /// v.wait_resync().await;
    /// assert_eq!(v.status(), [SideStatus::InSync, SideStatus::InSync]);
    /// assert_eq!(new.read(0, 8, IoOpts::new()).await?, vec![3u8; 4096]);
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::Resync`] without mirror metadata, for a component that is not there,
    /// whose partner is not in sync (it holds the only copy), while a resync runs, or for a
    /// device too small, of another block size or read-only; a failure to record the drop.
    pub async fn replace(&self, component: usize, device: Arc<dyn DynBlockDevice>) -> Result<()> {
        let refuse = |what: String| Err(crate::Error::Resync { component, what });
        if self.striped.info().read_only {
            return refuse("the volume is read-only: a replacement would be written".into());
        }
        let Some(slot) = self.slots.get(component) else {
            return refuse(if self.slots.is_empty() {
                "only a mirror with metadata (VolumeBuilder::metadata) can replace a side".into()
            } else {
                format!("the volume has {} components", self.slots.len())
            });
        };
        let (old, new) = (slot.info(), device.info());
        if new.sectors < old.sectors
            || new.limits.logical_block_size != old.limits.logical_block_size
            || new.read_only
        {
            return refuse(format!(
                "{} ({} sectors of {} bytes{}) cannot replace {} ({} sectors of {} bytes)",
                new.name,
                new.sectors,
                new.limits.logical_block_size,
                if new.read_only { ", read-only" } else { "" },
                old.name,
                old.sectors,
                old.limits.logical_block_size
            ));
        }
        if *self.resyncing.borrow() {
            return refuse("a resync is running; wait for it or stop it first".into());
        }
        let partner = self.striped.partner(component);
        let why = format!("replaced by {}", new.name);
        if partner == component || !self.striped.try_drop(component, partner, &why) {
            return refuse(format!(
                "its partner, component {}, is not in sync: it holds the only copy",
                self.striped.partner(component)
            ));
        }
        if let Some(k) = self.striped.keeper() {
            k.persist(&self.striped).await?;
        }
        let new_name = new.name.clone();
        let was = slot.replace(device);
        tracing::info!(
            target: "tagstripe::mirror",
            volume = %self.info().name,
            component,
            old = %was.info().name,
            new = %new_name,
            "mirror side replaced: copied whole from its partner"
        );
        if let Some(k) = self.striped.keeper() {
            k.set_all();
        }
        self.start_resync(vec![component]);
        Ok(())
    }

    /// Waits until no resync runs (at once if none does); see [`status`](Self::status)
    /// for how it ended.
    pub async fn wait_resync(&self) {
        let mut rx = self.resyncing.subscribe();
        let _ = rx.wait_for(|running| !*running).await;
    }

    /// Flushes the volume and, for a mirror with metadata in sync, clears the write-intent
    /// bitmap of every chunk with no write in flight (whatever the
    /// [`bitmap_delay`](VolumeBuilder::bitmap_delay)): a clean stop, after which the next
    /// open copies nothing. Call it when no more writes come.
    ///
    /// # Errors
    /// The flush's.
    pub async fn close(&self) -> Result<()> {
        if self.striped.info().read_only {
            // Nothing was written: nothing to make durable, no bitmap to clear.
            return Ok(());
        }
        let mark = self.striped.keeper().and_then(|k| k.flush_mark_of(None));
        self.flush(IoOpts::new()).await?;
        if let (Some(k), Some((epoch, chunks))) = (self.striped.keeper(), mark) {
            k.sweep(&self.striped, epoch, &chunks, true).await;
        }
        Ok(())
    }

    /// Stops a resync under way (as a crash would: the next open, or
    /// [`resync`](Self::resync), goes on from what the bitmap on disk says) and returns once
    /// its task has ended.
    pub async fn stop_resync(&self) {
        let task = self.resync_task.lock().take();
        if let Some(t) = task {
            t.abort();
            let _ = t.await;
        }
        self.resyncing.send_replace(false);
    }

    fn start_resync(&self, targets: Vec<usize>) {
        let s = Arc::clone(&self.striped);
        let clients = Arc::clone(&self.stats);
        let tx = self.resyncing.clone();
        tx.send_replace(true);
        let task = tokio::spawn(async move {
            if let Err(e) = crate::layers::mirror::resync::run(&s, &targets, &clients).await {
                crate::layers::mirror::resync::abandon(&s, &targets, &e).await;
            }
            tx.send_replace(false);
        });
        if let Some(old) = self.resync_task.lock().replace(task) {
            old.abort();
        }
    }

    /// The wrapped components (`Split<Queue<D>>`), in order.
    #[must_use]
    pub fn components(&self) -> &[Arc<dyn DynBlockDevice>] {
        self.striped.components()
    }

    /// A request's statistics, begun as it is made; [`Timing::end`] counts its result
    /// (see `timed!`).
    fn timing(&self) -> Timing<'_> {
        Timing {
            counted: self.stats.begin(),
            // tokio's clock, as the queues use: the two agree (also under a paused clock).
            times: Times::new(tokio::time::Instant::now()),
        }
    }
}

/// One request of a [`Volume`] being timed (see `Volume::timing`): its issue time is the
/// queues' submit time below, their last completion its end (see `crate::times`).
struct Timing<'a> {
    counted: crate::stats::InFlight<'a>,
    times: Times,
}

impl Timing<'_> {
    /// Counts the request's result `r` (of `bytes` bytes, `op` in `class`) and returns it.
    fn end<T>(
        self,
        op: OpKind,
        class: tagstripe_scheduler::IoClass,
        bytes: u64,
        r: Result<T>,
    ) -> Result<T> {
        let took = self
            .times
            .ended()
            .saturating_duration_since(self.times.issued());
        self.counted.end(op, class, bytes, took, r.is_ok());
        r
    }
}

/// `polled!(timing, FUTURE)`: awaits `FUTURE`, the request's future through the striped
/// layer, polled with the request's times (`Times::poll`); pinned in place, in the
/// enclosing future's state, not moved into a wrapper.
macro_rules! polled {
    ($t:ident, $fut:expr) => {{
        let mut fut = std::pin::pin!($fut);
        std::future::poll_fn(|cx| $t.times.poll(fut.as_mut(), cx)).await
    }};
}

/// A request of the volume: `timed!(self, OP, opts, BYTES, |striped| CALL)` runs `CALL` on
/// the volume's striped layer, timed and counted in the volume's statistics as `BYTES` of
/// `OP` in `opts`' class. An `async move` block, not an `async fn`, whose future keeps
/// room for its arguments twice (a server boxes a request's future whole), nor a wrapper
/// that takes the request's future by value (copied into its state and again into its
/// await).
macro_rules! timed {
    ($v:ident, $op:expr, $opts:ident, $bytes:expr, |$s:ident| $call:expr) => {
        async move {
            let bytes: u64 = $bytes;
            let mut t = $v.timing();
            let $s = &$v.striped;
            let r = polled!(t, $call);
            t.end($op, $opts.class, bytes, r)
        }
    };
}

#[expect(
    clippy::manual_async_fn,
    reason = "an async fn's future keeps its arguments twice (see `timed!`)"
)]
impl BlockDevice for Volume {
    fn info(&self) -> &DeviceInfo {
        self.striped.info()
    }

    // Each request an `async move` block through the striped layer (see `timed!`).
    fn read(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        timed!(self, OpKind::Read, opts, sectors.saturating_mul(512), |s| {
            s.read(start, sectors, opts)
        })
    }

    /// As [`read`](BlockDevice::read); a read of one piece is its component's
    /// `read_to_send`.
    fn read_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        timed!(self, OpKind::Read, opts, sectors.saturating_mul(512), |s| {
            s.read_to_send(start, sectors, opts)
        })
    }

    /// As [`read`](BlockDevice::read), each interleave unit as its component gives it.
    fn read_parts_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Vec<Bytes>>> + Send {
        timed!(self, OpKind::Read, opts, sectors.saturating_mul(512), |s| {
            s.read_parts_to_send(start, sectors, opts)
        })
    }

    fn read_into(
        &self,
        start: u64,
        buf: &mut [u8],
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        timed!(self, OpKind::Read, opts, buf.len() as u64, |s| {
            s.read_into(start, buf, opts)
        })
    }

    fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        timed!(
            self,
            OpKind::Read,
            opts,
            bufs.iter().map(|b| b.len() as u64).sum(),
            |s| s.read_vectored_into(start, bufs, opts)
        )
    }

    fn write(
        &self,
        start: u64,
        data: Bytes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        timed!(self, OpKind::Write, opts, data.len() as u64, |s| {
            s.write(start, data, opts)
        })
    }

    fn write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        timed!(
            self,
            OpKind::Write,
            opts,
            parts.iter().map(|p| p.len() as u64).sum(),
            |s| s.write_vectored(start, parts, opts)
        )
    }

    /// Where its striped layer does: every component writes from pipes, and no mirror.
    fn takes_piped_writes(&self) -> bool {
        self.striped.takes_piped_writes()
    }

    async fn write_piped(&self, start: u64, data: crate::Piped, opts: IoOpts) -> Result<()> {
        let bytes = data.len() as u64;
        let mut t = self.timing();
        let r = polled!(t, self.striped.write_piped(start, data, opts));
        t.end(OpKind::Write, opts.class, bytes, r)
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        let mut t = self.timing();
        let r = polled!(t, self.striped.flush(opts));
        t.end(OpKind::Flush, opts.class, 0, r)
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        let mut t = self.timing();
        let r = polled!(t, self.striped.write_zeroes(start, sectors, z, opts));
        t.end(OpKind::Write, opts.class, 0, r)
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        let mut t = self.timing();
        let r = polled!(t, self.striped.discard(start, sectors, opts));
        t.end(OpKind::Discard, opts.class, 0, r)
    }

    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        self.striped.allocation(start, sectors).await
    }
}
