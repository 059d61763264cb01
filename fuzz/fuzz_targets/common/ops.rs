//! Running a session's ops at once, for the session fuzz targets: reads give `fill` bytes,
//! allocation queries one data extent, writes are checked for their length, and every
//! `fail_every`-th op fails with EIO. Whether any op ran; a write's payload bytes left on
//! the stream for the caller (handed off) are added to `handed`.

use bytes::Bytes;
use tagstripe_nbd_proto::session::{Extent, OpKind, Outcome, ServerSession};

pub fn run_ops(
    s: &mut ServerSession,
    n: &mut u64,
    fail_every: u64,
    size: u64,
    handed: &mut u64,
) -> bool {
    let mut ran = false;
    while let Some(op) = s.poll_op() {
        ran = true;
        *n += 1;
        assert!(op.offset + op.length <= size, "op outside the export: {op:?}");
        *handed += op.on_stream;
        let r = if *n % fail_every == 0 {
            Err((5, "injected".to_owned()))
        } else {
            Ok(match op.kind {
                OpKind::Read => Outcome::Data(Bytes::from(vec![(*n % 3) as u8; op.length as usize])),
                OpKind::Allocation => Outcome::Extents(vec![Extent {
                    sectors: op.length.div_ceil(512),
                    hole: false,
                    zero: false,
                }]),
                OpKind::Write(ref d) => {
                    assert_eq!(d.len() as u64 + op.on_stream, op.length);
                    Outcome::Done
                }
                _ => Outcome::Done,
            })
        };
        s.complete(op.id, r);
    }
    ran
}
