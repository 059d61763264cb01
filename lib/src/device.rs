//! The `BlockDevice` trait every backend and layer implements.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe_quirks::{Identity, Limits};
use tagstripe_scheduler::{IoClass, TagKind};

use crate::{Error, Result};

/// How a device zeroes a range ([`BlockDevice::write_zeroes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Zeroing {
    /// Without moving data: `fallocate` on a file or block device, dropped pages in
    /// memory, the server's WRITE_ZEROES over NBD, a volume whose components all do.
    Native,
    /// By writing buffers of zeroes.
    #[default]
    Emulated,
}

/// What a device can do, in one place: each backend says what it has, the split layer
/// takes away what the quirk table forbids (`notrim`, FUA or the write cache off, a
/// `max_write_zeroes_sectors` of 0), and a volume has what all its components have.
///
/// ```
/// use tagstripe::{BlockDevice, MemDevice, Zeroing};
/// let caps = MemDevice::new("m", 64).caps();
/// assert!(caps.flush && caps.trim && caps.allocation && !caps.rotational);
/// assert_eq!(caps.zeroing, Zeroing::Native);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Caps {
    /// `flush` makes written data durable. False for an NBD export whose server offers no
    /// flush: its writes' durability is the server's affair, and a volume over it does not
    /// claim flush either.
    pub flush: bool,
    /// A FUA write is durable when it completes (natively or by a flush after it).
    pub fua: bool,
    /// Discard (trim) is supported; equal to `limits.max_discard_sectors > 0`.
    pub trim: bool,
    /// How ranges are zeroed.
    pub zeroing: Zeroing,
    /// A zeroing that must be fast (`Zeroes::fast_only`) can succeed.
    pub fast_zero: bool,
    /// [`BlockDevice::allocation`] knows holes from data (otherwise it calls everything
    /// data).
    pub allocation: bool,
    /// The medium seeks (a disk with heads).
    pub rotational: bool,
    /// Writes may sit in a volatile cache until a flush.
    pub write_cache: bool,
}

impl Default for Caps {
    /// What a device has unless it says otherwise: flush, FUA and trim, zeroes written as
    /// data, no allocation queries, not rotational, a volatile write cache.
    fn default() -> Self {
        Self {
            flush: true,
            fua: true,
            trim: true,
            zeroing: Zeroing::Emulated,
            fast_zero: false,
            allocation: false,
            rotational: false,
            write_cache: true,
        }
    }
}

impl Caps {
    /// What a volume over devices with `parts` has: each capability only if all have it
    /// (rotational if any is, a write cache if any has one).
    #[must_use]
    pub fn stack(parts: impl IntoIterator<Item = Caps>) -> Self {
        let mut all = Self {
            rotational: false,
            write_cache: false,
            zeroing: Zeroing::Native,
            fast_zero: true,
            allocation: true,
            ..Self::default()
        };
        for c in parts {
            all.flush &= c.flush;
            all.fua &= c.fua;
            all.trim &= c.trim;
            if c.zeroing == Zeroing::Emulated {
                all.zeroing = Zeroing::Emulated;
            }
            all.fast_zero &= c.fast_zero;
            all.allocation &= c.allocation;
            all.rotational |= c.rotational;
            all.write_cache |= c.write_cache;
        }
        all
    }
}

/// What a device is: its size, limits, identity and capabilities. Sizes in 512-byte
/// sectors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// A name for messages (a path, `mem0`, `volume`).
    pub name: String,
    /// Size in sectors.
    pub sectors: u64,
    /// The device's limits (Linux's meaning).
    pub limits: Limits,
    /// Vendor / model / revision, for quirk matching.
    pub identity: Identity,
    /// Refuses writes, flushes and discards.
    pub read_only: bool,
    /// What it can do. `caps.trim` is kept equal to `limits.max_discard_sectors > 0` (one
    /// meaning for 0 there: no discard); set both with [`DeviceInfo::set_discard`].
    pub caps: Caps,
    /// The physical device the data lives on, where known: a block device's own device
    /// number, or for a file the number of the device its filesystem is on (`st_rdev` /
    /// `st_dev`). A volume puts components with the same `media` behind one tagged queue
    /// ([`crate::Queue::group`]): they compete for one disk.
    pub media: Option<u64>,
    /// Bytes at the end of the device past its last whole block, which are never read or
    /// written: a file or an NBD export whose size is not a whole number of blocks (a
    /// 1,000,000-byte file is 1,953 sectors and 64 bytes). 0 for most devices.
    pub unused_tail_bytes: u64,
}

