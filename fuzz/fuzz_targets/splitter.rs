//! Arbitrary limits, modes and requests (with or without a scatter list): the splitter never
//! panics, and what it returns tiles the request in whole logical blocks within the limits.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tagstripe_quirks::{Limits, Mod15, Op, Segment, Splitter};

#[derive(Arbitrary, Debug)]
struct Input {
    lbs_shift: u8,
    pbs_shift: u8,
    max_hw: u32,
    max_user: u32,
    chunk: u32,
    segs: u32,
    seg_size: u32,
    boundary: u64,
    virt: u64,
    discard: u32,
    gran: u32,
    mode: u8,
    op: u8,
    start: u64,
    sectors: u32,
    sg: Option<Vec<(u64, u16)>>,
}

fuzz_target!(|i: Input| {
    let mut l = Limits::default();
    l.logical_block_size = 512u32
        .checked_shl(u32::from(i.lbs_shift % 8))
        .unwrap_or(512);
    l.physical_block_size = 512u32.checked_shl(u32::from(i.pbs_shift % 10)).unwrap_or(0);
    l.max_hw_sectors = i.max_hw % 70_000;
    l.max_user_sectors = i.max_user % 70_000;
    l.chunk_sectors = i.chunk % 5000;
    l.max_segments = i.segs % 300;
    l.max_segment_size = i.seg_size;
    l.seg_boundary_mask = i.boundary;
    l.virt_boundary_mask = i.virt;
    l.max_discard_sectors = i.discard;
    l.discard_granularity = i.gran;
    let mode = match i.mode % 3 {
        0 => Mod15::Off,
        1 => Mod15::Cap15,
        _ => Mod15::Smart,
    };
    let op = match i.op % 4 {
        0 => Op::Read,
        1 => Op::Write,
        2 => Op::Discard,
        _ => Op::WriteZeroes,
    };
    let Ok(s) = Splitter::new(&l, mode) else {
        return;
    };
    let lim = s.limits().clone();
    let lbs = u64::from(lim.logical_block_size / 512);
    let check = |pieces: &mut dyn Iterator<Item = (u64, u64)>, start: u64, total: u64| {
        let mut next = start;
        // Huge requests under small caps legitimately make millions of pieces: check a prefix.
        for (ps, n) in pieces.take(100_000) {
            assert_eq!(ps, next);
            assert!(n > 0 && n % lbs == 0, "piece of {n} sectors");
            if matches!(op, Op::Read | Op::Write) {
                assert!(n <= u64::from(lim.max_sectors));
                if mode == Mod15::Smart && op == Op::Write {
                    assert!(n == 1 || n % 15 != 1);
                }
            }
            next += n;
        }
        assert!(next <= start + total);
    };
    match &i.sg {
        None => {
            if let Ok(pieces) = s.split(op, i.start, u64::from(i.sectors)) {
                let total = u64::from(i.sectors);
                check(&mut pieces.map(|p| (p.start, p.sectors)), i.start, total);
            }
        }
        Some(list) => {
            let segs: Vec<Segment> = list
                .iter()
                .take(64)
                .map(|&(addr, len)| Segment {
                    addr,
                    len: u32::from(len) * 512,
                })
                .collect();
            if let Ok(pieces) = s.split_sg(op, i.start, &segs) {
                let total: u64 = segs.iter().map(|s| u64::from(s.len) / 512).sum();
                check(
                    &mut pieces.map_while(Result::ok).map(|p| (p.start, p.sectors)),
                    i.start,
                    total,
                );
            }
        }
    }
});
