//! A file backend: positional I/O on the blocking pool, optionally `O_DIRECT`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::{BlockDevice, DeviceInfo, Error, IoOpts, Result};

/// A zeroed buffer of `len` bytes for a read, aligned if `direct`.
pub(crate) fn read_buffer(len: usize, direct: bool) -> (Vec<u8>, usize) {
    if direct {
        aligned(len)
    } else {
        (vec![0u8; len], 0)
    }
}

/// A copy of `data` in memory aligned for `O_DIRECT` (to 4096 bytes, which every device
/// accepts): writing it through a file or block device opened with
/// [`FileOptions::direct`] hands it to the kernel as it is, where a buffer from the heap
/// (whose large allocations start just past a page boundary) is copied to an aligned one
/// first, on every write. A load generator or server that writes the same buffer
/// repeatedly builds it once with this.
///
/// ```
/// let b = tagstripe::aligned_bytes(&[7u8; 8192]);
/// assert_eq!(b.as_ptr() as usize % 4096, 0);
/// assert_eq!(&b[..], &[7u8; 8192][..]);
/// ```
#[must_use]
pub fn aligned_bytes(data: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(data.len() + DIRECT_ALIGN);
    let off = align_gap(v.as_ptr());
    // Only the alignment room is zeroed: the data is copied, not written twice.
    v.resize(off, 0);
    v.extend_from_slice(data);
    // Filled to its capacity, the vector becomes `Bytes` without being reallocated (so
    // without moving off its alignment).
    v.resize(v.capacity(), 0);
    Bytes::from(v).slice(off..off + data.len())
}

/// Bytes from `p` to the next `O_DIRECT`-aligned address (0 if it is aligned).
pub(crate) fn align_gap(p: *const u8) -> usize {
    (DIRECT_ALIGN - p as usize % DIRECT_ALIGN) % DIRECT_ALIGN
}

/// Whether `data` must be copied to an aligned buffer before an `O_DIRECT` write.
pub(crate) fn needs_copy(data: &Bytes, direct: bool) -> bool {
    direct && data.as_ptr() as usize % DIRECT_ALIGN != 0
}

/// Whether a gathered write's `parts` must be gathered into one buffer before they go to
/// a device opened `O_DIRECT` with logical blocks of `lbs` bytes: a part that is not
/// aligned in memory, or not whole logical blocks, cannot go as it is (`EINVAL`), though
/// the write as a whole may be aligned.
pub(crate) fn direct_needs_one_buffer(parts: &[Bytes], lbs: usize) -> bool {
    parts
        .iter()
        .any(|p| needs_copy(p, true) || p.len() % lbs.max(1) != 0)
}

/// Alignment of `O_DIRECT` buffers: a page, which every device here accepts
/// (measured here: 512 as the DMA alignment, 4 KiB as the largest
/// logical block).
const DIRECT_ALIGN: usize = 4096;

/// How to open a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Bypass the page cache (`O_DIRECT`); buffers are aligned for it.
    pub direct: bool,
    /// Open read-only.
    pub read_only: bool,
    /// Logical block size in bytes (default 512); requests must be whole blocks.
    pub logical_block_size: u32,
}

/// A device backed by a regular file (or anything `pread`/`pwrite` work on). Requests run
/// as positional reads and writes on tokio's blocking pool, with no lock shared between
/// them; `flush` is `fdatasync`; a FUA write is followed by `fdatasync` before it completes;
/// discard punches a hole (reads return zeroes after it).
#[derive(Debug)]
pub struct FileDevice {
    info: DeviceInfo,
    file: Arc<File>,
    direct: bool,
    /// Its pages mapped for [`BlockDevice::read_to_send`] (not with `O_DIRECT`).
    mapped: super::mapped::LazyMapped,
    /// Its pages mapped writable for [`BlockDevice::write_landing`] (a file in memory).
    landing: crate::landing::LazyWritable,
}

