//! ccd-exact striping geometry: where each sector of a striped, concatenated or mirrored
//! volume lives on its components.
//!
//! This crate is the math of tagstripe's striping layer and nothing else: it does no I/O,
//! reads no clock and spawns nothing, so it can be property-tested, fuzzed and embedded in any
//! runtime. All quantities are 512-byte sectors (`u64`), as in ccd (`DEV_BSIZE`) and Linux.
//!
//! A [`Geometry`] is built the way NetBSD/FreeBSD ccd's `ccdinit` builds its volume: an
//! optional reserved area per component, each size rounded down to the interleave, uniform
//! and mirror options, and an interleave table with one [`Row`] per distinct component size.
//! The map then follows `ccdbuffer`: ascending pieces, one per interleave unit touched, never
//! merged (unless asked with [`Pieces::merged`]). md raid0's zones are the same rows; its
//! 3.14+ layout maps like ccd and its older layout is available as [`MdLayout::Orig`], so
//! existing arrays' member images open correctly.
//!
//! ```text
//!  volume sectors ──map──► Piece { component, cblk, count, mirror }
//!
//!  comp 0 │u0│u3│u6│            row 0: all three components, round robin
//!  comp 1 │u1│u4│u7│u9│u10│u11│ row 1: components 1 and 2
//!  comp 2 │u2│u5│u8│u9'│...    (u = one interleave unit)
//! ```
//!
//! ```
//! use tagstripe_striping::{Flavor, Geometry, Status};
//!
//! let g = Geometry::builder([1000, 2000, 1500], 16).flavor(Flavor::NetBsd).build()?;
//! assert_eq!(g.total_sectors(), 4480);
//!
//! // A 40-sector request from sector 8 touches three interleave units.
//! let pieces: Vec<_> = g.map(8, 40)?.collect();
//! assert_eq!(pieces.len(), 3);
//! assert_eq!((pieces[1].component, pieces[1].cblk, pieces[1].count), (1, 0, 16));
//!
//! // The library refuses a request that crosses the end; ccd would truncate it.
//! assert!(g.map(4470, 20).is_err());
//! assert_eq!(g.map_ccd(4470, 20).0, Status::Truncated);
//! # Ok::<(), tagstripe_striping::Error>(())
//! ```
//!
//! The rules follow NetBSD's and FreeBSD's `ccd.c` and Linux's `drivers/md/raid0.c`; the tests replay the
//! reference cases produced by an independent model of ccd.
#![forbid(unsafe_code)]

mod error;
mod geometry;
mod map;
pub mod md;
mod mirror;
mod render;
pub mod superblock;

pub use error::{Errno, Error};
pub use geometry::{
    FREEBSD_RESERVED_SECTORS, Flavor, Geometry, GeometryBuilder, MAX_COMPONENTS, MdLayout, Note,
    Row,
};
pub use map::{Merged, Piece, Pieces, Status};
pub use mirror::{MirrorReads, ReadBalancer, Side};

/// Bytes in one sector, the unit of every quantity in this crate (ccd's `DEV_BSIZE`).
pub const SECTOR_BYTES: u64 = 512;
