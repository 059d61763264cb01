//! The mirror's room: everything that keeps a mirror's sides honest, under the striped
//! layer that serves them. The side states and the drop rule live on [`super::Striped`]
//! (its write path drops a failed side); here are the rest:
//! - [`metadata`]: each component's on-disk metadata and the write-intent bitmap (what a
//!   restart trusts, which side is stale, where the sides may differ);
//! - [`resync`]: copying a stale or replaced side back from its partner, online, in the
//!   bulk class, and the events that report it;
//! - [`Slot`]: the place a component sits in, so a dead side can be replaced.
//!
//! Imports run one way: the volume builds on this module and on `Striped`; nothing here
//! reaches above the layers.

pub(crate) mod metadata;
pub(crate) mod resync;
mod slot;

pub(crate) use slot::Slot;
