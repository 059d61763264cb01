//! A write's payload received in place ([`Landing`]): a window onto a device's own pages,
//! mapped writable, that a server reads a write's payload into straight from its socket.
//! The kernel then copies the socket's bytes once, into the page cache, where reading them
//! into memory and writing them with `pwrite` copies them twice and has the page cache look
//! up, lock and unlock every page of them as well.
//!
//! Only a file in memory (tmpfs, such as /dev/shm) lends its pages so: its pages are never
//! written back, so a write through the mapping costs nothing later. Through a disk's page
//! cache, a write through a mapping marks whole folios dirty (up to 2 MiB on Linux 6.18,
//! where `pwrite` marks only the blocks it wrote), which writeback would then write whole.
//!
//! This process's own code never touches the mapping: bytes go in through the kernel
//! (`read` from the socket into it), so a page the mapping can no longer reach (the file cut
//! short by another process, tmpfs out of room) fails that call with `EFAULT` instead of
//! raising `SIGBUS`. The rest of the payload is then read into memory and written with
//! `pwrite`, which lands it or reports why not (`ENOSPC`, ...): nothing is lost, and the
//! write's outcome is the one the usual path would have given.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};

/// Writes of fewer bytes than this are not landed: the file's size is checked per landing
/// (a system call), which a small write costs about as much as it saves.
pub(crate) const LAND_FROM: usize = 32 << 10;

/// `f_type` of a tmpfs file system (`statfs(2)`).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// A whole file in memory mapped `PROT_READ | PROT_WRITE`, `MAP_SHARED`: the page cache's
/// own pages, that [`Landing`]s receive payloads into.
#[derive(Debug)]
pub(crate) struct Writable {
    /// The mapping's first byte (page aligned, as `mmap` returns it).
    addr: usize,
    len: usize,
    /// The file mapped (a descriptor of its own): its size is checked before each landing,
    /// and what could not land in place is written through it.
    file: File,
}

impl Writable {
    /// Maps the first `len` bytes of `file` if it is a regular file on tmpfs, opened for
    /// writing; `None` otherwise (or if it cannot be mapped): its writes go the usual way.
    fn new(file: &File, len: u64) -> Option<Arc<Self>> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        if !file.metadata().ok()?.file_type().is_file() || !on_tmpfs(file) {
            return None;
        }
        let file = file.try_clone().ok()?;
        // SAFETY: a fresh shared mapping at an address the kernel picks, over a descriptor
        // the `File` kept in the struct owns; `Drop` unmaps it once no landing is left (each
        // holds an `Arc`). No Rust reference into it is ever made: the kernel alone reads
        // and writes it (see the module's doc). A descriptor opened read-only is refused
        // (`EACCES`): `None`. Exercised by this module's tests.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Arc::new(Self {
            addr: p as usize,
            len,
            file,
        }))
    }
}

impl Drop for Writable {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no landing is left (each holds an `Arc`).
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
    }
}

/// Whether `file` lives on tmpfs (`fstatfs`).
fn on_tmpfs(file: &File) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes one `statfs` into the zeroed buffer we own and pass; it is read
    // only if the call succeeds. The fd is the live `File`'s. Exercised by this module's
    // tests (a file in /dev/shm and one that is not).
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    // SAFETY: initialised by the successful call above (and zeroed before it anyway).
    let f_type = unsafe { st.assume_init() }.f_type;
    // `f_type` is an i64 on 64-bit Linux, narrower elsewhere.
    #[allow(clippy::useless_conversion)]
    let f_type = i64::from(f_type);
    rc == 0 && f_type == TMPFS_MAGIC
}

/// The file's size now (`fstat`).
fn size_now(file: &File) -> Option<u64> {
    file.metadata().ok().map(|m| m.len())
}

/// What a device tells its [`LazyWritable`] about itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lender<'a> {
    /// The device's file.
    pub(crate) file: &'a File,
    /// Its size in sectors.
    pub(crate) sectors: u64,
    /// Opened read-only: lends nothing.
    pub(crate) read_only: bool,
    /// Opened with `O_DIRECT`: lends nothing.
    pub(crate) direct: bool,
}

/// A device's writable mapping, made when a server first asks whether the device lands
/// writes (a device nobody serves maps nothing).
#[derive(Debug, Default)]
pub(crate) struct LazyWritable(OnceLock<Option<Arc<Writable>>>);

