//! Property tests of the splitter against an independent checker written here: it knows
//! nothing of how pieces are chosen, only what a valid split is.

use proptest::prelude::*;
use tagstripe_quirks::{Limits, Mod15, Op, Segment, Splitter};

fn limits() -> impl Strategy<Value = Limits> {
    (
        prop_oneof![Just(512u32), Just(512), Just(4096)],
        prop_oneof![Just(0u32), Just(4096), Just(8192)],
        prop_oneof![
            Just(0u32),
            8u32..5000,
            8u32..64,
            Just(255),
            Just(256),
            Just(2560)
        ],
        prop_oneof![Just(0u32), 1u32..400],
        prop_oneof![Just(0u32), 1u32..8],
        prop_oneof![Just(0u32), Just(4096), Just(65536)],
        prop_oneof![Just(0u64), Just(0xFFFF), Just(0xFFF)],
        prop_oneof![Just(0u32), 8u32..3000],
        prop_oneof![Just(0u32), Just(4096), Just(65536)],
    )
        .prop_filter_map(
            "valid limits",
            |(lbs, pbs, hw, chunk, segs, seg_size, boundary, discard, gran)| {
                let mut l = Limits::default();
                l.logical_block_size = lbs;
                l.physical_block_size = pbs;
                l.max_hw_sectors = hw;
                l.chunk_sectors = chunk - chunk % (lbs / 512);
                l.max_segments = segs;
                l.max_segment_size = seg_size;
                l.seg_boundary_mask = boundary;
                l.max_discard_sectors = discard;
                l.discard_granularity = gran;
                l.validate().ok()
            },
        )
}

/// What every valid piece list must satisfy.
fn check(
    l: &Limits,
    op: Op,
    start: u64,
    sectors: u64,
    pieces: &[(u64, u64)],
    mode: Mod15,
) -> Result<(), TestCaseError> {
    let lbs = u64::from(l.logical_block_size / 512);
    let mut next = start;
    for &(s, n) in pieces {
        prop_assert_eq!(s, next, "pieces must tile the request in order");
        prop_assert!(n > 0);
        prop_assert_eq!(n % lbs, 0, "whole logical blocks");
        match op {
            Op::Discard => prop_assert!(n <= u64::from(l.max_discard_sectors)),
            _ => {
                prop_assert!(
                    n <= u64::from(l.max_sectors),
                    "piece {} over max_sectors {}",
                    n,
                    l.max_sectors
                );
                if l.chunk_sectors != 0 {
                    let c = u64::from(l.chunk_sectors);
                    prop_assert_eq!(s / c, (s + n - 1) / c, "piece crosses a chunk boundary");
                }
                if mode == Mod15::Cap15 {
                    prop_assert!(n <= 15);
                }
                if mode == Mod15::Smart && op == Op::Write {
                    prop_assert!(n == 1 || n % 15 != 1, "smart produced a bad count {}", n);
                }
            }
        }
        next += n;
    }
    prop_assert_eq!(next, start + sectors);
    Ok(())
}

