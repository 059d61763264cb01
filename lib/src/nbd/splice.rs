//! Write payloads taken off the socket into pipes: a large write's payload goes from the
//! socket into a kernel pipe with `splice(2)` (the socket's pages, by reference), and the
//! device `splice`s it on into the file's page cache ([`crate::BlockDevice::write_piped`]),
//! so its bytes are copied once, into the page cache, instead of twice (into the server's
//! buffer, then from it). The session hands such a payload off
//! ([`ServerSession::hand_off_payloads`](tagstripe_nbd_proto::session::ServerSession::hand_off_payloads))
//! only on a plain TCP socket (not TLS; a Unix socket's payloads measured slower so) and
//! only to a device that takes piped writes (a file or block device through the page
//! cache, served alone); the write then runs as any other, through the same checks.
//!
//! To a device that lends its pages (a file in memory, served alone: see
//! [`Landing`](crate::Landing)), payloads of 32 KiB and more are handed off over either
//! plain socket and read straight into the file's pages instead ([`Receiver::land`]): one
//! copy, with no `pwrite` (the shm file, 1 MiB writes at QD16: over a Unix socket
//! 1.45-1.55x the writes a second with one job and 2.15-2.30x with 4, over TCP 1.61-1.72x,
//! at about half the CPU a GiB; docs/nbd-performance.md).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::{Landing, Piped};

/// Pieces of writes with at least this many bytes still on the socket when their header
/// has been read are handed off (see the module's measurements in `server.rs`).
pub(super) const HAND_OFF_FROM: u64 = 128 << 10;

/// The largest piece handed off: a pipe holds a piece whole (the kernel lets root grow a
/// pipe past `pipe-max-size`, 1 MiB by default; others get what fits, the rest of a piece
/// read into memory).
pub(super) const HAND_OFF_MAX: u64 = 4 << 20;

/// A connection's socket (a descriptor of its own, registered for readability), to take
/// payloads from.
#[derive(Debug)]
pub(super) struct Receiver {
    sock: AsyncFd<OwnedFd>,
}

impl Receiver {
    /// A receiver on the socket `sock` (duplicated); `None` if it cannot be duplicated or
    /// registered: payloads are then read as usual.
    pub(super) fn new(sock: BorrowedFd<'_>) -> Option<Self> {
        let sock = super::sendfile::registered(sock, Interest::READABLE)?;
        Some(Self { sock })
    }

    /// Fills `p` from the socket until it holds `total` bytes. Stopping it (dropping the
    /// future) loses nothing: what was taken is in `p`, and the next call goes on.
    ///
    /// # Errors
    /// The socket's; `UnexpectedEof` if the client closed it first.
    pub(super) async fn fill(&self, p: &mut Piped, total: usize) -> io::Result<()> {
        while p.len() < total {
            let mut ready = self.sock.readable().await?;
            if let Ok(r) = ready.try_io(|s| p.fill_from(s.as_fd(), total - p.len())) {
                r?;
            }
        }
        Ok(())
    }

    /// Receives into `l` from the socket until it is full, each read under a share of the
    /// export's read-modify-write lock `rmw`, taken once bytes are waiting and let go
    /// before the next wait: a read-modify-write of a block of the write (which would put
    /// back the bytes it read) comes wholly before or after each read, and a client slow
    /// to send its payload holds no other writer up. Stopping it (dropping the future)
    /// loses nothing: what was taken is in `l`, and the next call goes on.
    ///
    /// # Errors
    /// The socket's; `UnexpectedEof` if the client closed it first.
    pub(super) async fn land(
        &self,
        l: &mut Landing,
        rmw: &tokio::sync::RwLock<()>,
    ) -> io::Result<()> {
        while !l.is_full() {
            let mut ready = self.sock.readable().await?;
            let _share = super::server::shared(rmw).await;
            if let Ok(r) = ready.try_io(|s| l.receive_from(s.as_fd())) {
                r?;
            }
        }
        Ok(())
    }
}