impl DeviceInfo {
    /// A writable device of `sectors` sectors with default limits, discard supported with
    /// no per-request cap (`max_discard_sectors` = `u32::MAX`).
    #[must_use]
    pub fn new(name: impl Into<String>, sectors: u64) -> Self {
        let mut limits = Limits::default();
        limits.max_discard_sectors = u32::MAX;
        Self {
            name: name.into(),
            sectors,
            limits,
            identity: Identity::default(),
            read_only: false,
            caps: Caps::default(),
            media: None,
            unused_tail_bytes: 0,
        }
    }

    /// Says whether discard is supported, keeping `caps.trim` and
    /// `limits.max_discard_sectors` in agreement (0 sectors: none; on, a cap already set is
    /// kept, else none is set).
    ///
    /// ```
    /// let mut i = tagstripe::DeviceInfo::new("d", 1024);
    /// i.set_discard(false);
    /// assert!(!i.caps.trim);
    /// assert_eq!(i.limits.max_discard_sectors, 0);
    /// ```
    pub fn set_discard(&mut self, on: bool) {
        self.caps.trim = on;
        self.limits.max_discard_sectors = match (on, self.limits.max_discard_sectors) {
            (false, _) => 0,
            (true, 0) => u32::MAX,
            (true, n) => n,
        };
    }

    /// Size in bytes.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.sectors.saturating_mul(512)
    }

    /// Sets the size from what the device holds, `bytes`, in whole logical blocks (set
    /// `limits.logical_block_size` first): a part block at the end goes to
    /// [`unused_tail_bytes`](Self::unused_tail_bytes), as no request can reach it.
    ///
    /// ```
    /// use tagstripe::DeviceInfo;
    /// let mut info = DeviceInfo::new("odd", 0);
    /// info.limits.logical_block_size = 4096;
    /// info.set_size_bytes(1_000_000);
    /// assert_eq!((info.sectors, info.unused_tail_bytes), (1952, 576));
    /// ```
    pub fn set_size_bytes(&mut self, bytes: u64) {
        let block = u64::from(self.limits.logical_block_size.max(512));
        self.sectors = bytes / block * block / 512;
        self.unused_tail_bytes = bytes % block;
    }

    /// Checks that `[start, start + sectors)` is inside the device and made of whole logical
    /// blocks, and not empty.
    ///
    /// # Errors
    /// [`Error::Overflow`], [`Error::OutOfRange`], [`Error::Misaligned`] or
    /// [`Error::BadLength`] for zero sectors.
    pub fn check(&self, start: u64, sectors: u64) -> Result<()> {
        let device = || self.name.clone();
        if sectors == 0 {
            return Err(Error::BadLength {
                device: device(),
                what: "zero-length request".to_owned(),
            });
        }
        let end = start.checked_add(sectors).ok_or_else(|| Error::Overflow {
            device: device(),
            start,
            sectors,
        })?;
        if end > self.sectors {
            return Err(Error::OutOfRange {
                device: device(),
                start,
                sectors,
                size: self.sectors,
            });
        }
        let lbs = self.limits.lbs_sectors();
        if start % lbs != 0 || sectors % lbs != 0 {
            return Err(Error::Misaligned {
                device: device(),
                start,
                sectors,
                lbs,
            });
        }
        Ok(())
    }

    /// Checks a write: writable, whole sectors, in range.
    ///
    /// # Errors
    /// As [`DeviceInfo::check`], and [`Error::ReadOnly`] / [`Error::BadLength`].
    pub fn check_write(&self, start: u64, len: usize) -> Result<u64> {
        if self.read_only {
            return Err(Error::ReadOnly {
                device: self.name.clone(),
            });
        }
        if len % 512 != 0 {
            return Err(Error::BadLength {
                device: self.name.clone(),
                what: format!("{len} bytes is not a whole number of sectors"),
            });
        }
        let sectors = len as u64 / 512;
        self.check(start, sectors)?;
        Ok(sectors)
    }
}