impl LazyWritable {
    /// The mapping of device `d`'s file (made now if not yet); `None` if the device does
    /// not lend its pages: read-only, opened with `O_DIRECT`, or not a file in memory (see
    /// [`Writable::new`]).
    pub(crate) fn get(&self, d: Lender<'_>) -> Option<&Arc<Writable>> {
        if d.read_only || d.direct {
            return None;
        }
        self.0
            .get_or_init(|| Writable::new(d.file, d.sectors.saturating_mul(512)))
            .as_ref()
    }

    /// A landing for `sectors` sectors at `start` of device `d`: `None` if the device
    /// does not lend its pages (see [`get`](Self::get)), the write is smaller than
    /// [`LAND_FROM`], or it does not lie inside the mapping and the file as it is now.
    pub(crate) fn landing(&self, d: Lender<'_>, start: u64, sectors: u64) -> Option<Landing> {
        let map = self.get(d)?;
        let len = usize::try_from(sectors).ok()?.checked_mul(512)?;
        let off = start.checked_mul(512)?;
        let end = off.checked_add(u64::try_from(len).ok()?)?;
        if len < LAND_FROM || end > u64::try_from(map.len).ok()? || size_now(&map.file)? < end {
            return None;
        }
        Some(Landing {
            map: Arc::clone(map),
            off: usize::try_from(off).ok()?,
            len,
            got: 0,
            rest: None,
        })
    }
}

/// A write's bytes that could not land in place: read into memory, to be written at `at`
/// (bytes from the landing's start) with `pwrite` when the payload is all in.
#[derive(Debug)]
struct Rest {
    at: usize,
    bytes: Vec<u8>,
}

/// A window onto a device's own pages for one write (from
/// [`BlockDevice::write_landing`](crate::BlockDevice::write_landing)), to receive its
/// payload into in place: [`put`](Self::put) the bytes already in memory, then
/// [`receive_from`](Self::receive_from) the socket until [`is_full`](Self::is_full), then
/// [`finish`](Self::finish), whose outcome is the write's. The bytes are the device's as
/// they land (a reader may see part of the write before it finishes, as with any write in
/// flight); nothing is made durable (a write that asks for that goes the usual way).
///
/// ```
/// use std::io::Write;
/// use std::os::fd::AsFd;
/// use tagstripe::{BlockDevice, IoOpts, OpenOptions};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let path = format!("/dev/shm/landing-doc-{}.img", std::process::id());
/// std::fs::write(&path, vec![0u8; 1 << 20])?;
/// let dev = tagstripe::open(&path, &OpenOptions::new()).await?;
/// // A file in memory lends its pages (elsewhere, `None`: the write goes the usual way).
/// if let Some(mut landing) = dev.write_landing(256, 128) {
///     let (mut client, server) = std::os::unix::net::UnixStream::pair()?;
///     client.write_all(&[9u8; 60 << 10])?;
///     landing.put(&[9u8; 4 << 10])?; // what came with the request's header
///     while !landing.is_full() {
///         landing.receive_from(server.as_fd())?;
///     }
///     landing.finish()?;
///     let back = dev.read(256, 128, IoOpts::new()).await?;
///     assert!(back.iter().all(|&b| b == 9));
/// }
/// std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Landing {
    map: Arc<Writable>,
    /// The write's first byte in the file (and the mapping).
    off: usize,
    len: usize,
    /// Bytes taken so far (landed, or read into `rest`).
    got: usize,
    /// From the first byte that could not land, the rest (see the module's doc).
    rest: Option<Rest>,
}

impl Landing {
    /// The write's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the write is of no bytes (never: a landing is for 32 KiB or more).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes taken so far.
    pub fn received(&self) -> usize {
        self.got
    }

    /// Every byte of the write has been taken.
    pub fn is_full(&self) -> bool {
        self.got == self.len
    }

