//! Slot: a mirror component's place, whose device can be replaced while the volume runs.

use std::sync::Arc;

use crate::{BlockDevice, DeviceInfo, DynBlockDevice};

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
    crate::device::forward_io!(async |self| self.get());
}
