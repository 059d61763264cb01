//! Type erasure: [`DynBlockDevice`](crate::DynBlockDevice), the object-safe form of [`BlockDevice`](crate::BlockDevice), and the
//! forwarding impls that make `dyn DynBlockDevice` and `Arc<D>` block devices again.

use std::sync::Arc;

use bytes::Bytes;

use crate::Result;

use super::{BlockDevice, Caps, DeviceInfo, Extent, IoOpts, Zeroes};

/// A boxed future, as [`DynBlockDevice`](crate::DynBlockDevice)'s methods return.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The object-safe form of [`BlockDevice`](crate::BlockDevice), for devices of different types behind one
/// pointer: `Arc<dyn DynBlockDevice>`. Every `BlockDevice` is one (a blanket impl boxes each
/// request's future once), and `dyn DynBlockDevice` is a `BlockDevice` again, so layers and
/// volumes take either. Implement [`BlockDevice`](crate::BlockDevice), never this; call `BlockDevice`'s methods,
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
    /// [`BlockDevice::info`](crate::BlockDevice::info).
    fn erased_info(&self) -> &DeviceInfo;
    /// [`BlockDevice::caps`](crate::BlockDevice::caps).
    fn erased_caps(&self) -> Caps;
    /// [`BlockDevice::read`](crate::BlockDevice::read).
    fn erased_read(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, Bytes>;
    /// [`BlockDevice::read_to_send`](crate::BlockDevice::read_to_send).
    fn erased_read_to_send(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, Bytes>;
    /// [`BlockDevice::read_parts_to_send`](crate::BlockDevice::read_parts_to_send).
    fn erased_read_parts_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> BoxFuture<'_, Vec<Bytes>>;
    /// [`BlockDevice::read_into`](crate::BlockDevice::read_into).
    fn erased_read_into<'a>(
        &'a self,
        start: u64,
        buf: &'a mut [u8],
        opts: IoOpts,
    ) -> BoxFuture<'a, ()>;
    /// [`BlockDevice::read_vectored_into`](crate::BlockDevice::read_vectored_into).
    fn erased_read_vectored_into<'a>(
        &'a self,
        start: u64,
        bufs: Vec<&'a mut [u8]>,
        opts: IoOpts,
    ) -> BoxFuture<'a, ()>;
    /// [`BlockDevice::write`](crate::BlockDevice::write).
    fn erased_write(&self, start: u64, data: Bytes, opts: IoOpts) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::write_vectored`](crate::BlockDevice::write_vectored).
    fn erased_write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::takes_piped_writes`](crate::BlockDevice::takes_piped_writes).
    fn erased_takes_piped_writes(&self) -> bool;
    /// [`BlockDevice::lands_writes`](crate::BlockDevice::lands_writes).
    fn erased_lands_writes(&self) -> bool;
    /// [`BlockDevice::write_landing`](crate::BlockDevice::write_landing).
    fn erased_write_landing(&self, start: u64, sectors: u64) -> Option<crate::Landing>;
    /// [`BlockDevice::write_piped`](crate::BlockDevice::write_piped).
    fn erased_write_piped(&self, start: u64, data: crate::Piped, opts: IoOpts)
    -> BoxFuture<'_, ()>;
    /// [`BlockDevice::flush`](crate::BlockDevice::flush).
    fn erased_flush(&self, opts: IoOpts) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::discard`](crate::BlockDevice::discard).
    fn erased_discard(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::write_zeroes`](crate::BlockDevice::write_zeroes).
    fn erased_write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: Zeroes,
        opts: IoOpts,
    ) -> BoxFuture<'_, ()>;
    /// [`BlockDevice::allocation`](crate::BlockDevice::allocation).
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
    fn erased_read_to_send(&self, start: u64, sectors: u64, opts: IoOpts) -> BoxFuture<'_, Bytes> {
        Box::pin(self.read_to_send(start, sectors, opts))
    }
    fn erased_read_parts_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> BoxFuture<'_, Vec<Bytes>> {
        Box::pin(self.read_parts_to_send(start, sectors, opts))
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
    fn erased_takes_piped_writes(&self) -> bool {
        self.takes_piped_writes()
    }
    fn erased_lands_writes(&self) -> bool {
        self.lands_writes()
    }
    fn erased_write_landing(&self, start: u64, sectors: u64) -> Option<crate::Landing> {
        self.write_landing(start, sectors)
    }
    fn erased_write_piped(
        &self,
        start: u64,
        data: crate::Piped,
        opts: IoOpts,
    ) -> BoxFuture<'_, ()> {
        Box::pin(self.write_piped(start, data, opts))
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
    fn read_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        self.erased_read_to_send(start, sectors, opts)
    }
    fn read_parts_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Vec<Bytes>>> + Send {
        self.erased_read_parts_to_send(start, sectors, opts)
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
    fn takes_piped_writes(&self) -> bool {
        self.erased_takes_piped_writes()
    }
    fn lands_writes(&self) -> bool {
        self.erased_lands_writes()
    }
    fn write_landing(&self, start: u64, sectors: u64) -> Option<crate::Landing> {
        self.erased_write_landing(start, sectors)
    }
    fn write_piped(
        &self,
        start: u64,
        data: crate::Piped,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        self.erased_write_piped(start, data, opts)
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
    super::forward_io!(direct | self | (**self));
}
