//! The seam every backend and layer plugs into: the [`BlockDevice`] trait (read here first),
//! then what a device is ([`DeviceInfo`], [`Caps`]), what travels with a request
//! ([`IoOpts`], [`Zeroes`], [`Extent`]), the object-safe [`DynBlockDevice`] for devices of
//! different types behind one pointer, and the checks every implementation shares.

/// Writes the thirteen I/O methods of a [`BlockDevice`] impl that hands every request on to
/// another device, once, for every such impl (`Arc<D>`, a mirror's `Slot`, ...): the
/// forwarding boilerplate in one place. `|self| DEV` names the device (evaluated once per
/// request). `direct` returns the inner device's futures as they are (no state machine of
/// its own); `async` awaits them (for a `DEV` that is a temporary, such as a guard's clone).
macro_rules! forward_io {
    (direct |$s:ident| $dev:expr) => {
        fn read(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<bytes::Bytes>> + Send {
            $dev.read(start, sectors, opts)
        }
        fn read_to_send(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<bytes::Bytes>> + Send {
            $dev.read_to_send(start, sectors, opts)
        }
        fn read_parts_to_send(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<Vec<bytes::Bytes>>> + Send {
            $dev.read_parts_to_send(start, sectors, opts)
        }
        fn read_into(
            &$s,
            start: u64,
            buf: &mut [u8],
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.read_into(start, buf, opts)
        }
        fn read_vectored_into(
            &$s,
            start: u64,
            bufs: Vec<&mut [u8]>,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.read_vectored_into(start, bufs, opts)
        }
        fn write(
            &$s,
            start: u64,
            data: bytes::Bytes,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.write(start, data, opts)
        }
        fn write_vectored(
            &$s,
            start: u64,
            parts: Vec<bytes::Bytes>,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.write_vectored(start, parts, opts)
        }
        fn takes_piped_writes(&$s) -> bool {
            $dev.takes_piped_writes()
        }
        fn lands_writes(&$s) -> bool {
            $dev.lands_writes()
        }
        fn write_landing(&$s, start: u64, sectors: u64) -> Option<$crate::Landing> {
            $dev.write_landing(start, sectors)
        }
        fn write_piped(
            &$s,
            start: u64,
            data: $crate::Piped,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.write_piped(start, data, opts)
        }
        fn flush(&$s, opts: $crate::IoOpts) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.flush(opts)
        }
        fn discard(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.discard(start, sectors, opts)
        }
        fn write_zeroes(
            &$s,
            start: u64,
            sectors: u64,
            z: $crate::Zeroes,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            $dev.write_zeroes(start, sectors, z, opts)
        }
        fn allocation(
            &$s,
            start: u64,
            sectors: u64,
        ) -> impl Future<Output = $crate::Result<Vec<$crate::Extent>>> + Send {
            $dev.allocation(start, sectors)
        }
    };
    (async |$s:ident| $dev:expr) => {
        async fn read(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> $crate::Result<bytes::Bytes> {
            $dev.read(start, sectors, opts).await
        }
        async fn read_to_send(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> $crate::Result<bytes::Bytes> {
            $dev.read_to_send(start, sectors, opts).await
        }
        async fn read_parts_to_send(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> $crate::Result<Vec<bytes::Bytes>> {
            $dev.read_parts_to_send(start, sectors, opts).await
        }
        async fn read_into(
            &$s,
            start: u64,
            buf: &mut [u8],
            opts: $crate::IoOpts,
        ) -> $crate::Result<()> {
            $dev.read_into(start, buf, opts).await
        }
        async fn read_vectored_into(
            &$s,
            start: u64,
            bufs: Vec<&mut [u8]>,
            opts: $crate::IoOpts,
        ) -> $crate::Result<()> {
            $dev.read_vectored_into(start, bufs, opts).await
        }
        async fn write(
            &$s,
            start: u64,
            data: bytes::Bytes,
            opts: $crate::IoOpts,
        ) -> $crate::Result<()> {
            $dev.write(start, data, opts).await
        }
        async fn write_vectored(
            &$s,
            start: u64,
            parts: Vec<bytes::Bytes>,
            opts: $crate::IoOpts,
        ) -> $crate::Result<()> {
            $dev.write_vectored(start, parts, opts).await
        }
        fn takes_piped_writes(&$s) -> bool {
            $dev.takes_piped_writes()
        }
        fn lands_writes(&$s) -> bool {
            $dev.lands_writes()
        }
        fn write_landing(&$s, start: u64, sectors: u64) -> Option<$crate::Landing> {
            $dev.write_landing(start, sectors)
        }
        async fn write_piped(
            &$s,
            start: u64,
            data: $crate::Piped,
            opts: $crate::IoOpts,
        ) -> $crate::Result<()> {
            $dev.write_piped(start, data, opts).await
        }
        async fn flush(&$s, opts: $crate::IoOpts) -> $crate::Result<()> {
            $dev.flush(opts).await
        }
        async fn discard(&$s, start: u64, sectors: u64, opts: $crate::IoOpts) -> $crate::Result<()> {
            $dev.discard(start, sectors, opts).await
        }
        async fn write_zeroes(
            &$s,
            start: u64,
            sectors: u64,
            z: $crate::Zeroes,
            opts: $crate::IoOpts,
        ) -> $crate::Result<()> {
            $dev.write_zeroes(start, sectors, z, opts).await
        }
        async fn allocation(&$s, start: u64, sectors: u64) -> $crate::Result<Vec<$crate::Extent>> {
            $dev.allocation(start, sectors).await
        }
    };
}
pub(crate) use forward_io;

/// Writes [`BlockDevice::write`] and [`BlockDevice::write_vectored`] for a layer that takes
/// both through one path: each checked against the layer's own [`DeviceInfo`], then
/// `|self| FUNCTION(start, sectors, parts, opts)` called with the data as a
/// [`Parts`] (one buffer as one, a list of one as one buffer). They return `async move`
/// blocks, not `async fn`s: an `async fn`'s future keeps room for its arguments twice, and
/// every layer above holds a request's future inline (a server boxes it whole).
macro_rules! write_through_parts {
    (|$s:ident| $f:ident) => {
        fn write(
            &$s,
            start: u64,
            data: bytes::Bytes,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            async move {
                let sectors = $crate::BlockDevice::info($s).check_write(start, data.len())?;
                $s.$f(start, sectors, $crate::device::Parts::One(data), opts).await
            }
        }
        fn write_vectored(
            &$s,
            start: u64,
            parts: Vec<bytes::Bytes>,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<()>> + Send {
            async move {
                let sectors =
                    $crate::device::check_parts($crate::BlockDevice::info($s), start, &parts)?;
                $s.$f(start, sectors, $crate::device::Parts::from(parts), opts).await
            }
        }
    };
}
pub(crate) use write_through_parts;

/// Writes [`BlockDevice::read`] and [`BlockDevice::read_to_send`] for a layer that takes
/// both through one path: `|self| FUNCTION(start, sectors, opts, send)`, `send` true for
/// `read_to_send`; that function's future as it is (see [`write_through_parts`]).
macro_rules! read_through_bytes {
    (|$s:ident| $f:ident) => {
        fn read(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<bytes::Bytes>> + Send {
            $s.$f(start, sectors, opts, false)
        }
        fn read_to_send(
            &$s,
            start: u64,
            sectors: u64,
            opts: $crate::IoOpts,
        ) -> impl Future<Output = $crate::Result<bytes::Bytes>> + Send {
            $s.$f(start, sectors, opts, true)
        }
    };
}
pub(crate) use read_through_bytes;

mod checks;
mod erased;
mod info;
mod parts;
mod request;

use bytes::Bytes;

use crate::{Error, Landing, Piped, Result};

pub(crate) use checks::*;
pub use erased::{BoxFuture, DynBlockDevice};
pub use info::{Caps, DeviceInfo, Zeroing};
pub(crate) use parts::{Parts, slice_parts};
pub(crate) use request::push_extent;
pub use request::{Extent, IoOpts, Zeroes};

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

    /// Reads `sectors` sectors from `start` for a caller that sends the bytes on at once (a
    /// server answering a read over a socket) and drops them once sent. A device through the
    /// page cache may answer with a view of the cached pages themselves instead of a copy
    /// (the io_uring and file backends do, for reads of 32 KiB and more whose pages are all
    /// cached; a volume passes its components' on): such bytes show any later write to those
    /// sectors for as long as they are held, so they are no snapshot. Use
    /// [`read`](Self::read) for data that is kept, compared or computed on (parity, a
    /// mirror's resync, a recording). The default is `read`; a layer that changes or
    /// accounts its requests keeps it. As with any mapping of a file, a file shrunk by
    /// another process while such bytes are held faults (`SIGBUS`) where they are read past
    /// its new end in user space; the kernel's socket write reports `EFAULT` instead, and a
    /// range past the end when the read is made is read, not viewed.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let d = MemDevice::new("m", 64);
    /// d.write(8, Bytes::from(vec![9u8; 4096]), IoOpts::new()).await?;
    /// let out = d.read_to_send(8, 8, IoOpts::new()).await?;
    /// assert!(out.iter().all(|&b| b == 9));
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    fn read_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        self.read(start, sectors, opts)
    }

    /// [`read_to_send`](Self::read_to_send) in parts, one after the other, for a caller that
    /// sends them on as they are (an NBD reply gathers them into one write): a striped
    /// volume answers a read of several interleave units with each unit as its component
    /// gives it (a view of the page cache where it can), with no copy into one buffer. The
    /// default is one part, `read_to_send`'s.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let d = MemDevice::new("m", 64);
    /// d.write(0, Bytes::from(vec![4u8; 8192]), IoOpts::new()).await?;
    /// let parts = d.read_parts_to_send(0, 16, IoOpts::new()).await?;
    /// assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), 8192);
    /// assert!(parts.iter().all(|p| p.iter().all(|&b| b == 4)));
    /// # Ok::<(), tagstripe::Error>(())
    /// # }).unwrap();
    /// ```
    fn read_parts_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Vec<Bytes>>> + Send {
        async move { Ok(vec![self.read_to_send(start, sectors, opts).await?]) }
    }

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

    /// Whether [`write_piped`](Self::write_piped) sends a payload's piped bytes on to the
    /// device without reading them into memory first: a server asks before it takes write
    /// payloads off its socket into pipes (which only pays where they stay there). True for
    /// the io_uring and file backends through the page cache, and for the layers over them
    /// that pass a payload on whole or cut it pipe to pipe (the tagged queue, the split
    /// layer, a striped volume without a mirror); false by default, and for every layer
    /// that looks at or keeps the bytes it writes (a mirror, a recording, tenants).
    fn takes_piped_writes(&self) -> bool {
        false
    }

    /// Writes `data` (whole sectors, in memory and in a kernel pipe: see [`Piped`]) at
    /// `start`. The io_uring and file backends through the page cache `splice` the pipe's
    /// bytes into the file (the page cache's copy, and no other); the default reads them
    /// into memory ([`Piped::into_bytes`]) and calls [`write`](Self::write), so every
    /// device takes such a payload. A pipe's bytes can be read once: a write that fails
    /// has lost them (the caller reports the failure; it cannot retry).
    ///
    /// ```
    /// use std::io::Write;
    /// use std::os::fd::AsFd;
    /// use bytes::Bytes;
    /// use tagstripe::{BlockDevice, IoOpts, MemDevice, Piped};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let (mut client, server) = std::os::unix::net::UnixStream::pair()?;
    /// client.write_all(&[3u8; 4096])?;
    /// let mut p = Piped::new(Bytes::new(), 4096);
    /// while p.len() < 4096 {
    ///     p.fill_from(server.as_fd(), 4096 - p.len())?;
    /// }
    /// let d = MemDevice::new("m", 64);
    /// assert!(!d.takes_piped_writes()); // read into memory, then written
    /// d.write_piped(8, p, IoOpts::new()).await?;
    /// assert!(d.read(8, 8, IoOpts::new()).await?.iter().all(|&b| b == 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    fn write_piped(
        &self,
        start: u64,
        data: Piped,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        write_piped_from_memory(self, start, data, opts)
    }

    /// Whether [`write_landing`](Self::write_landing) can lend this device's pages: a
    /// server asks once per connection, before it leaves large write payloads on its socket
    /// for it. True for the io_uring and file backends over a file in memory (tmpfs, such
    /// as /dev/shm) opened for writing through the page cache; false by default, and for
    /// every layer (each looks at, records or schedules the writes it passes on).
    fn lands_writes(&self) -> bool {
        false
    }

    /// A window onto this device's own pages for a write of `sectors` sectors at `start`,
    /// for a server to receive the write's payload into straight from its socket (see
    /// [`Landing`]); the write is done when the landing is
    /// [`finish`](Landing::finish)ed. `None` (the default) where the device does not lend
    /// its pages, or not for this write (too small, outside the device or the file as it
    /// is now, a read-only device): write it the usual way. The caller keeps overlapping
    /// writes apart as for any other write.
    fn write_landing(&self, start: u64, sectors: u64) -> Option<Landing> {
        let _ = (start, sectors);
        None
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