impl FileDevice {
    /// What this device tells its writable mapping about itself (see `landing`).
    fn lender(&self) -> crate::landing::Lender<'_> {
        crate::landing::Lender {
            file: &self.file,
            sectors: self.info.sectors,
            read_only: self.info.read_only,
            direct: self.direct,
        }
    }

    /// Opens `path` with its current size (rounded down to whole logical blocks).
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be opened, [`Error::BadLength`] if it holds no whole
    /// block, [`Error::Limits`] for an invalid block size.
    pub fn open(path: impl AsRef<Path>, opts: FileOptions) -> Result<Self> {
        let (file, name) = open_with(path.as_ref(), opts)?;
        let io_err = |op, source| open_error(&name, op, source);
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        let len = meta.len();
        let mut info = DeviceInfo::new(name.clone(), 0);
        info.media = Some(std::os::unix::fs::MetadataExt::dev(&meta));
        info.limits.logical_block_size = if opts.logical_block_size == 0 {
            512
        } else {
            opts.logical_block_size
        };
        info.limits = info.limits.validate()?;
        info.set_size_bytes(len);
        info.read_only = opts.read_only;
        // A regular file: fallocate zeroes and punches, SEEK_DATA/SEEK_HOLE tell holes,
        // the page cache (or the disk's cache under O_DIRECT) holds writes until fdatasync.
        info.caps.zeroing = crate::Zeroing::Native;
        info.caps.fast_zero = true;
        info.caps.allocation = true;
        if info.sectors == 0 {
            return Err(Error::BadLength {
                device: name,
                what: format!(
                    "{len} bytes hold no whole {}-byte block",
                    info.limits.logical_block_size
                ),
            });
        }
        Ok(Self {
            info,
            file: Arc::new(file),
            direct: opts.direct,
            mapped: super::mapped::LazyMapped::default(),
            landing: crate::landing::LazyWritable::default(),
        })
    }

    /// Opens a Linux block device: size and sector sizes by ioctl (`BLKGETSIZE64`,
    /// `BLKSSZGET`, `BLKPBSZGET`), limits from `/sys/dev/block/MAJ:MIN/queue/*`, identity from
    /// `.../device/{vendor,model,rev}` where present. I/O is the same positional I/O as for
    /// files, `O_DIRECT` if asked.
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be opened or is not a block device, [`Error::Limits`] if
    /// what the kernel reports does not validate.
    pub fn open_block(path: impl AsRef<Path>, opts: FileOptions) -> Result<Self> {
        use std::os::unix::fs::FileTypeExt;
        let (file, name) = open_with(path.as_ref(), opts)?;
        let io_err = |op, source| open_error(&name, op, source);
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        if !meta.file_type().is_block_device() {
            return Err(io_err(
                "open",
                io::Error::new(io::ErrorKind::InvalidInput, "not a block device"),
            ));
        }
        let bytes = blk_size(&file).map_err(|e| io_err("BLKGETSIZE64", e))?;
        let lbs = blk_int(&file, libc::BLKSSZGET).map_err(|e| io_err("BLKSSZGET", e))?;
        let pbs = blk_int(&file, libc::BLKPBSZGET).map_err(|e| io_err("BLKPBSZGET", e))?;
        let sys = sysfs_dir(&meta);
        let mut info = DeviceInfo::new(name, bytes / 512);
        info.media = Some(std::os::unix::fs::MetadataExt::rdev(&meta));
        info.limits = sysfs_limits(&sys.join("queue"), lbs, pbs);
        info.limits = info.limits.validate()?;
        info.identity = tagstripe_quirks::Identity::new(
            &read_trim(&sys.join("device/vendor")),
            &read_trim(&sys.join("device/model")),
            &read_trim(&sys.join("device/rev")),
        );
        info.read_only = opts.read_only;
        info.caps.trim = info.limits.max_discard_sectors > 0;
        // fallocate zeroes a block device's range (the kernel writes zeroes if the device
        // has no WRITE ZEROES: fast only if it has).
        info.caps.zeroing = crate::Zeroing::Native;
        info.caps.fast_zero = info.limits.max_write_zeroes_sectors > 0;
        info.caps.rotational = read_trim(&sys.join("queue/rotational")) == "1";
        info.caps.write_cache = read_trim(&sys.join("queue/write_cache")) != "write through";
        Ok(Self {
            info,
            file: Arc::new(file),
            direct: opts.direct,
            mapped: super::mapped::LazyMapped::default(),
            landing: crate::landing::LazyWritable::default(),
        })
    }

    /// Creates (or truncates) `path` with `sectors` sectors and opens it.
    ///
    /// # Errors
    /// As [`FileDevice::open`].
    pub fn create(path: impl AsRef<Path>, sectors: u64, opts: FileOptions) -> Result<Self> {
        let path = path.as_ref();
        let f = File::create(path).map_err(|e| Error::Io {
            device: path.display().to_string(),
            op: "create",
            start: 0,
            sectors,
            source: e,
        })?;
        f.set_len(sectors.saturating_mul(512))
            .map_err(|e| Error::Io {
                device: path.display().to_string(),
                op: "truncate",
                start: 0,
                sectors,
                source: e,
            })?;
        drop(f);
        Self::open(path, opts)
    }

    /// The open file, for a backend that drives it another way (io_uring).
    #[cfg(feature = "uring")]
    pub(crate) fn into_file(self) -> io::Result<File> {
        Arc::try_unwrap(self.file).or_else(|shared| shared.try_clone())
    }

    fn err(&self, op: &'static str, start: u64, sectors: u64, source: io::Error) -> Error {
        Error::Io {
            device: self.info.name.clone(),
            op,
            start,
            sectors,
            source,
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        start: u64,
        sectors: u64,
        f: impl FnOnce(&File) -> io::Result<T> + Send + 'static,
    ) -> Result<T> {
        let file = Arc::clone(&self.file);
        match tokio::task::spawn_blocking(move || f(&file)).await {
            Ok(r) => r.map_err(|e| self.err(op, start, sectors, e)),
            Err(join) => Err(self.err(op, start, sectors, io::Error::other(join.to_string()))),
        }
    }
}

