//! Replies sent from the page cache itself, on Unix sockets: a large read's payload that is
//! a view of cached pages ([`BlockDevice::read_to_send`](crate::BlockDevice::read_to_send))
//! goes to the socket by reference instead of being copied into its buffers: the views'
//! pages into a pipe with `vmsplice(2)` (the view is the file's page cache, mapped), and
//! from the pipe to the socket with `splice(2)`; `sendfile(2)` where the kernel refuses
//! either. The copy was a quarter of the server's time on 1 MiB reads (`perf`, over TCP:
//! `_copy_from_iter` 27%).
//!
//! Measured (fio's nbd engine, QD16, one binary with it against one without, alternated
//! both ways, 2-3 rounds each; docs/nbd-performance.md): `sendfile` against the copy, 1 MiB
//! reads over a Unix socket, one connection, 1.22-1.93x the reads a second at about half
//! the CPU per GiB (a file in /dev/shm and a loop device through its page cache); 4
//! connections 0.96-1.05x. The pipe against `sendfile` (which goes through the kernel's
//! own 64 KiB pipe, sixteen rounds a 1 MiB view, and a striped volume's 1 MiB read is
//! sixteen views, 21 system calls a read against the one device's 3.5): 1 MiB reads, 4
//! connections, the one loop device 1.03-1.09x, the shm file 1.17-1.25x, 4 striped loop
//! devices 1.03-1.09x, at 15-35% less CPU per GiB; one connection 0.90-1.07x (the client
//! is the limit) at the same saving. Over TCP on loopback neither: 4 connections
//! 0.54-0.62x with `sendfile` (the reader then copies the cold pages itself, where with
//! a copy it read them hot from the sender's buffers), and the one connection's gain
//! (1.2-1.5x) came from the machine's BBR congestion control and was gone under cubic
//! (0.97x), so TCP connections never use it. Payloads under [`SENDFILE_FROM`] neither (64
//! KiB random 50/50, 4 connections: 0.93-0.95x with `sendfile`, 0.91-1.08x through the
//! pipe); a payload in parts (a striped volume's views of its chunks) counts whole.
//!
//! A reply so sent is, like the view it was, the pages as they are when the peer reads them:
//! a write to the same sectors meanwhile may show in it, as in a `pread` racing that write
//! (concurrent reads and writes of the same sectors have no order in NBD). A file cut short
//! under the server ends the connection (the reply cannot be finished) rather than send
//! bytes it does not have.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use bytes::Bytes;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::backend::mapped;
use crate::piped::Pipe;

/// Chunks given to one gathered write at most (`sendmsg` here, `writev` in the server's
/// `send_all`; Linux's `UIO_MAXIOV` is 1024).
pub(super) const IOV_AT_ONCE: usize = 64;

/// The smallest payload sent from the page cache (see the module's measurements).
pub(super) const SENDFILE_FROM: usize = 256 << 10;

/// The most bytes asked of a pipe for views sent through one (the kernel's default
/// `pipe-max-size`: a 1 MiB read's views at once).
const PIPE_ROOM: usize = 1 << 20;

/// A duplicate of socket `sock`, registered with tokio for `interest`: the server's own
/// handle on a connection's socket for the system calls tokio has no method for
/// (`sendfile`, `splice`). `None` if it cannot be duplicated or registered.
pub(super) fn registered(sock: BorrowedFd<'_>, interest: Interest) -> Option<AsyncFd<OwnedFd>> {
    let fd = sock.try_clone_to_owned().ok()?;
    // SAFETY: `fd` is an open descriptor this `AsyncFd` owns (a fresh duplicate): it stays
    // open, the same description, until the `AsyncFd` drops it. Exercised by this module's
    // tests and every NBD server test over a socket.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.ok()
}

/// Which chunks of a batch go from their files (see [`Sender::plan`]): the mapping and
/// offset of each that does.
#[derive(Debug)]
pub(super) struct Plan(Vec<Option<(Arc<mapped::Mapped>, u64)>>);

/// A connection's socket (a descriptor of its own, registered for writability), for
/// replies with payloads sent from their files.
#[derive(Debug)]
pub(super) struct Sender {
    sock: AsyncFd<OwnedFd>,
    /// `sendfile` was refused here (a socket or file that does not take it): copies from
    /// then on.
    refused: AtomicBool,
    /// `vmsplice`, or `splice` to this socket, was refused here: views go by `sendfile`
    /// from then on.
    pipe_refused: AtomicBool,
}

