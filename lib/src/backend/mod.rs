//! Backends: where the bytes live.

mod fault;
mod file;
pub(crate) mod mapped;
mod mem;
mod sim;
#[cfg(feature = "uring")]
mod uring;

pub use fault::{Fault, FaultDevice, FaultKind, FaultOp};
pub use file::{FileDevice, FileOptions, aligned_bytes, sysfs_limits};
pub(crate) use file::{punch_hole, seek_extents};
pub use mem::MemDevice;
pub use sim::SimDevice;
#[cfg(feature = "uring")]
pub use uring::{UringDevice, UringRing};
