//! Worked examples of Linux's split order, the Seagate mod-15 example, limit
//! validation and stacking, as named tests.

use tagstripe_quirks::{
    Error, Identity, Limits, Misalignment, Mod15, Op, QuirkSet, Segment, Splitter, StripeShape,
};

fn limits(f: impl FnOnce(&mut Limits)) -> Limits {
    let mut l = Limits::default();
    f(&mut l);
    l
}

fn plain(l: &Limits, op: Op, start: u64, sectors: u64) -> Vec<u64> {
    Splitter::new(l, Mod15::Off)
        .unwrap()
        .split(op, start, sectors)
        .unwrap()
        .map(|p| p.sectors)
        .collect()
}

fn sg(l: &Limits, start: u64, segs: &[Segment]) -> Vec<u64> {
    Splitter::new(l, Mod15::Off)
        .unwrap()
        .split_sg(Op::Read, start, segs)
        .unwrap()
        .map(|p| p.unwrap().sectors)
        .collect()
}

#[test]
fn pbs_end_alignment_512e() {
    let l = limits(|l| {
        l.physical_block_size = 4096;
        l.max_hw_sectors = 2560;
    });
    assert_eq!(plain(&l, Op::Read, 3, 6000), [2557, 2560, 883]);
}

#[test]
fn chunk_boundary_power_of_two() {
    let l = limits(|l| {
        l.chunk_sectors = 128;
        l.max_hw_sectors = 2560;
    });
    assert_eq!(plain(&l, Op::Write, 100, 300), [28, 128, 128, 16]);
}

#[test]
fn chunk_boundary_not_power_of_two() {
    let l = limits(|l| l.chunk_sectors = 96);
    assert_eq!(plain(&l, Op::Write, 90, 200), [6, 96, 96, 2]);
}

#[test]
fn max_segments_two_with_ten_4k_buffers() {
    let l = limits(|l| l.max_segments = 2);
    let bufs: Vec<Segment> = (0..10)
        .map(|i| Segment {
            addr: i * 0x10000,
            len: 4096,
        })
        .collect();
    assert_eq!(sg(&l, 0, &bufs), [16; 5]);
}

#[test]
fn max_segment_size_with_one_contiguous_mib() {
    let l = limits(|l| {
        l.max_segments = 4;
        l.max_segment_size = 65536;
    });
    assert_eq!(
        sg(
            &l,
            0,
            &[Segment {
                addr: 0,
                len: 1 << 20
            }]
        ),
        [512; 4]
    );
}

#[test]
fn segment_boundary_crossing() {
    let l = limits(|l| {
        l.max_segments = 1;
        l.seg_boundary_mask = 0xFFFF;
    });
    assert_eq!(
        sg(
            &l,
            0,
            &[Segment {
                addr: 0xF000,
                len: 264 * 512
            }]
        ),
        [8, 128, 128]
    );
}

#[test]
fn four_kn_rounds_segment_walk_down_to_blocks() {
    let l = limits(|l| {
        l.logical_block_size = 4096;
        l.max_segments = 3;
    });
    let bufs: Vec<Segment> = (0..4)
        .map(|i| Segment {
            addr: i * 0x10000,
            len: 6144,
        })
        .collect();
    assert_eq!(sg(&l, 0, &bufs), [32, 16]);
}

#[test]
fn virt_boundary_gap_splits() {
    let l = limits(|l| l.virt_boundary_mask = 0xFFF);
    let bufs = [
        Segment { addr: 0, len: 4096 },
        Segment {
            addr: 0x10000,
            len: 2048,
        },
        Segment {
            addr: 0x20000,
            len: 6144,
        },
    ];
    assert_eq!(sg(&l, 0, &bufs), [12, 12]);
}

#[test]
fn discard_granularity_grid() {
    let l = limits(|l| {
        l.max_discard_sectors = 1000;
        l.discard_granularity = 4096;
    });
    assert_eq!(
        plain(&l, Op::Discard, 3, 5000),
        [997, 1000, 1000, 1000, 1000, 3]
    );
}

#[test]
fn seagate_mod15_write_of_2576_sectors() {
    // ST380023AS is in sata_sil's MOD15WRITE list; the controller takes 2560 sectors.
    let hw = limits(|l| l.max_hw_sectors = 2560);
    let applied = QuirkSet::builtin()
        .apply(&Identity::new("ATA", "ST380023AS", "3.01"), &hw)
        .unwrap();
    assert!(applied.mod15write);
    let cap15: Vec<u64> = Splitter::for_device(&applied, Mod15::Cap15)
        .unwrap()
        .split(Op::Write, 0, 2576)
        .unwrap()
        .map(|p| p.sectors)
        .collect();
    assert_eq!(cap15.len(), 172);
    assert!(cap15[..171].iter().all(|&n| n == 15));
    assert_eq!(cap15[171], 2576 - 171 * 15);
    let smart: Vec<u64> = Splitter::for_device(&applied, Mod15::Smart)
        .unwrap()
        .split(Op::Write, 0, 2576)
        .unwrap()
        .map(|p| p.sectors)
        .collect();
    assert_eq!(smart, [2559, 17]);
    // Plain Linux without the quirk: 2560 + 16, and 16 % 15 == 1.
    assert_eq!(plain(&hw, Op::Write, 0, 2576), [2560, 16]);
    // Smart leaves reads alone.
    let reads: Vec<u64> = Splitter::for_device(&applied, Mod15::Smart)
        .unwrap()
        .split(Op::Read, 0, 2576)
        .unwrap()
        .map(|p| p.sectors)
        .collect();
    assert_eq!(reads, [2560, 16]);
}

