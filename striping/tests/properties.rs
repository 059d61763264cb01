//! Property tests of the striping map against independent reference models.

use std::collections::HashSet;

use proptest::prelude::*;
use tagstripe_striping::{Error, Flavor, Geometry, MdLayout, Piece};

fn flavor() -> impl Strategy<Value = Flavor> {
    prop_oneof![
        Just(Flavor::NetBsd),
        Just(Flavor::NetBsd1997),
        Just(Flavor::FreeBsd),
        Just(Flavor::Md(MdLayout::Alt)),
        Just(Flavor::Md(MdLayout::Orig)),
    ]
}

/// Small geometries, so every sector can be checked.
fn small_geometry() -> impl Strategy<Value = Geometry> {
    geometry_with(prop_oneof![
        Just(0u64),
        1u64..40,
        Just(8),
        Just(16),
        Just(32)
    ])
}

fn geometry_with(interleave: impl Strategy<Value = u64>) -> impl Strategy<Value = Geometry> {
    (
        prop::collection::vec(1u64..400, 1..7),
        interleave,
        flavor(),
        any::<[bool; 4]>(),
        prop_oneof![Just(512u32), Just(1024), Just(4096)],
    )
        .prop_filter_map(
            "configuration refused",
            |(sizes, il, flavor, f, secsize)| {
                Geometry::builder(sizes, il)
                    .flavor(flavor)
                    .uniform(f[0])
                    .mirror(f[1])
                    .no_offset(f[2])
                    .linux(f[3] && flavor == Flavor::FreeBsd)
                    .sector_size(secsize)
                    .build()
                    .ok()
            },
        )
}

/// The round-robin model of ccd's interleave table: interleave units are handed out one per
/// component per round, in component order, skipping components that are full. Returns,
/// for every volume unit, (component, unit on the component). md's ORIG layout differs.
fn round_robin(g: &Geometry) -> Vec<(usize, u64)> {
    let il = g.interleave();
    let data = g.data_components();
    let units: Vec<u64> = g.component_sizes()[..data].iter().map(|s| s / il).collect();
    let mut used = vec![0u64; data];
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for c in 0..data {
            if used[c] < units[c] {
                out.push((c, used[c]));
                used[c] += 1;
                any = true;
            }
        }
        if !any {
            return out;
        }
    }
}