    /// Takes `bytes` (the next of the payload, already in memory: those read with the
    /// request's header) with `pwrite`; if that fails, they wait in memory with the rest
    /// (see [`finish`](Self::finish)).
    ///
    /// # Errors
    /// `InvalidInput` if they are more than the write has left to take (nothing taken).
    pub fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() > self.len - self.got {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes for a write with {} left to take",
                    bytes.len(),
                    self.len - self.got
                ),
            ));
        }
        if self.rest.is_none()
            && self
                .map
                .file
                .write_all_at(bytes, (self.off + self.got) as u64)
                .is_err()
        {
            self.spill();
        }
        if let Some(r) = &mut self.rest {
            r.bytes.extend_from_slice(bytes);
        }
        self.got += bytes.len();
        Ok(())
    }

    /// From here on, the bytes go to memory (see the module's doc).
    fn spill(&mut self) {
        self.rest = Some(Rest {
            at: self.got,
            bytes: Vec::with_capacity(self.len - self.got),
        });
    }

    /// Reads the next of the payload from `from` (non-blocking) into the window, or into
    /// memory once a page could not be reached; returns the bytes taken.
    ///
    /// # Errors
    /// `WouldBlock` when `from` has nothing waiting; `UnexpectedEof` when it is closed
    /// before the write's last byte; its other errors as they are. Nothing taken then.
    pub fn receive_from(&mut self, from: BorrowedFd<'_>) -> io::Result<usize> {
        let want = self.len - self.got;
        if want == 0 {
            return Ok(0);
        }
        if self.rest.is_none() {
            // SAFETY: `off + got .. off + len` lies inside the live mapping (checked when the
            // landing was made; the `Arc` keeps it mapped), writable (PROT_WRITE); the kernel
            // writes at most `want` bytes there and keeps no pointer, and no Rust reference
            // to those bytes exists. A page it cannot reach fails the call (EFAULT, never
            // SIGBUS: the fault is the kernel's). Exercised by this module's tests.
            let n = unsafe {
                libc::read(
                    from.as_raw_fd(),
                    (self.map.addr + self.off + self.got) as *mut libc::c_void,
                    want,
                )
            };
            match usize::try_from(n) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.got += n;
                    return Ok(n);
                }
                Err(_) => {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EFAULT) {
                        return Err(e);
                    }
                    // Nothing of the failed read was taken off the socket: the rest goes
                    // to memory, from this byte on (below).
                }
            }
        }
        let (at, left) = (self.got, self.len - self.got);
        let r = self.rest.get_or_insert_with(|| Rest {
            at,
            bytes: Vec::with_capacity(left),
        });
        let had = r.bytes.len();
        // In steps, so that a read of a few bytes does not zero the whole rest first.
        r.bytes.resize(had + want.min(256 << 10), 0);
        let buf = &mut r.bytes[had..];
        // SAFETY: read writes at most `buf.len()` bytes into `buf`, our own memory borrowed
        // mutably for the call, and keeps no pointer. Exercised by
        // `a_page_it_cannot_reach_sends_the_rest_through_pwrite`.
        let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error());
        r.bytes.truncate(had + *n.as_ref().unwrap_or(&0));
        match n? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                self.got += n;
                Ok(n)
            }
        }
    }

    /// Ends the write: what could not land in place is written now with `pwrite`.
    ///
    /// # Errors
    /// `pwrite`'s, if it could not write that rest (the device's bytes there are then
    /// undefined, as after any failed write); `UnexpectedEof` if the payload is not all in.
    pub fn finish(self) -> io::Result<()> {
        if !self.is_full() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} of the write's {} bytes taken", self.got, self.len),
            ));
        }
        match &self.rest {
            Some(r) => self
                .map
                .file
                .write_all_at(&r.bytes, (self.off + r.at) as u64),
            None => Ok(()),
        }
    }

    /// Whether every byte landed in place (none went through memory).
    pub fn in_place(&self) -> bool {
        self.rest.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    /// A file in /dev/shm of `len` bytes of zeroes, if /dev/shm is tmpfs here.
    fn shm_file(name: &str, len: usize) -> Option<(std::path::PathBuf, File)> {
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/tagstripe-landing-{name}-{}",
            std::process::id()
        ));
        std::fs::write(&path, vec![0u8; len]).ok()?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .ok()?;
        if !on_tmpfs(&f) {
            let _ = std::fs::remove_file(&path);
            eprintln!("skipped: /dev/shm is not tmpfs here");
            return None;
        }
        Some((path, f))
    }

    /// A device of `len` bytes over `f`, writable, through the page cache.
    fn dev(f: &File, len: usize) -> Lender<'_> {
        Lender {
            file: f,
            sectors: len as u64 / 512,
            read_only: false,
            direct: false,
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    /// Takes the whole payload from `s` (its sender has sent it all).
    fn take(l: &mut Landing, s: &UnixStream) {
        while !l.is_full() {
            l.receive_from(s.as_fd()).expect("bytes are waiting");
        }
    }

    #[test]
    fn a_payload_lands_in_the_files_pages_at_its_offset() {
        let Some((path, f)) = shm_file("lands", 1 << 20) else {
            return;
        };
        let lazy = LazyWritable::default();
        let mut l = lazy.landing(dev(&f, 1 << 20), 128, 256).expect("a landing");
        assert_eq!(l.len(), 128 << 10);
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let body = pattern(128 << 10, 3);
        a.write_all(&body[4096..]).unwrap();
        l.put(&body[..4096]).unwrap();
        take(&mut l, &b);
        assert!(l.in_place());
        l.finish().unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(&got[64 << 10..][..128 << 10], &body[..]);
        assert!(
            got[..64 << 10].iter().all(|&x| x == 0),
            "before it untouched"
        );
        assert!(
            got[192 << 10..].iter().all(|&x| x == 0),
            "after it untouched"
        );
        // Nothing more waiting: says so; the sender gone: the end.
        let mut m = lazy.landing(dev(&f, 1 << 20), 0, 64).unwrap();
        let e = m.receive_from(b.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        let e = m.receive_from(b.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(m.finish().unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn what_is_not_in_memory_or_inside_the_file_is_no_landing() {
        // A file on a disk's file system (the build's own directory): no mapping.
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let f = File::open(dir.join("Cargo.toml")).unwrap();
        if on_tmpfs(&f) {
            eprintln!("skipped in part: the sources are on tmpfs here");
        } else {
            let len = f.metadata().unwrap().len() as usize / 512 * 512;
            assert!(LazyWritable::default().get(dev(&f, len)).is_none());
        }
        let Some((path, f)) = shm_file("bounds", 1 << 20) else {
            return;
        };
        let lazy = LazyWritable::default();
        let i = dev(&f, 1 << 20);
        assert!(lazy.landing(i, 0, 32).is_none(), "16 KiB: too small");
        assert!(lazy.landing(i, 2048 - 64, 64).is_some(), "the last 32 KiB");
        assert!(lazy.landing(i, 2048 - 32, 64).is_none(), "past the end");
        assert!(lazy.landing(i, u64::MAX / 256, 64).is_none(), "overflow");
        // A file shrunk since it was mapped: no landing past its end now.
        f.set_len(512 << 10).unwrap();
        assert!(lazy.landing(i, 1024, 64).is_none());
        assert!(lazy.landing(i, 0, 64).is_some());
        // Read-only, or O_DIRECT: nothing is mapped.
        let ro = Lender {
            read_only: true,
            ..dev(&f, 1 << 20)
        };
        assert!(LazyWritable::default().landing(ro, 0, 64).is_none());
        let direct = Lender {
            direct: true,
            ..dev(&f, 1 << 20)
        };
        assert!(LazyWritable::default().landing(direct, 0, 64).is_none());
        // Opened read-only: the mapping is refused.
        let r = File::open(&path).unwrap();
        assert!(LazyWritable::default().get(dev(&r, 1 << 20)).is_none());
        let mut l = lazy.landing(i, 0, 64).unwrap();
        let e = l.put(&[0u8; 64 << 10]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(l.received(), 0);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_page_it_cannot_reach_sends_the_rest_through_pwrite() {
        let Some((path, f)) = shm_file("shrunk", 1 << 20) else {
            return;
        };
        let lazy = LazyWritable::default();
        let mut l = lazy.landing(dev(&f, 1 << 20), 0, 1024).expect("a landing");
        // Another process cuts the file to 256 KiB while the write's payload comes in: the
        // mapping's pages past that fault (in the kernel: EFAULT, no SIGBUS).
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let body = pattern(512 << 10, 7);
        let sender = {
            let body = body.clone();
            std::thread::spawn(move || a.write_all(&body))
        };
        f.set_len(256 << 10).unwrap();
        while !l.is_full() {
            match l.receive_from(b.as_fd()) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        sender.join().unwrap().unwrap();
        assert!(!l.in_place(), "the rest went through memory");
        l.finish().unwrap();
        // The write is whole, as a `pwrite` past the end would have left it.
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), 512 << 10);
        assert_eq!(got, body);
        std::fs::remove_file(&path).unwrap();
    }
}
