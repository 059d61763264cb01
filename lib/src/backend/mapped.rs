//! A read-only shared mapping of a file or block device opened through its page cache: the
//! answer of [`BlockDevice::read_to_send`](crate::BlockDevice::read_to_send) where the pages
//! are all cached. Served over NBD, such a read is a view of the cached pages that the socket
//! write copies from, instead of a copy into a buffer that the socket write then copies
//! again (a file in /dev/shm over TCP, alternated with copying reads: 1 MiB reads 1.34-1.43x
//! at a third less CPU a GiB, 64 KiB random 50/50 1.06-1.11x, before the size check that
//! costs the latter about 3%; docs/nbd-performance.md).

use std::fs::File;
use std::os::fd::AsRawFd;
#[cfg(feature = "nbd")]
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
#[cfg(feature = "nbd")]
use std::sync::Weak;

use bytes::Bytes;

/// Reads smaller than this are copied as before: the residency check is a system call of
/// its own, which a small copy costs about as much as.
pub(crate) const MAPPED_FROM: usize = 32 << 10;

/// The whole device mapped `PROT_READ`, `MAP_SHARED`: the page cache's own pages, which
/// every write through the file descriptor (or by anyone else) changes in place.
#[derive(Debug)]
pub(crate) struct Mapped {
    /// The mapping's first byte (page aligned, as `mmap` returns it).
    addr: usize,
    len: usize,
    page: usize,
    /// A regular file (not a block device), whose size another process may cut.
    regular: bool,
    /// The file mapped (a descriptor of its own), for [`file_range`]'s callers: `None` if it
    /// could not be duplicated.
    #[cfg(feature = "nbd")]
    file: Option<File>,
}

/// Every live mapping, by its first byte and length: how bytes handed out as views are
/// traced back to their file ([`file_range`]).
#[cfg(feature = "nbd")]
static LIVE: parking_lot::RwLock<Vec<(usize, usize, Weak<Mapped>)>> =
    parking_lot::RwLock::new(Vec::new());

/// The file and offset of `bytes` if they are a view of a live mapping (as
/// [`BlockDevice::read_to_send`](crate::BlockDevice::read_to_send) hands out): a socket can
/// then be given the file's pages themselves (`sendfile`, or the view's pages through a
/// pipe) instead of a copy of them. The mapping returned keeps its file open.
#[cfg(feature = "nbd")]
pub(crate) fn file_range(bytes: &[u8]) -> Option<(Arc<Mapped>, u64)> {
    let (p, len) = (bytes.as_ptr() as usize, bytes.len());
    if len < MAPPED_FROM {
        return None;
    }
    let live = LIVE.read();
    let (addr, _, map) = live
        .iter()
        .find(|(addr, l, _)| p >= *addr && p.checked_add(len).is_some_and(|e| e <= addr + l))?;
    let map = map.upgrade()?;
    map.file.as_ref()?;
    Some((map, (p - addr) as u64))
}

