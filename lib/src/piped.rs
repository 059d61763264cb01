//! A write's payload held in a kernel pipe ([`Piped`]): bytes a server moved from its socket
//! with `splice(2)`, which hands the pipe the socket's pages by reference instead of copying
//! them into the server's memory, for a device to `splice` on into a file's page cache (the
//! one copy left). A device that cannot take them so reads them out into memory first
//! ([`Piped::into_bytes`]), which is the copy a `read` from the socket would have made.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use bytes::{Bytes, BytesMut};

/// Pipes kept for reuse once drained (creating one and growing it is three system calls).
/// Few: a pipe's slots count against its user's pipe memory (`pipe-user-pages-soft`,
/// 64 MiB by default, past which an unprivileged user's new pipes get two pages) whether
/// or not it holds bytes.
const POOL_MAX: usize = 8;

static POOL: parking_lot::Mutex<Vec<Pipe>> = parking_lot::Mutex::new(Vec::new());

/// Where [`Piped::into_bytes`] starts its buffer: a page, as `O_DIRECT` asks.
const ALIGN: usize = 4096;

/// One pipe, both ends non-blocking, and what it holds at most. Also the NBD server's, to
/// send views of the page cache to a socket (`vmsplice` in, one `splice` out).
#[derive(Debug)]
pub(crate) struct Pipe {
    pub(crate) read: OwnedFd,
    pub(crate) write: OwnedFd,
    pub(crate) capacity: usize,
}

impl Pipe {
    /// A pipe that holds at least `room` bytes (twice that where the kernel allows: a
    /// socket's bytes take a slot of the pipe per piece of memory they are in, and the
    /// pieces are not always whole pages), from the pool if one there is large enough and
    /// not over four times as large (the smallest such: a payload of a few KiB does not
    /// hold a pipe of megabytes, and one that is to spill past its pipe does).
    pub(crate) fn with_room(room: usize) -> Option<Self> {
        {
            let mut pool = POOL.lock();
            let fits = pool
                .iter()
                .enumerate()
                .filter(|(_, p)| p.capacity >= room && p.capacity / 4 <= room)
                .min_by_key(|(_, p)| p.capacity)
                .map(|(i, _)| i);
            if let Some(i) = fits {
                return Some(pool.swap_remove(i));
            }
        }
        Self::fresh(room)
    }

    /// A new pipe for `room` bytes (see [`with_room`](Self::with_room)).
    fn fresh(room: usize) -> Option<Self> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the two-element array on our stack and
        // keeps no pointer. Exercised by every test of this module.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: both descriptors were just created by pipe2 and are owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let grow = |bytes: usize| -> Option<usize> {
            let bytes = libc::c_int::try_from(bytes).ok()?;
            // SAFETY: F_SETPIPE_SZ takes an int argument and no pointer; the fd is the
            // pipe's, open. Exercised by every test of this module.
            let got = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) };
            usize::try_from(got).ok()
        };
        let capacity = grow(room.saturating_mul(2)).or_else(|| grow(room))?;
        Some(Self {
            read,
            write,
            capacity,
        })
    }

    /// Back to the pool (only an empty pipe comes here).
    pub(crate) fn give_back(self) {
        let mut pool = POOL.lock();
        if pool.len() < POOL_MAX {
            pool.push(self);
        }
    }
}