impl DeviceInfo {
    /// Checks a discard: writable, supported, in range.
    ///
    /// # Errors
    /// As [`DeviceInfo::check`], and [`Error::ReadOnly`] / [`Error::Unsupported`].
    pub fn check_discard(&self, start: u64, sectors: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly {
                device: self.name.clone(),
            });
        }
        if !self.caps.trim {
            return Err(Error::Unsupported {
                device: self.name.clone(),
                op: "discard",
            });
        }
        self.check(start, sectors)
    }
}

/// The sectors a buffer of `len` bytes holds, or [`Error::BadLength`].
pub(crate) fn sectors_of(info: &DeviceInfo, len: usize) -> Result<u64> {
    if len % 512 != 0 {
        return Err(Error::BadLength {
            device: info.name.clone(),
            what: format!("{len} bytes is not a whole number of sectors"),
        });
    }
    Ok(len as u64 / 512)
}

/// How a request is to be treated: its I/O class, its tag kind, and forced unit access.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoOpts {
    /// Class, for the tagged queue's fairness.
    pub class: IoClass,
    /// Tag kind (ordered: a barrier; head-of-queue: next).
    pub kind: TagKind,
    /// The write is durable when it completes.
    pub fua: bool,
}

impl IoOpts {
    /// Best-effort, simple tag, no FUA.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The same with another class.
    #[must_use]
    pub fn class(mut self, class: IoClass) -> Self {
        self.class = class;
        self
    }

    /// The same with FUA.
    #[must_use]
    pub fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }
}

