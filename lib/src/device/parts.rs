//! A write's data as a layer passes it on: one buffer or a list of parts, and the one call
//! that sends either down.

use bytes::Bytes;
use futures_util::future::Either;

use super::BlockDevice;
use crate::{IoOpts, Result};

/// A write's data as it came down: one buffer ([`BlockDevice::write`]) or a list of parts
/// ([`BlockDevice::write_vectored`]). A layer takes both kinds of write through one path
/// with it, and a buffer it cuts stays one buffer a piece: a write of one buffer goes down
/// every layer as one, never as a list of one.
#[derive(Clone, Debug)]
pub(crate) enum Parts {
    /// One buffer.
    One(Bytes),
    /// Several parts, one after the other.
    Many(Vec<Bytes>),
}

impl From<Bytes> for Parts {
    fn from(data: Bytes) -> Self {
        Self::One(data)
    }
}

impl From<Vec<Bytes>> for Parts {
    /// A list of one part is that part as one buffer.
    fn from(mut parts: Vec<Bytes>) -> Self {
        if parts.len() == 1 {
            Self::One(parts.pop().unwrap_or_default())
        } else {
            Self::Many(parts)
        }
    }
}

impl Parts {
    /// The parts as a slice (one buffer: a slice of one).
    pub(crate) fn as_slice(&self) -> &[Bytes] {
        match self {
            Self::One(b) => std::slice::from_ref(b),
            Self::Many(v) => v,
        }
    }

    /// Bytes in all.
    pub(crate) fn len(&self) -> usize {
        self.as_slice().iter().map(Bytes::len).sum()
    }

    /// The bytes `[from, from + len)` (inside the data), as slices of it, no copy; a piece
    /// of one buffer (or of one part) is one buffer.
    pub(crate) fn slice(&self, from: usize, len: usize) -> Self {
        match self {
            Self::One(b) => Self::One(b.slice(from..from + len)),
            Self::Many(v) => Self::from(slice_parts(v, from, len)),
        }
    }

    /// Sent to `dev` at `start`: one buffer by its [`write`](BlockDevice::write), parts by
    /// its [`write_vectored`](BlockDevice::write_vectored). The device's own future, not
    /// one wrapped around it (every layer above holds it inline).
    pub(crate) fn write_to<D: BlockDevice + ?Sized>(
        self,
        dev: &D,
        start: u64,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send + '_ {
        match self {
            Self::One(data) => Either::Left(dev.write(start, data, opts)),
            Self::Many(parts) => Either::Right(dev.write_vectored(start, parts, opts)),
        }
    }
}

/// The bytes `[from, from + len)` of `parts` taken one after the other, as slices of them
/// (no copy): how a gathered write is cut into pieces.
pub(crate) fn slice_parts(parts: &[Bytes], from: usize, len: usize) -> Vec<Bytes> {
    let end = from + len;
    let mut out = Vec::new();
    if len == 0 {
        return out;
    }
    let mut at = 0;
    for p in parts {
        let (lo, hi) = (at, at + p.len());
        at = hi;
        if hi <= from || p.is_empty() {
            continue;
        }
        if lo >= end {
            break;
        }
        out.push(p.slice(from.max(lo) - lo..end.min(hi) - lo));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Vec<Bytes> {
        vec![
            Bytes::from(vec![1u8; 1024]),
            Bytes::new(),
            Bytes::from(vec![2u8; 512]),
            Bytes::from(vec![3u8; 2048]),
        ]
    }

    #[test]
    fn a_list_of_one_is_one_buffer() {
        let one = Parts::from(vec![Bytes::from(vec![7u8; 512])]);
        assert!(matches!(one, Parts::One(ref b) if b.len() == 512));
        assert!(matches!(Parts::from(parts()), Parts::Many(ref v) if v.len() == 4));
        assert_eq!(Parts::from(parts()).len(), 3584);
    }

    #[test]
    fn slices_keep_the_bytes_and_one_buffer_stays_one() {
        let whole: Vec<u8> = parts().iter().flat_map(|p| p.to_vec()).collect();
        let many = Parts::from(parts());
        let one = Parts::from(Bytes::from(whole.clone()));
        for (from, len) in [
            (0, 3584),
            (512, 1024),
            (1024, 512),
            (1536, 2048),
            (3072, 512),
        ] {
            for p in [&many, &one] {
                let s = p.slice(from, len);
                let got: Vec<u8> = s.as_slice().iter().flat_map(|b| b.to_vec()).collect();
                assert_eq!(got, whole[from..from + len], "{from}+{len}");
            }
            assert!(matches!(one.slice(from, len), Parts::One(_)));
        }
        // Inside one part of a list: one buffer.
        assert!(matches!(many.slice(1536, 1024), Parts::One(_)));
        // Across parts: the parts it touches, the empty one skipped.
        assert!(matches!(many.slice(512, 1024), Parts::Many(ref v) if v.len() == 2));
        assert!(slice_parts(&parts(), 0, 0).is_empty());
    }

    #[test]
    fn slice_parts_takes_any_byte_range_across_parts() {
        let parts: Vec<Bytes> = [3usize, 0, 5, 2]
            .iter()
            .scan(0u8, |next, &n| {
                let b: Vec<u8> = (0..n).map(|i| *next + i as u8).collect();
                *next += n as u8;
                Some(Bytes::from(b))
            })
            .collect();
        let flat: Vec<u8> = (0..10).collect();
        for from in 0..=10 {
            for len in 0..=10 - from {
                let got = slice_parts(&parts, from, len);
                assert!(got.iter().all(|p| !p.is_empty()), "no empty slices");
                assert_eq!(got.concat(), &flat[from..from + len], "{from}+{len}");
            }
        }
        assert_eq!(
            slice_parts(&parts, 3, 5).len(),
            1,
            "inside one part: one slice"
        );
    }
}
