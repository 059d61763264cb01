//! md's raid5, raid6 and raid10 layouts against references:
//! - stripe tables for four- and five-member arrays, as md's own comments draw them
//!   (`drivers/md/raid5.c`, `raid5_compute_sector`: "Q D D D P", "D D P Q D") and as the md(4)
//!   man page describes raid10's near, far and offset copies;
//! - a port of md's inverse, `compute_blocknr`, written here case by case as the kernel
//!   writes it (not the library's way), checked against the library's forward map for every
//!   chunk of every layout;
//! - properties: every volume sector maps to exactly one data place and back, parity never
//!   shares a member with its stripe's data, raid10's copies sit on distinct members and map
//!   back (md's `raid10_find_virt` inverts `__raid10_find_phys`).

use proptest::prelude::*;
use tagstripe_striping::Error;
use tagstripe_striping::md::{Parity, ParityLayout, Raid10, Raid10Layout};

/// The member of each data chunk and of P (and Q) for the first `stripes` stripes, as a
/// string per stripe: `D<n>` for data chunk n, `P`, `Q`.
fn table(a: &Parity, stripes: u64) -> Vec<String> {
    (0..stripes)
        .map(|st| {
            let s = a.stripe(st);
            let mut row = vec![String::new(); a.disks()];
            row[s.p] = "P".into();
            if let Some(q) = s.q {
                row[q] = "Q".into();
            }
            for (i, &m) in s.data.iter().enumerate() {
                row[m] = format!("D{}", st * a.data_disks() as u64 + i as u64);
            }
            row.join(" ")
        })
        .collect()
}

fn raid(level: u8, layout: ParityLayout, disks: usize) -> Parity {
    Parity::new(level, layout, disks, 8, 8 * 64).unwrap()
}

#[test]
fn raid5_tables_of_four_members() {
    use ParityLayout::*;
    assert_eq!(
        table(&raid(5, LeftAsymmetric, 4), 4),
        ["D0 D1 D2 P", "D3 D4 P D5", "D6 P D7 D8", "P D9 D10 D11"]
    );
    assert_eq!(
        table(&raid(5, RightAsymmetric, 4), 4),
        ["P D0 D1 D2", "D3 P D4 D5", "D6 D7 P D8", "D9 D10 D11 P"]
    );
    assert_eq!(
        table(&raid(5, LeftSymmetric, 4), 4),
        ["D0 D1 D2 P", "D4 D5 P D3", "D8 P D6 D7", "P D9 D10 D11"]
    );
    assert_eq!(
        table(&raid(5, RightSymmetric, 4), 4),
        ["P D0 D1 D2", "D5 P D3 D4", "D7 D8 P D6", "D9 D10 D11 P"]
    );
    assert_eq!(
        table(&raid(5, ParityFirst, 4), 2),
        ["P D0 D1 D2", "P D3 D4 D5"]
    );
    assert_eq!(
        table(&raid(5, ParityLast, 4), 2),
        ["D0 D1 D2 P", "D3 D4 D5 P"]
    );
}

