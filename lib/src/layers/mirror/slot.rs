//! Slot: a mirror component's place, whose device can be replaced while the volume runs.

use std::sync::Arc;

use bytes::Bytes;

use crate::{BlockDevice, DeviceInfo, DynBlockDevice, Extent, IoOpts, Result, Zeroes};

/// A component's place in a mirror with metadata: requests go to the device it holds now,
/// and [`crate::Volume::replace`] puts another there (requests already under way finish on
/// the old one). Its [`DeviceInfo`] is the first device's, which the volume was built on.
#[derive(Debug)]
pub(crate) struct Slot {
    info: DeviceInfo,
    dev: parking_lot::RwLock<Arc<dyn DynBlockDevice>>,
}

impl Slot {
    pub(crate) fn new(dev: Arc<dyn DynBlockDevice>) -> Self {
        Self {
            info: dev.info().clone(),
            dev: parking_lot::RwLock::new(dev),
        }
    }

    fn get(&self) -> Arc<dyn DynBlockDevice> {
        Arc::clone(&self.dev.read())
    }

    /// Puts `dev` in the slot; returns the device it held.
    pub(crate) fn replace(&self, dev: Arc<dyn DynBlockDevice>) -> Arc<dyn DynBlockDevice> {
        std::mem::replace(&mut *self.dev.write(), dev)
    }
}

impl BlockDevice for Slot {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        self.get().read(start, sectors, opts).await
    }
    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        self.get().read_into(start, buf, opts).await
    }
    async fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> Result<()> {
        self.get().read_vectored_into(start, bufs, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        self.get().write(start, data, opts).await
    }
    async fn write_vectored(&self, start: u64, parts: Vec<Bytes>, opts: IoOpts) -> Result<()> {
        self.get().write_vectored(start, parts, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.get().flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.get().discard(start, sectors, opts).await
    }
    async fn write_zeroes(&self, start: u64, sectors: u64, z: Zeroes, opts: IoOpts) -> Result<()> {
        self.get().write_zeroes(start, sectors, z, opts).await
    }
    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<Extent>> {
        self.get().allocation(start, sectors).await
    }
}