/// Bytes moved between two descriptors by `splice(2)`, at most `len`; `off_out` is the
/// file offset to write at (`None`: the descriptor's own position, a pipe's); `more`:
/// `SPLICE_F_MORE` (more bytes follow, as `MSG_MORE` to a socket).
pub(crate) fn splice(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    len: usize,
    off_out: Option<u64>,
    more: bool,
) -> io::Result<usize> {
    let mut off = match off_out {
        Some(o) => Some(
            libc::loff_t::try_from(o).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        ),
        None => None,
    };
    let off_ptr = off
        .as_mut()
        .map_or(std::ptr::null_mut(), std::ptr::from_mut);
    // SAFETY: splice reads and writes only the kernel's buffers of the two descriptors, both
    // open for the call (borrowed), and the offset through `off_ptr`, a live loff_t on our
    // stack or null; it keeps no pointer after it returns. Exercised by every test here.
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            off_ptr,
            len,
            libc::SPLICE_F_MOVE
                | libc::SPLICE_F_NONBLOCK
                | if more { libc::SPLICE_F_MORE } else { 0 },
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Reads exactly `buf.len()` bytes from `fd` (a pipe holding at least that many).
fn read_exact(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let want = &mut buf[got..];
        // SAFETY: read writes at most `want.len()` bytes into `want`, live and borrowed
        // mutably for the call, and keeps no pointer. Exercised by
        // `the_bytes_come_back_whole_from_memory_and_pipe` and
        // `a_file_that_refuses_splice_gets_the_bytes_written`.
        let n = unsafe { libc::read(fd.as_raw_fd(), want.as_mut_ptr().cast(), want.len()) };
        match usize::try_from(n) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Bytes waiting to be read on a socket (or pipe) `fd` (`FIONREAD`); 0 if it cannot say.
fn waiting(fd: BorrowedFd<'_>) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `n`, a live c_int on our stack, and keeps no
    // pointer. Exercised by `a_full_pipe_takes_the_rest_into_memory_in_order`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &raw mut n) };
    if r == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// A write's payload: bytes already in memory, then bytes in a pipe, then bytes in memory
/// again (those that came when the pipe was full), in that order. Made by a server that
/// takes a write's payload off its socket with [`fill_from`](Self::fill_from); written by
/// a device with [`write_to`](Self::write_to) (the pipe's bytes go to the file's page
/// cache without passing through memory here) or read out with
/// [`into_bytes`](Self::into_bytes).
///
/// ```
/// use std::io::Write;
/// use std::os::fd::AsFd;
/// use bytes::Bytes;
/// use tagstripe::Piped;
///
/// let (mut client, server) = std::os::unix::net::UnixStream::pair()?;
/// client.write_all(&[2u8; 8192])?;
/// let mut p = Piped::new(Bytes::from(vec![1u8; 512]), 8192);
/// while p.len() < 512 + 8192 {
///     p.fill_from(server.as_fd(), 512 + 8192 - p.len())?;
/// }
/// let path = std::env::temp_dir().join(format!("tagstripe-piped-doc-{}", std::process::id()));
/// let file = std::fs::OpenOptions::new().read(true).write(true).create(true).open(&path)?;
/// std::fs::remove_file(&path)?;
/// p.write_to(&file, 4096)?;
/// let mut back = vec![0u8; 512 + 8192];
/// std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 4096)?;
/// assert!(back[..512].iter().all(|&b| b == 1) && back[512..].iter().all(|&b| b == 2));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Piped {
    head: Bytes,
    pipe: Option<Pipe>,
    /// Bytes in the pipe.
    in_pipe: usize,
    tail: BytesMut,
}

impl Piped {
    /// A payload that starts with `head`, with a pipe for `room` bytes more (from a pool of
    /// drained ones). If no pipe that large can be had (the kernel's `pipe-max-size` or its
    /// per-user limit on pipe memory), the bytes that follow are read into memory instead.
    #[must_use]
    pub fn new(head: Bytes, room: usize) -> Self {
        Self {
            head,
            pipe: if room > 0 {
                Pipe::with_room(room)
            } else {
                None
            },
            in_pipe: 0,
            tail: BytesMut::new(),
        }
    }

    /// Bytes held, in memory and in the pipe.
    #[must_use]
    pub fn len(&self) -> usize {
        self.head.len() + self.in_pipe + self.tail.len()
    }

    /// Holds no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes that went into the pipe (the rest is in memory).
    #[must_use]
    pub fn in_pipe(&self) -> usize {
        self.in_pipe
    }

    /// Takes up to `max` bytes from `from` (a non-blocking socket, or a pipe) and returns how
    /// many: into the pipe while it has room, else (the pipe full, or none) into memory, so
    /// the bytes always stay in the order they came.
    ///
    /// # Errors
    /// `WouldBlock` when `from` has no bytes waiting (wait for it to be readable, then call
    /// again); `UnexpectedEof` when it is closed; its other errors as they are.
    pub fn fill_from(&mut self, from: BorrowedFd<'_>, max: usize) -> io::Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        if self.tail.is_empty() {
            if let Some(p) = &self.pipe {
                let room = p.capacity - self.in_pipe;
                if room > 0 {
                    match splice(from, p.write.as_fd(), max.min(room), None, false) {
                        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Ok(n) => {
                            self.in_pipe += n;
                            return Ok(n);
                        }
                        // Either `from` has nothing, or the pipe has no slot left (bytes
                        // in small pieces take one each): the latter if `from` has bytes.
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock && waiting(from) == 0 => {
                            return Err(e);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        // A descriptor that cannot be spliced from: memory from here on.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        self.tail.reserve(max);
        let spare = &mut self.tail.spare_capacity_mut()[..max];
        // SAFETY: read writes at most `spare.len()` bytes into the spare capacity of `tail`,
        // live and borrowed mutably for the call, and keeps no pointer; only the bytes it
        // reports written are then counted as initialized (`set_len`). Exercised by
        // `a_full_pipe_takes_the_rest_into_memory_in_order`.
        let n = unsafe { libc::read(from.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len()) };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // SAFETY: the read above initialized the first `n` bytes of the spare capacity.
        unsafe { self.tail.set_len(self.tail.len() + n) };
        Ok(n)
    }

    /// Moves the first `n` bytes of this payload to the end of `dst`, in order: a pipe's
    /// bytes `splice`d from pipe to pipe (the pages by reference, not copied), into `dst`'s
    /// memory where its pipe is full or it has none; bytes in memory copied. How a payload
    /// is cut into the pieces of a striped volume's components, which a pipe, read once
    /// and front to back, could not otherwise be.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::Piped;
    ///
    /// let mut p = Piped::new(Bytes::from(vec![7u8; 4096]), 0);
    /// let mut first = Piped::new(Bytes::new(), 1024);
    /// p.move_front_to(&mut first, 1024)?;
    /// assert_eq!((first.len(), p.len()), (1024, 3072));
    /// assert!(p.move_front_to(&mut first, 4096).is_err()); // only 3,072 bytes are left
    /// assert_eq!(p.len(), 3072);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    /// `UnexpectedEof` (nothing moved) if this payload holds fewer than `n` bytes; the
    /// pipes' errors (none is expected: the bytes are there), after which both payloads
    /// are to be dropped, as a failed write's.
    pub fn move_front_to(&mut self, dst: &mut Self, n: usize) -> io::Result<()> {
        if n > self.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let from_head = n.min(self.head.len());
        dst.push_memory(self.head.split_to(from_head));
        let mut left = n - from_head;
        if left > 0 && self.in_pipe > 0 {
            let p = self.pipe.as_ref().map(|p| p.read.as_fd());
            let Some(src) = p else {
                return Err(io::ErrorKind::UnexpectedEof.into());
            };
            let mut want = left.min(self.in_pipe);
            while want > 0 {
                let moved = dst.fill_from(src, want)?;
                self.in_pipe -= moved;
                want -= moved;
                left -= moved;
            }
        }
        if left > 0 {
            dst.push_memory(self.tail.split_to(left).freeze());
        }
        Ok(())
    }

    /// Appends bytes in memory: to the head while nothing is in the pipe or after it,
    /// else after the pipe's bytes. Into an empty payload they go as they are (the same
    /// buffer, not a copy: a striped volume's first piece often starts with the bytes that
    /// came with the header).
    fn push_memory(&mut self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        if self.is_empty() {
            self.head = bytes;
        } else if self.in_pipe == 0 && self.tail.is_empty() {
            let mut head = BytesMut::with_capacity(self.head.len() + bytes.len());
            head.extend_from_slice(&self.head);
            head.extend_from_slice(&bytes);
            self.head = head.freeze();
        } else {
            self.tail.extend_from_slice(&bytes);
        }
    }

    /// Writes the bytes, in order, to `file` from byte `offset`: those in memory with
    /// `pwrite`, the pipe's with `splice` (no copy through this process's memory), or, if
    /// the file does not take `splice` (`EINVAL`: a file opened for appending, a file
    /// system without it), read out of the pipe and written with `pwrite`. The pipe goes
    /// back to the pool for the next payload.
    ///
    /// # Errors
    /// The file's. The bytes are then gone (a pipe cannot be read twice): the write failed
    /// as a whole, as a device error would have it.
    pub fn write_to(mut self, file: &File, offset: u64) -> io::Result<()> {
        file.write_all_at(&self.head, offset)?;
        let mut at = offset + self.head.len() as u64;
        if let Some(p) = &self.pipe {
            while self.in_pipe > 0 {
                match splice(p.read.as_fd(), file.as_fd(), self.in_pipe, Some(at), false) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        self.in_pipe -= n;
                        at += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                        ) =>
                    {
                        // Refused, and nothing taken from the pipe by the refusal.
                        let mut rest = vec![0u8; self.in_pipe];
                        read_exact(p.read.as_fd(), &mut rest)?;
                        self.in_pipe = 0;
                        file.write_all_at(&rest, at)?;
                        at += rest.len() as u64;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        file.write_all_at(&self.tail, at)
    }

    /// All the bytes in one buffer, starting on a page (the copy a read from the socket
    /// would have made): for a device that cannot write from a pipe.
    ///
    /// # Errors
    /// The pipe's (none is expected: its bytes are there).
    pub fn into_bytes(mut self) -> io::Result<Bytes> {
        let len = self.len();
        if self.in_pipe == 0 && self.tail.is_empty() {
            return Ok(std::mem::take(&mut self.head));
        }
        let mut v = vec![0u8; len + ALIGN];
        let gap = (ALIGN - v.as_ptr() as usize % ALIGN) % ALIGN;
        let buf = &mut v[gap..gap + len];
        let (h, rest) = buf.split_at_mut(self.head.len());
        h.copy_from_slice(&self.head);
        let (mid, t) = rest.split_at_mut(self.in_pipe);
        if let Some(p) = &self.pipe {
            read_exact(p.read.as_fd(), mid)?;
            self.in_pipe = 0;
        }
        t.copy_from_slice(&self.tail);
        Ok(Bytes::from(v).slice(gap..gap + len))
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        // A pipe still holding bytes (a write that failed or was never made) is closed, not
        // handed to the next payload.
        if let Some(p) = self.pipe.take() {
            if self.in_pipe == 0 {
                p.give_back();
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// A file of its own, already unlinked.
    pub(crate) fn scratch(name: &str) -> File {
        let path =
            std::env::temp_dir().join(format!("tagstripe-piped-{name}-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 253) as u8 ^ seed).collect()
    }

    /// Fills `p` from `s` until it holds `len` bytes (the writer has sent them all).
    fn fill(p: &mut Piped, s: &UnixStream, len: usize) {
        while p.len() < len {
            p.fill_from(s.as_fd(), len - p.len())
                .expect("bytes are waiting");
        }
    }

    /// Fills `p` from `s` until it holds `len` bytes, while a writer thread sends them.
    fn fill_as_sent(p: &mut Piped, s: &UnixStream, len: usize) {
        while p.len() < len {
            match p.fill_from(s.as_fd(), len - p.len()) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn the_bytes_come_back_whole_from_memory_and_pipe() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let body = pattern(200 << 10, 5);
        a.write_all(&body).unwrap();
        let head = pattern(3000, 9);
        let mut p = Piped::new(Bytes::from(head.clone()), body.len());
        fill(&mut p, &b, head.len() + body.len());
        assert!(p.in_pipe() > 0, "the socket's bytes went to the pipe");
        let got = p.into_bytes().unwrap();
        assert_eq!(got.as_ptr() as usize % ALIGN, 0);
        assert_eq!(&got[..head.len()], &head[..]);
        assert_eq!(&got[head.len()..], &body[..]);
        // Nothing more waiting: says so, and takes nothing.
        let mut q = Piped::new(Bytes::new(), 4096);
        let e = q.fill_from(b.as_fd(), 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(q.is_empty());
        drop(a);
        let e = q.fill_from(b.as_fd(), 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn the_pipes_bytes_land_in_the_file_at_the_offset_in_order() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let body = pattern(1 << 20, 1);
        let sender = std::thread::spawn(move || a.write_all(&body).map(|()| body));
        let head = pattern(4096, 2);
        let total = head.len() + (1 << 20);
        let mut p = Piped::new(Bytes::from(head.clone()), 1 << 20);
        fill_as_sent(&mut p, &b, total);
        let body = sender.join().unwrap().unwrap();
        let f = scratch("order");
        f.set_len(8 << 20).unwrap();
        p.write_to(&f, 3 << 20).unwrap();
        let mut back = vec![0u8; total];
        f.read_exact_at(&mut back, 3 << 20).unwrap();
        assert_eq!(&back[..4096], &head[..]);
        assert!(back[4096..] == body[..], "the payload, in order");
    }

    /// A pipe too small for the payload (no room for all of it) takes what fits; the rest
    /// comes into memory behind it, and the order holds both ways out.
    #[test]
    fn a_full_pipe_takes_the_rest_into_memory_in_order() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let body = pattern(96 << 10, 7);
        a.write_all(&body[..64 << 10]).unwrap();
        // A pipe of its own (the pool's, shared with the other tests, may be larger).
        let mut p = Piped {
            head: Bytes::new(),
            pipe: Pipe::fresh(4096),
            in_pipe: 0,
            tail: BytesMut::new(),
        };
        let cap = p.pipe.as_ref().unwrap().capacity;
        assert!(cap < body.len(), "a pipe of {cap} bytes");
        // Written in two bursts: the second arrives after the pipe filled.
        fill(&mut p, &b, 64 << 10);
        a.write_all(&body[64 << 10..]).unwrap();
        fill(&mut p, &b, body.len());
        assert!(p.in_pipe() > 0 && p.in_pipe() <= cap);
        assert!(!p.tail.is_empty(), "the rest went to memory");
        let f = scratch("full");
        p.write_to(&f, 512).unwrap();
        let mut back = vec![0u8; body.len()];
        f.read_exact_at(&mut back, 512).unwrap();
        assert!(back == body);
    }

    #[test]
    fn a_payload_cut_into_pieces_keeps_every_byte_in_order() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let body = pattern(300 << 10, 3);
        let sent = body.clone();
        let sender = std::thread::spawn(move || a.write_all(&sent));
        let head = pattern(5000, 4);
        let total = head.len() + body.len();
        // A pipe for 64 KiB of the body: the rest spills into memory after it.
        let mut p = Piped::new(Bytes::from(head.clone()), 64 << 10);
        fill_as_sent(&mut p, &b, total);
        sender.join().unwrap().unwrap();
        assert!(p.in_pipe() > 0 && p.in_pipe() < body.len());
        let whole: Vec<u8> = [head, body].concat();
        // Pieces dealt round-robin to three payloads (as a stripe's units to its
        // components): one with a pipe as large as its share, one with a small pipe (it
        // spills), one with none (all memory). Pieces straddle head, pipe and tail.
        let piece = 23 * 512 + 100;
        let mut dst = [
            Piped::new(Bytes::new(), total / 3 + piece),
            Piped::new(Bytes::new(), 4096),
            Piped::new(Bytes::new(), 0),
        ];
        let mut want: [Vec<u8>; 3] = Default::default();
        let (mut at, mut i) = (0, 0);
        while at < total {
            let n = piece.min(total - at);
            p.move_front_to(&mut dst[i % 3], n).unwrap();
            want[i % 3].extend_from_slice(&whole[at..at + n]);
            assert_eq!(p.len(), total - at - n);
            at += n;
            i += 1;
        }
        assert!(p.is_empty());
        assert!(dst[0].in_pipe() > 0, "pipe to pipe");
        for (d, w) in dst.into_iter().zip(want) {
            assert_eq!(d.len(), w.len());
            assert!(d.into_bytes().unwrap() == w);
        }
        // More than it holds: refused, nothing moved.
        let mut q = Piped::new(Bytes::from(vec![1u8; 10]), 0);
        let mut r = Piped::new(Bytes::new(), 0);
        assert!(q.move_front_to(&mut r, 11).is_err());
        assert_eq!((q.len(), r.len()), (10, 0));
    }

    /// Bytes in memory moved into an empty payload go as they are: the same buffer, not a
    /// copy (a striped volume's first pieces of a write are often the bytes that came with
    /// its header). Into a payload that holds bytes they are appended, in order.
    #[test]
    fn memory_moved_into_an_empty_payload_is_the_same_buffer() {
        let whole = Bytes::from(pattern(64 << 10, 6));
        let mut p = Piped::new(whole.clone(), 0);
        let (mut a, mut b) = (Piped::new(Bytes::new(), 0), Piped::new(Bytes::new(), 0));
        p.move_front_to(&mut a, 16 << 10).unwrap();
        p.move_front_to(&mut b, 16 << 10).unwrap();
        assert_eq!(a.head.as_ptr(), whole.as_ptr());
        assert_eq!(b.head.as_ptr(), whole[16 << 10..].as_ptr());
        p.move_front_to(&mut a, 1000).unwrap();
        assert_eq!(p.len(), (32 << 10) - 1000);
        let mut want = whole[..16 << 10].to_vec();
        want.extend_from_slice(&whole[32 << 10..(32 << 10) + 1000]);
        assert!(a.into_bytes().unwrap() == want);
        assert!(b.into_bytes().unwrap() == whole[16 << 10..32 << 10]);
        // The bytes that came into memory after a pipe (its tail) go the same way.
        let (mut c, d) = UnixStream::pair().unwrap();
        d.set_nonblocking(true).unwrap();
        c.write_all(&whole).unwrap();
        let mut q = Piped::new(Bytes::new(), 0);
        fill(&mut q, &d, whole.len());
        let at = q.tail.as_ptr();
        let mut e = Piped::new(Bytes::new(), 0);
        q.move_front_to(&mut e, 4096).unwrap();
        assert_eq!(e.head.as_ptr(), at);
        assert!(e.into_bytes().unwrap() == whole[..4096]);
    }

    /// A file that does not take `splice` (opened for appending: `EINVAL`) gets the pipe's
    /// bytes read out and written: nothing lost.
    #[test]
    fn a_file_that_refuses_splice_gets_the_bytes_written() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let body = pattern(128 << 10, 11);
        a.write_all(&body).unwrap();
        let head = pattern(1024, 12);
        let mut p = Piped::new(Bytes::from(head.clone()), body.len());
        fill(&mut p, &b, head.len() + body.len());
        assert!(p.in_pipe() > 0);
        let path =
            std::env::temp_dir().join(format!("tagstripe-piped-append-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        // An empty file: appending lands where the offset says.
        p.write_to(&f, 0).unwrap();
        let mut back = vec![0u8; head.len() + body.len()];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..head.len()] == head[..] && back[head.len()..] == body[..]);
    }

    /// A write that fails (a file opened read-only) reports the file's error, and its pipe,
    /// still holding bytes, is not handed to the next payload.
    #[test]
    fn a_failed_write_reports_the_error_and_keeps_no_stale_pipe() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        a.write_all(&pattern(64 << 10, 3)).unwrap();
        let mut p = Piped::new(Bytes::new(), 64 << 10);
        fill(&mut p, &b, 64 << 10);
        let path = std::env::temp_dir().join(format!("tagstripe-piped-ro-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let ro = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(p.write_to(&ro, 0).is_err());
        // Every pipe in the pool is empty.
        for q in POOL.lock().iter() {
            assert_eq!(waiting(q.read.as_fd()), 0);
        }
    }
}