impl Mapped {
    /// Maps the first `len` bytes of `file`; `None` if it cannot be mapped (length 0, a file
    /// system or device without `mmap`, no address space): its reads are then copies.
    pub(crate) fn new(file: &File, len: u64) -> Option<Arc<Self>> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        // SAFETY: a fresh read-only mapping at an address the kernel picks, over a file
        // descriptor the caller's live `File` owns; nothing else refers to the range, and
        // `Drop` unmaps it once no view of it is left (each holds an `Arc`). Exercised by
        // the io_uring and file backend tests of `read_to_send`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        let regular = file.metadata().is_ok_and(|m| m.file_type().is_file());
        let map = Arc::new(Self {
            addr: p as usize,
            len,
            page,
            regular,
            #[cfg(feature = "nbd")]
            file: file.try_clone().ok(),
        });
        #[cfg(feature = "nbd")]
        LIVE.write().push((map.addr, map.len, Arc::downgrade(&map)));
        Some(map)
    }

    /// The file mapped (see [`file_range`]).
    #[cfg(feature = "nbd")]
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(AsFd::as_fd)
    }

    /// The bytes at `off..off + len` as a view of the mapping, if they lie inside it, are
    /// at least [`MAPPED_FROM`] long, inside the file as it is now (a regular file's size is
    /// read again: a page past the end of a file shrunk since it was mapped would fault,
    /// and `mincore` still calls such pages cached, Linux 6.18) and every page of them is in
    /// the page cache (`mincore`): a view is then never a wait for the device on the thread
    /// that sends it. `None`: read it the usual way.
    pub(crate) fn cached(self: &Arc<Self>, file: &File, off: u64, len: usize) -> Option<Bytes> {
        let end = off.checked_add(u64::try_from(len).ok()?)?;
        let off = usize::try_from(off).ok()?;
        if len < MAPPED_FROM || off.checked_add(len)? > self.len {
            return None;
        }
        if self.regular && size_now(file)? < end {
            return None;
        }
        let first = off & !(self.page - 1);
        let pages = (off + len - first).div_ceil(self.page);
        let mut small = [0u8; 272];
        let mut large = Vec::new();
        let vec: &mut [u8] = if pages <= small.len() {
            &mut small[..pages]
        } else {
            large.resize(pages, 0);
            &mut large
        };
        // SAFETY: the range starts on a page boundary inside our live mapping and ends inside
        // its last page (the kernel maps whole pages); `vec` has one byte a page, written by
        // the kernel before the call returns. Exercised by the `read_to_send` tests (cached
        // and dropped pages).
        let rc = unsafe {
            libc::mincore(
                (self.addr + first) as *mut libc::c_void,
                pages * self.page,
                vec.as_mut_ptr().cast(),
            )
        };
        if rc != 0 || vec.iter().any(|&v| v & 1 == 0) {
            return None;
        }
        Some(Bytes::from_owner(View {
            map: Arc::clone(self),
            off,
            len,
        }))
    }
}

/// The file's size now (`fstat`: one system call, nothing more read).
fn size_now(file: &File) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes one `stat` into the zeroed buffer we own and pass; it is read
    // only if the call succeeds. The fd is owned by the live `File`. Exercised by the
    // `read_to_send` tests (a file shrunk while mapped among them).
    let rc = unsafe { libc::fstat(file.as_raw_fd(), st.as_mut_ptr()) };
    // SAFETY: initialised by the successful call above (and zeroed before it anyway).
    (rc == 0).then(|| u64::try_from(unsafe { st.assume_init() }.st_size).unwrap_or(0))
}

impl Drop for Mapped {
    fn drop(&mut self) {
        #[cfg(feature = "nbd")]
        LIVE.write().retain(|(addr, _, _)| *addr != self.addr);
        // SAFETY: unmaps exactly what `new` mapped; no view is left (each holds an `Arc`).
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
    }
}

/// A range of the mapping, kept mapped while the bytes are held.
struct View {
    map: Arc<Mapped>,
    off: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `off..off + len` lies inside the mapping (checked in `cached`), which stays
        // mapped while this view holds its `Arc`, readable (PROT_READ). The bytes are the
        // page cache's and change when the sectors are written: `read_to_send`'s contract,
        // whose callers scan the bytes once or hand them to the kernel, so a byte written
        // meanwhile is seen as its old or its new value, as with a `pread` racing a write.
        unsafe { std::slice::from_raw_parts((self.map.addr + self.off) as *const u8, self.len) }
    }
}

/// A device's mapping, made at its first [`read_to_send`](crate::BlockDevice::read_to_send)
/// of [`MAPPED_FROM`] bytes or more (a device nobody serves maps nothing).
#[derive(Debug, Default)]
pub(crate) struct LazyMapped(std::sync::OnceLock<Option<Arc<Mapped>>>);

impl LazyMapped {
    /// [`Mapped::cached`] for `sectors` sectors from `start` of the device `info` describes,
    /// over `file` (mapped now if not yet).
    pub(crate) fn cached(
        &self,
        file: &File,
        info: &crate::DeviceInfo,
        start: u64,
        sectors: u64,
    ) -> Option<Bytes> {
        let len = usize::try_from(sectors).ok()?.checked_mul(512)?;
        if len < MAPPED_FROM {
            return None;
        }
        self.0
            .get_or_init(|| Mapped::new(file, info.sectors.saturating_mul(512)))
            .as_ref()?
            .cached(file, start.checked_mul(512)?, len)
    }
}