fn open_error(name: &str, op: &'static str, source: io::Error) -> Error {
    Error::Io {
        device: name.to_owned(),
        op,
        start: 0,
        sectors: 0,
        source,
    }
}

/// Opens `path` read-write (or read-only), with `O_DIRECT` if asked; returns it and its name.
fn open_with(path: &Path, opts: FileOptions) -> Result<(File, String)> {
    let name = path.display().to_string();
    let mut o = OpenOptions::new();
    o.read(true).write(!opts.read_only);
    if opts.direct {
        o.custom_flags(libc::O_DIRECT);
    }
    let file = o.open(path).map_err(|e| open_error(&name, "open", e))?;
    Ok((file, name))
}

/// A zeroed buffer of `len` bytes whose start is aligned for `O_DIRECT`, as a `Vec` and the
/// offset of the aligned part (no `unsafe`: over-allocate and skip to the boundary).
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + DIRECT_ALIGN];
    let off = align_gap(v.as_ptr());
    (v, off)
}

impl BlockDevice for FileDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    async fn read(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<Bytes> {
        self.info.check(start, sectors)?;
        let (offset, len) = (start * 512, sectors as usize * 512);
        let direct = self.direct;
        self.blocking("read", start, sectors, move |f| {
            let (mut v, off) = read_buffer(len, direct);
            f.read_exact_at(&mut v[off..off + len], offset)?;
            Ok(Bytes::from(v).slice(off..off + len))
        })
        .await
    }

    /// A view of the page cache where the whole range is cached (see
    /// [`BlockDevice::read_to_send`]); else a read.
    async fn read_to_send(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        // A range past the end is no view (the mapping is the device's size): `read` refuses it.
        if !self.direct {
            if let Some(b) = self.mapped.cached(&self.file, &self.info, start, sectors) {
                return Ok(b);
            }
        }
        self.read(start, sectors, opts).await
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        let offset = start * 512;
        let copy = needs_copy(&data, self.direct);
        self.blocking("write", start, sectors, move |f| {
            let data = if copy { aligned_bytes(&data) } else { data };
            f.write_all_at(&data, offset)?;
            if opts.fua {
                f.sync_data()?;
            }
            Ok(())
        })
        .await
    }

    /// A file in memory (tmpfs) opened for writing through the page cache: yes (see
    /// [`Landing`](crate::Landing)).
    fn lands_writes(&self) -> bool {
        self.landing.get(self.lender()).is_some()
    }

    fn write_landing(&self, start: u64, sectors: u64) -> Option<crate::Landing> {
        self.landing.landing(self.lender(), start, sectors)
    }

    /// Through the page cache: yes (see [`write_piped`](Self::write_piped)).
    fn takes_piped_writes(&self) -> bool {
        !self.direct
    }

    /// Through the page cache, the pipe's bytes are `splice`d into the file on the
    /// blocking pool; with `O_DIRECT`, read into memory and written.
    async fn write_piped(&self, start: u64, data: crate::Piped, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        if self.direct {
            return crate::device::write_piped_from_memory(self, start, data, opts).await;
        }
        let offset = start * 512;
        self.blocking("write", start, sectors, move |f| {
            data.write_to(f, offset)?;
            if opts.fua {
                f.sync_data()?;
            }
            Ok(())
        })
        .await
    }

    /// One trip to the blocking pool for all the parts (written one after the other).
    /// Under `O_DIRECT`, parts that cannot go as they are (not aligned in memory, or not
    /// whole logical blocks) are gathered into one aligned buffer first.
    async fn write_vectored(&self, start: u64, parts: Vec<Bytes>, opts: IoOpts) -> Result<()> {
        let sectors = crate::device::check_parts(&self.info, start, &parts)?;
        let lbs = self.info.limits.logical_block_size as usize;
        if self.direct && direct_needs_one_buffer(&parts, lbs) {
            return crate::device::write_parts(self, start, parts, opts).await;
        }
        self.blocking("write", start, sectors, move |f| {
            write_all_vectored_at(f, &parts, start * 512)?;
            if opts.fua {
                f.sync_data()?;
            }
            Ok(())
        })
        .await
    }

    async fn flush(&self, _opts: IoOpts) -> Result<()> {
        if self.info.read_only {
            return Err(Error::ReadOnly {
                device: self.info.name.clone(),
            });
        }
        self.blocking("flush", 0, 0, |f| f.sync_data()).await
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        crate::device::check_zeroes(&self.info, start, sectors)?;
        let (offset, len) = (start * 512, sectors * 512);
        let native = self
            .blocking("write-zeroes", start, sectors, move |f| {
                zero_range(f, offset, len, z.unmap)
            })
            .await?;
        if !native {
            // The filesystem cannot zero a range: write zeroes (unless only fast would do).
            crate::device::write_zero_buffers(self, start, sectors, z, opts).await?;
        }
        if opts.fua {
            self.blocking("write-zeroes", start, sectors, |f| f.sync_data())
                .await?;
        }
        Ok(())
    }

    async fn discard(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<()> {
        self.info.check_discard(start, sectors)?;
        let (offset, len) = (start * 512, sectors * 512);
        self.blocking("discard", start, sectors, move |f| {
            punch_hole(f, offset, len)
        })
        .await
    }

    /// The filesystem's answer (`SEEK_DATA` / `SEEK_HOLE`); all data where it has none (block
    /// devices, filesystems without it).
    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        self.info.check(start, sectors)?;
        let lbs = self.info.limits.lbs_sectors();
        self.blocking("seek-data", start, sectors, move |f| {
            Ok(seek_extents(f, start, sectors, lbs))
        })
        .await
    }
}

