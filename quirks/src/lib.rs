//! Device limits, a vendor quirk table with runtime overrides, and a request splitter.
//!
//! This crate will hold, as pure data and math with no I/O:
//!
//! - `Limits`: a device's queue limits with Linux's meaning (logical and physical block
//!   size, `max_hw_sectors`, the tunable `max_sectors`, segments, boundaries, chunk size,
//!   discard limits, tag counts), validation, and stacking for a striped volume;
//! - the quirk table: real vendor/model/revision rows with their sources, compiled in, and
//!   overridden at run time by a TOML file and a `libata.force`-style string;
//! - the splitter: Linux's split order, and the mod-15 policies (`cap15`, `smart`).
//!
//! It is filled in by the quirks issue; until then it exports nothing.
#![forbid(unsafe_code)]
