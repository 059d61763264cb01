//! Split: requests cut by a device's limits and quirks before they reach it.

use bytes::Bytes;
use tagstripe_quirks::{Applied, Mod15, Op, Splitter};

use crate::device::Parts;
use crate::{BlockDevice, DeviceInfo, IoOpts, Result};

/// Splits every request by the device's limits (and matched quirks) in Linux's order, and
/// issues the pieces concurrently; reads are gathered in order.
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::quirks::{Limits, Mod15, Settings};
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, Split};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dev = MemDevice::new("mem0", 4096);
/// let mut hw = Limits::default();
/// hw.max_hw_sectors = 64;
/// let applied = Settings::default().apply(&hw)?;
/// let split = Split::new(dev, &applied, Mod15::Cap15)?;
/// split.write(0, Bytes::from(vec![9u8; 100 * 512]), IoOpts::new()).await?; // 64 + 36
/// assert_eq!(split.read(0, 100, IoOpts::new()).await?, vec![9u8; 100 * 512]);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Split<D> {
    dev: D,
    info: DeviceInfo,
    splitter: Splitter,
    /// The device has a write cache the quirks forbid: every write goes durable.
    force_fua: bool,
}

impl<D: BlockDevice> Split<D> {
    /// Splits for `dev` with the limits quirks produced (`applied`) and a mod-15 policy used
    /// if the device has the erratum.
    ///
    /// # Errors
    /// [`crate::Error::Limits`] if the limits do not validate.
    pub fn new(dev: D, applied: &Applied, mod15: Mod15) -> Result<Self> {
        let splitter = Splitter::for_device(applied, mod15)?;
        let mut info = dev.info().clone();
        info.limits = splitter.limits().clone();
        // The quirk table takes away what a drive must not be sent: discard (`notrim`: then
        // the device has none, end to end), FUA (a FUA write becomes a write and a flush),
        // the write cache (every write goes FUA).
        info.caps.trim &= info.limits.max_discard_sectors > 0;
        info.caps.fua &= applied.fua;
        let force_fua = info.caps.write_cache && !applied.write_cache;
        info.caps.write_cache &= applied.write_cache;
        Ok(Self {
            dev,
            info,
            splitter,
            force_fua,
        })
    }

    /// The device underneath.
    pub fn inner(&self) -> &D {
        &self.dev
    }

    /// A write of `parts` (checked: `sectors` long) cut by the limits; each piece goes as
    /// one command, gathered if it spans several parts. (An `async move` block, not an
    /// `async fn`, here and in `write`: an `async fn`'s future keeps room for its
    /// arguments twice, and every layer above holds a request's future inline.)
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future keeps its arguments twice"
    )]
    fn write_parts(
        &self,
        start: u64,
        sectors: u64,
        parts: Parts,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send + '_ {
        async move {
            // The write cache off: every write durable as it completes. FUA forbidden: the
            // write without it, then a flush.
            let durable = opts.fua || self.force_fua;
            let fua = durable && self.info.caps.fua;
            if self.splitter.whole(Op::Write, start, sectors)? {
                // Not split (the common small write): the data goes down as it came.
                parts.write_to(&self.dev, start, opts.fua(fua)).await?;
            } else {
                // Boxed: the rare path kept out of the common one's future.
                Box::pin(self.write_pieces(start, sectors, parts, opts.fua(fua))).await?;
            }
            if durable && !fua {
                self.dev.flush(opts.fua(false)).await?;
            }
            Ok(())
        }
    }

    /// A write cut into pieces by the limits, each one command: a piece of one buffer (or
    /// of one part) as one buffer, else gathered.
    async fn write_pieces(
        &self,
        start: u64,
        sectors: u64,
        parts: Parts,
        opts: IoOpts,
    ) -> Result<()> {
        let pieces = self.splitter.split(Op::Write, start, sectors)?;
        let writes = pieces.map(|p| {
            let off = ((p.start - start) * 512) as usize;
            parts
                .slice(off, p.sectors as usize * 512)
                .write_to(&self.dev, p.start, opts)
        });
        crate::device::all(writes).await?;
        Ok(())
    }
}

