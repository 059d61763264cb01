//! An io_uring backend (feature `uring`): the file backend's semantics with no thread
//! handoff per request. The caller's task submits (one `io_uring_enter`), and completions are
//! reaped by a task woken through tokio's reactor when the ring's fd becomes readable.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use io_uring::{IoUring, opcode, squeue, types};
use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::file::{align_gap, aligned_bytes, direct_needs_one_buffer, needs_copy, read_buffer};
use crate::{BlockDevice, DeviceInfo, Error, FileDevice, FileOptions, IoOpts, Result};

/// A request in the ring: its buffer lives here until its completion is reaped.
enum InFlight {
    /// A read: the buffer is handed back whole, with where the data starts in it.
    Read {
        buf: Vec<u8>,
        off: usize,
        len: usize,
        reply: oneshot::Sender<io::Result<(Vec<u8>, usize)>>,
    },
    Write {
        _data: Bytes,
        len: usize,
        reply: oneshot::Sender<io::Result<()>>,
    },
    /// A gathered write: its parts, and the `iovec`s the kernel reads them through.
    Writev {
        _parts: Vec<Bytes>,
        _iov: Iovecs,
        len: usize,
        reply: oneshot::Sender<io::Result<()>>,
    },
    Other {
        reply: oneshot::Sender<io::Result<()>>,
    },
}

/// The `iovec`s of a gathered write, each pointing into one of the parts kept beside them.
struct Iovecs(Vec<libc::iovec>);

// SAFETY: the pointers are only addresses of the heap bytes of `Bytes` held in the same
// `InFlight::Writev` (which are `Send + Sync`); nothing here dereferences them, the kernel
// reads through them while the entry is in the ring. Exercised by the gathered-write tests.
unsafe impl Send for Iovecs {}

/// The most parts one `IORING_OP_WRITEV` takes (Linux's `UIO_MAXIOV`); a write of more is
/// sent as several.
const IOV_MAX: usize = 1024;

/// A request not yet answered, and the file its entry names by descriptor: kept open until
/// the completion is reaped, also when the device that sent it is dropped first while other
/// devices keep the ring.
struct Pending {
    state: InFlight,
    _file: Arc<File>,
}

struct Ring {
    ring: IoUring,
    /// Every request not yet answered, in the ring or waiting for room in it.
    inflight: HashMap<u64, Pending>,
    /// Entries (with their ids) waiting in user space for room in the completion queue.
    waiting: VecDeque<squeue::Entry>,
    /// Entries handed to the ring and not yet reaped.
    in_ring: usize,
    /// The most entries the ring may hold: its completion queue's size, so completions
    /// never overflow into the kernel's list (which raises no readiness on the fd).
    cap: usize,
    next: u64,
}

impl Ring {
    /// Moves waiting entries into the submission queue while the completion queue has room
    /// for their completions, then submits. Errors of `io_uring_enter` are returned; the
    /// entries stay in the submission queue for the next submit.
    fn feed(&mut self) -> io::Result<()> {
        // Entries a plug left in the submission queue go too.
        let pushed = self.fill()?;
        let sq = self.ring.submission();
        let (queued, overflow) = (!sq.is_empty(), sq.cq_overflow());
        drop(sq);
        if pushed || queued || overflow {
            self.submit()?;
        }
        Ok(())
    }

    /// Moves waiting entries into the submission queue while the completion queue has room
    /// for their completions, entering the kernel only when the submission queue is full;
    /// true if any entry was moved (and is now to be submitted).
    fn fill(&mut self) -> io::Result<bool> {
        let mut pushed = false;
        while self.in_ring < self.cap {
            let Some(entry) = self.waiting.front().cloned() else {
                break;
            };
            if !self.push(&entry) {
                // The submission queue is full: hand it to the kernel, then try once more.
                self.submit()?;
                if !self.push(&entry) {
                    break;
                }
            }
            self.waiting.pop_front();
            self.in_ring += 1;
            pushed = true;
        }
        Ok(pushed)
    }

    /// Puts one entry in the submission queue; false if it is full.
    fn push(&mut self, entry: &squeue::Entry) -> bool {
        // SAFETY: the entry points into a heap buffer (a `Vec`'s or a `Bytes`') owned by
        // `inflight[entry.user_data()]`; moving the owner does not move the heap buffer, and
        // the owner is kept until the completion carrying the id is reaped (`reap`), also when
        // the device is dropped first (`Shared::drop` waits). The fd belongs to
        // `Shared::file`, open as long as the ring. Exercised by the uring tests.
        unsafe { self.ring.submission().push(entry) }.is_ok()
    }

