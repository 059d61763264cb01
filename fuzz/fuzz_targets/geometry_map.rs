//! Arbitrary geometries and requests: building and mapping never panic, and every successful
//! map tiles its request with pieces inside their components and interleave units.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tagstripe_striping::{Flavor, Geometry, MdLayout};

#[derive(Arbitrary, Debug)]
struct Input {
    sizes: Vec<u64>,
    interleave: u64,
    flavor: u8,
    flags: u8,
    sector_size: Option<u32>,
    reserved: Option<u64>,
    requests: Vec<(u64, u64)>,
}

/// Most interesting geometries are small; shrink values when the fuzzer asks for it.
fn small(v: u64, on: bool) -> u64 {
    if on { v % 4096 } else { v }
}

fuzz_target!(|input: Input| {
    let shrink = input.flags & 0x40 != 0;
    let sizes: Vec<u64> = input
        .sizes
        .iter()
        .take(16)
        .map(|&s| small(s, shrink))
        .collect();
    let flavor = match input.flavor % 5 {
        0 => Flavor::NetBsd,
        1 => Flavor::NetBsd1997,
        2 => Flavor::FreeBsd,
        3 => Flavor::Md(MdLayout::Alt),
        _ => Flavor::Md(MdLayout::Orig),
    };
    let mut b = Geometry::builder(sizes, small(input.interleave, shrink));
    b.flavor(flavor)
        .uniform(input.flags & 1 != 0)
        .mirror(input.flags & 2 != 0)
        .no_offset(input.flags & 4 != 0)
        .linux(input.flags & 8 != 0);
    if let Some(s) = input.sector_size {
        b.sector_size(s);
    }
    if let Some(r) = input.reserved {
        b.reserved(small(r, shrink));
    }
    let Ok(g) = b.build() else { return };
    let _ = g.to_string();
    let total = g.total_sectors();
    let il = g.interleave();
    for &(start, count) in input.requests.iter().take(8) {
        let (start, count) = if shrink {
            (start % (total + 2), count % 8192)
        } else {
            (start, count)
        };
        let _ = g.map_ccd(start, count).1.take(64).count();
        let Ok(pieces) = g.map(start, count) else {
            assert!(start.checked_add(count).is_none_or(|end| end > total));
            continue;
        };
        let mut next = start;
        for p in pieces.take(4096) {
            assert_eq!(p.lblk, next, "pieces must be contiguous");
            assert!(p.count > 0);
            let size = g.component_sizes()[p.component];
            let lo = g.reserved_sectors();
            assert!(
                p.cblk >= lo && p.cblk - lo + p.count <= size,
                "piece off its component"
            );
            if il > 0 {
                assert_eq!(
                    p.lblk / il,
                    (p.lblk + p.count - 1) / il,
                    "piece crosses a unit"
                );
            }
            next += p.count;
        }
        assert!(next <= start + count);
    }
});
