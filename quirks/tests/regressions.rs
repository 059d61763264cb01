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

/// Found by the `splitter` fuzz target as a slow unit (14-18 s under the fuzzer's
/// instrumentation): smart mod-15 writes under a cap that is itself a bad count (33,871 =
/// 15 x 2,258 + 1) looked for a smaller piece through every physical-block step first, even
/// where those steps were switched off, on every piece. The pieces are unchanged: one
/// sector under the cap each, every count good, tiling the whole 2^32-sector request.
#[test]
fn smart_writes_under_a_bad_cap_take_one_sector_less_a_piece() {
    let mut l = Limits::default();
    l.max_hw_sectors = 33_871;
    l.max_user_sectors = 49_312;
    let s = Splitter::new(&l, Mod15::Smart).unwrap();
    let (start, total) = (144_115_183_948_838_325, 4_278_779_654);
    let mut next = start;
    let mut pieces = 0u64;
    for p in s.split(Op::Write, start, total).unwrap() {
        assert_eq!(p.start, next);
        assert!(
            p.sectors == 1 || p.sectors % 15 != 1,
            "{} sectors",
            p.sectors
        );
        if p.start + p.sectors < start + total {
            assert_eq!(p.sectors, 33_870);
        }
        next += p.sectors;
        pieces += 1;
    }
    assert_eq!(next, start + total);
    assert_eq!(pieces, total.div_ceil(33_870));
}
