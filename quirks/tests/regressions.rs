//! Failures found by fuzzing, kept as named tests with their cause.

use tagstripe_quirks::{Error, Limits, Mod15, Op, Segment, Splitter};

/// Found by the `splitter` fuzz target: a boundary mask of u64::MAX overflowed
/// `mask - (addr & mask) + 1` in the segment walk.
#[test]
fn full_width_segment_boundary_mask_does_not_overflow() {
    let mut l = Limits::default();
    l.seg_boundary_mask = u64::MAX;
    let s = Splitter::new(&l, Mod15::Off).unwrap();
    let segs = [
        Segment { addr: 0, len: 8192 },
        Segment {
            addr: u64::MAX - 511,
            len: 512,
        },
    ];
    let pieces: Vec<u64> = s
        .split_sg(Op::Read, 0, &segs)
        .unwrap()
        .map(|p| p.unwrap().sectors)
        .collect();
    assert_eq!(pieces.iter().sum::<u64>(), 17);
}

/// Found by the `splitter` fuzz target: a discard granularity that is not a whole number of
/// logical blocks produced discard pieces that were not either; it is now refused.
#[test]
fn discard_granularity_must_be_whole_logical_blocks() {
    let mut l = Limits::default();
    l.logical_block_size = 2048;
    l.max_discard_sectors = 1 << 20;
    l.discard_granularity = 168_430_090;
    assert!(matches!(
        l.validate(),
        Err(Error::NotBlockMultiple {
            field: "discard_granularity",
            ..
        })
    ));
}
