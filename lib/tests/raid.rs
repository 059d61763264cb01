//! md's raid5, raid6 and raid10 served by `Raid` over memory members, against a byte model:
//! random writes (small ones by read-modify-write or reconstruct-write, full stripes with
//! no read), then every one-member failure (and for raid6 every two-member failure) read
//! back whole; writes while degraded; a member rebuilt onto a new device, after which every
//! member holds byte for byte what a healthy array written with the same data holds.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe::striping::md::{Parity, ParityLayout, Raid10, Raid10Layout, gf};
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MemDevice, Raid};

const CHUNK: u64 = 16;
const MEMBER: u64 = CHUNK * 24;

/// A deterministic stream of numbers (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Debug)]
enum Kind {
    Parity(u8, ParityLayout),
    Raid10(Raid10Layout),
}

fn members(n: usize) -> Vec<Arc<MemDevice>> {
    (0..n)
        .map(|i| Arc::new(MemDevice::new(&format!("m{i}"), MEMBER)))
        .collect()
}

fn erased(m: &[Arc<MemDevice>]) -> Vec<Arc<dyn DynBlockDevice>> {
    m.iter()
        .map(|d| Arc::clone(d) as Arc<dyn DynBlockDevice>)
        .collect()
}

fn array(kind: &Kind, disks: usize, m: Vec<Arc<dyn DynBlockDevice>>) -> Raid {
    match kind {
        Kind::Parity(level, layout) => Raid::parity(
            "md",
            Parity::new(*level, *layout, disks, CHUNK, MEMBER).unwrap(),
            m,
        )
        .unwrap(),
        Kind::Raid10(layout) => {
            Raid::raid10("md", Raid10::new(*layout, disks, CHUNK, MEMBER).unwrap(), m).unwrap()
        }
    }
}

/// Random writes over `a`, mirrored into `model`: small ones anywhere, and whole stripes.
async fn workload(a: &Raid, model: &mut [u8], rng: &mut Rng, writes: usize, stripe: u64) {
    let total = a.info().sectors;
    for _ in 0..writes {
        let (start, count) = if rng.below(4) == 0 {
            let s = rng.below(total / stripe) * stripe;
            (s, stripe.min(total - s))
        } else {
            let s = rng.below(total);
            (s, (1 + rng.below(3 * CHUNK)).min(total - s))
        };
        let fill = (rng.next() & 0xff) as u8;
        let data: Vec<u8> = (0..count * 512)
            .map(|i| fill ^ (i as u8).wrapping_mul(31))
            .collect();
        a.write(start, Bytes::from(data.clone()), IoOpts::new())
            .await
            .unwrap();
        model[(start * 512) as usize..((start + count) * 512) as usize].copy_from_slice(&data);
    }
}

/// Every byte of `a` against `model`, in reads of varying size.
async fn verify(a: &Raid, model: &[u8], what: &str) {
    let total = a.info().sectors;
    let mut at = 0;
    let mut step = 1;
    while at < total {
        let n = step.min(total - at);
        let got = a.read(at, n, IoOpts::new()).await.unwrap();
        assert!(
            got[..] == model[(at * 512) as usize..((at + n) * 512) as usize],
            "{what}: sectors {at}+{n} differ"
        );
        at += n;
        step = step % 37 + 5;
    }
}

fn kinds() -> Vec<(Kind, usize)> {
    use ParityLayout::*;
    let mut v = Vec::new();
    for layout in [
        LeftSymmetric,
        LeftAsymmetric,
        RightSymmetric,
        RightAsymmetric,
        ParityFirst,
        ParityLast,
    ] {
        v.push((Kind::Parity(5, layout), 4));
    }
    v.push((Kind::Parity(5, LeftSymmetric), 3));
    for layout in [
        LeftSymmetric,
        LeftAsymmetric,
        RightSymmetric,
        ParityFirst,
        ParityLast,
        LeftSymmetric6,
        RightAsymmetric6,
        ParityFirst6,
    ] {
        v.push((Kind::Parity(6, layout), 5));
    }
    v.push((Kind::Parity(6, LeftAsymmetric), 6));
    for l in ["n2", "f2", "o2"] {
        v.push((Kind::Raid10(l.parse().unwrap()), 4));
    }
    v.push((Kind::Raid10("n2".parse().unwrap()), 3));
    v.push((Kind::Raid10("f3".parse().unwrap()), 5));
    v
}

