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

pub use tagstripe_quirks as quirks;
pub use tagstripe_scheduler as scheduler;
pub use tagstripe_striping as striping;

mod backend;
mod device;
mod error;
mod layers;
#[cfg(feature = "nbd")]
pub mod nbd;
mod open;
mod stats;
mod volume;

#[cfg(feature = "uring")]
pub use backend::UringDevice;
pub use backend::{
    Fault, FaultDevice, FaultKind, FaultOp, FileDevice, FileOptions, MemDevice, SimDevice,
    sysfs_limits,
};
pub use device::{BlockDevice, DeviceInfo, Extent, IoOpts, Zeroes};
pub use error::{Error, Result};
pub use layers::{Queue, QueueHandle, Split, Striped};
pub use open::{OpenOptions, open};
pub use stats::{Stats, StatsSnapshot};
pub use volume::{IntoComponent, Volume, VolumeBuilder};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