/// A block device: a backend, a layer over one, or a whole volume. Sectors are 512 bytes;
/// requests must be whole logical blocks inside the device. Implementations are `Send +
/// Sync`; every one is also a [`DynBlockDevice`], so it can be shared as
/// `Arc<dyn DynBlockDevice>` (which is a `BlockDevice` again).
///
/// The methods return `impl Future`: a layer's future holds the future of the device under
/// it inline, so a stack of layers over one device costs no allocation a request; the only
/// boxing is where a stack is erased to `dyn DynBlockDevice` (a volume's component, say).
/// Implement the methods with `async fn`:
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, DeviceInfo, IoOpts, MemDevice, Result};
///
/// /// Counts the writes that reach the device under it.
/// #[derive(Debug)]
/// struct Counted<D> {
///     inner: D,
///     writes: std::sync::atomic::AtomicU64,
/// }
///
/// impl<D: BlockDevice> BlockDevice for Counted<D> {
///     fn info(&self) -> &DeviceInfo {
///         self.inner.info()
///     }
///     async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
///         self.inner.read(start, sectors, opts).await
///     }
///     async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
///         self.inner.read_into(start, buf, opts).await
///     }
///     async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
///         self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         self.inner.write(start, data, opts).await
///     }
///     async fn flush(&self, opts: IoOpts) -> Result<()> {
///         self.inner.flush(opts).await
///     }
///     async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
///         self.inner.discard(start, sectors, opts).await
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let d = Counted { inner: MemDevice::new("m", 64), writes: Default::default() };
/// d.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new()).await?;
/// assert_eq!(d.read(0, 8, IoOpts::new()).await?[0], 1);
/// assert_eq!(d.writes.into_inner(), 1);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
///
/// Contract: a request that fails validation returns an error and touches nothing; `write`
/// returns `Ok` only once the data is written (durably if `opts.fua`); `flush` makes every
/// completed write durable; after `discard`, the sectors read as zeroes on the backends here.
/// A request split into pieces returns only when every piece has finished, even when one
/// fails. Dropping a request's future before it completes leaves its outcome undefined:
/// I/O already handed to the operating system may still land.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Size, limits and identity.
    fn info(&self) -> &DeviceInfo;

    /// What the device can do ([`Caps`]): its info's.
    fn caps(&self) -> Caps {
        self.info().caps
    }

    /// Reads `sectors` sectors from `start`.
    fn read(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send;

    /// Reads `buf.len()` bytes (whole sectors) from `start` into `buf`: the path with no
    /// allocation, for callers that reuse buffers. The default reads and copies; backends
    /// and layers that can fill `buf` directly do.
    fn read_into(
        &self,
        start: u64,
        buf: &mut [u8],
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        async move {
            let sectors = sectors_of(self.info(), buf.len())?;
            let data = self.read(start, sectors, opts).await?;
            buf.copy_from_slice(&data);
            Ok(())
        }
    }

    /// Reads the run of sectors from `start` into `bufs`, one after the other: a scattered
    /// read (`preadv`), each buffer whole sectors. A striped volume reads the interleave units
    /// of a request that lie back to back on one component this way: one command a
    /// component, not one a unit. The default reads the run as one request
    /// ([`read`](Self::read)) and copies it into the buffers, as `read_into`'s default copies.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let d = MemDevice::new("m", 64);
    /// d.write(0, Bytes::from((0..8u8).flat_map(|i| [i; 512]).collect::<Vec<u8>>()), IoOpts::new()).await?;
    /// let (mut a, mut b) = (vec![0u8; 1024], vec![0u8; 512]);
    /// d.read_vectored_into(5, vec![&mut a, &mut b], IoOpts::new()).await?;
    /// assert_eq!((a[0], a[600], b[0]), (5, 6, 7));
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        async move {
            let sectors = check_bufs(self.info(), start, &bufs)?;
            let len = sectors as usize * 512;
            let data = self.read(start, sectors, opts).await?;
            let mut at = 0;
            for b in bufs {
                let n = b.len();
                b.copy_from_slice(data.get(at..at + n).ok_or_else(|| Error::BadLength {
                    device: self.info().name.clone(),
                    what: format!("read returned {} bytes, {len} asked", data.len()),
                })?);
                at += n;
            }
            Ok(())
        }
    }

    /// Writes `data` (whole sectors) at `start`.
    fn write(
        &self,
        start: u64,
        data: Bytes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Writes `parts`, one after the other, as one run of sectors from `start`: a gathered
    /// write (`pwritev`). Each part is whole sectors. A striped volume sends the interleave
    /// units of a request that lie back to back on one component this way, so the component
    /// gets one command where it would get one a unit (as the Linux block layer merges
    /// adjacent bios into one request). The default copies the parts into one buffer and
    /// writes that (one command either way: a device under a tagged queue is never sent more
    /// commands than the queue gave tags); layers pass the parts down whole, the io_uring
    /// backend sends them as one `IORING_OP_WRITEV` and the file backend as one trip to its
    /// thread pool, neither copying.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let d = MemDevice::new("m", 64);
    /// let parts = vec![Bytes::from(vec![1u8; 1024]), Bytes::from(vec![2u8; 512])];
    /// d.write_vectored(4, parts, IoOpts::new()).await?;
    /// let back = d.read(4, 3, IoOpts::new()).await?;
    /// assert!(back[..1024].iter().all(|&b| b == 1) && back[1024..].iter().all(|&b| b == 2));
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    fn write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        write_parts(self, start, parts, opts)
    }

    /// Makes completed writes durable.
    fn flush(&self, opts: IoOpts) -> impl Future<Output = Result<()>> + Send;

    /// Discards `sectors` sectors from `start`.
    fn discard(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Makes `sectors` sectors from `start` read as zeroes. With `z.unmap` the device may
    /// deallocate them (punch a hole); with `z.fast_only` it must not fall back to writing
    /// zeroes, and refuses with [`Error::Unsupported`] instead (NBD's `FAST_ZERO`). Backends
    /// zero natively (files and block devices: `fallocate` zero-range or punch-hole; memory:
    /// in place; NBD: `WRITE_ZEROES`); the default writes zero buffers, which is not fast.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice, Zeroes};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let d = MemDevice::new("m", 64);
    /// d.write(0, Bytes::from(vec![7u8; 4096]), IoOpts::new()).await?;
    /// d.write_zeroes(2, 4, Zeroes::new().fast_only(true), IoOpts::new()).await?;
    /// let back = d.read(0, 8, IoOpts::new()).await?;
    /// assert!(back[1024..3072].iter().all(|&b| b == 0) && back[..1024].iter().all(|&b| b == 7));
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: Zeroes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        write_zero_buffers(self, start, sectors, z, opts)
    }

    /// Which parts of `[start, start + sectors)` hold data and which are holes or read as
    /// zeroes: the extents, in order, covering exactly the range (NBD's `base:allocation`,
    /// `SEEK_DATA`/`SEEK_HOLE`). A hint, never a promise of content beyond what it says: an
    /// extent marked `zero` reads as zeroes; one marked data may hold anything. Files ask the
    /// filesystem (`lseek` `SEEK_DATA`/`SEEK_HOLE`), memory scans for zero blocks, volumes
    /// map the range to their components and ask each; the default reports it all as data.
    /// The range is checked as for a read.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, Extent, IoOpts, MemDevice};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let d = MemDevice::new("m", 1024);
    /// d.write(8, Bytes::from(vec![1u8; 4096]), IoOpts::new()).await?;
    /// assert_eq!(
    ///     d.allocation(0, 64).await?,
    ///     [Extent::hole(8), Extent::data(8), Extent::hole(48)]
    /// );
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    fn allocation(
        &self,
        start: u64,
        sectors: u64,
    ) -> impl Future<Output = Result<Vec<Extent>>> + Send {
        async move {
            self.info().check(start, sectors)?;
            Ok(vec![Extent::data(sectors)])
        }
    }
}

