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

/// A FreeBSD mirror with metadata over two sides, in this order.
fn mirror_of(x: Arc<dyn BlockDevice>, y: Arc<dyn BlockDevice>) -> tagstripe::VolumeBuilder {
    Volume::builder([x, y])
        .flavor(Flavor::FreeBsd)
        .no_offset(true)
        .mirror(true)
        .interleave(16)
        .metadata(true)
}

fn mirror(a: &Arc<FaultDevice<MemDevice>>, b: &Arc<MemDevice>) -> tagstripe::VolumeBuilder {
    mirror_of(a.clone(), b.clone())
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
        let swapped = mirror_of(b.clone(), a.clone()).open().await.unwrap_err();
        assert!(swapped.to_string().contains("another order"), "{swapped}");
        // From another volume.
        let c = Arc::new(FaultDevice::new(MemDevice::new("c", SECTORS)));
        let d = Arc::new(MemDevice::new("d", SECTORS));
        drop(mirror(&c, &d).open().await.unwrap());
        let mixed = mirror_of(a.clone(), d.clone()).open().await.unwrap_err();
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

/// Every sector not marked unknown reads back as the model says.
async fn check(v: &Volume, model: &[u8], unknown: &[bool]) {
    let total = v.info().sectors;
    let all = v.read(0, total, IoOpts::new()).await.unwrap();
    for sec in 0..total as usize {
        if !unknown[sec] {
            assert!(
                all[sec * 512..sec * 512 + 512] == model[sec * 512..sec * 512 + 512],
                "sector {sec} lost"
            );
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Write(u64, u64, u8),
    /// Side `n` fails every write from now on.
    Fail(usize),
    /// Side `n` works again (a dropped side stays dropped: there is no resync yet).
    Heal(usize),
    /// The volume is dropped and opened again on the same components.
    Restart,
}

fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    let step = prop_oneof![
        5 => (any::<u64>(), 1u64..64, any::<u8>()).prop_map(|(s, n, b)| Step::Write(s, n, b)),
        1 => (0usize..2).prop_map(Step::Fail),
        1 => (0usize..2).prop_map(Step::Heal),
        1 => Just(Step::Restart),
    ];
    proptest::collection::vec(step, 1..40)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]
    /// Any sequence of side failures, heals, writes and restarts: every acknowledged write
    /// reads back, after every restart and at the end; a side never comes back by itself.
    #[test]
    fn acknowledged_writes_survive_failures_and_restarts(steps in steps()) {
        rt().block_on(async move {
            let sides = [
                Arc::new(FaultDevice::new(MemDevice::new("a", 1024))),
                Arc::new(FaultDevice::new(MemDevice::new("b", 1024))),
            ];
            let open = || async {
                mirror_of(sides[0].clone(), sides[1].clone())
                    .open()
                    .await
            };
            let mut v = open().await.unwrap();
            let total = v.info().sectors;
            let mut model = vec![0u8; total as usize * 512];
            let mut unknown = vec![false; total as usize];
            let mut failing = [false; 2];
            for step in steps {
                match step {
                    Step::Write(s, n, seed) => {
                        let s = s % total;
                        let n = n.min(total - s);
                        let data = vec![seed; n as usize * 512];
                        let range = s as usize..(s + n) as usize;
                        match v.write(s, Bytes::from(data.clone()), IoOpts::new()).await {
                            Ok(()) => {
                                model[range.start * 512..range.end * 512].copy_from_slice(&data);
                                unknown[range].fill(false);
                            }
                            Err(_) => unknown[range].fill(true),
                        }
                    }
                    Step::Fail(i) => {
                        sides[i].inject(Fault::always(FaultOp::Write, FaultKind::Error));
                        failing[i] = true;
                    }
                    Step::Heal(i) => {
                        sides[i].clear();
                        failing[i] = false;
                    }
                    Step::Restart => {
                        let degraded = v.degraded();
                        drop(v);
                        // It opens unless no side can take the metadata.
                        v = match open().await {
                            Ok(v) => v,
                            Err(e) => {
                                let writable = (0..2).any(|i| !failing[i] && !degraded.contains(&i));
                                assert!(!writable, "did not open with a writable side: {e}");
                                for (i, s) in sides.iter().enumerate() {
                                    s.clear();
                                    failing[i] = false;
                                }
                                open().await.unwrap()
                            }
                        };
                        for d in degraded {
                            assert!(v.degraded().contains(&d), "side {d} came back by itself");
                        }
                        check(&v, &model, &unknown).await;
                    }
                }
            }
            for s in &sides {
                s.clear();
            }
            check(&v, &model, &unknown).await;
            drop(v);
            let v = open().await.unwrap();
            check(&v, &model, &unknown).await;
        });
    }
}