impl<D: BlockDevice> Split<D> {
    /// A read into bytes: the device's as they come when not split (`send`: its
    /// `read_to_send`), else each piece straight into its place in one buffer (one copy,
    /// not two).
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future keeps its arguments twice"
    )]
    fn read_bytes(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
        send: bool,
    ) -> impl Future<Output = Result<Bytes>> + Send + '_ {
        async move {
            self.info.check(start, sectors)?;
            if self.splitter.whole(Op::Read, start, sectors)? {
                return crate::device::read_or_send(&self.dev, start, sectors, opts, send).await;
            }
            // Boxed: the rare path kept out of the common one's future.
            Box::pin(async move {
                let mut buf = vec![0u8; sectors as usize * 512];
                self.read_into(start, &mut buf, opts).await?;
                Ok(Bytes::from(buf))
            })
            .await
        }
    }
}

impl<D: BlockDevice> BlockDevice for Split<D> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    // `read_to_send`: through the device's `read_to_send` when not split.
    crate::device::read_through_bytes!(|self| read_bytes);

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let sectors = crate::device::sectors_of(&self.info, buf.len())?;
        self.info.check(start, sectors)?;
        if self.splitter.whole(Op::Read, start, sectors)? {
            return self.dev.read_into(start, buf, opts).await;
        }
        let mut pieces = self.splitter.split(Op::Read, start, sectors)?;
        let mut rest = buf;
        let mut reads = Vec::new();
        for p in pieces.by_ref() {
            let (part, tail) = rest.split_at_mut(p.sectors as usize * 512);
            rest = tail;
            reads.push(self.dev.read_into(p.start, part, opts));
        }
        crate::device::all(reads).await?;
        Ok(())
    }

    async fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> Result<()> {
        let sectors = crate::device::check_bufs(&self.info, start, &bufs)?;
        if self.splitter.whole(Op::Read, start, sectors)? {
            // Not split: the buffers go down as they are.
            return self.dev.read_vectored_into(start, bufs, opts).await;
        }
        // Split: read whole through the pieces, then laid out.
        let mut whole = vec![0u8; sectors as usize * 512];
        self.read_into(start, &mut whole, opts).await?;
        crate::device::scatter(&whole, bufs);
        Ok(())
    }

    crate::device::write_through_parts!(|self| write_parts);

    /// As the device does (see [`write_piped`](Self::write_piped)).
    fn takes_piped_writes(&self) -> bool {
        self.dev.takes_piped_writes()
    }

    /// A write within the device's limits goes down whole, in its pipe; one to be cut
    /// into pieces (or to a device that does not write from pipes) is read into memory and
    /// cut as any other.
    async fn write_piped(&self, start: u64, data: crate::Piped, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        if !self.splitter.whole(Op::Write, start, sectors)? || !self.dev.takes_piped_writes() {
            return crate::device::write_piped_from_memory(self, start, data, opts).await;
        }
        let durable = opts.fua || self.force_fua;
        let fua = durable && self.info.caps.fua;
        self.dev.write_piped(start, data, opts.fua(fua)).await?;
        if durable && !fua {
            self.dev.flush(opts.fua(false)).await?;
        }
        Ok(())
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.dev.flush(opts).await
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        // Zeroing carries no data: the device takes it whole (each backend cuts its own).
        crate::device::check_zeroes(&self.info, start, sectors)?;
        self.dev.write_zeroes(start, sectors, z, opts).await
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.info.check_discard(start, sectors)?;
        let pieces = self.splitter.split(Op::Discard, start, sectors)?;
        crate::device::all(pieces.map(|p| self.dev.discard(p.start, p.sectors, opts))).await?;
        Ok(())
    }

    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        // A question, not I/O: no pieces.
        self.info.check(start, sectors)?;
        self.dev.allocation(start, sectors).await
    }
}