/// A run of sectors in one allocation state, as [`BlockDevice::allocation`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Length in sectors (never 0).
    pub sectors: u64,
    /// Not allocated on the backing store (NBD's `NBD_STATE_HOLE`).
    pub hole: bool,
    /// Reads as zeroes (NBD's `NBD_STATE_ZERO`).
    pub zero: bool,
}

impl Extent {
    /// Allocated data.
    #[must_use]
    pub fn data(sectors: u64) -> Self {
        Self {
            sectors,
            hole: false,
            zero: false,
        }
    }

    /// A hole that reads as zeroes.
    #[must_use]
    pub fn hole(sectors: u64) -> Self {
        Self {
            sectors,
            hole: true,
            zero: true,
        }
    }

    /// Allocated, and reads as zeroes.
    #[must_use]
    pub fn zero(sectors: u64) -> Self {
        Self {
            sectors,
            hole: false,
            zero: true,
        }
    }

    /// Whether two extents have the same state.
    #[must_use]
    pub fn same_state(&self, other: &Self) -> bool {
        self.hole == other.hole && self.zero == other.zero
    }
}

/// Appends `e` to `out`, merging it into the last extent if their states match; empty
/// extents are dropped.
pub(crate) fn push_extent(out: &mut Vec<Extent>, e: Extent) {
    if e.sectors == 0 {
        return;
    }
    match out.last_mut() {
        Some(last) if last.same_state(&e) => last.sectors += e.sectors,
        _ => out.push(e),
    }
}

/// How [`BlockDevice::write_zeroes`] may zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Zeroes {
    /// The sectors may be deallocated (a hole that reads as zeroes).
    pub unmap: bool,
    /// Fail with [`Error::Unsupported`] rather than write zeroes the slow way.
    pub fast_only: bool,
}

impl Zeroes {
    /// Zero in place, falling back to writing zeroes.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// May deallocate.
    #[must_use]
    pub fn unmap(mut self, on: bool) -> Self {
        self.unmap = on;
        self
    }

