//! tagstripe: striped volumes over pluggable async block-device backends.
//!
//! Every piece implements [`BlockDevice`]: the backends ([`MemDevice`], [`FileDevice`],
//! [`FaultDevice`] for tests), the layers ([`Split`] by a device's limits and quirks,
//! [`Queue`] driving a tagged queue, [`Striped`] over a ccd geometry), and the [`Volume`]
//! that stacks them. So a volume can stand wherever a device does, including as a component
//! of another volume.
//!
//! ```text
//! caller ──► Volume ──► Striped ── Geometry::map ──► pieces
//!                          │  fan out, gather reads; mirror: both sides
//!              ┌───────────┼───────────┐
//!            Split       Split       Split      quirks::Splitter with each device's limits
//!            Queue       Queue       Queue      scheduler::TagQueue: a tag per piece
//!           backend     backend     backend     Mem | File | Fault | ...
//! ```
//!
//! The pure crates are re-exported as [`striping`], [`quirks`] and [`scheduler`].
//!
//! A volume striped over two devices, a component wrapped in a fault injector, and the
//! error that names where it failed:
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use tagstripe::{BlockDevice, DynBlockDevice, Fault, FaultDevice, FaultKind, FaultOp, IoOpts, MemDevice, Volume};
//! # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
//! let a: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("a", 4096));
//! let b = Arc::new(FaultDevice::new(MemDevice::new("b", 4096)));
//! let vol = Volume::builder([a, b.clone()])
//!     .interleave(64)
//!     .no_offset(true)
//!     .build()?;
//! vol.write(0, Bytes::from(vec![1u8; 128 * 512]), IoOpts::new()).await?; // both components
//! assert_eq!(vol.read(64, 1, IoOpts::new()).await?, vec![1u8; 512]);
//!
//! b.inject(Fault::always(FaultOp::Read, FaultKind::Error));
//! let e = vol.read(64, 1, IoOpts::new()).await.unwrap_err();
//! assert_eq!((e.component(), e.errno()), (Some(1), libc::EIO));
//! # Ok::<(), tagstripe::Error>(())
//! # }).unwrap();
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use tagstripe_quirks as quirks;
pub use tagstripe_scheduler as scheduler;
pub use tagstripe_striping as striping;

mod backend;
mod buffers;
pub mod crash;
mod device;
mod error;
mod landing;
mod layers;
mod model;
#[cfg(feature = "nbd")]
#[cfg_attr(docsrs, doc(cfg(feature = "nbd")))]
pub mod nbd;
mod open;
mod piped;
mod plug;
mod shard;
mod stats;
mod times;
mod volume;

pub use backend::{
    Fault, FaultDevice, FaultKind, FaultOp, FileDevice, FileOptions, MemDevice, SimDevice,
    aligned_bytes, sysfs_limits,
};
#[cfg(feature = "uring")]
#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
pub use backend::{UringDevice, UringRing};
pub use crash::{Recorded, Recorder};
pub use device::{
    BlockDevice, BoxFuture, Caps, DeviceInfo, DynBlockDevice, Extent, IoOpts, Zeroes, Zeroing,
};
pub use error::{Error, Result};
pub use landing::Landing;
pub use layers::mirror::metadata::component_metadata;
pub use layers::mirror::resync::{MirrorEvent, SideStatus};
pub use layers::{
    Queue, QueueHandle, Raid, Split, Striped, Tenant, TenantError, TenantSpec, TenantStats,
    Tenants, read_md_superblock,
};
pub use model::{ByteModel, Check};
pub use open::{OpenOptions, Opener, open, parse_size};
pub use piped::Piped;
pub use plug::Plugged;
pub use stats::{Stats, StatsSnapshot};
pub use volume::{IntoComponent, Layer, Volume, VolumeBuilder};

/// The README's examples, compiled and run as doctests.
// The README's examples run as doctests (one of them serves over NBD: with the `nbd`
// feature, as `cargo test --workspace` builds the library).
#[cfg(all(doctest, feature = "nbd"))]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