fn check_piece_bounds(g: &Geometry, p: &Piece) -> Result<(), TestCaseError> {
    let il = g.interleave();
    let size = g.component_sizes()[p.component];
    let lo = g.reserved_sectors();
    prop_assert!(p.count > 0);
    prop_assert!(
        p.cblk >= lo && p.cblk + p.count <= lo + size,
        "piece {:?} off component",
        p
    );
    if let Some(unit) = p.lblk.checked_div(il) {
        prop_assert_eq!(
            unit,
            (p.lblk_end() - 1) / il,
            "piece crosses an interleave unit"
        );
        prop_assert_eq!((p.cblk - lo) % il, p.lblk % il);
    }
    if g.is_mirror() {
        let half = g.components() / 2;
        prop_assert!(p.component < half);
        prop_assert_eq!(p.mirror, Some(p.component + half));
    } else {
        prop_assert_eq!(p.mirror, None);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Every volume sector maps to a distinct usable component sector, and together they
    /// cover all of the data components' usable sectors: the map is a bijection.
    #[test]
    fn map_is_a_bijection(g in small_geometry()) {
        let data = g.data_components();
        let usable: u64 = g.component_sizes()[..data].iter().sum();
        prop_assert_eq!(g.total_sectors(), usable);
        let expected_total = if g.is_mirror() {
            g.component_sizes()[0] * data as u64
        } else {
            g.component_sizes().iter().sum()
        };
        prop_assert_eq!(g.total_sectors(), expected_total);
        let mut seen = HashSet::new();
        for lblk in 0..g.total_sectors() {
            let p = g.locate(lblk).expect("inside the volume");
            prop_assert_eq!(p.lblk, lblk);
            prop_assert_eq!(p.count, 1);
            check_piece_bounds(&g, &p)?;
            prop_assert!(seen.insert((p.component, p.cblk)), "two sectors map to {:?}", p);
        }
        prop_assert!(g.locate(g.total_sectors()).is_none());
    }

    /// ccd (and md's ALT layout) hand out units round robin, skipping full components.
    #[test]
    fn map_matches_round_robin_model(g in small_geometry()) {
        prop_assume!(g.interleave() > 0 && g.flavor() != Flavor::Md(MdLayout::Orig));
        let il = g.interleave();
        for (unit, (comp, cunit)) in round_robin(&g).into_iter().enumerate() {
            let p = g.locate(unit as u64 * il).expect("inside");
            prop_assert_eq!((p.component, p.cblk), (comp, cunit * il + g.reserved_sectors()));
        }
    }

    /// Concatenation: component after component.
    #[test]
    fn concat_is_sequential(g in geometry_with(Just(0))) {
        let mut lblk = 0;
        for (c, &size) in g.component_sizes().iter().enumerate() {
            let pieces: Vec<_> = g.map(lblk, size).unwrap().collect();
            let want = vec![Piece { lblk, component: c, cblk: g.reserved_sectors(), count: size, mirror: None }];
            prop_assert_eq!(pieces, want);
            lblk += size;
        }
    }

    /// Pieces tile the request in ascending order and agree with the per-sector map; the
    /// merged adapter covers the same sectors with no two mergeable neighbours left.
    #[test]
    fn pieces_tile_requests(g in small_geometry(), a in any::<u64>(), b in any::<u64>()) {
        let total = g.total_sectors();
        let start = a % total;
        let count = b % (total - start + 1);
        let pieces: Vec<_> = g.map(start, count).unwrap().collect();
        let mut next = start;
        for p in &pieces {
            prop_assert_eq!(p.lblk, next);
            check_piece_bounds(&g, p)?;
            for i in 0..p.count {
                let one = g.locate(p.lblk + i).unwrap();
                prop_assert_eq!((one.component, one.cblk), (p.component, p.cblk + i));
            }
            next += p.count;
        }
        prop_assert_eq!(next, start + count);
        let merged: Vec<_> = g.map(start, count).unwrap().merged().collect();
        prop_assert!(merged.len() <= pieces.len());
        let expand = |ps: &[Piece]| ps.iter().flat_map(|p| (0..p.count).map(move |i| (p.lblk + i, p.component, p.cblk + i))).collect::<Vec<_>>();
        prop_assert_eq!(expand(&merged), expand(&pieces));
        for w in merged.windows(2) {
            prop_assert!(!(w[0].component == w[1].component && w[0].cblk + w[0].count == w[1].cblk));
        }
    }

    /// Requests that reach past the end are refused whole; ccd's view truncates them.
    #[test]
    fn past_end_is_refused(g in small_geometry(), over in 1u64..1000, back in 0u64..1000) {
        let total = g.total_sectors();
        let start = total.saturating_sub(back);
        let count = (total - start) + over;
        prop_assert_eq!(g.map(start, count).unwrap_err(), Error::PastEnd { start, count, total });
        let (status, pieces) = g.map_ccd(start, count);
        prop_assert_eq!(pieces.map(|p| p.count).sum::<u64>(), total - start);
        prop_assert_ne!(status, tagstripe_striping::Status::Ok);
        let overflow = matches!(g.map(u64::MAX, 2), Err(Error::RequestOverflow { .. }));
        prop_assert!(overflow);
    }

    /// No input panics: any sizes (up to u64::MAX), interleave and flags.
    #[test]
    fn never_panics(
        sizes in prop::collection::vec(prop_oneof![any::<u64>(), u64::MAX - 100..=u64::MAX, 0u64..100], 0..6),
        il in prop_oneof![any::<u64>(), 0u64..64, u64::MAX / 2..=u64::MAX],
        flavor in flavor(),
        f in any::<[bool; 5]>(),
        secsize in any::<u32>(),
        start in any::<u64>(),
        count in any::<u64>(),
    ) {
        let mut b = Geometry::builder(sizes, il);
        b.flavor(flavor).uniform(f[0]).mirror(f[1]).no_offset(f[2]).linux(f[3]);
        if f[4] { b.sector_size(secsize); }
        if let Ok(g) = b.build() {
            let total = g.total_sectors();
            // A start inside the volume (or at its end); `total + 1` overflows at u64::MAX.
            let inside = total.checked_add(1).map_or(start, |t| start % t);
            for (s, c) in [(start, count), (inside, count % 4096), (total.saturating_sub(1), 1)] {
                if let Ok(pieces) = g.map(s, c) {
                    let sum: u64 = pieces.take(10_000).map(|p| p.count).sum();
                    prop_assert!(sum <= c);
                }
                let _ = g.map_ccd(s, c).1.take(10).count();
            }
            let _ = g.to_string();
        }
    }
}

/// md's pre-3.14 layout moves chunks in zones after the first.
#[test]
fn md_orig_differs_from_alt_in_second_zone() {
    // Sizes 1, 2, 2 chunks; logical chunk 3 is on device 1 (ALT) but device 2 (ORIG).
    let chunk = 8;
    let alt = Geometry::builder([8, 16, 16], chunk)
        .flavor(Flavor::Md(MdLayout::Alt))
        .build()
        .unwrap();
    let orig = Geometry::builder([8, 16, 16], chunk)
        .flavor(Flavor::Md(MdLayout::Orig))
        .build()
        .unwrap();
    assert_eq!(alt.locate(3 * chunk).unwrap().component, 1);
    assert_eq!(orig.locate(3 * chunk).unwrap().component, 2);
    let ccd = Geometry::builder([8, 16, 16], chunk).build().unwrap();
    for lblk in 0..ccd.total_sectors() {
        assert_eq!(
            alt.locate(lblk),
            ccd.locate(lblk),
            "md ALT must equal ccd at {lblk}"
        );
    }
}

/// The example in ccdvar.h's header comment (sizes 5, 3, 7; interleave 1).
#[test]
fn ccdvar_header_example() {
    let g = Geometry::builder([5, 3, 7], 1).build().unwrap();
    let rows: Vec<_> = g
        .rows()
        .iter()
        .map(|r| {
            (
                r.ndisk(),
                r.lblk_start(),
                r.cblk_start(),
                r.members().to_vec(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (3, 0, 0, vec![0, 1, 2]),
            (2, 9, 3, vec![0, 2]),
            (1, 13, 5, vec![2])
        ]
    );
}

#[test]
fn fast_path_only_for_one_power_of_two_row() {
    assert!(
        Geometry::builder([1024; 4], 16)
            .build()
            .unwrap()
            .has_fast_path()
    );
    assert!(
        !Geometry::builder([1024; 3], 16)
            .build()
            .unwrap()
            .has_fast_path()
    );
    assert!(
        !Geometry::builder([1024, 2048], 16)
            .build()
            .unwrap()
            .has_fast_path()
    );
    assert!(
        !Geometry::builder([1024; 4], 12)
            .build()
            .unwrap()
            .has_fast_path()
    );
    assert!(
        !Geometry::builder([1024; 4], 0)
            .build()
            .unwrap()
            .has_fast_path()
    );
}

#[test]
fn refusals_name_the_component() {
    let err = Geometry::builder([1000, 15, 1000], 16).build().unwrap_err();
    assert_eq!(
        err,
        Error::ComponentSmallerThanInterleave {
            component: 1,
            sectors: 15,
            interleave: 16
        }
    );
    assert_eq!(
        err.to_string(),
        "component 1 is smaller than the interleave"
    );
    let err = Geometry::builder([1000, 16], 0)
        .flavor(Flavor::FreeBsd)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        Error::ComponentEmpty {
            component: 1,
            raw_sectors: 16,
            reserved: 16
        }
    );
    let err = Geometry::builder([u64::MAX, u64::MAX], 1)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        Error::Overflow {
            what: "volume size"
        }
    );
    let err = Geometry::builder([100; 3], 16)
        .flavor(Flavor::FreeBsd)
        .mirror(true)
        .build()
        .unwrap_err();
    assert_eq!(err, Error::MirrorOddCount { count: 3 });
    let err = Geometry::builder([100; 2], 16)
        .mirror(true)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        Error::MirrorUnsupported {
            flavor: Flavor::NetBsd
        }
    );
    let err = Geometry::builder([100; 2], 0)
        .flavor(Flavor::Md(MdLayout::Alt))
        .build()
        .unwrap_err();
    assert_eq!(err, Error::ChunkRequired);
    let err = Geometry::builder([1000; 2], 12)
        .flavor(Flavor::Md(MdLayout::Alt))
        .sector_size(4096)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        Error::ChunkNotBlockMultiple {
            interleave: 12,
            sector_size: 4096
        }
    );
    assert_eq!(
        "sun".parse::<Flavor>().unwrap_err(),
        Error::UnknownFlavor { name: "sun".into() }
    );
}