#[test]
fn smart_on_512e_keeps_physical_alignment() {
    // 2576 on a 512e disk -> 2552 + 24; 16 -> 8 + 8.
    let hw = limits(|l| {
        l.physical_block_size = 4096;
        l.max_hw_sectors = 2560;
    });
    let smart = Splitter::new(&hw, Mod15::Smart).unwrap();
    let sizes = |n| {
        smart
            .split(Op::Write, 0, n)
            .unwrap()
            .map(|p| p.sectors)
            .collect::<Vec<_>>()
    };
    assert_eq!(sizes(2576), [2552, 24]);
    assert_eq!(sizes(16), [8, 8]);
    assert_eq!(sizes(256), [248, 8]);
}

#[test]
fn smart_on_512n_small_requests() {
    let smart = Splitter::new(&Limits::default(), Mod15::Smart).unwrap();
    let sizes = |n| {
        smart
            .split(Op::Write, 0, n)
            .unwrap()
            .map(|p| p.sectors)
            .collect::<Vec<_>>()
    };
    assert_eq!(sizes(31), [30, 1]);
    assert_eq!(sizes(1), [1]);
    assert_eq!(sizes(16), [15, 1]);
    let cap15 = Splitter::new(&Limits::default(), Mod15::Cap15).unwrap();
    assert_eq!(
        cap15
            .split(Op::Write, 0, 31)
            .unwrap()
            .map(|p| p.sectors)
            .collect::<Vec<_>>(),
        [15, 15, 1]
    );
}

#[test]
fn misaligned_requests_are_errors() {
    let s = Splitter::new(&limits(|l| l.logical_block_size = 4096), Mod15::Off).unwrap();
    assert_eq!(
        s.split(Op::Read, 4, 8).unwrap_err(),
        Error::Misaligned {
            start: 4,
            sectors: 8,
            lbs: 8
        }
    );
    assert_eq!(
        s.split(Op::Read, 8, 12).unwrap_err(),
        Error::Misaligned {
            start: 8,
            sectors: 12,
            lbs: 8
        }
    );
    assert!(matches!(
        s.split(Op::Read, u64::MAX - 7, 16),
        Err(Error::RequestOverflow { .. })
    ));
    assert_eq!(
        s.split(Op::Discard, 0, 8).unwrap_err(),
        Error::Unsupported { op: "discard" }
    );
    assert!(
        s.split_sg(Op::Read, 0, &[Segment { addr: 0, len: 100 }])
            .is_err()
    );
}

#[test]
fn segment_limits_that_fit_no_block_are_an_error() {
    let l = limits(|l| {
        l.logical_block_size = 4096;
        l.max_segments = 1;
    });
    let s = Splitter::new(&l, Mod15::Off).unwrap();
    let bufs: Vec<Segment> = (0..8)
        .map(|i| Segment {
            addr: i * 0x10000,
            len: 512,
        })
        .collect();
    let first = s.split_sg(Op::Read, 0, &bufs).unwrap().next().unwrap();
    assert_eq!(first.unwrap_err(), Error::NoProgress { sector: 0 });
}

#[test]
fn validation_errors_are_typed() {
    let v = |f: fn(&mut Limits)| limits(f).validate().unwrap_err();
    assert_eq!(
        v(|l| l.logical_block_size = 1000),
        Error::InvalidLogicalBlockSize { bytes: 1000 }
    );
    assert_eq!(
        v(|l| {
            l.logical_block_size = 4096;
            l.physical_block_size = 512;
        }),
        Error::PhysicalBelowLogical {
            physical: 512,
            logical: 4096
        }
    );
    assert_eq!(
        v(|l| l.max_hw_sectors = 7),
        Error::LimitTooSmall {
            field: "max_hw_sectors",
            value: 7,
            min: 8
        }
    );
    assert_eq!(
        v(|l| l.max_user_sectors = 4),
        Error::LimitTooSmall {
            field: "max_user_sectors",
            value: 4,
            min: 8
        }
    );
    assert_eq!(
        v(|l| l.max_segment_size = 1024),
        Error::LimitTooSmall {
            field: "max_segment_size",
            value: 1024,
            min: 4096
        }
    );
    assert_eq!(
        v(|l| l.seg_boundary_mask = 0x1_0000),
        Error::InvalidMask {
            field: "seg_boundary_mask",
            value: 0x1_0000
        }
    );
    assert_eq!(
        v(|l| {
            l.logical_block_size = 4096;
            l.chunk_sectors = 12;
        }),
        Error::NotBlockMultiple {
            field: "chunk_sectors",
            value: 12,
            lbs: 8
        }
    );
    assert_eq!(
        v(|l| {
            l.max_tags = 4;
            l.min_tags = 8;
        }),
        Error::InvalidTags { min: 8, max: 4 }
    );
}