/// Minimal hardware segments for `len` bytes at `addr` under the segment-size and boundary
/// limits.
fn min_segments(l: &Limits, mut addr: u64, mut len: u64) -> u64 {
    let mut n = 0;
    while len > 0 {
        let mut take = len;
        if l.max_segment_size != 0 {
            take = take.min(u64::from(l.max_segment_size));
        }
        if l.seg_boundary_mask != 0 {
            take = take.min(l.seg_boundary_mask - (addr & l.seg_boundary_mask) + 1);
        }
        addr += take;
        len -= take;
        n += 1;
    }
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn plain_split_tiles_and_honours_limits(l in limits(), start in 0u64..100_000, len in 1u64..40_000, op in prop_oneof![Just(Op::Read), Just(Op::Write), Just(Op::Discard)]) {
        let lbs = u64::from(l.logical_block_size / 512);
        let (start, len) = (start - start % lbs, (len - len % lbs).max(lbs));
        let s = Splitter::new(&l, Mod15::Off).unwrap();
        match s.split(op, start, len) {
            Ok(pieces) => {
                let pieces: Vec<(u64, u64)> = pieces.map(|p| (p.start, p.sectors)).collect();
                check(&l, op, start, len, &pieces, Mod15::Off)?;
                if op != Op::Discard {
                    // Greedy: every piece but the last is as long as Linux allows, so it
                    // either hits max_sectors, a chunk boundary, or ends PBS-aligned.
                    let pbs = u64::from(l.physical_block_size / 512);
                    for &(ps, n) in &pieces[..pieces.len() - 1] {
                        let at_chunk = l.chunk_sectors != 0 && (ps + n) % u64::from(l.chunk_sectors) == 0;
                        prop_assert!(n == u64::from(l.max_sectors) || at_chunk || (ps + n) % pbs == 0);
                    }
                }
            }
            Err(e) => prop_assert!(op == Op::Discard && l.max_discard_sectors == 0, "{e}"),
        }
    }

    /// `whole` answers as the first piece of `split` does, for every op and mod-15 mode,
    /// aligned or not, the request small or large (its fast path is only a shortcut).
    #[test]
    fn whole_is_the_first_piece_being_all(
        l in limits(),
        start in 0u64..100_000,
        len in prop_oneof![Just(0u64), 1u64..64, 1u64..40_000],
        op in prop_oneof![Just(Op::Read), Just(Op::Write), Just(Op::Discard), Just(Op::WriteZeroes)],
        aligned in any::<bool>(),
    ) {
        let lbs = u64::from(l.logical_block_size / 512);
        let (start, len) = if aligned { (start - start % lbs, (len - len % lbs).max(lbs)) } else { (start, len) };
        for mode in [Mod15::Off, Mod15::Cap15, Mod15::Smart] {
            let Ok(s) = Splitter::new(&l, mode) else { continue };
            let by_split = s.split(op, start, len).map(|mut p| p.next().is_some_and(|p| p.sectors == len));
            match (s.whole(op, start, len), by_split) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{:?} {:?} at {} for {}", mode, op, start, len),
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "{:?} against {:?}", a, b),
            }
        }
    }

    #[test]
    fn mod15_policies(l in limits(), start in 0u64..100_000, len in 1u64..40_000) {
        let lbs = u64::from(l.logical_block_size / 512);
        let (start, len) = (start - start % lbs, (len - len % lbs).max(lbs));
        let plain: Vec<_> = Splitter::new(&l, Mod15::Off).unwrap().split(Op::Write, start, len).unwrap().collect();
        for mode in [Mod15::Cap15, Mod15::Smart] {
            let Ok(s) = Splitter::new(&l, mode) else {
                prop_assert!(lbs > 8);
                continue;
            };
            let pieces: Vec<(u64, u64)> = s.split(Op::Write, start, len).unwrap().map(|p| (p.start, p.sectors)).collect();
            check(&l, Op::Write, start, len, &pieces, mode)?;
            if mode == Mod15::Smart {
                // Where the largest allowed piece is itself a good size, smart costs at
                // most one piece more than plain Linux. (Where it is not, e.g. 256 sectors,
                // every full piece must shrink and no policy can keep the count.)
                let full_is_good = plain.iter().all(|p| p.sectors == 1 || p.sectors % 15 != 1 || p.start + p.sectors == start + len);
                if full_is_good {
                    prop_assert!(pieces.len() <= plain.len() + 1, "smart {} vs plain {}", pieces.len(), plain.len());
                }
            }
        }
    }

    #[test]
    fn scatter_list_split_honours_segment_limits(
        l in limits(),
        bufs in prop::collection::vec((0u64..64, 1u32..40), 1..24),
        mode in prop_oneof![Just(Mod15::Off), Just(Mod15::Smart)],
    ) {
        let lbs_bytes = u64::from(l.logical_block_size);
        // Buffers of whole 512-byte units at scattered, sometimes unaligned addresses.
        let mut segs: Vec<Segment> = bufs.iter().enumerate().map(|(i, &(a, n))| Segment {
            addr: ((i as u64) << 24) | (a * 512 + if a % 3 == 0 { 0x800 } else { 0 }),
            len: n * 512,
        }).collect();
        let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
        let pad = (lbs_bytes - total % lbs_bytes) % lbs_bytes;
        if pad > 0 {
            segs.push(Segment { addr: 1 << 40, len: pad as u32 });
        }
        let Ok(s) = Splitter::new(&l, mode) else { return Ok(()) };
        let sectors = (total + pad) / 512;
        let results: Vec<_> = s.split_sg(Op::Write, 0, &segs).unwrap().collect();
        if results.iter().any(Result::is_err) {
            // Only when one logical block cannot fit the segment limits somewhere.
            prop_assert!(l.max_segments != 0);
            return Ok(());
        }
        let pieces: Vec<(u64, u64)> = results.into_iter().map(|p| p.unwrap()).map(|p| (p.start, p.sectors)).collect();
        check(&l, Op::Write, 0, sectors, &pieces, mode)?;
        // Each piece's bytes, sliced from the list, need no more segments than allowed.
        let mut pos = 0u64;
        for &(_, n) in &pieces {
            let (mut from, to) = (pos, pos + n * 512);
            let mut base = 0u64;
            let mut nsegs = 0;
            for seg in &segs {
                let (a, b) = (base, base + u64::from(seg.len));
                if b > from && a < to {
                    let lo = from.max(a);
                    let hi = to.min(b);
                    nsegs += min_segments(&l, seg.addr + (lo - a), hi - lo);
                    from = hi;
                }
                base = b;
            }
            if l.max_segments != 0 {
                prop_assert!(nsegs <= u64::from(l.max_segments), "piece needs {} segments", nsegs);
            }
            pos = to;
        }
    }
}