    /// Only if fast.
    #[must_use]
    pub fn fast_only(mut self, on: bool) -> Self {
        self.fast_only = on;
        self
    }
}

/// Zero buffers for the emulated path, written in pieces of this size.
static ZERO_BUF: [u8; 1 << 20] = [0u8; 1 << 20];

/// Zeroes by writing zero buffers (1 MiB pieces, whole logical blocks), or refuses with
/// [`Error::Unsupported`] if only a fast way would do.
pub(crate) async fn write_zero_buffers<D: BlockDevice + ?Sized>(
    dev: &D,
    start: u64,
    sectors: u64,
    z: Zeroes,
    opts: IoOpts,
) -> Result<()> {
    check_zeroes(dev.info(), start, sectors)?;
    if z.fast_only {
        return Err(Error::Unsupported {
            device: dev.info().name.clone(),
            op: "fast write-zeroes",
        });
    }
    let lbs = u64::from(dev.info().limits.logical_block_size / 512).max(1);
    let step = (ZERO_BUF.len() as u64 / 512) / lbs * lbs;
    let mut at = 0;
    while at < sectors {
        let n = step.min(sectors - at);
        let piece = Bytes::from_static(&ZERO_BUF[..n as usize * 512]);
        dev.write(start + at, piece, opts).await?;
        at += n;
    }
    Ok(())
}

/// Checks a write-zeroes request like a write of that many sectors.
pub(crate) fn check_zeroes(info: &DeviceInfo, start: u64, sectors: u64) -> Result<()> {
    let bytes = sectors
        .checked_mul(512)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::Overflow {
            device: info.name.clone(),
            start,
            sectors,
        })?;
    info.check_write(start, bytes).map(|_| ())
}

/// The bytes of a gathered write (`parts` one after the other), checked as a write of that
/// length at `start`: its sectors.
pub(crate) fn check_parts(info: &DeviceInfo, start: u64, parts: &[Bytes]) -> Result<u64> {
    for p in parts {
        sectors_of(info, p.len())?;
    }
    info.check_write(start, parts.iter().map(Bytes::len).sum())
}

/// The buffers of a scattered read (`bufs` one after the other), checked as a read of
/// that length at `start`: its sectors.
pub(crate) fn check_bufs(info: &DeviceInfo, start: u64, bufs: &[&mut [u8]]) -> Result<u64> {
    for b in bufs {
        sectors_of(info, b.len())?;
    }
    let sectors = sectors_of(info, bufs.iter().map(|b| b.len()).sum())?;
    info.check(start, sectors)?;
    Ok(sectors)
}

/// [`BlockDevice::write_vectored`]'s default: the parts copied into one buffer, written as
/// one request.
pub(crate) async fn write_parts<D: BlockDevice + ?Sized>(
    dev: &D,
    start: u64,
    mut parts: Vec<Bytes>,
    opts: IoOpts,
) -> Result<()> {
    let sectors = check_parts(dev.info(), start, &parts)?;
    if parts.len() == 1 {
        let data = parts.pop().unwrap_or_default();
        return dev.write(start, data, opts).await;
    }
    let mut whole = Vec::with_capacity(sectors as usize * 512);
    for p in &parts {
        whole.extend_from_slice(p);
    }
    dev.write(start, Bytes::from(whole), opts).await
}

/// The bytes `[from, from + len)` of `parts` taken one after the other, as slices of them
/// (no copy): how a gathered write is cut into pieces.
pub(crate) fn slice_parts(parts: &[Bytes], from: usize, len: usize) -> Vec<Bytes> {
    let end = from + len;
    let mut out = Vec::new();
    if len == 0 {
        return out;
    }
    let mut at = 0;
    for p in parts {
        let (lo, hi) = (at, at + p.len());
        at = hi;
        if hi <= from || p.is_empty() {
            continue;
        }
        if lo >= end {
            break;
        }
        out.push(p.slice(from.max(lo) - lo..end.min(hi) - lo));
    }
    out
}