/// The extents of `[start, start + sectors)` by `lseek(SEEK_DATA / SEEK_HOLE)`: holes read as
/// zeroes; data boundaries are widened to whole blocks of `lbs` sectors (a partly allocated
/// block is data). Where the file cannot say (`EINVAL`, `ENOTSUP` on block devices and some
/// filesystems) the rest is reported as data.
pub(crate) fn seek_extents(f: &File, start: u64, sectors: u64, lbs: u64) -> Vec<crate::Extent> {
    use crate::Extent;
    let seek = |pos: u64, whence: libc::c_int| -> Option<u64> {
        let off = libc::off_t::try_from(pos).ok()?;
        // SAFETY: lseek takes a file descriptor we own (borrowed from a live `File`) and plain
        // integers; it touches no memory of ours. The file offset it moves is never used
        // (all I/O here is positional). Exercised by the allocation tests on sparse files.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
        u64::try_from(r).ok()
    };
    let end = start + sectors;
    let mut out = Vec::new();
    let mut pos = start;
    while pos < end {
        let Some(data) = seek(pos * 512, libc::SEEK_DATA) else {
            // ENXIO: no data after `pos` (the rest is a hole); any other error: unknown.
            let hole = io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
            let rest = end - pos;
            crate::device::push_extent(
                &mut out,
                if hole {
                    Extent::hole(rest)
                } else {
                    Extent::data(rest)
                },
            );
            break;
        };
        // The data's first block (rounded down), clamped to the range.
        let d = (data / 512 / lbs * lbs).clamp(pos, end);
        crate::device::push_extent(&mut out, Extent::hole(d - pos));
        if d >= end {
            break;
        }
        let h = seek(data, libc::SEEK_HOLE).map_or(end, |h| h.div_ceil(512).div_ceil(lbs) * lbs);
        let h = h.clamp(d + lbs.min(end - d), end);
        crate::device::push_extent(&mut out, Extent::data(h - d));
        pos = h;
    }
    out
}