    /// One `io_uring_enter`; a busy ring (EBUSY, EAGAIN) takes its entries on a later one.
    /// With completions parked on the kernel's overflow list, the enter carries GETEVENTS,
    /// which moves them back to the completion queue.
    fn submit(&mut self) -> io::Result<()> {
        match self.ring.submit() {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// One io_uring instance and the task that reaps its completions.
struct RingShared {
    state: Mutex<Ring>,
    /// The task that reaps completions, bound to the runtime it was started on.
    reaper: Mutex<Option<JoinHandle<()>>>,
}

/// Under a plug ([`crate::Plugged`]), entries wait in the submission queue; pulling the plug
/// enters them all at once, those of every device on the ring together.
impl crate::plug::Unplug for RingShared {
    fn unplug(&self) {
        let mut st = self.state.lock();
        if let Err(e) = st.feed() {
            // As a submission that fails at once: entries still waiting in user space fail;
            // those in the submission queue go with the next submit (the reaper's included).
            tracing::warn!(target: "tagstripe::uring", error = %e, "io_uring submission failed");
            fail_waiting(&mut st, &e);
        }
    }
}

/// Whether `f` is on tmpfs (`statfs`'s `TMPFS_MAGIC`).
fn on_tmpfs(f: &File) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes one `statfs` into the zeroed buffer we own and pass; it is read
    // only if the call succeeds. The fd is owned by the live `File`. Exercised by every
    // io_uring device opened in the tests.
    let rc = unsafe { libc::fstatfs(f.as_raw_fd(), st.as_mut_ptr()) };
    // SAFETY: initialised by the successful call above (and zeroed before it anyway).
    rc == 0 && unsafe { st.assume_init() }.f_type == libc::TMPFS_MAGIC
}

impl Drop for RingShared {
    fn drop(&mut self) {
        if let Some(r) = self.reaper.get_mut().take() {
            r.abort();
        }
        // Requests still in the kernel write into buffers owned here: wait for every one of
        // them before the buffers are freed.
        let st = self.state.get_mut();
        // Entries still waiting in user space never reached the kernel: answer them now.
        for entry in std::mem::take(&mut st.waiting) {
            if let Some(p) = st.inflight.remove(&entry.get_user_data()) {
                fail(p.state, io::Error::from(io::ErrorKind::BrokenPipe));
            }
        }
        while st.in_ring > 0 {
            if st.ring.submit_and_wait(1).is_err() {
                // The ring cannot wait (it should always be able to): leak the buffers
                // rather than free memory the kernel may still write.
                std::mem::forget(std::mem::take(&mut st.inflight));
                break;
            }
            reap(st);
        }
    }
}

/// Takes every completion off the ring and answers its request, then lets waiting entries
/// into the room that made. Completions the kernel parked on its overflow list (only
/// possible if something else filled the ring) are fetched back and reaped too.
fn reap(st: &mut Ring) {
    loop {
        let done: Vec<(u64, i32)> = st
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        let none = done.is_empty();
        st.in_ring = st.in_ring.saturating_sub(done.len());
        answer(st, done);
        let overflow = st.ring.submission().cq_overflow();
        if let Err(e) = st.feed() {
            // The kernel refused the entries: fail the ones it cannot have taken, rather than
            // leave their callers waiting for completions that will never come.
            fail_waiting(st, &e);
        }
        if none && !overflow {
            return;
        }
    }
}

/// Fails every entry still waiting in user space with `e`.
fn fail_waiting(st: &mut Ring, e: &io::Error) {
    for entry in std::mem::take(&mut st.waiting) {
        if let Some(p) = st.inflight.remove(&entry.get_user_data()) {
            fail(p.state, io::Error::new(e.kind(), e.to_string()));
        }
    }
}

/// Answers the requests of these completions.
fn answer(st: &mut Ring, done: Vec<(u64, i32)>) {
    for (id, res) in done {
        let Some(Pending { state, .. }) = st.inflight.remove(&id) else {
            continue;
        };
        if res < 0 {
            fail(state, io::Error::from_raw_os_error(-res));
            continue;
        }
        let n = res as usize;
        match state {
            InFlight::Read {
                buf,
                off,
                len,
                reply,
            } => {
                let r = if n == len {
                    Ok((buf, off))
                } else {
                    Err(io::Error::from(io::ErrorKind::UnexpectedEof))
                };
                let _ = reply.send(r);
            }
            InFlight::Write { len, reply, .. } | InFlight::Writev { len, reply, .. } => {
                let r = if n == len {
                    Ok(())
                } else {
                    Err(io::Error::from(io::ErrorKind::WriteZero))
                };
                let _ = reply.send(r);
            }
            InFlight::Other { reply } => {
                let _ = reply.send(Ok(()));
            }
        }
    }
}

fn fail(state: InFlight, e: io::Error) {
    match state {
        InFlight::Read { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        InFlight::Write { reply, .. }
        | InFlight::Writev { reply, .. }
        | InFlight::Other { reply } => {
            let _ = reply.send(Err(e));
        }
    }
}

/// Reaps completions whenever the ring's fd (a duplicate, owned here) turns readable.
async fn reaper(fd: AsyncFd<OwnedFd>, shared: Weak<RingShared>) {
    loop {
        let Ok(mut guard) = fd.readable().await else {
            return;
        };
        // Cleared before reaping, so a completion posted while reaping wakes us again.
        guard.clear_ready();
        let Some(shared) = shared.upgrade() else {
            return;
        };
        reap(&mut shared.state.lock());
    }
}

/// An io_uring instance that several [`UringDevice`]s share: the components of one volume
/// opened on one ring send the requests a poll starts to the kernel in one
/// `io_uring_enter`, and one task reaps all their completions. With a ring each, a striped
/// volume of 4 loop devices (`O_DIRECT`, 4 KiB random writes at QD32 over NBD) entered the
/// kernel 3 times as often a request, and switched threads twice as often, as one device
/// on its own ring. Cloning shares it; the ring goes when its last clone and its last
/// device are dropped, after the requests still in the kernel complete. Its completions
/// are reaped by a task on the tokio runtime of its first request (a later one once that
/// runtime has gone): its devices serve one runtime at a time, as a [`UringDevice`] does.
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, FileDevice, FileOptions, IoOpts, UringDevice, UringRing};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = std::env::temp_dir().join(format!("tagstripe-ring-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// let Ok(ring) = UringRing::new(64) else {
///     return Ok(()); // no io_uring here (seccomp, an old kernel)
/// };
/// let (a, b) = (dir.join("a.img"), dir.join("b.img"));
/// drop(FileDevice::create(&a, 2048, FileOptions::default())?);
/// drop(FileDevice::create(&b, 2048, FileOptions::default())?);
/// let da = UringDevice::open_on(&ring, &a, FileOptions::default(), false)?;
/// let db = UringDevice::open_on(&ring, &b, FileOptions::default(), false)?;
/// da.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new()).await?;
/// db.write(0, Bytes::from(vec![2u8; 4096]), IoOpts::new()).await?;
/// assert_eq!(da.read(0, 8, IoOpts::new()).await?[..], [1u8; 4096][..]);
/// assert_eq!(db.read(0, 8, IoOpts::new()).await?[..], [2u8; 4096][..]);
/// assert_eq!(da.ring_capacity(), ring.capacity());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct UringRing {
    shared: Arc<RingShared>,
}

impl UringRing {
    /// A ring of `entries` submission entries (clamped to 2..=4096; the kernel rounds up to
    /// a power of two), its completion queue twice that: the most requests its devices
    /// keep in the kernel at once. More wait in user space.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when io_uring cannot be set up here (an old kernel, seccomp,
    /// `kernel.io_uring_disabled`).
    pub fn new(entries: u32) -> Result<Self> {
        let ring = IoUring::new(entries.clamp(2, 4096)).map_err(|_| Error::Unsupported {
            device: "io_uring".to_owned(),
            op: "io_uring",
        })?;
        Ok(Self {
            shared: Arc::new(RingShared {
                state: Mutex::new(Ring {
                    cap: ring.params().cq_entries() as usize,
                    ring,
                    inflight: HashMap::new(),
                    waiting: VecDeque::new(),
                    in_ring: 0,
                    next: 0,
                }),
                reaper: Mutex::new(None),
            }),
        })
    }

    /// The most requests the ring keeps in the kernel at once, over all its devices (its
    /// completion queue's size).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.shared.state.lock().cap
    }

    /// How many hold the ring: this handle, its clones and the devices opened on it.
    #[cfg(test)]
    pub(crate) fn holders(&self) -> usize {
        Arc::strong_count(&self.shared)
    }

    /// Starts the reaper on this runtime unless one is running.
    fn ensure_reaper(&self) -> io::Result<()> {
        let mut r = self.shared.reaper.lock();
        if r.as_ref().is_some_and(|h| !h.is_finished()) {
            return Ok(());
        }
        let dup = self.shared.state.lock().ring.as_fd().try_clone_to_owned()?;
        // SAFETY: `dup` is an open fd owned by the `OwnedFd` moved into the `AsyncFd`; an
        // `OwnedFd` never closes or replaces its fd before it is dropped, which happens only
        // after the `AsyncFd` deregisters it. Exercised by every uring test.
        let fd = unsafe { AsyncFd::register_with_interest(dup, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        *r = Some(tokio::spawn(reaper(fd, Arc::downgrade(&self.shared))));
        Ok(())
    }
}

/// A file or block device driven through io_uring: the same semantics as [`FileDevice`]
/// (positional I/O, optional `O_DIRECT`, flush = fdatasync, FUA = write then fdatasync,
/// discard = punch hole). Requests are submitted from the calling task and completed by a
/// task on the caller's tokio runtime (the runtime of the first request, or a later one if
/// that runtime has gone), which must have I/O enabled (`enable_io` or `enable_all`).
/// Where io_uring is unavailable (old kernel, seccomp, disabled), opening fails with
/// [`Error::Unsupported`]. A device has a ring of its own ([`open`](Self::open)) or shares
/// one with others ([`open_on`](Self::open_on), [`UringRing`]). Dropping the last device
/// of a ring waits for requests still in the kernel. With `O_DIRECT`, requests started
/// while a [`crate::Plugged`] future is polled reach the kernel together when that poll
/// returns (one `io_uring_enter` for them, over all the devices of the ring).
#[derive(Debug)]
pub struct UringDevice {
    info: DeviceInfo,
    direct: bool,
    ring: UringRing,
    /// The file the ring's entries name by descriptor (each entry keeps it open until its
    /// completion is reaped).
    file: Arc<File>,
    /// Read buffers of `read_into`, reused: no allocation, zeroing or page faults per read.
    pool: Arc<crate::buffers::BufferPool>,
    /// How reads may be done at once on the calling thread instead of through the ring.
    inline: Inline,
    /// Writes are `pwrite`s, not ring entries: a block device opened without `O_DIRECT`
    /// (see [`BufferedWrites`]); `None` otherwise.
    buffered: Option<BufferedWrites>,
    /// Its pages mapped for [`BlockDevice::read_to_send`] (not with `O_DIRECT`).
    mapped: super::mapped::LazyMapped,
    /// Its pages mapped writable for [`BlockDevice::write_landing`] (a file in memory).
    landing: crate::landing::LazyWritable,
}

/// How writes to a block device through its page cache are done. The kernel cannot do
/// them without the chance of blocking, so io_uring hands each to a worker thread, and
/// keeps the writes to one file on one worker, one after another: 4 KiB random writes at
/// QD32 to a loop device through its page cache, fio alone, 58-120 k/s through io_uring
/// against 576-597 k/s from 8 threads of `pwrite` (Linux 6.18, 2 cores); served over NBD,
/// 60 k/s through the ring, 99-115 k/s with `pwrite` on the calling thread. So each is a
/// `pwrite` on the calling thread (a copy into the page cache), unless one of them made the
/// thread wait 20 ms (the kernel holding back a writer of too many dirty pages): then for
/// a second they go to tokio's blocking pool, so the runtime's threads do not wait on the
/// disk's writeback.
#[derive(Debug)]
struct BufferedWrites {
    epoch: std::time::Instant,
    /// Until when (ns since `epoch`) writes go to the blocking pool.
    pool_until: std::sync::atomic::AtomicU64,
}

/// A `pwrite` that took this long waited for the disk (ns): the kernel holds back a writer
/// of too many dirty pages for tens to hundreds of milliseconds. (At 2 ms, a thread merely
/// preempted on a busy 2-core machine counted as waiting, and the writes of 4 connections
/// went to the pool, each a hand-off: 4 KiB random writes to a loop device 0.29x nbdkit's.)
const WRITE_WAITED: u64 = 20_000_000;
/// How long writes then go to the blocking pool (ns).
const POOL_FOR: u64 = 1_000_000_000;

/// Reads that cannot wait for a device need no trip through the ring (which, for a file in
/// memory, is a hop to an io_uring worker thread and back).
#[derive(Debug)]
enum Inline {
    /// Never (O_DIRECT: every read goes to the device). A block device through its page
    /// cache tries `RWF_NOWAIT` (4 KiB random reads of a cached loop device over NBD:
    /// 143-153 k/s, against 83 k/s through the ring alone).
    Never,
    /// The file lives in memory (tmpfs): a read or a write is a copy, done at once (a tmpfs
    /// page swapped out would make it wait for swap, which this accepts).
    Always,
    /// Try `preadv2(RWF_NOWAIT)`: served at once from the page cache, or refused at once
    /// (`EAGAIN`) and sent to the ring. Turned off for good if the filesystem refuses the
    /// flag itself.
    NoWait(std::sync::atomic::AtomicBool),
}

impl std::fmt::Debug for RingShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringRing")
            .field("in_flight", &self.state.lock().inflight.len())
            .finish()
    }
}

impl UringDevice {
    /// What this device tells its writable mapping about itself (see `landing`).
    fn lender(&self) -> crate::landing::Lender<'_> {
        crate::landing::Lender {
            file: &self.file,
            sectors: self.info.sectors,
            read_only: self.info.read_only,
            direct: self.direct,
        }
    }

    /// Opens `path` (a file, or a block device if `block`) with a ring of its own of
    /// `depth` entries (see [`UringRing::new`]).
    ///
    /// # Errors
    /// As [`FileDevice::open`] / [`FileDevice::open_block`]; [`Error::Unsupported`] when
    /// io_uring cannot be set up here.
    pub fn open(
        path: impl AsRef<Path>,
        opts: FileOptions,
        block: bool,
        depth: u32,
    ) -> Result<Self> {
        let path = path.as_ref();
        let ring = UringRing::new(depth).map_err(|_| Error::Unsupported {
            device: path.display().to_string(),
            op: "io_uring",
        })?;
        Self::open_on(&ring, path, opts, block)
    }

    /// Opens `path` (a file, or a block device if `block`) on `ring`, which it shares with
    /// the other devices opened on it.
    ///
    /// # Errors
    /// As [`FileDevice::open`] / [`FileDevice::open_block`].
    pub fn open_on(
        ring: &UringRing,
        path: impl AsRef<Path>,
        opts: FileOptions,
        block: bool,
    ) -> Result<Self> {
        let path = path.as_ref();
        let probe = if block {
            FileDevice::open_block(path, opts)?
        } else {
            FileDevice::open(path, opts)?
        };
        let info = probe.info().clone();
        let file = probe.into_file().map_err(|e| Error::Io {
            device: info.name.clone(),
            op: "open",
            start: 0,
            sectors: 0,
            source: e,
        })?;
        let inline = if opts.direct {
            Inline::Never
        } else if !block && on_tmpfs(&file) {
            // (A device node sits on devtmpfs: its data does not.)
            Inline::Always
        } else {
            Inline::NoWait(std::sync::atomic::AtomicBool::new(true))
        };
        Ok(Self {
            info,
            inline,
            buffered: (block && !opts.direct).then(|| BufferedWrites {
                epoch: std::time::Instant::now(),
                pool_until: std::sync::atomic::AtomicU64::new(0),
            }),
            direct: opts.direct,
            mapped: super::mapped::LazyMapped::default(),
            landing: crate::landing::LazyWritable::default(),
            ring: ring.clone(),
            file: Arc::new(file),
            pool: Arc::default(),
        })
    }

    fn io(&self, op: &'static str, start: u64, sectors: u64) -> impl Fn(io::Error) -> Error + '_ {
        move |source| Error::Io {
            device: self.info.name.clone(),
            op,
            start,
            sectors,
            source,
        }
    }

    /// Puts one entry in the ring (its buffers in `state`) and submits it, or keeps it
    /// waiting in user space while the ring holds as many entries as its completion queue
    /// has room for (the reaper lets it in as completions are reaped).
    fn submit(&self, entry: squeue::Entry, state: InFlight) -> io::Result<()> {
        self.ring.ensure_reaper()?;
        let mut st = self.ring.shared.state.lock();
        let id = st.next;
        st.next = st.next.wrapping_add(1);
        st.inflight.insert(
            id,
            Pending {
                state,
                _file: Arc::clone(&self.file),
            },
        );
        st.waiting.push_back(entry.user_data(id));
        if self.direct && crate::plug::plugged_now() {
            // Under a plug: into the submission queue now, into the kernel when the plug is
            // pulled (with whatever else this poll starts). Only with O_DIRECT, where the
            // requests wait in the device's queue and one submission (one wakeup of its
            // worker) for a batch is what was measured to help (4 KiB random writes to a
            // striped volume of 4 loop devices, alternated: 1.14-1.36x). Through the page
            // cache a request here is a copy the kernel makes in the submitting call,
            // with no device queue to batch for.
            let r = st.fill();
            drop(st);
            let target: Arc<dyn crate::plug::Unplug> = self.ring.shared.clone();
            crate::plug::hold(&target);
            if let Err(e) = r {
                let mut st = self.ring.shared.state.lock();
                fail_waiting(&mut st, &e);
                return Err(e);
            }
            return Ok(());
        }
        if let Err(e) = st.feed() {
            // Nothing of this request reached the kernel unless it is in the ring already;
            // fail whatever is still waiting (this one included) and report it.
            fail_waiting(&mut st, &e);
            return Err(e);
        }
        Ok(())
    }

    /// The most requests this device's ring keeps in the kernel at once (its completion
    /// queue's size, over every device on the ring); more wait in user space.
    #[must_use]
    pub fn ring_capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Reads into a pooled buffer; returns it with where the data starts.
    async fn read_raw(
        &self,
        start: u64,
        sectors: u64,
        try_inline: bool,
    ) -> Result<(Vec<u8>, usize)> {
        let len = sectors as usize * 512;
        let n = ring_len(len).map_err(self.io("read", start, sectors))?;
        // The kernel reads into a buffer the ring owns (never the caller's, which a dropped
        // future would leave the kernel writing into).
        let (mut buf, off) = self.pooled(len);
        if try_inline && self.read_inline(&mut [&mut buf[off..off + len]], start * 512) {
            return Ok((buf, off));
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let e = opcode::Read::new(fd, buf[off..].as_mut_ptr(), n)
            .offset(start * 512)
            .build();
        let (reply, rx) = oneshot::channel();
        self.submit(
            e,
            InFlight::Read {
                buf,
                off,
                len,
                reply,
            },
        )
        .map_err(self.io("read", start, sectors))?;
        rx.await
            .map_err(|_| self.closed())?
            .map_err(self.io("read", start, sectors))
    }

    /// Reads `bufs`, one after the other, at `offset` on this thread if that cannot wait for
    /// a device (see [`Inline`]); false if it was not done (then nothing of `bufs` is to be
    /// trusted). Synchronous: the kernel is done with the buffers when it returns, so they
    /// may be the caller's own.
    fn read_inline(&self, bufs: &mut [&mut [u8]], offset: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let flags = match &self.inline {
            Inline::Never => return false,
            Inline::Always => 0,
            Inline::NoWait(on) if !on.load(Relaxed) => return false,
            Inline::NoWait(_) => libc::RWF_NOWAIT,
        };
        let Ok(off) = libc::off_t::try_from(offset) else {
            return false;
        };
        // At most IOV_MAX (1,024) vectors to a call.
        if bufs.is_empty() || bufs.len() > 1024 {
            return false;
        }
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let vector = |b: &mut &mut [u8]| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        };
        // One buffer (the common case) needs no allocation.
        let (one, many): ([libc::iovec; 1], Vec<libc::iovec>);
        let iov: &[libc::iovec] = if let [b] = bufs {
            one = [vector(b)];
            &one
        } else {
            many = bufs.iter_mut().map(vector).collect();
            &many
        };
        // SAFETY: each iovec names one of `bufs`, live and exclusively borrowed for the
        // call; the kernel writes at most each one's length into it and nothing after the
        // call returns (a synchronous read). The count is at most 1,024 (checked above). The
        // fd is owned by the live `File` in `shared`. Exercised by the io_uring tests on
        // files (page cache) and tmpfs, whole and vectored.
        let n = unsafe {
            libc::preadv2(
                self.file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                off,
                flags,
            )
        };
        if n < 0 {
            if let Inline::NoWait(on) = &self.inline {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
                    on.store(false, Relaxed);
                }
            }
            return false;
        }
        // A short read (part cached, or past the end) goes to the ring whole.
        n as usize == want
    }

    /// Writes `data` at `offset` on this thread if the file lives in memory (tmpfs: a copy
    /// that waits for no device); false if not done, or not wholly (the ring then writes it
    /// all again: a write is idempotent).
    fn write_inline(&self, data: &[u8], offset: u64) -> bool {
        if !matches!(self.inline, Inline::Always) {
            return false;
        }
        let Ok(off) = libc::off_t::try_from(offset) else {
            return false;
        };
        // SAFETY: pwrite reads at most `data.len()` bytes from `data`, which is live and
        // borrowed for the call, and keeps no pointer after it returns (synchronous). The fd
        // is owned by the live `File` in `shared`. Exercised by the io_uring test on tmpfs.
        let n =
            unsafe { libc::pwrite(self.file.as_raw_fd(), data.as_ptr().cast(), data.len(), off) };
        n >= 0 && n as usize == data.len()
    }

    /// One `IORING_OP_WRITEV` of `parts` (at most [`IOV_MAX`], checked, aligned if
    /// O_DIRECT) from sector `start`.
    async fn writev(&self, start: u64, parts: Vec<Bytes>) -> Result<()> {
        let len: usize = parts.iter().map(Bytes::len).sum();
        let sectors = len as u64 / 512;
        let iov = Iovecs(
            parts
                .iter()
                .map(|p| libc::iovec {
                    iov_base: p.as_ptr().cast_mut().cast(),
                    iov_len: p.len(),
                })
                .collect(),
        );
        let fd = types::Fd(self.file.as_raw_fd());
        // At most IOV_MAX (1,024) parts: the count fits.
        let e = opcode::Writev::new(fd, iov.0.as_ptr(), iov.0.len() as u32)
            .offset(start * 512)
            .build();
        let (reply, rx) = oneshot::channel();
        self.submit(
            e,
            InFlight::Writev {
                _parts: parts,
                _iov: iov,
                len,
                reply,
            },
        )
        .map_err(self.io("write", start, sectors))?;
        rx.await
            .map_err(|_| self.closed())?
            .map_err(self.io("write", start, sectors))
    }

    /// Writes `parts` one after the other from byte `offset` (one `pwritev` as a rule), on
    /// this thread or on tokio's blocking pool (see [`BufferedWrites`]).
    async fn write_buffered(
        &self,
        b: &BufferedWrites,
        parts: Vec<Bytes>,
        offset: u64,
    ) -> io::Result<()> {
        self.buffered_with(b, move |file| {
            super::file::write_all_vectored_at(file, &parts, offset)
        })
        .await
    }

    /// Runs `write` (a write through the page cache) on this thread, or on tokio's
    /// blocking pool while the kernel holds back writers (see [`BufferedWrites`]).
    async fn buffered_with(
        &self,
        b: &BufferedWrites,
        write: impl FnOnce(&File) -> io::Result<()> + Send + 'static,
    ) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // One clock read before the write and one after (each 25-40 ns on a VM).
        let t = std::time::Instant::now();
        let now = ns(t.saturating_duration_since(b.epoch));
        if now < b.pool_until.load(Relaxed) {
            let file = Arc::clone(&self.file);
            return tokio::task::spawn_blocking(move || write(&file))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)));
        }
        let r = write(&self.file);
        if ns(t.elapsed()) > WRITE_WAITED {
            b.pool_until.store(now.saturating_add(POOL_FOR), Relaxed);
        }
        r
    }

    /// Writes `parts` one after the other from sector `start` on this thread if the file
    /// lives in memory (as [`write_inline`](Self::write_inline), one `pwritev` as a rule);
    /// false if not done, or not wholly (the ring then writes them all again).
    fn writev_inline(&self, parts: &[Bytes], start: u64) -> bool {
        matches!(self.inline, Inline::Always)
            && super::file::write_all_vectored_at(&self.file, parts, start * 512).is_ok()
    }

    /// A buffer of at least `len` bytes (plus alignment room for O_DIRECT) and the offset
    /// where the data goes.
    fn pooled(&self, len: usize) -> (Vec<u8>, usize) {
        let room = len + if self.direct { 4096 } else { 0 };
        match self.pool.take(room) {
            Some(v) => {
                let off = if self.direct {
                    align_gap(v.as_ptr())
                } else {
                    0
                };
                (v, off)
            }
            None => read_buffer(len, self.direct),
        }
    }

    /// Returns a read buffer to the pool (within its bounds).
    fn give_back(&self, v: Vec<u8>) {
        self.pool.give_back(v);
    }

    async fn simple(
        &self,
        op: &'static str,
        start: u64,
        sectors: u64,
        e: squeue::Entry,
    ) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.submit(e, InFlight::Other { reply })
            .map_err(self.io(op, start, sectors))?;
        rx.await
            .map_err(|_| self.closed())?
            .map_err(self.io(op, start, sectors))
    }

    async fn fsync(&self, op: &'static str, start: u64, sectors: u64) -> Result<()> {
        let fd = types::Fd(self.file.as_raw_fd());
        let e = opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        self.simple(op, start, sectors, e).await
    }

    fn closed(&self) -> Error {
        Error::Closed {
            device: self.info.name.clone(),
        }
    }
}