fn redundancy(kind: &Kind) -> usize {
    match kind {
        Kind::Parity(level, _) => usize::from(level - 4),
        Kind::Raid10(_) => 1,
    }
}

fn stripe_sectors(kind: &Kind, disks: usize) -> u64 {
    match kind {
        Kind::Parity(level, _) => CHUNK * (disks - usize::from(level - 4)) as u64,
        Kind::Raid10(_) => CHUNK,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_reads_return_every_byte_for_every_failure() {
    for (kind, disks) in kinds() {
        let m = members(disks);
        let a = array(&kind, disks, erased(&m));
        let mut model = vec![0u8; (a.info().sectors * 512) as usize];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ disks as u64);
        workload(&a, &mut model, &mut rng, 60, stripe_sectors(&kind, disks)).await;
        verify(&a, &model, &format!("{kind:?} healthy")).await;
        // Every single failure, and every pair where the array survives two.
        let mut sets: Vec<Vec<usize>> = (0..disks).map(|i| vec![i]).collect();
        if redundancy(&kind) >= 2 {
            for i in 0..disks {
                for j in i + 1..disks {
                    sets.push(vec![i, j]);
                }
            }
        }
        for set in sets {
            let d = array(&kind, disks, erased(&m));
            for &f in &set {
                d.fail(f);
            }
            verify(&d, &model, &format!("{kind:?} without {set:?}")).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_writes_then_a_rebuild_make_the_member_whole() {
    for (kind, disks) in kinds() {
        let m = members(disks);
        let a = array(&kind, disks, erased(&m));
        let mut model = vec![0u8; (a.info().sectors * 512) as usize];
        let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ disks as u64);
        let stripe = stripe_sectors(&kind, disks);
        workload(&a, &mut model, &mut rng, 30, stripe).await;
        let dead = (rng.below(disks as u64)) as usize;
        a.fail(dead);
        workload(&a, &mut model, &mut rng, 30, stripe).await;
        verify(&a, &model, &format!("{kind:?} degraded, without {dead}")).await;
        let new = Arc::new(MemDevice::new("new", MEMBER));
        a.rebuild(dead, Arc::clone(&new) as Arc<dyn DynBlockDevice>)
            .await
            .unwrap();
        assert!(a.failed().is_empty(), "{kind:?}");
        verify(&a, &model, &format!("{kind:?} rebuilt")).await;
        // Every member as a healthy array written with the same data has it.
        let fresh = members(disks);
        let f = array(&kind, disks, erased(&fresh));
        f.write(0, Bytes::from(model.clone()), IoOpts::new())
            .await
            .unwrap();
        let used = match &kind {
            Kind::Parity(level, layout) => Parity::new(*level, *layout, disks, CHUNK, MEMBER)
                .unwrap()
                .member_sectors(),
            Kind::Raid10(l) => Raid10::new(*l, disks, CHUNK, MEMBER)
                .unwrap()
                .member_sectors(),
        };
        for i in 0..disks {
            let got: Arc<dyn DynBlockDevice> = if i == dead {
                Arc::clone(&new) as _
            } else {
                Arc::clone(&m[i]) as _
            };
            let want = fresh[i].read(0, used, IoOpts::new()).await.unwrap();
            let have = got.read(0, used, IoOpts::new()).await.unwrap();
            assert!(
                want == have,
                "{kind:?}: member {i} differs after the rebuild of {dead}"
            );
        }
        // And the rebuilt member serves a degraded read of the others' loss.
        let other = (dead + 1) % disks;
        let mut now = erased(&m);
        now[dead] = new;
        let d = array(&kind, disks, now);
        d.fail(other);
        verify(
            &d,
            &model,
            &format!("{kind:?} rebuilt {dead}, then without {other}"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_makes_parity_agree_after_a_torn_stripe() {
    let disks = 4;
    let m = members(disks);
    let geo = Parity::new(5, ParityLayout::LeftSymmetric, disks, CHUNK, MEMBER).unwrap();
    let a = Raid::parity("md", geo.clone(), erased(&m)).unwrap();
    let total = a.info().sectors;
    let model: Vec<u8> = (0..total * 512).map(|i| (i % 251) as u8).collect();
    a.write(0, Bytes::from(model.clone()), IoOpts::new())
        .await
        .unwrap();
    // A crash between data and parity: stripe 2's first data chunk written, its parity not.
    let p = geo.locate(2 * 3 * CHUNK).unwrap();
    let torn = vec![0xeeu8; (CHUNK * 512) as usize];
    m[p.comp]
        .write(p.cblk, Bytes::from(torn.clone()), IoOpts::new())
        .await
        .unwrap();
    let mut model = model;
    let at = (p.lblk * 512) as usize;
    model[at..at + torn.len()].copy_from_slice(&torn);
    // Degraded now, another member of that stripe would be rebuilt wrong: resync first.
    a.resync_parity().await.unwrap();
    let other = (p.comp + 1) % disks;
    let other = if other == p.p_comp {
        (other + 1) % disks
    } else {
        other
    };
    let d = Raid::parity("md", geo, erased(&m)).unwrap();
    d.fail(other);
    verify(&d, &model, "after resync, degraded").await;
}

#[tokio::test]
async fn too_many_failures_are_refused_not_guessed() {
    let m = members(4);
    let geo = Parity::new(5, ParityLayout::LeftSymmetric, 4, CHUNK, MEMBER).unwrap();
    let a = Raid::parity("md", geo, erased(&m)).unwrap();
    a.write(0, Bytes::from(vec![1u8; 512 * 96]), IoOpts::new())
        .await
        .unwrap();
    a.fail(0);
    a.fail(1);
    assert!(a.read(0, 96, IoOpts::new()).await.is_err());
    assert!(
        a.write(0, Bytes::from(vec![2u8; 512]), IoOpts::new())
            .await
            .is_err()
    );
    // Wrong member counts and sizes are refused when the array is built.
    let geo = Parity::new(5, ParityLayout::LeftSymmetric, 4, CHUNK, MEMBER).unwrap();
    assert!(Raid::parity("md", geo.clone(), erased(&m[..3])).is_err());
    let small: Vec<Arc<dyn DynBlockDevice>> = (0..4)
        .map(|i| Arc::new(MemDevice::new(&format!("s{i}"), CHUNK)) as _)
        .collect();
    assert!(Raid::parity("md", geo, small).is_err());
}

#[test]
fn q_is_md_syndrome() {
    // Two data blocks at coefficients 0 and 1: Q = D0 + 2·D1 (Anvin, "The mathematics of
    // RAID-6", section 2).
    let (d0, d1) = ([0x01u8, 0x80], [0x01u8, 0x80]);
    let mut q = [0u8; 2];
    gf::mul_acc(&mut q, gf::pow2(0), &d0);
    gf::mul_acc(&mut q, gf::pow2(1), &d1);
    assert_eq!(q, [0x03, 0x80 ^ 0x1d]);
}

/// An md raid6 laid out by hand from the superblock format (version 1.2 at sector 8, data
/// offsets of 2048 and 4096 sectors, members in a shuffled order): assembled from the
/// superblocks alone, it reads back what was written; a member whose event count is behind
/// is left out as stale, a missing one is served around, two too many are refused, and a
/// member of another array is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md_members_laid_out_by_hand_assemble() {
    use tagstripe::striping::md::Superblock1;
    let (disks, chunk, size) = (5usize, 64u64, 4096u64);
    let geo = Parity::new(6, ParityLayout::LeftSymmetric, disks, chunk, size).unwrap();
    let offsets: Vec<u64> = (0..disks)
        .map(|i| if i % 2 == 0 { 2048 } else { 4096 })
        .collect();
    let devs: Vec<Arc<MemDevice>> = (0..disks)
        .map(|i| Arc::new(MemDevice::new(&format!("sd{i}"), offsets[i] + size)))
        .collect();
    let superblock = |role: usize, events: u64| Superblock1 {
        feature_map: 0,
        set_uuid: [0x5a; 16],
        set_name: "lab:md6".into(),
        level: 6,
        layout: ParityLayout::LeftSymmetric.md_algorithm(),
        size,
        chunk: chunk as u32,
        raid_disks: disks as u32,
        data_offset: offsets[role],
        data_size: size,
        super_offset: 8,
        dev_number: role as u32,
        events,
        dev_roles: (0..disks as u16).collect(),
    };
    for (i, d) in devs.iter().enumerate() {
        d.write(8, Bytes::from(superblock(i, 10).encode()), IoOpts::new())
            .await
            .unwrap();
    }
    let a = Raid::parity("md6", geo, erased(&devs))
        .unwrap()
        .with_data_offsets(offsets.clone())
        .unwrap();
    let mut model = vec![0u8; (a.info().sectors * 512) as usize];
    let mut rng = Rng(77);
    workload(&a, &mut model, &mut rng, 40, chunk * 3).await;
    let shuffled = |order: &[usize]| -> Vec<Arc<dyn DynBlockDevice>> {
        order.iter().map(|&i| Arc::clone(&devs[i]) as _).collect()
    };
    let md = Raid::assemble_md("md6", shuffled(&[3, 0, 4, 1, 2]))
        .await
        .unwrap();
    assert!(md.failed().is_empty());
    verify(&md, &model, "assembled").await;
    // Member 2 missed an update: behind on events, it is stale and not read.
    for i in [0, 1, 3, 4] {
        devs[i]
            .write(8, Bytes::from(superblock(i, 11).encode()), IoOpts::new())
            .await
            .unwrap();
    }
    devs[2]
        .write(
            offsets[2],
            Bytes::from(vec![0xffu8; 512 * 64]),
            IoOpts::new(),
        )
        .await
        .unwrap();
    let md = Raid::assemble_md("md6", shuffled(&[0, 1, 2, 3, 4]))
        .await
        .unwrap();
    assert_eq!(md.failed(), [2]);
    verify(&md, &model, "member 2 stale").await;
    // Member 4 missing as well: raid6 serves without two.
    let md = Raid::assemble_md("md6", shuffled(&[0, 1, 2, 3]))
        .await
        .unwrap();
    assert_eq!(md.failed(), [2, 4]);
    verify(&md, &model, "2 stale, 4 missing").await;
    // Three gone is one too many.
    let e = Raid::assemble_md("md6", shuffled(&[0, 1, 2]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("redundancy"), "{e}");
    // A member of another array is named.
    let other = Arc::new(MemDevice::new("other", 2048 + size));
    let mut sb = superblock(4, 11);
    sb.set_uuid = [1; 16];
    other
        .write(8, Bytes::from(sb.encode()), IoOpts::new())
        .await
        .unwrap();
    let mut with_other = shuffled(&[0, 1, 3]);
    with_other.push(other);
    let e = Raid::assemble_md("md6", with_other).await.unwrap_err();
    assert!(e.to_string().contains("another array"), "{e}");
    // A device with no superblock says where it looked.
    let blank: Vec<Arc<dyn DynBlockDevice>> = vec![Arc::new(MemDevice::new("blank", 8192))];
    let e = Raid::assemble_md("x", blank).await.unwrap_err().to_string();
    assert!(e.contains("1.2 at sector 8") && e.contains("magic"), "{e}");
}