impl Sender {
    /// A sender on the socket `sock` (duplicated); `None` if it cannot be duplicated or
    /// registered: replies are then written as usual.
    pub(super) fn new(sock: BorrowedFd<'_>) -> Option<Self> {
        let sock = registered(sock, Interest::WRITABLE)?;
        Some(Self {
            sock,
            refused: AtomicBool::new(false),
            pipe_refused: AtomicBool::new(false),
        })
    }

    /// Which of `chunks` to send from their files: the views of mapped files in runs (one
    /// after the other, as a reply's data in parts is) of [`SENDFILE_FROM`] bytes or more,
    /// so that a striped volume's 1 MiB read, 16 views of 64 KiB on 4 files, goes as one
    /// device's does. `None` if none (the chunks are better written the usual way).
    pub(super) fn plan(&self, chunks: &[Bytes]) -> Option<Plan> {
        if self.refused.load(Relaxed) || longest_run(chunks) < SENDFILE_FROM {
            // No run of chunks large enough to be views could reach the size: no lookup,
            // no allocation (a batch of 64 KiB replies).
            return None;
        }
        let mut plan: Vec<_> = chunks.iter().map(|c| mapped::file_range(c)).collect();
        let mut i = 0;
        while i < plan.len() {
            let run = plan[i..].iter().take_while(|v| v.is_some()).count();
            let bytes: usize = chunks[i..i + run].iter().map(Bytes::len).sum();
            if bytes < SENDFILE_FROM {
                plan[i..i + run].fill(None);
            }
            i += run.max(1);
        }
        plan.iter().any(Option::is_some).then_some(Plan(plan))
    }

    /// Sends `chunks` in order: those `plan` names from their files, the rest from memory
    /// (`sendmsg`, `MSG_MORE` while a view follows). Views one after the other (one, or a
    /// striped volume's chunks, each in its component's file) go together through a pipe
    /// ([`send_through_pipe`](Self::send_through_pipe)), each with `sendfile` where the
    /// kernel refuses that. Returns the bytes sent from their files.
    ///
    /// # Errors
    /// The socket's, or `UnexpectedEof` if a file ended before its view did (the reply
    /// cannot be finished: the connection is over).
    pub(super) async fn send(&self, chunks: &[Bytes], plan: Plan) -> io::Result<u64> {
        let plan = plan.0;
        let is_view = |k: usize| plan.get(k).is_some_and(Option::is_some);
        let (mut i, mut from_files) = (0, 0);
        while i < chunks.len() {
            let j = (i..chunks.len())
                .find(|&k| is_view(k) && !self.refused.load(Relaxed))
                .unwrap_or(chunks.len());
            self.send_memory(&chunks[i..j], j < chunks.len()).await?;
            let Some(Some((map, off))) = plan.get(j) else {
                break;
            };
            let run = (j..chunks.len()).take_while(|&k| is_view(k)).count();
            let more = j + run < chunks.len();
            if !self.pipe_refused.load(Relaxed) {
                if let Some(n) = self.send_through_pipe(&chunks[j..j + run], more).await? {
                    from_files += n;
                    i = j + run;
                    continue;
                }
            }
            let more = j + 1 < chunks.len();
            match map.fd() {
                Some(fd) => from_files += self.send_file(fd, *off, &chunks[j], more).await?,
                None => self.send_memory(&chunks[j..=j], more).await?,
            }
            i = j + 1;
        }
        Ok(from_files)
    }