#[test]
fn raid6_tables_of_five_members() {
    use ParityLayout::*;
    // md's comments: P at the end puts Q first ("Q D D D P"), else Q follows P ("D D P Q D").
    assert_eq!(
        table(&raid(6, LeftAsymmetric, 5), 5),
        [
            "Q D0 D1 D2 P",
            "D3 D4 D5 P Q",
            "D6 D7 P Q D8",
            "D9 P Q D10 D11",
            "P Q D12 D13 D14"
        ]
    );
    assert_eq!(
        table(&raid(6, LeftSymmetric, 5), 5),
        [
            "Q D0 D1 D2 P",
            "D3 D4 D5 P Q",
            "D7 D8 P Q D6",
            "D11 P Q D9 D10",
            "P Q D12 D13 D14"
        ]
    );
    assert_eq!(
        table(&raid(6, RightAsymmetric, 5), 2),
        ["P Q D0 D1 D2", "D3 P Q D4 D5"]
    );
    assert_eq!(table(&raid(6, ParityFirst, 5), 1), ["P Q D0 D1 D2"]);
    assert_eq!(table(&raid(6, ParityLast, 5), 1), ["D0 D1 D2 P Q"]);
    // The -6 layouts: raid5's layout over the first n-1 members, Q always last.
    assert_eq!(
        table(&raid(6, LeftSymmetric6, 5), 4),
        [
            "D0 D1 D2 P Q",
            "D4 D5 P D3 Q",
            "D8 P D6 D7 Q",
            "P D9 D10 D11 Q"
        ]
    );
    assert_eq!(
        table(&raid(6, LeftAsymmetric6, 5), 2),
        ["D0 D1 D2 P Q", "D3 D4 P D5 Q"]
    );
    assert_eq!(table(&raid(6, ParityFirst6, 5), 1), ["P D0 D1 D2 Q"]);
}

/// md's `compute_blocknr` for data member `i` of stripe `stripe`, ported case by case (its
/// shape kept, so it reads against the kernel's).
#[allow(clippy::collapsible_if, clippy::collapsible_match)]
fn compute_blocknr(a: &Parity, stripe: u64, i: usize) -> Option<u64> {
    use ParityLayout::*;
    let s = a.stripe(stripe);
    let (raid_disks, data_disks) = (a.disks() as i64, a.data_disks() as i64);
    let (pd, mut i) = (s.p as i64, i as i64);
    if i == pd || Some(i as usize) == s.q {
        return None;
    }
    if a.level() == 5 {
        match a.layout() {
            LeftAsymmetric | RightAsymmetric => {
                if i > pd {
                    i -= 1;
                }
            }
            LeftSymmetric | RightSymmetric => {
                if i < pd {
                    i += raid_disks;
                }
                i -= pd + 1;
            }
            ParityFirst => i -= 1,
            _ => {}
        }
    } else {
        match a.layout() {
            LeftAsymmetric | RightAsymmetric => {
                if pd == raid_disks - 1 {
                    i -= 1;
                } else if i > pd {
                    i -= 2;
                }
            }
            LeftSymmetric | RightSymmetric => {
                if pd == raid_disks - 1 {
                    i -= 1;
                } else {
                    if i < pd {
                        i += raid_disks;
                    }
                    i -= pd + 2;
                }
            }
            ParityFirst => i -= 2,
            ParityLast => {}
            LeftAsymmetric6 | RightAsymmetric6 => {
                if i > pd {
                    i -= 1;
                }
            }
            LeftSymmetric6 | RightSymmetric6 => {
                if i < pd {
                    i += data_disks + 1;
                }
                i -= pd + 1;
            }
            ParityFirst6 => i -= 1,
        }
    }
    let chunk_number = stripe * data_disks as u64 + u64::try_from(i).ok()?;
    Some(chunk_number * a.chunk())
}

