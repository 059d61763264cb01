//! Layers: each wraps devices and is a device itself.

mod component;
mod queue;
mod slot;
mod split;
mod striped;

pub(crate) use component::Component;
pub use queue::{Queue, QueueHandle};
pub(crate) use slot::Slot;
pub use split::Split;
pub use striped::Striped;

use std::future::Future;

use futures_util::future::join_all;

use crate::Result;

/// Runs every piece of a request to the end, then reports the first error. Never returns
/// while a piece is still running: a piece abandoned at the first error could still land
/// after a later request (a discard zeroing a newer write), which would break ordering.
pub(crate) async fn all<T, F>(pieces: impl IntoIterator<Item = F>) -> Result<Vec<T>>
where
    F: Future<Output = Result<T>>,
{
    join_all(pieces).await.into_iter().collect()
}
