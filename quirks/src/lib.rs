//! Device limits, a vendor quirk table with runtime overrides, and a request splitter.
//!
//! Pure data and math: no I/O, no clock, no async runtime. Quantities are 512-byte sectors
//! unless a field says bytes, as in Linux's `struct queue_limits`.
//!
//! - [`Limits`]: a device's limits with Linux's meaning, [`Limits::validate`] (deriving the
//!   soft cap `max_sectors` from the hardware's, the user's and the 4 MiB default), and
//!   [`Limits::stack`] for a striped volume.
//! - [`QuirkTable`]: real rows from Linux libata, sata_sil, scsi_devinfo, NVMe and FreeBSD CAM,
//!   each with its source, compiled in; [`QuirkSet`] lays a TOML file and a
//!   `libata.force`-style [`ForceString`] over it, so a device's limits change without a
//!   rebuild.
//! - [`Splitter`]: Linux's split order (per-piece cap, chunk boundary, physical-block end
//!   alignment, segment walk, round down to logical blocks), discard splitting, and the
//!   [`Mod15`] policies for sata_sil's MOD15WRITE drives.
//!
//! ```text
//!  hardware Limits ─┐
//!  Identity ──► QuirkSet::resolve ──► Settings::apply ──► Applied { limits, mod15write, .. }
//!                 (builtin < file < force)                    │
//!                                             Splitter::for_device(&applied, Mod15::Cap15)
//!                                                             │
//!                                  split(Op::Write, start, sectors) ──► pieces
//! ```
//!
//! ```
//! use tagstripe_quirks::{Identity, Limits, Mod15, Op, QuirkSet, Splitter};
//!
//! // A Seagate drive that sata_sil lists for MOD15WRITE, behind a controller taking 2560.
//! let mut hw = Limits::default();
//! hw.max_hw_sectors = 2560;
//! let id = Identity::new("ATA", "ST380023AS", "3.01");
//! let applied = QuirkSet::builtin().apply(&id, &hw)?;
//! assert!(applied.mod15write);
//!
//! // Linux's answer: 15 sectors per command.
//! let linux = Splitter::for_device(&applied, Mod15::Cap15)?;
//! assert!(linux.split(Op::Write, 0, 2576)?.all(|p| p.sectors <= 15));
//!
//! // The opt-in smart policy: two large pieces, neither of size n with n % 15 == 1.
//! let smart = Splitter::for_device(&applied, Mod15::Smart)?;
//! let sizes: Vec<u64> = smart.split(Op::Write, 0, 2576)?.map(|p| p.sectors).collect();
//! assert_eq!(sizes, [2559, 17]);
//! # Ok::<(), tagstripe_quirks::Error>(())
//! ```
#![forbid(unsafe_code)]

mod error;
mod glob;
mod limits;
mod settings;
mod split;
mod table;

pub use error::{Error, Location};
pub use glob::{MatchKind, Pattern, glob_match};
pub use limits::{
    DEFAULT_MAX_SECTORS_CAP, Limits, MIN_SEGMENT_BYTES, Misalignment, PAGE_SECTORS, SECTOR_BYTES,
    Stacked, StripeShape,
};
pub use settings::{Applied, KEYS, Settings, Warning};
pub use split::{Mod15, Op, Piece, Pieces, Segment, SgPieces, Splitter};
pub use table::{
    BUILTIN_TSV, ForceString, Identity, Layer, Match, QuirkRow, QuirkSet, QuirkTable, Resolved,
};
