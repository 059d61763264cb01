//! Criterion benches for every tagstripe layer; see `benches/README.md`.
//!
//! The library part is empty on purpose: the benches live in `benches/*.rs`.