/// A boxed future, as [`DynBlockDevice`]'s methods return.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The object-safe form of [`BlockDevice`], for devices of different types behind one
/// pointer: `Arc<dyn DynBlockDevice>`. Every `BlockDevice` is one (a blanket impl boxes each
/// request's future once), and `dyn DynBlockDevice` is a `BlockDevice` again, so layers and
/// volumes take either. Implement [`BlockDevice`], never this; call `BlockDevice`'s methods,
/// never these.
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, DynBlockDevice, FaultDevice, IoOpts, MemDevice};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let devs: Vec<Arc<dyn DynBlockDevice>> = vec![
///     Arc::new(MemDevice::new("m", 64)),
///     Arc::new(FaultDevice::new(MemDevice::new("f", 64))),
/// ];
/// for d in &devs {
///     d.write(0, Bytes::from(vec![3u8; 512]), IoOpts::new()).await?;
///     assert_eq!(d.read(0, 1, IoOpts::new()).await?[0], 3);
/// }
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
pub trait DynBlockDevice: Send + Sync + std::fmt::Debug {
    /// [`BlockDevice::info`].
    fn erased_info(&self) -> &DeviceInfo;
    /// [`BlockDevice::caps`].
    fn erased_caps(&self) -> Caps;
    /// [`BlockDevice::read`].
    fn erased_read(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, Bytes>;
    /// [`BlockDevice::read_into`].
    fn erased_read_into<'a>(
        &'a self,
        start: u64,
        buf: &'a mut [u8],
        opts: IoOpts,
    ) -> BoxFuture<'a, ()>;
    /// [`BlockDevice::read_vectored_into`].
    fn erased_read_vectored_into<'a>(
        &'a self,
        start: u64,
        bufs: Vec<&'a mut [u8]>,
        opts: IoOpts,
    ) -> BoxFuture<'a, ()>;
    /// [`BlockDevice::write`].
    fn erased_write(&self, start: u64, data: Bytes, opts: IoOpts) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::write_vectored`].
    fn erased_write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::flush`].
    fn erased_flush(&self, opts: IoOpts) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::discard`].
    fn erased_discard(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::write_zeroes`].
    fn erased_write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: Zeroes,
        opts: IoOpts,
    ) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::allocation`].
    fn erased_allocation(&self, start: u64, sectors: u64) -> BoxFuture<'_, Vec<Extent>>;
}

impl<D: BlockDevice> DynBlockDevice for D {
    fn erased_info(&self) -> &DeviceInfo {
        self.info()
    }
    fn erased_caps(&self) -> Caps {
        self.caps()
    }
    fn erased_read(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, Bytes> {
        Box::pin(self.read(start, sectors, opts))
    }
    fn erased_read_into<'a>(
        &'a self,
        start: u64,
        buf: &'a mut [u8],
        opts: IoOpts,
    ) -> BoxFuture<'a, ()> {
        Box::pin(self.read_into(start, buf, opts))
    }
    fn erased_read_vectored_into<'a>(
        &'a self,
        start: u64,
        bufs: Vec<&'a mut [u8]>,
        opts: IoOpts,
    ) -> BoxFuture<'a, ()> {
        Box::pin(self.read_vectored_into(start, bufs, opts))
    }
    fn erased_write(&self, start: u64, data: Bytes, opts: IoOpts) -> BoxFuture<'_, ()> {
        Box::pin(self.write(start, data, opts))
    }
    fn erased_write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> BoxFuture<'_, ()> {
        Box::pin(self.write_vectored(start, parts, opts))
    }
    fn erased_flush(&self, opts: IoOpts) -> BoxFuture<'_, ()> {
        Box::pin(self.flush(opts))
    }
    fn erased_discard(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, ()> {
        Box::pin(self.discard(start, sectors, opts))
    }
    fn erased_write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: Zeroes,
        opts: IoOpts,
    ) -> BoxFuture<'_, ()> {
        Box::pin(self.write_zeroes(start, sectors, z, opts))
    }
    fn erased_allocation(&self, start: u64, sectors: u64) -> BoxFuture<'_, Vec<Extent>> {
        Box::pin(self.allocation(start, sectors))
    }
}

/// An erased device is a device: each request costs the one boxed future the erasure needs.
impl BlockDevice for dyn DynBlockDevice + '_ {
    fn info(&self) -> &DeviceInfo {
        self.erased_info()
    }
    fn caps(&self) -> Caps {
        self.erased_caps()
    }
    fn read(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        self.erased_read(start, sectors, opts)
    }
    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        // The boxed future lives as long as the shorter of `self` and `buf`; the `async fn`
        // (no allocation) names both.
        self.erased_read_into(start, buf, opts).await
    }
    async fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> Result<()> {
        self.erased_read_vectored_into(start, bufs, opts).await
    }
    fn write(
        &self,
        start: u64,
        data: Bytes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        self.erased_write(start, data, opts)
    }
    fn write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        self.erased_write_vectored(start, parts, opts)
    }
    fn flush(&self, opts: IoOpts) -> impl Future<Output = Result<()>> + Send {
        self.erased_flush(opts)
    }
    fn discard(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        self.erased_discard(start, sectors, opts)
    }
    fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: Zeroes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        self.erased_write_zeroes(start, sectors, z, opts)
    }
    fn allocation(
        &self,
        start: u64,
        sectors: u64,
    ) -> impl Future<Output = Result<Vec<Extent>>> + Send {
        self.erased_allocation(start, sectors)
    }
}

/// An `Arc` of a device is that device, at no cost: each method hands back the inner
/// device's future as it is.
impl<D: BlockDevice + ?Sized> BlockDevice for Arc<D> {
    fn info(&self) -> &DeviceInfo {
        (**self).info()
    }
    fn caps(&self) -> Caps {
        (**self).caps()
    }
    fn read(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        (**self).read(start, sectors, opts)
    }
    fn read_into(
        &self,
        start: u64,
        buf: &mut [u8],
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).read_into(start, buf, opts)
    }
    fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).read_vectored_into(start, bufs, opts)
    }
    fn write(
        &self,
        start: u64,
        data: Bytes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).write(start, data, opts)
    }
    fn write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).write_vectored(start, parts, opts)
    }
    fn flush(&self, opts: IoOpts) -> impl Future<Output = Result<()>> + Send {
        (**self).flush(opts)
    }
    fn discard(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).discard(start, sectors, opts)
    }
    fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: Zeroes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).write_zeroes(start, sectors, z, opts)
    }
    fn allocation(
        &self,
        start: u64,
        sectors: u64,
    ) -> impl Future<Output = Result<Vec<Extent>>> + Send {
        (**self).allocation(start, sectors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_parts_takes_any_byte_range_across_parts() {
        let parts: Vec<Bytes> = [3usize, 0, 5, 2]
            .iter()
            .scan(0u8, |next, &n| {
                let b: Vec<u8> = (0..n).map(|i| *next + i as u8).collect();
                *next += n as u8;
                Some(Bytes::from(b))
            })
            .collect();
        let flat: Vec<u8> = (0..10).collect();
        for from in 0..=10 {
            for len in 0..=10 - from {
                let got = slice_parts(&parts, from, len);
                assert!(got.iter().all(|p| !p.is_empty()), "no empty slices");
                assert_eq!(got.concat(), &flat[from..from + len], "{from}+{len}");
            }
        }
        assert_eq!(
            slice_parts(&parts, 3, 5).len(),
            1,
            "inside one part: one slice"
        );
    }
}

/// Runs every piece of a request to the end, then reports the first error. Never returns
/// while a piece is still running: a piece abandoned at the first error could still land
/// after a later request (a discard zeroing a newer write), which would break ordering.
pub(crate) async fn all<T, F>(pieces: impl IntoIterator<Item = F>) -> Result<Vec<T>>
where
    F: Future<Output = Result<T>>,
{
    futures_util::future::join_all(pieces)
        .await
        .into_iter()
        .collect()
}