/// `BLKGETSIZE64`: `_IOR(0x12, 114, size_t)` on 64-bit Linux (libc does not export it).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

fn blk_size(f: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at a live,
    // aligned u64 on our stack; the fd is owned by a live `File`. Exercised by the
    // loop-device tests.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(size)
    }
}

fn blk_int(f: &File, request: libc::c_ulong) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: BLKSSZGET and BLKPBSZGET write one int through the pointer, which points at a
    // live c_int on our stack; the fd is owned by a live `File`. Exercised by the
    // loop-device tests.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), request as _, &mut v as *mut libc::c_int) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(v).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// `/sys/dev/block/MAJ:MIN`, or its parent for a partition (which has no `queue/`).
fn sysfs_dir(meta: &std::fs::Metadata) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let dir = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if dir.join("queue").exists() {
        dir
    } else {
        dir.join("..")
    }
}

/// A sysfs identity string, trimmed; bytes that are not UTF-8 (firmware strings can hold
/// anything) become U+FFFD rather than losing the whole string.
fn read_trim(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default()
}

/// Limits from a sysfs `queue/` directory (Linux's names and units); files that are missing
/// or unreadable leave the default ("unlimited") in place.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("tagstripe-sysfs-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("max_hw_sectors_kb"), "1280\n").unwrap();
/// std::fs::write(dir.join("max_sectors_kb"), "124\n").unwrap();
/// let l = tagstripe::sysfs_limits(&dir, 4096, 4096);
/// assert_eq!((l.max_hw_sectors, l.max_user_sectors, l.logical_block_size), (2560, 248, 4096));
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[must_use]
pub fn sysfs_limits(queue: &Path, lbs: u32, pbs: u32) -> tagstripe_quirks::Limits {
    let num = |f: &str| -> Option<u64> { read_trim(&queue.join(f)).parse().ok() };
    let u32_of = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    let mut l = tagstripe_quirks::Limits::default();
    l.logical_block_size = lbs;
    l.physical_block_size = pbs;
    if let Some(v) = num("max_hw_sectors_kb") {
        l.max_hw_sectors = u32_of(v.saturating_mul(2));
    }
    if let Some(v) = num("max_sectors_kb") {
        l.max_user_sectors = u32_of(v.saturating_mul(2));
    }
    if let Some(v) = num("max_segments") {
        l.max_segments = u32_of(v);
    }
    if let Some(v) = num("max_segment_size") {
        l.max_segment_size = u32_of(v);
    }
    if let Some(v) = num("chunk_sectors") {
        l.chunk_sectors = u32_of(v);
    }
    if let Some(v) = num("minimum_io_size") {
        l.io_min = u32_of(v);
    }
    if let Some(v) = num("optimal_io_size") {
        l.io_opt = u32_of(v);
    }
    if let Some(v) = num("discard_max_bytes") {
        l.max_discard_sectors = u32_of(v / 512);
    }
    if let Some(v) = num("write_zeroes_max_bytes") {
        l.max_write_zeroes_sectors = u32_of(v / 512);
    }
    if let Some(v) = num("discard_granularity") {
        l.discard_granularity = u32_of(v);
    }
    if let Some(v) = num("nr_requests") {
        l.max_tags = u32_of(v).clamp(1, 1024);
    }
    l
}

