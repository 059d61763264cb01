//! Volume metadata across restarts: a mirror side dropped for a failed write is known stale
//! after the volume is opened again (the scenario: write A, side 0 fails, write B,
//! restart: everything reads B, never A); components swapped, from another volume or of
//! another geometry are refused by name; a torn copy falls back to the other slot.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe::striping::Flavor;
use tagstripe::{
    BlockDevice, Error, Fault, FaultDevice, FaultKind, FaultOp, IoOpts, MemDevice, Volume,
};

mod common;
use common::rt;

const SECTORS: u64 = 8192;

fn mirror(a: &Arc<FaultDevice<MemDevice>>, b: &Arc<MemDevice>) -> tagstripe::VolumeBuilder {
    Volume::builder([a.clone() as Arc<dyn BlockDevice>, b.clone()])
        .flavor(Flavor::FreeBsd)
        .no_offset(true)
        .mirror(true)
        .interleave(16)
        .metadata(true)
}

#[test]
fn a_dropped_side_stays_stale_across_a_restart() {
    rt().block_on(async {
        let a = Arc::new(FaultDevice::new(MemDevice::new("side0", SECTORS)));
        let b = Arc::new(MemDevice::new("side1", SECTORS));
        let v = mirror(&a, &b).open().await.unwrap();
        let size = v.info().sectors;
        assert_eq!(size, SECTORS - 16, "the metadata takes the last 16 sectors");
        v.write(
            0,
            Bytes::from(vec![0xAA; size as usize * 512]),
            IoOpts::new(),
        )
        .await
        .unwrap();
        a.inject(Fault::always(FaultOp::Write, FaultKind::Error));
        v.write(
            0,
            Bytes::from(vec![0xBB; size as usize * 512]),
            IoOpts::new(),
        )
        .await
        .unwrap();
        assert_eq!(v.degraded(), [0]);
        drop(v);
        // The fault is gone; side 0 still holds A.
        a.clear();
        let v = mirror(&a, &b).open().await.unwrap();
        assert_eq!(
            v.degraded(),
            [0],
            "the stale side is known after the restart"
        );
        let all = v.read(0, size, IoOpts::new()).await.unwrap();
        let stale = all.chunks(512).filter(|s| s[0] == 0xAA).count();
        assert_eq!(stale, 0, "{stale} sectors read back as the old data");
        assert!(all.iter().all(|&x| x == 0xBB));
        // And again: the state is durable, not a one-off.
        drop(v);
        let v = mirror(&a, &b).open().await.unwrap();
        assert_eq!(v.degraded(), [0]);
    });
}

#[test]
fn components_that_do_not_belong_are_refused_by_name() {
    rt().block_on(async {
        let a = Arc::new(FaultDevice::new(MemDevice::new("a", SECTORS)));
        let b = Arc::new(MemDevice::new("b", SECTORS));
        drop(mirror(&a, &b).open().await.unwrap());
        // Swapped.
        let swapped = Volume::builder([b.clone() as Arc<dyn BlockDevice>, a.clone()])
            .flavor(Flavor::FreeBsd)
            .no_offset(true)
            .mirror(true)
            .interleave(16)
            .metadata(true)
            .open()
            .await
            .unwrap_err();
        assert!(swapped.to_string().contains("another order"), "{swapped}");
        // From another volume.
        let c = Arc::new(FaultDevice::new(MemDevice::new("c", SECTORS)));
        let d = Arc::new(MemDevice::new("d", SECTORS));
        drop(mirror(&c, &d).open().await.unwrap());
        let mixed = Volume::builder([a.clone() as Arc<dyn BlockDevice>, d.clone()])
            .flavor(Flavor::FreeBsd)
            .no_offset(true)
            .mirror(true)
            .interleave(16)
            .metadata(true)
            .open()
            .await
            .unwrap_err();
        assert!(
            matches!(&mixed, Error::Metadata(_))
                && mixed
                    .to_string()
                    .contains("component 1 belongs to another volume"),
            "{mixed}"
        );
        // Another geometry.
        let other = mirror(&a, &b).interleave(32).open().await.unwrap_err();
        assert!(other.to_string().contains("another geometry"), "{other}");
        // And the right order still opens.
        mirror(&a, &b).open().await.unwrap();
        // `build` refuses a volume with metadata (it must be read first).
        assert!(mirror(&a, &b).build().is_err());
    });
}

#[test]
fn a_torn_copy_falls_back_and_a_blank_stripe_member_is_refused() {
    rt().block_on(async {
        let a = Arc::new(FaultDevice::new(MemDevice::new("a", SECTORS)));
        let b = Arc::new(MemDevice::new("b", SECTORS));
        let v = mirror(&a, &b).open().await.unwrap();
        a.inject(Fault::always(FaultOp::Write, FaultKind::Error));
        v.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new())
            .await
            .unwrap();
        drop(v);
        a.clear();
        // Tear side 1's newest copy (event 2, in slot 0): as if the update that recorded
        // side 0's drop never finished. Then the write that dropped it was never
        // acknowledged (the update comes first), so the older copy (event 1, both in sync)
        // is the truth for everything acknowledged: it opens, from that copy, no error.
        let meta = SECTORS - 16;
        b.write(meta, Bytes::from(vec![0x5a; 4096]), IoOpts::new())
            .await
            .unwrap();
        let v = mirror(&a, &b).open().await.unwrap();
        assert_eq!(v.degraded(), Vec::<usize>::new());
        drop(v);
        // A striped volume whose member was replaced by a blank device: refused.
        let s0 = Arc::new(MemDevice::new("s0", SECTORS));
        let s1 = Arc::new(MemDevice::new("s1", SECTORS));
        let stripe = |x: &Arc<MemDevice>, y: &Arc<MemDevice>| {
            Volume::builder([x.clone() as Arc<dyn BlockDevice>, y.clone()])
                .interleave(16)
                .metadata(true)
        };
        drop(stripe(&s0, &s1).open().await.unwrap());
        let blank = Arc::new(MemDevice::new("new", SECTORS));
        let e = stripe(&s0, &blank).open().await.unwrap_err();
        assert!(e.to_string().contains("stale"), "{e}");
    });
}
