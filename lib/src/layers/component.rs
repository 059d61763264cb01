//! A volume's component as the striped layer holds it: the builder's stack of concrete
//! layers over the (erased) device, so a request's futures nest inline down to the device and
//! the only boxed future a piece costs is the device's own.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::Either;

use crate::{
    BlockDevice, Caps, DeviceInfo, DynBlockDevice, Extent, IoOpts, Queue, Result, Split, Zeroes,
};

/// One component of a [`crate::Striped`]: the stacks a volume builds, or any device.
#[derive(Debug, Clone)]
pub(crate) enum Component {
    /// Split over a tagged queue over the device (a volume's default).
    Queued(Arc<Split<Queue<Arc<dyn DynBlockDevice>>>>),
    /// Split straight over the device (a volume without queues).
    Direct(Arc<Split<Arc<dyn DynBlockDevice>>>),
    /// Any device (what `Striped::new` is given).
    Erased(Arc<dyn DynBlockDevice>),
}

impl Component {
    /// The same device, erased (one boxed future a request through it).
    pub(crate) fn erased(&self) -> Arc<dyn DynBlockDevice> {
        match self {
            Self::Queued(d) => Arc::clone(d) as Arc<dyn DynBlockDevice>,
            Self::Direct(d) => Arc::clone(d) as Arc<dyn DynBlockDevice>,
            Self::Erased(d) => Arc::clone(d),
        }
    }
}

/// Calls the same method on whichever stack it is: that stack's own future, not one
/// wrapped around it (no state machine of the component's, nor room for the call's
/// arguments kept twice; every layer above holds the future inline).
macro_rules! each {
    ($self:ident, $d:ident => $call:expr) => {
        match $self {
            Component::Queued($d) => Either::Left($call),
            Component::Direct($d) => Either::Right(Either::Left($call)),
            Component::Erased($d) => Either::Right(Either::Right($call)),
        }
    };
}

impl BlockDevice for Component {
    fn info(&self) -> &DeviceInfo {
        match self {
            Self::Queued(d) => d.info(),
            Self::Direct(d) => d.info(),
            Self::Erased(d) => d.info(),
        }
    }
    fn caps(&self) -> Caps {
        match self {
            Self::Queued(d) => d.caps(),
            Self::Direct(d) => d.caps(),
            Self::Erased(d) => d.caps(),
        }
    }
    fn read(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        each!(self, d => d.read(start, sectors, opts))
    }
    fn read_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<Bytes>> + Send {
        each!(self, d => d.read_to_send(start, sectors, opts))
    }
    fn read_into(
        &self,
        start: u64,
        buf: &mut [u8],
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.read_into(start, buf, opts))
    }
    fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.read_vectored_into(start, bufs, opts))
    }
    fn write(
        &self,
        start: u64,
        data: Bytes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.write(start, data, opts))
    }
    fn write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.write_vectored(start, parts, opts))
    }
    fn takes_piped_writes(&self) -> bool {
        match self {
            Self::Queued(d) => d.takes_piped_writes(),
            Self::Direct(d) => d.takes_piped_writes(),
            Self::Erased(d) => d.takes_piped_writes(),
        }
    }
    fn write_piped(
        &self,
        start: u64,
        data: crate::Piped,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.write_piped(start, data, opts))
    }
    fn flush(&self, opts: IoOpts) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.flush(opts))
    }
    fn discard(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.discard(start, sectors, opts))
    }
    fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: Zeroes,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send {
        each!(self, d => d.write_zeroes(start, sectors, z, opts))
    }
    fn allocation(
        &self,
        start: u64,
        sectors: u64,
    ) -> impl Future<Output = Result<Vec<Extent>>> + Send {
        each!(self, d => d.allocation(start, sectors))
    }
}