/// Zeroes a range with `fallocate`: punching a hole if `unmap` (it reads as zeroes), else
/// `FALLOC_FL_ZERO_RANGE` (allocated, zeroed). `Ok(false)` when the file or device cannot
/// (`EOPNOTSUPP`): the caller writes zeroes.
pub(super) fn zero_range(f: &File, offset: u64, len: u64, unmap: bool) -> io::Result<bool> {
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let mode = libc::FALLOC_FL_KEEP_SIZE
        | if unmap {
            libc::FALLOC_FL_PUNCH_HOLE
        } else {
            libc::FALLOC_FL_ZERO_RANGE
        };
    // SAFETY: fallocate takes a file descriptor we own (borrowed from a live `File`) and
    // plain integers; it touches no memory of ours. Exercised by the write-zeroes tests on
    // files and loop devices.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, off, n) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Ok(false),
        _ => Err(e),
    }
}

/// Writes `parts` one after the other from byte `offset` of `f`, as few `pwritev` calls as
/// the kernel allows (at most 1,024 parts a call; a short write goes on where it stopped):
/// one call, not one a part, for a run gathered from several places (a striped volume's
/// pieces on one component).
pub(crate) fn write_all_vectored_at(f: &File, parts: &[Bytes], offset: u64) -> io::Result<()> {
    const IOV_MAX: usize = 1024;
    // The first part not wholly written, and how much of it is.
    let (mut first, mut done_in_first, mut at) = (0usize, 0usize, offset);
    loop {
        // Past the parts written, and past empty ones (no iovec needs them; a call of only
        // empty ones would write nothing and look like a failure).
        while first < parts.len() && parts[first].len() == done_in_first {
            first += 1;
            done_in_first = 0;
        }
        if first == parts.len() {
            return Ok(());
        }
        let iov: Vec<libc::iovec> = parts[first..]
            .iter()
            .take(IOV_MAX)
            .enumerate()
            .map(|(i, p)| {
                let skip = if i == 0 { done_in_first } else { 0 };
                libc::iovec {
                    iov_base: p[skip..].as_ptr().cast_mut().cast(),
                    iov_len: p.len() - skip,
                }
            })
            .collect();
        let off = libc::off_t::try_from(at)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))?;
        // SAFETY: each iovec names the unwritten bytes of one of `parts`, live and borrowed
        // for the call; the kernel only reads them, and keeps no pointer after it returns (a
        // synchronous write). At most 1,024 of them (IOV_MAX). The fd is `f`'s, live for the
        // call. Exercised by the file and io_uring backends' vectored write tests.
        let n =
            unsafe { libc::pwritev(f.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int, off) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut n = n as usize;
        at += n as u64;
        while n > 0 {
            let left = parts[first].len() - done_in_first;
            if n < left {
                done_in_first += n;
                n = 0;
            } else {
                n -= left;
                first += 1;
                done_in_first = 0;
            }
        }
    }
}