#[test]
fn huge_components_map_without_overflow() {
    let big = u64::MAX / 4;
    let g = Geometry::builder([big, big, big], 1 << 20).build().unwrap();
    let end = g.total_sectors();
    let pieces: Vec<_> = g.map(end - 3, 3).unwrap().collect();
    assert_eq!(pieces.iter().map(|p| p.count).sum::<u64>(), 3);
    assert!(
        pieces
            .iter()
            .all(|p| p.cblk + p.count <= g.component_sizes()[p.component])
    );
}

proptest! {
    /// `volume_sector` inverts `locate` for every flavor, interleave and size: each volume
    /// sector's component sector (and its mirror copy's) maps back to it, and a component
    /// sector that maps to a volume sector is where that sector lives.
    #[test]
    fn volume_sector_inverts_locate(
        sizes in proptest::collection::vec(1u64..400, 1..6),
        interleave in prop_oneof![Just(0u64), 1u64..40],
        flavor in prop_oneof![
            Just(Flavor::NetBsd),
            Just(Flavor::FreeBsd),
            Just(Flavor::Md(MdLayout::Alt)),
            Just(Flavor::Md(MdLayout::Orig)),
        ],
        mirror in any::<bool>(),
    ) {
        let mut b = Geometry::builder(sizes.clone(), interleave);
        b.flavor(flavor).mirror(mirror && sizes.len() % 2 == 0);
        let Ok(g) = b.build() else { return Ok(()) };
        for lblk in 0..g.total_sectors() {
            let p = g.locate(lblk).unwrap();
            prop_assert_eq!(g.volume_sector(p.component, p.cblk), Some(lblk));
            if let Some(m) = p.mirror {
                prop_assert_eq!(g.volume_sector(m, p.cblk), Some(lblk));
            }
        }
        for (c, &raw) in g.raw_sizes().iter().enumerate() {
            for cblk in 0..raw + 2 {
                if let Some(lblk) = g.volume_sector(c, cblk) {
                    let p = g.locate(lblk).unwrap();
                    prop_assert!(
                        (p.component == c || p.mirror == Some(c)) && p.cblk == cblk,
                        "component {} sector {} -> {} -> {:?}", c, cblk, lblk, p
                    );
                }
            }
        }
    }
}
