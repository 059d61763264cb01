//! Layers: each wraps devices and is a device itself.

mod queue;
mod split;
mod striped;

pub use queue::Queue;
pub use split::Split;
pub use striped::Striped;

use bytes::{Bytes, BytesMut};

/// Joins read pieces in order: the piece itself when there is one (no copy).
pub(crate) fn gather(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for p in parts {
        out.extend_from_slice(&p);
    }
    out.freeze()
}