/// Deallocates `[offset, offset + len)` so it reads as zeroes; falls back to writing zeroes
/// where the filesystem cannot punch holes.
pub(crate) fn punch_hole(f: &File, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: fallocate takes a file descriptor we own (borrowed from a live `File`) and
    // plain integers; it touches no memory of ours. Exercised by the file backend's discard
    // tests.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    let zeroes = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zeroes.len() as u64) as usize;
        f.write_all_at(&zeroes[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// More parts than one `pwritev` takes (1,024), empty ones among them, of odd sizes,
    /// at an odd offset: the file holds them back to back, nothing before or after.
    #[test]
    fn a_vectored_write_of_many_parts_lands_back_to_back() {
        use std::os::unix::fs::FileExt;
        let f = crate::piped::tests::scratch("pwritev");
        let parts: Vec<bytes::Bytes> = (0..2500usize)
            .map(|i| {
                let n = if i % 7 == 3 { 0 } else { i % 13 * 37 + 1 };
                bytes::Bytes::from(vec![(i % 251) as u8 + 1; n])
            })
            .collect();
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        super::write_all_vectored_at(&f, &parts, 777).unwrap();
        let mut got = vec![0u8; want.len() + 777 + 10];
        let n = f.read_at(&mut got, 0).unwrap();
        assert_eq!(n, 777 + want.len());
        assert!(got[..777].iter().all(|&b| b == 0));
        assert!(got[777..777 + want.len()] == want[..]);
        // Nothing at all is nothing written.
        super::write_all_vectored_at(&f, &[], 0).unwrap();
        super::write_all_vectored_at(&f, &[bytes::Bytes::new()], 0).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 777 + want.len() as u64);
    }

    #[test]
    fn aligned_bytes_are_aligned_copies_of_any_length_and_start() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for (from, len) in [
            (0, 0),
            (1, 1),
            (3, 511),
            (17, 4096),
            (5, 65_537),
            (100, 69_000),
        ] {
            let b = super::aligned_bytes(&src[from..from + len]);
            assert_eq!(&b[..], &src[from..from + len], "{from} {len}");
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % super::DIRECT_ALIGN, 0, "{from} {len}");
                assert!(!super::needs_copy(&b, true), "{from} {len}");
            }
        }
    }

    #[test]
    fn identity_strings_that_are_not_utf8_are_kept_lossily() {
        let p = std::env::temp_dir().join(format!("tagstripe-ident-{}", std::process::id()));
        std::fs::write(&p, b"ST380023AS\xff\xfe  \n").unwrap();
        assert_eq!(super::read_trim(&p), "ST380023AS\u{fffd}\u{fffd}");
        std::fs::remove_file(&p).unwrap();
        assert_eq!(super::read_trim(&p), "");
    }

    /// A file that is not a whole number of blocks: the part block at its end is counted in
    /// `unused_tail_bytes`, and writing the whole device leaves it as it was.
    #[test]
    fn a_part_block_at_the_end_is_reported_and_never_touched() {
        use crate::{BlockDevice, FileDevice, FileOptions, IoOpts};
        let p = std::env::temp_dir().join(format!("tagstripe-tail-{}.img", std::process::id()));
        let original: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        for (lbs, sectors, tail) in [(512, 1953, 64), (4096, 1952, 576)] {
            std::fs::write(&p, &original).unwrap();
            let opts = FileOptions {
                logical_block_size: lbs,
                ..FileOptions::default()
            };
            let d = FileDevice::open(&p, opts).unwrap();
            let info = d.info();
            assert_eq!(
                (info.sectors, info.unused_tail_bytes),
                (sectors, tail),
                "{lbs}"
            );
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let data = bytes::Bytes::from(vec![0xa5; usize::try_from(sectors).unwrap() * 512]);
                d.write(0, data, IoOpts::new()).await.unwrap();
                d.flush(IoOpts::new()).await.unwrap();
            });
            let now = std::fs::read(&p).unwrap();
            assert_eq!(now.len(), original.len(), "{lbs}");
            let end = original.len() - usize::try_from(tail).unwrap();
            assert_eq!(
                &now[end..],
                &original[end..],
                "{lbs}: the tail is untouched"
            );
            assert!(now[..end].iter().all(|&b| b == 0xa5), "{lbs}");
        }
        std::fs::remove_file(&p).unwrap();
    }
}