#[test]
fn max_sectors_is_derived_as_linux_does() {
    let v = |f: fn(&mut Limits)| limits(f).validate().unwrap().max_sectors;
    assert_eq!(v(|_| {}), 8192, "4 MiB default cap");
    assert_eq!(v(|l| l.max_hw_sectors = 2560), 2560);
    assert_eq!(
        v(|l| {
            l.max_hw_sectors = 2560;
            l.max_user_sectors = 1000;
        }),
        1000
    );
    assert_eq!(
        v(|l| {
            l.max_hw_sectors = 2560;
            l.max_user_sectors = 9000;
        }),
        2560,
        "user value clamped"
    );
    assert_eq!(
        v(|l| {
            l.max_hw_sectors = 65535;
            l.io_opt = 16 << 20;
        }),
        32768,
        "io_opt above the cap raises it"
    );
    assert_eq!(
        v(|l| {
            l.logical_block_size = 4096;
            l.max_hw_sectors = 2047;
        }),
        2040,
        "rounded to the logical block"
    );
    assert_eq!(v(|l| l.max_user_sectors = 1001), 1000, "KiB granular");
}

#[test]
fn stacking_takes_max_min_lcm_gcd_and_reports_misalignment() {
    let a = limits(|l| {
        l.physical_block_size = 4096;
        l.max_hw_sectors = 2560;
        l.max_segments = 128;
        l.chunk_sectors = 96;
        l.io_opt = 12288;
        l.max_discard_sectors = 4096;
    });
    let b = limits(|l| {
        l.logical_block_size = 4096;
        l.max_hw_sectors = 1024;
        l.chunk_sectors = 128;
    });
    let shape = StripeShape {
        interleave_sectors: 256,
        data_members: 2,
        data_offset_sectors: 0,
    };
    let s = Limits::stack(&[a.clone(), b], &shape).unwrap();
    assert_eq!(s.limits.logical_block_size, 4096);
    assert_eq!(s.limits.physical_block_size, 4096);
    assert_eq!(s.limits.max_hw_sectors, 1024);
    assert_eq!(s.limits.max_segments, 128);
    assert_eq!(s.limits.chunk_sectors, 32, "gcd(256, 96, 128)");
    assert_eq!(s.limits.io_opt, 786_432, "lcm(12288, 256*512*2)");
    assert_eq!(s.limits.max_discard_sectors, 0, "b cannot discard");
    assert!(s.misaligned.is_empty(), "{:?}", s.misaligned);

    let shifted = StripeShape {
        interleave_sectors: 1,
        data_members: 2,
        data_offset_sectors: 16 + 3,
    };
    let s = Limits::stack(&[a], &shifted).unwrap();
    assert!(
        s.misaligned
            .iter()
            .any(|m| matches!(m, Misalignment::DataOffset { component: 0, .. }))
    );
    assert!(
        s.misaligned
            .iter()
            .any(|m| matches!(m, Misalignment::Interleave { component: 0, .. }))
    );
    assert_eq!(Limits::stack(&[], &shape).unwrap_err(), Error::NoMembers);
}

/// `whole` on 4 KiB physical blocks with a cap that is not a whole number of them (13
/// sectors): Linux ends a piece on a physical block, so 12 sectors from a block's start go
/// as 8 and 4, and 8 go whole; from a block's middle, the first boundary within the cap.
#[test]
fn whole_respects_the_physical_block_end() {
    let mut l = Limits::default();
    l.physical_block_size = 4096;
    l.max_hw_sectors = 13;
    let s = Splitter::new(&l, Mod15::Off).expect("limits");
    assert!(s.whole(Op::Write, 0, 8).expect("write"));
    assert!(!s.whole(Op::Write, 0, 12).expect("write"));
    assert_eq!(
        s.split(Op::Write, 0, 12)
            .expect("split")
            .map(|p| p.sectors)
            .collect::<Vec<_>>(),
        [8, 4]
    );
    assert!(
        s.whole(Op::Read, 3, 13).expect("read"),
        "3 + 13 ends on a boundary"
    );
    assert!(s.whole(Op::Read, 5, 11).expect("read"), "5 + 11 too");
    assert!(
        !s.whole(Op::Read, 5, 12).expect("read"),
        "the cap from 5 is 11"
    );
    assert!(
        !s.whole(Op::Read, 3, 0).expect("read"),
        "nothing is no piece"
    );
}