/// A length the ring takes (32 bits).
fn ring_len(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

impl BlockDevice for UringDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    async fn read(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<Bytes> {
        self.info.check(start, sectors)?;
        let (buf, off) = self.read_raw(start, sectors, true).await?;
        let len = sectors as usize * 512;
        // The buffer goes back to the pool when the caller drops the bytes: no allocation,
        // zeroing or page faults per read once the pool is warm.
        Ok(crate::buffers::BufferPool::bytes(&self.pool, buf, off, len))
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

    async fn read_into(&self, start: u64, buf: &mut [u8], _opts: IoOpts) -> Result<()> {
        let sectors = crate::device::sectors_of(&self.info, buf.len())?;
        self.info.check(start, sectors)?;
        let len = buf.len();
        // What cannot wait is read straight into the caller's buffer (synchronously).
        if self.read_inline(&mut [&mut *buf], start * 512) {
            return Ok(());
        }
        // Else through the ring: the copy is the price of never letting the kernel write into
        // the caller's buffer after a dropped future.
        let (v, off) = self.read_raw(start, sectors, false).await?;
        buf.copy_from_slice(&v[off..off + len]);
        self.give_back(v);
        Ok(())
    }

    async fn read_vectored_into(
        &self,
        start: u64,
        mut bufs: Vec<&mut [u8]>,
        _opts: IoOpts,
    ) -> Result<()> {
        let sectors = crate::device::check_bufs(&self.info, start, &bufs)?;
        if self.read_inline(&mut bufs, start * 512) {
            return Ok(());
        }
        let (v, off) = self.read_raw(start, sectors, false).await?;
        crate::device::scatter(&v[off..], bufs);
        self.give_back(v);
        Ok(())
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        let len = data.len();
        let n = ring_len(len).map_err(self.io("write", start, sectors))?;
        // The caller's bytes go to the ring as they are, unless O_DIRECT needs them aligned.
        let data = if needs_copy(&data, self.direct) {
            aligned_bytes(&data)
        } else {
            data
        };
        if let Some(b) = &self.buffered {
            self.write_buffered(b, vec![data], start * 512)
                .await
                .map_err(self.io("write", start, sectors))?;
        } else if !self.write_inline(&data, start * 512) {
            let fd = types::Fd(self.file.as_raw_fd());
            let e = opcode::Write::new(fd, data.as_ptr(), n)
                .offset(start * 512)
                .build();
            let (reply, rx) = oneshot::channel();
            self.submit(
                e,
                InFlight::Write {
                    _data: data,
                    len,
                    reply,
                },
            )
            .map_err(self.io("write", start, sectors))?;
            rx.await
                .map_err(|_| self.closed())?
                .map_err(self.io("write", start, sectors))?;
        }
        if opts.fua {
            self.fsync("write", start, sectors).await?;
        }
        Ok(())
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

    /// Through the page cache, the pipe's bytes are `splice`d into the file: on this
    /// thread for a file in memory or a block device (as [`write`](Self::write)'s `pwrite`),
    /// else on tokio's blocking pool. With `O_DIRECT`, read into memory and written.
    async fn write_piped(&self, start: u64, data: crate::Piped, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        if self.direct {
            return crate::device::write_piped_from_memory(self, start, data, opts).await;
        }
        let offset = start * 512;
        let r = if let Some(b) = &self.buffered {
            self.buffered_with(b, move |f| data.write_to(f, offset))
                .await
        } else if matches!(self.inline, Inline::Always) {
            data.write_to(&self.file, offset)
        } else {
            let file = Arc::clone(&self.file);
            tokio::task::spawn_blocking(move || data.write_to(&file, offset))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
        };
        r.map_err(self.io("write", start, sectors))?;
        if opts.fua {
            self.fsync("write", start, sectors).await?;
        }
        Ok(())
    }

    async fn write_vectored(&self, start: u64, mut parts: Vec<Bytes>, opts: IoOpts) -> Result<()> {
        let sectors = crate::device::check_parts(&self.info, start, &parts)?;
        if parts.len() <= 1 {
            let data = parts.pop().unwrap_or_default();
            return self.write(start, data, opts).await;
        }
        let lbs = self.info.limits.logical_block_size as usize;
        if self.direct && direct_needs_one_buffer(&parts, lbs) {
            // O_DIRECT takes each part aligned: one buffer of them all (`write` aligns it).
            return crate::device::write_parts(self, start, parts, opts).await;
        }
        if let Some(b) = &self.buffered {
            self.write_buffered(b, parts, start * 512)
                .await
                .map_err(self.io("write", start, sectors))?;
        } else if !self.writev_inline(&parts, start) {
            let mut at = start;
            let writes = parts.chunks(IOV_MAX).map(|c| {
                let here = at;
                at += c.iter().map(|p| p.len() as u64).sum::<u64>() / 512;
                self.writev(here, c.to_vec())
            });
            crate::device::all(writes).await?;
        }
        if opts.fua {
            self.fsync("write", start, sectors).await?;
        }
        Ok(())
    }

    async fn flush(&self, _opts: IoOpts) -> Result<()> {
        if self.info.read_only {
            return Err(Error::ReadOnly {
                device: self.info.name.clone(),
            });
        }
        self.fsync("flush", 0, 0).await
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        crate::device::check_zeroes(&self.info, start, sectors)?;
        let fd = types::Fd(self.file.as_raw_fd());
        let mode = libc::FALLOC_FL_KEEP_SIZE
            | if z.unmap {
                libc::FALLOC_FL_PUNCH_HOLE
            } else {
                libc::FALLOC_FL_ZERO_RANGE
            };
        let e = opcode::Fallocate::new(fd, sectors * 512)
            .offset(start * 512)
            .mode(mode)
            .build();
        match self.simple("write-zeroes", start, sectors, e).await {
            Ok(()) => {}
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                // Not natively: write zeroes (unless only fast would do).
                crate::device::write_zero_buffers(self, start, sectors, z, opts).await?;
            }
            Err(e) => return Err(e),
        }
        if opts.fua {
            self.fsync("write-zeroes", start, sectors).await?;
        }
        Ok(())
    }

    async fn discard(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<()> {
        self.info.check_discard(start, sectors)?;
        let fd = types::Fd(self.file.as_raw_fd());
        let e = opcode::Fallocate::new(fd, sectors * 512)
            .offset(start * 512)
            .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
            .build();
        self.simple("discard", start, sectors, e).await
    }

    /// As for files: `SEEK_DATA` / `SEEK_HOLE` on a duplicate of the file's descriptor, on
    /// tokio's blocking pool.
    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        self.info.check(start, sectors)?;
        let lbs = self.info.limits.lbs_sectors();
        let err = |e: io::Error| Error::Io {
            device: self.info.name.clone(),
            op: "seek-data",
            start,
            sectors,
            source: e,
        };
        let file = self.file.try_clone().map_err(err)?;
        tokio::task::spawn_blocking(move || super::file::seek_extents(&file, start, sectors, lbs))
            .await
            .map_err(|j| err(io::Error::other(j.to_string())))
    }
}