    /// Sends `views` (views of mapped files, one after the other) through a pipe: their
    /// pages go into it by reference (`vmsplice`: the views' memory is the page cache,
    /// mapped) and from it to the socket (`splice`), two system calls for a 1 MiB read
    /// where `sendfile` made one a view (sixteen for a striped volume's) and, within one,
    /// sixteen rounds through the kernel's own 64 KiB pipe. `SPLICE_F_MORE` on the last
    /// piece too if `more`. Returns the bytes sent, or `None` if none went this way and
    /// none ever will here: no pipe to be had this time, or the kernel refused `vmsplice`
    /// or the `splice` to this socket (`pipe_refused`: `sendfile` from then on).
    ///
    /// # Errors
    /// The socket's; `UnexpectedEof` if a file ended inside its view (`vmsplice` finds no
    /// page there: `EFAULT`). Either way the reply cannot be finished.
    async fn send_through_pipe(&self, views: &[Bytes], more: bool) -> io::Result<Option<u64>> {
        let total: usize = views.iter().map(Bytes::len).sum();
        let Some(pipe) = Pipe::with_room(total.min(PIPE_ROOM)) else {
            return Ok(None);
        };
        let mut iov: Vec<IoSlice<'_>> = views.iter().map(|v| IoSlice::new(v)).collect();
        let mut rest = &mut iov[..];
        let (mut in_pipe, mut sent) = (0, 0);
        loop {
            if !rest.is_empty() {
                let n = rest.len().min(IOV_AT_ONCE);
                match vmsplice(pipe.write.as_fd(), &rest[..n]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(k) => {
                        IoSlice::advance_slices(&mut rest, k);
                        in_pipe += k;
                    }
                    // The pipe is full: empty it into the socket first.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && in_pipe > 0 => {}
                    Err(e) if sent + in_pipe == 0 && refused(&e) => {
                        self.pipe_refused.store(true, Relaxed);
                        pipe.give_back();
                        return Ok(None);
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EFAULT) => return Err(cut_short()),
                    Err(e) => return Err(e),
                }
            }
            if in_pipe == 0 {
                break;
            }
            let more = more || !rest.is_empty();
            let out = self
                .io(|s| crate::piped::splice(pipe.read.as_fd(), s, in_pipe, None, more))
                .await;
            match out {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    in_pipe -= n;
                    sent += n;
                }
                // Nothing went to the socket: the pipe (and its references) is dropped.
                Err(e) if sent == 0 && refused(&e) => {
                    self.pipe_refused.store(true, Relaxed);
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        pipe.give_back();
        Ok(Some(sent as u64))
    }

    /// Sends `chunks` from memory; `MSG_MORE` on the last piece too if `more`.
    async fn send_memory(&self, chunks: &[Bytes], more: bool) -> io::Result<()> {
        let mut left: Vec<IoSlice<'_>> = chunks
            .iter()
            .filter(|c| !c.is_empty())
            .map(|c| IoSlice::new(c))
            .collect();
        let mut rest = &mut left[..];
        while !rest.is_empty() {
            let n = rest.len().min(IOV_AT_ONCE);
            let mut flags = libc::MSG_NOSIGNAL;
            if more || n < rest.len() {
                flags |= libc::MSG_MORE;
            }
            let part = &rest[..n];
            let sent = self
                .io(|s| send_vectored(s.as_raw_fd(), part, flags))
                .await?;
            if sent == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, sent);
        }
        Ok(())
    }

    /// Sends `view` (the bytes at `off` of `file`) with `sendfile`; falls back to sending it
    /// from memory if the kernel does not take `sendfile` here before a byte went. Returns
    /// the bytes sent with `sendfile`.
    async fn send_file(
        &self,
        file: BorrowedFd<'_>,
        off: u64,
        view: &Bytes,
        more: bool,
    ) -> io::Result<u64> {
        let (file, len) = (file.as_raw_fd(), view.len() as u64);
        let (Ok(mut at), Some(end)) = (libc::off_t::try_from(off), off.checked_add(len)) else {
            self.send_memory(std::slice::from_ref(view), more).await?;
            return Ok(0);
        };
        while (at as u64) < end {
            let count = usize::try_from(end - at as u64).unwrap_or(usize::MAX);
            let sent = self
                .io(|s| send_file(s.as_raw_fd(), file, &mut at, count))
                .await;
            match sent {
                Ok(0) => return Err(cut_short()),
                Ok(_) => {}
                Err(e) if at as u64 == off && refused(&e) => {
                    self.refused.store(true, Relaxed);
                    self.send_memory(std::slice::from_ref(view), more).await?;
                    return Ok(0);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(len)
    }

    /// Runs `f` on the socket once it is writable, again each time it would block.
    async fn io<R>(&self, mut f: impl FnMut(BorrowedFd<'_>) -> io::Result<R>) -> io::Result<R> {
        loop {
            let mut ready = self.sock.writable().await?;
            if let Ok(r) = ready.try_io(|s| f(s.get_ref().as_fd())) {
                return r;
            }
        }
    }
}

/// The most bytes in chunks one after the other, each large enough to be a view
/// ([`mapped::MAPPED_FROM`]).
fn longest_run(chunks: &[Bytes]) -> usize {
    let (mut run, mut longest) = (0, 0);
    for c in chunks {
        run = if c.len() >= mapped::MAPPED_FROM {
            run + c.len()
        } else {
            0
        };
        longest = longest.max(run);
    }
    longest
}

/// A file that ended inside a view being sent.
fn cut_short() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the file ended inside a read's reply (cut short while it was served?)",
    )
}

/// `sendfile`'s and `splice`'s refusals of a socket or file that does not take them.
fn refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    )
}

/// One `sendmsg` of `parts` with `flags` on the non-blocking socket `s`.
fn send_vectored(s: RawFd, parts: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data); its iovec array is
    // `parts`, which lives across the call (`IoSlice` is ABI-compatible with `iovec` on
    // Unix, as std documents), and the kernel only reads it. Exercised by this module's
    // tests and the NBD server's test of reads sent from the page cache.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = parts.as_ptr().cast_mut().cast();
        msg.msg_iovlen = parts.len() as _;
        libc::sendmsg(s, &raw const msg, flags)
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// One `vmsplice` of `parts`' pages into the non-blocking pipe `pipe` (by reference: the
/// pipe holds the pages, not a copy); the bytes it took.
fn vmsplice(pipe: BorrowedFd<'_>, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: the iovec array is `parts` (`IoSlice` is ABI-compatible with `iovec` on Unix),
    // live across the call and only read; the kernel takes references to the pages behind
    // them (here a mapped file's page cache, which outlives the mapping by those
    // references), not to the array. Exercised by this module's tests of views one after
    // the other and the NBD tests of striped volumes over a Unix socket.
    let n = unsafe {
        libc::vmsplice(
            pipe.as_raw_fd(),
            parts.as_ptr().cast(),
            parts.len(),
            libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// One `sendfile` of up to `count` bytes of `file` from `*at` (which it moves on) to the
/// non-blocking socket `s`.
fn send_file(s: RawFd, file: RawFd, at: &mut libc::off_t, count: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open (the socket is ours, the file is held by the
    // mapping the caller holds); `at` is a live off_t the kernel reads and updates. Exercised
    // as `send_vectored` is.
    let n = unsafe { libc::sendfile(s, file, at, count) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mapped::Mapped;
    use std::os::fd::AsFd;
    use tokio::io::AsyncReadExt;

    /// A file of `len` patterned bytes in a scratch directory, mapped, with its pages
    /// cached (just written).
    fn mapped_file(name: &str, len: usize) -> (std::path::PathBuf, std::fs::File, Vec<u8>) {
        let dir =
            std::env::temp_dir().join(format!("tagstripe-sendfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = dir.join("f");
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (dir, f, data)
    }

    #[tokio::test]
    async fn views_go_from_their_file_and_the_rest_from_memory_in_order() {
        let (dir, f, data) = mapped_file("order", 2 << 20);
        let map = Mapped::new(&f, data.len() as u64).unwrap();
        let large = map.cached(&f, 4096, 1 << 20).unwrap();
        let second = map.cached(&f, (1 << 20) + 8192, 512 << 10).unwrap();
        let small = map.cached(&f, 0, 64 << 10).unwrap();
        let chunks = vec![
            Bytes::from_static(b"header one"),
            large,
            Bytes::from_static(b"two"),
            small,
            Bytes::from_static(b"three"),
            second,
            Bytes::new(),
            Bytes::from_static(b"the end"),
        ];
        let want: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let sender = Sender::new(a.as_fd()).unwrap();
        assert!(
            sender.plan(&chunks[2..5]).is_none(),
            "a view under SENDFILE_FROM, alone, is copied"
        );
        let plan = sender.plan(&chunks).unwrap();
        let mut got = vec![0u8; want.len()];
        let (sent, read) = tokio::join!(sender.send(&chunks, plan), b.read_exact(&mut got));
        read.unwrap();
        assert_eq!(
            sent.unwrap(),
            (1 << 20) + (512 << 10),
            "the two large views, from their file"
        );
        assert!(got == want);

        // A reply's data in parts: five views of 64 KiB one after the other (320 KiB) go
        // from the file, each; the lone one after the next header does not.
        let mut parts = vec![Bytes::from_static(b"hdr")];
        for k in [3, 1, 7, 0, 2] {
            parts.push(map.cached(&f, k * (64 << 10), 64 << 10).unwrap());
        }
        parts.push(Bytes::from_static(b"next hdr"));
        parts.push(map.cached(&f, 5 * (64 << 10), 64 << 10).unwrap());
        let want: Vec<u8> = parts.iter().flat_map(|c| c.to_vec()).collect();
        let plan = sender.plan(&parts).unwrap();
        let mut got = vec![0u8; want.len()];
        let (sent, read) = tokio::join!(sender.send(&parts, plan), b.read_exact(&mut got));
        read.unwrap();
        assert_eq!(sent.unwrap(), 5 * (64 << 10));
        assert!(got == want);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_socket_that_refuses_splice_gets_the_views_copied() {
        let (dir, f, data) = mapped_file("refused", 1 << 20);
        let map = Mapped::new(&f, data.len() as u64).unwrap();
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        // Linux refuses to splice into a descriptor opened for appending (EINVAL), which a
        // socket's flags may say: the pipe's `splice` and then `sendfile` are refused, and
        // the sender copies, for this view and from then on.
        // SAFETY: F_GETFL and F_SETFL on a socket this test owns; no memory is passed.
        let set = unsafe {
            let fl = libc::fcntl(a.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(a.as_raw_fd(), libc::F_SETFL, fl | libc::O_APPEND)
        };
        assert_eq!(set, 0, "{}", io::Error::last_os_error());
        let sender = Sender::new(a.as_fd()).unwrap();
        for round in 0..2 {
            let chunks = [
                Bytes::from_static(b"hdr"),
                map.cached(&f, 256 << 10, 512 << 10).unwrap(),
            ];
            let want: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
            let plan = sender.plan(&chunks);
            assert_eq!(plan.is_some(), round == 0, "round {round}: tried only once");
            let mut got = vec![0u8; want.len()];
            let send = async {
                match plan {
                    Some(plan) => sender.send(&chunks, plan).await,
                    None => sender.send_memory(&chunks, false).await.map(|()| 0),
                }
            };
            let (sent, read) = tokio::join!(send, b.read_exact(&mut got));
            read.unwrap();
            assert_eq!(sent.unwrap(), 0, "round {round}: nothing from the file");
            assert!(got == want, "round {round}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn views_more_than_a_pipe_holds_go_through_it_whole_and_in_order() {
        // 48 views of 64 KiB, out of order and off page boundaries (a view's first and last
        // pages are partly its), 3 MiB: three times a pipe's room, so it fills and is
        // emptied into the socket again and again, and the reader lags behind the writer.
        let (dir, f, data) = mapped_file("pipe", 4 << 20);
        let map = Mapped::new(&f, data.len() as u64).unwrap();
        let views: Vec<Bytes> = (0..48u64)
            .map(|k| {
                let at = (k * 29 % 48) * (64 << 10) + 512 * (k % 3);
                map.cached(&f, at, 64 << 10).unwrap()
            })
            .collect();
        let want: Vec<u8> = views.iter().flat_map(|c| c.to_vec()).collect();
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let sender = Sender::new(a.as_fd()).unwrap();
        for round in 0..2 {
            let mut got = vec![0u8; want.len()];
            let (sent, read) = tokio::join!(
                sender.send_through_pipe(&views, false),
                b.read_exact(&mut got)
            );
            read.unwrap();
            assert_eq!(
                sent.unwrap(),
                Some(3 << 20),
                "round {round}: all through the pipe"
            );
            assert!(got == want, "round {round}");
        }
        assert!(!sender.pipe_refused.load(Relaxed));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_file_cut_short_under_its_view_ends_the_reply_with_an_error() {
        let (dir, f, data) = mapped_file("cut", 1 << 20);
        let map = Mapped::new(&f, data.len() as u64).unwrap();
        let view = map.cached(&f, 512 << 10, 512 << 10).unwrap();
        // Cut inside the view: its last 424 KiB are no longer the file's.
        f.set_len(600 << 10).unwrap();
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let sender = Sender::new(a.as_fd()).unwrap();
        let chunks = [Bytes::from_static(b"hdr"), view];
        let plan = sender.plan(&chunks).unwrap();
        let send = async {
            let r = sender.send(&chunks, plan).await;
            // The view went through a pipe, which found the file's end (`EFAULT`), and was
            // not refused.
            assert!(!sender.pipe_refused.load(Relaxed));
            drop(sender);
            drop(a);
            r
        };
        let mut got = Vec::new();
        let (sent, read) = tokio::join!(send, b.read_to_end(&mut got));
        read.unwrap();
        let e = sent.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        // What did go is the header and the file's bytes up to its new end, nothing else.
        assert_eq!(&got[..3], b"hdr");
        assert!(got[3..] == data[512 << 10..600 << 10]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