#[test]
fn the_forward_map_agrees_with_mds_compute_blocknr() {
    for level in [5u8, 6] {
        for layout in ParityLayout::ALL {
            if level == 5 && layout.raid6_only() {
                continue;
            }
            for disks in (if level == 5 { 2 } else { 4 })..=9 {
                let a = Parity::new(level, layout, disks, 8, 8 * 40).unwrap();
                for stripe in 0..a.stripes() {
                    for m in 0..disks {
                        let want = compute_blocknr(&a, stripe, m);
                        let cblk = stripe * a.chunk();
                        assert_eq!(
                            a.volume_sector(m, cblk),
                            want,
                            "raid{level} {} disks {disks} stripe {stripe} member {m}",
                            layout.name()
                        );
                        if let Some(l) = want {
                            let p = a.locate(l).unwrap();
                            assert_eq!((p.comp, p.cblk), (m, cblk));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn md_sizes_and_refusals() {
    // raid5_size: whole chunks of each member times the data members.
    let a = Parity::new(5, ParityLayout::LeftSymmetric, 4, 128, 1000).unwrap();
    assert_eq!((a.member_sectors(), a.total_sectors()), (896, 2688));
    let r = Raid10::new(Raid10Layout::near(2), 4, 128, 1000).unwrap();
    // raid10_size: 7 chunks a member, times 4 members, over 2 copies.
    assert_eq!(r.total_sectors(), 14 * 128);
    assert!(matches!(
        Parity::new(5, ParityLayout::LeftSymmetric, 4, 12, 1000),
        Err(Error::InvalidChunk { .. })
    ));
    assert!(matches!(
        Parity::new(6, ParityLayout::LeftSymmetric, 3, 8, 1000),
        Err(Error::TooFewDisks { min: 4, .. })
    ));
    assert!(matches!(
        Parity::new(5, ParityLayout::LeftSymmetric6, 4, 8, 1000),
        Err(Error::LayoutUnsupported { .. })
    ));
    assert!(matches!(
        Parity::new(4, ParityLayout::LeftSymmetric, 4, 8, 1000),
        Err(Error::InvalidLevel { level: 4 })
    ));
    assert!(matches!(
        Raid10::new("f3".parse().unwrap(), 2, 8, 1000),
        Err(Error::TooFewDisks { .. })
    ));
    assert!("x2".parse::<Raid10Layout>().is_err());
    assert!("n0".parse::<Raid10Layout>().is_err());
    assert!("middle".parse::<ParityLayout>().is_err());
    assert_eq!(
        "ls".parse::<ParityLayout>().unwrap(),
        ParityLayout::LeftSymmetric
    );
    assert!(a.map(a.total_sectors() - 1, 2).is_err());
    assert!(a.map(u64::MAX, 2).is_err());
}

#[test]
fn raid10_copies_as_md_places_them() {
    let chunk = 8;
    let rows = 8 * chunk; // each member: 8 chunks
    // n2 over 4 members: chunk k's two copies side by side, rows advancing every 2 chunks.
    let n2 = Raid10::new("n2".parse().unwrap(), 4, chunk, rows).unwrap();
    assert_eq!(n2.copies(0), [(0, 0), (1, 0)]);
    assert_eq!(n2.copies(chunk), [(2, 0), (3, 0)]);
    assert_eq!(n2.copies(2 * chunk + 3), [(0, chunk + 3), (1, chunk + 3)]);
    // n2 over 3 members: a chunk's copies wrap to the next row.
    let n2_3 = Raid10::new("n2".parse().unwrap(), 3, chunk, rows).unwrap();
    assert_eq!(n2_3.copies(chunk), [(2, 0), (0, chunk)]);
    // f2 over 4 members: raid0 over the first half; the second copy one member on, in
    // the second half (stride = half of each member).
    let f2 = Raid10::new("f2".parse().unwrap(), 4, chunk, rows).unwrap();
    let half = 4 * chunk;
    assert_eq!(f2.copies(0), [(0, 0), (1, half)]);
    assert_eq!(f2.copies(3 * chunk), [(3, 0), (0, half)]);
    assert_eq!(f2.copies(4 * chunk), [(0, chunk), (1, half + chunk)]);
    // o2 over 4 members: the second copy in the next chunk row, one member on.
    let o2 = Raid10::new("o2".parse().unwrap(), 4, chunk, rows).unwrap();
    assert_eq!(o2.copies(0), [(0, 0), (1, chunk)]);
    assert_eq!(o2.copies(3 * chunk), [(3, 0), (0, chunk)]);
    assert_eq!(o2.copies(4 * chunk), [(0, 2 * chunk), (1, 3 * chunk)]);
    assert_eq!(
        Raid10Layout::from_md(0x10201).unwrap().to_string(),
        "o2",
        "md's layout number for o2"
    );
    assert_eq!("f2".parse::<Raid10Layout>().unwrap().md_layout(), 0x201);
    assert_eq!("n2".parse::<Raid10Layout>().unwrap().md_layout(), 0x102);
}

fn parity_layouts() -> impl Strategy<Value = (u8, ParityLayout)> {
    (
        prop_oneof![Just(5u8), Just(6u8)],
        0..ParityLayout::ALL.len(),
    )
        .prop_map(|(level, i)| (level, ParityLayout::ALL[i]))
        .prop_filter("raid5 has no -6 layouts", |(level, l)| {
            *level == 6 || !l.raid6_only()
        })
}

proptest! {
    #[test]
    fn every_parity_sector_has_one_place_and_parity_apart(
        (level, layout) in parity_layouts(),
        disks in 2usize..10,
        chunk_shift in 3u32..6,
        chunks in 1u64..12,
    ) {
        let chunk = 1u64 << chunk_shift;
        let Ok(a) = Parity::new(level, layout, disks, chunk, chunks * chunk + 3) else {
            prop_assume!(false);
            unreachable!()
        };
        let mut seen = std::collections::HashSet::new();
        for lblk in 0..a.total_sectors() {
            let p = a.locate(lblk).unwrap();
            prop_assert!(p.comp < disks && p.cblk < a.member_sectors());
            prop_assert!(p.comp != p.p_comp && Some(p.comp) != p.q_comp && Some(p.p_comp) != p.q_comp);
            prop_assert_eq!(p.q_comp.is_some(), level == 6);
            prop_assert!(seen.insert((p.comp, p.cblk)), "two sectors in one place");
            prop_assert_eq!(a.volume_sector(p.comp, p.cblk), Some(lblk));
        }
        // Data and parity fill every member sector exactly.
        let parity = a.member_sectors() * u64::from(level - 4);
        prop_assert_eq!(seen.len() as u64 + parity, a.member_sectors() * disks as u64);
        // A request's pieces cover it in order.
        let m = a.map(1, a.total_sectors() - 1).unwrap();
        prop_assert_eq!(m.iter().map(|p| p.count).sum::<u64>(), a.total_sectors() - 1);
        prop_assert!(m.windows(2).all(|w| w[0].lblk + w[0].count == w[1].lblk));
    }

    #[test]
    fn raid10_copies_are_distinct_and_map_back(
        near in 1u8..4,
        far in 1u8..4,
        offset in any::<bool>(),
        far_sets in any::<bool>(),
        extra in 0usize..4,
        chunk_shift in 3u32..5,
        chunks in 1u64..10,
    ) {
        let layout = Raid10Layout { near, far, offset: offset && far > 1, far_sets: far_sets && far > 1 };
        prop_assume!(layout.copies() >= 2);
        let disks = layout.copies() + extra;
        let chunk = 1u64 << chunk_shift;
        let r = match Raid10::new(layout, disks, chunk, chunks * u64::from(far) * chunk + 5) {
            Ok(r) => r,
            // A layout refused for putting copies together: nothing to check.
            Err(Error::LayoutUnsupported { .. }) => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(format!("{layout} over {disks}: {e}"))),
        };
        let mut seen = std::collections::HashSet::new();
        for lblk in 0..r.total_sectors() {
            let c = r.copies(lblk);
            prop_assert_eq!(c.len(), layout.copies());
            let members: std::collections::HashSet<usize> = c.iter().map(|x| x.0).collect();
            prop_assert_eq!(members.len(), c.len(), "copies on one member: {:?}", c);
            for &(m, s) in &c {
                prop_assert!(m < disks && s < r.member_sectors(), "{:?} past {}", (m, s), r.member_sectors());
                prop_assert!(seen.insert((m, s)), "two copies in one place");
                prop_assert_eq!(r.volume_sector(m, s), Some(lblk), "copy {:?}", (m, s));
            }
        }
    }
}

#[test]
fn superblocks_round_trip_and_refuse_corruption() {
    use tagstripe_striping::md::{MdGeometry, Superblock1};
    let sb = Superblock1 {
        feature_map: 0,
        set_uuid: [7; 16],
        set_name: "host:md0".into(),
        level: 6,
        layout: ParityLayout::LeftSymmetric.md_algorithm(),
        size: 8192,
        chunk: 128,
        raid_disks: 5,
        data_offset: 2048,
        data_size: 8192,
        super_offset: 8,
        dev_number: 3,
        events: 42,
        resync_offset: u64::MAX,
        recovery_offset: 0,
        dev_roles: vec![0, 1, 2, 3, 4, 0xffff],
    };
    let b = sb.encode();
    assert_eq!(b.len(), 4096);
    assert_eq!(Superblock1::parse(&b).unwrap(), sb);
    assert_eq!(sb.role(), Some(3));
    let MdGeometry::Parity(g) = sb.geometry().unwrap() else {
        panic!("raid6 is a parity geometry")
    };
    assert_eq!((g.disks(), g.total_sectors()), (5, 3 * 8192));
    // Any flipped bit in the checksummed bytes is refused, naming the checksum.
    for at in [0usize, 72, 80, 130, 200, 258] {
        let mut c = b.clone();
        c[at] ^= 0x10;
        let e = Superblock1::parse(&c).unwrap_err().to_string();
        assert!(
            e.contains("checksum") || e.contains("magic"),
            "byte {at}: {e}"
        );
    }
    assert!(Superblock1::parse(&b[..200]).is_err());
    let spare = Superblock1 {
        dev_number: 5,
        ..sb.clone()
    };
    assert_eq!(spare.role(), None);
    let raid1 = Superblock1 { level: 1, ..sb };
    assert!(matches!(
        raid1.geometry(),
        Err(Error::InvalidLevel { level: 1 })
    ));
}

proptest! {
    /// P and Q in one pass (Horner's rule, eight bytes at a time) equal their definitions
    /// (the XOR of the data, and `Σ 2^c · D_c` a byte at a time), for any number of data
    /// blocks, any length (whole words or not), with blocks missing (zeroes).
    #[test]
    fn gen_syndrome_is_p_and_q_by_definition(
        blocks in proptest::collection::vec(
            proptest::option::weighted(0.85, proptest::collection::vec(any::<u8>(), 77)),
            1..20,
        ),
        len in 0usize..77,
    ) {
        let data: Vec<Option<&[u8]>> = blocks.iter().map(|b| b.as_deref().map(|b| &b[..len])).collect();
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        tagstripe_striping::md::gf::gen_syndrome(&data, &mut p, &mut q);
        let (mut p2, mut q2) = (vec![0u8; len], vec![0u8; len]);
        for (c, d) in data.iter().enumerate() {
            if let Some(d) = d {
                tagstripe_striping::md::gf::xor_into(&mut p2, d);
                tagstripe_striping::md::gf::mul_acc(&mut q2, tagstripe_striping::md::gf::pow2(c), d);
            }
        }
        prop_assert_eq!(p, p2);
        prop_assert_eq!(q, q2);
    }
    /// The XOR of any number of sources (odd and even: two a pass, the first alone when
    /// odd), any length across the 4 KiB blocks and the 32-byte lanes, equals the XOR a
    /// byte at a time.
    #[test]
    fn xor_sum_new_is_the_xor_of_its_sources(
        seeds in proptest::collection::vec(any::<u8>(), 0..9),
        len in prop_oneof![0usize..100, 4000usize..8300],
    ) {
        let srcs: Vec<Vec<u8>> = seeds
            .iter()
            .map(|&s| (0..len).map(|i| (i as u8).wrapping_mul(31) ^ s.rotate_left(i as u32 % 8)).collect())
            .collect();
        let refs: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
        let mut want = vec![0u8; len];
        for s in &srcs {
            for (w, b) in want.iter_mut().zip(s) {
                *w ^= b;
            }
        }
        prop_assert_eq!(tagstripe_striping::md::gf::xor_sum_new(&refs, len), want);
    }
}
