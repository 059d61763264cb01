//! tagstripe: striped volumes over pluggable async block-device backends.
//!
//! This is the crate users depend on. It re-exports the pure crates and will add the async
//! stack: the `BlockDevice` trait, the `Split`, `Queue` and `Striped` layers, the `Volume`
//! builder, and the memory, file, block-device, io_uring and NBD backends.
//!
//! Today it offers the striping geometry:
//!
//! ```
//! use tagstripe::striping::Geometry;
//!
//! let g = Geometry::builder([1000, 2000, 1500], 16).build()?;
//! assert_eq!(g.total_sectors(), 4480);
//! # Ok::<(), tagstripe::striping::Error>(())
//! ```

pub use tagstripe_quirks as quirks;
pub use tagstripe_scheduler as scheduler;
pub use tagstripe_striping as striping;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
