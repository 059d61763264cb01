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
        put(a, model, start, count, (rng.next() & 0xff) as u8).await;
    }
}

/// Writes `count` sectors at `start` of a pattern from `fill` to `a` and to `model`.
async fn put(a: &Raid, model: &mut [u8], start: u64, count: u64, fill: u8) {
    let data: Vec<u8> = (0..count * 512)
        .map(|i| fill ^ (i as u8).wrapping_mul(31))
        .collect();
    a.write(start, Bytes::from(data.clone()), IoOpts::new())
        .await
        .unwrap();
    model[(start * 512) as usize..((start + count) * 512) as usize].copy_from_slice(&data);
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
        resync_offset: u64::MAX,
        recovery_offset: 0,
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
    // Member 2 failed: the others record it faulty (and move on an event); it is stale and
    // not read, though its own superblock still claims the role.
    for i in [0, 1, 3, 4] {
        let mut sb = superblock(i, 11);
        sb.dev_roles[2] = tagstripe::striping::md::ROLE_FAULTY; // as md records a failure
        devs[i]
            .write(8, Bytes::from(sb.encode()), IoOpts::new())
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
    sb.dev_roles[2] = tagstripe::striping::md::ROLE_FAULTY;
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

/// A member device for power cuts: writes reach it until a shared budget of writes is
/// spent, after which they are lost (acknowledged, never on the medium), as at a power cut.
#[derive(Debug)]
struct Cut {
    inner: Arc<MemDevice>,
    budget: Arc<std::sync::atomic::AtomicI64>,
}

impl BlockDevice for Cut {
    fn info(&self) -> &tagstripe::DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        self.inner.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        if self
            .budget
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            > 0
        {
            self.inner.write(start, data, opts).await
        } else {
            Ok(())
        }
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.discard(start, sectors, opts).await
    }
}

/// Four raid5 members laid out by hand as mdadm would (64-sector chunks, 2,048 sectors of
/// data each after a 2,048-sector data offset, a version-1.2 superblock at sector 8), clean.
async fn md5_members(set_name: &str, uuid: u8) -> Vec<Arc<MemDevice>> {
    use tagstripe::striping::md::Superblock1;
    let (disks, chunk, size, offset) = (4usize, 64u64, 2048u64, 2048u64);
    let mems: Vec<Arc<MemDevice>> = (0..disks)
        .map(|i| Arc::new(MemDevice::new(&format!("sd{i}"), offset + size)))
        .collect();
    for (i, d) in mems.iter().enumerate() {
        let sb = Superblock1 {
            feature_map: 0,
            set_uuid: [uuid; 16],
            set_name: set_name.into(),
            level: 5,
            layout: ParityLayout::LeftSymmetric.md_algorithm(),
            size,
            chunk: chunk as u32,
            raid_disks: disks as u32,
            data_offset: offset,
            data_size: size,
            super_offset: 8,
            dev_number: i as u32,
            events: 1,
            resync_offset: u64::MAX,
            recovery_offset: 0,
            dev_roles: (0..disks as u16).collect(),
        };
        d.write(8, Bytes::from(sb.encode()), IoOpts::new())
            .await
            .unwrap();
    }
    mems
}

/// No write hole: an md raid5 whose members are cut off after every possible number of
/// member writes of a small (read-modify-write) write, superblocks included, then assembled
/// again (a dirty array is resynced first, as md does without a bitmap) and read with each
/// other member of the stripe failed, returns every chunk it held before, and the written
/// chunk either all old or all new: never a parity that silently disagrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_at_every_point_leaves_no_write_hole() {
    let (disks, chunk, size, offset) = (4usize, 64u64, 2048u64, 2048u64);
    let base = md5_members("lab:cut", 9).await;
    // Old contents A, written and stopped cleanly.
    let a = Raid::assemble_md("cut", erased(&base)).await.unwrap();
    let old: Vec<u8> = (0..a.info().sectors * 512)
        .map(|i| (i * 7 % 253) as u8)
        .collect();
    a.write(0, Bytes::from(old.clone()), IoOpts::new())
        .await
        .unwrap();
    a.close().await.unwrap();
    drop(a);
    let snapshot = |devs: &[Arc<MemDevice>]| {
        let devs = devs.to_vec();
        async move {
            let mut out = Vec::new();
            for (i, d) in devs.iter().enumerate() {
                let copy = Arc::new(MemDevice::new(&format!("sd{i}"), offset + size));
                let all = d.read(0, offset + size, IoOpts::new()).await.unwrap();
                copy.write(0, all, IoOpts::new()).await.unwrap();
                out.push(copy);
            }
            out
        }
    };
    let geo = Parity::new(5, ParityLayout::LeftSymmetric, disks, chunk, size).unwrap();
    let target = geo.locate(3 * chunk).unwrap(); // stripe 1, its first data chunk
    let new = vec![0xc3u8; (chunk * 512) as usize];
    let mut cuts_seen = 0;
    for budget in 0..12 {
        let devs = snapshot(&base).await;
        let counter = Arc::new(std::sync::atomic::AtomicI64::new(budget));
        let cut: Vec<Arc<dyn DynBlockDevice>> = devs
            .iter()
            .map(|d| {
                Arc::new(Cut {
                    inner: Arc::clone(d),
                    budget: Arc::clone(&counter),
                }) as Arc<dyn DynBlockDevice>
            })
            .collect();
        let a = Raid::assemble_md("cut", cut).await.unwrap();
        a.write(target.lblk, Bytes::from(new.clone()), IoOpts::new())
            .await
            .unwrap();
        drop(a); // the power cut: no close
        if counter.load(std::sync::atomic::Ordering::SeqCst) < 0 {
            cuts_seen += 1;
        }
        // Assembled again: a dirty array resyncs before it serves.
        let again = Raid::assemble_md("cut", erased(&devs)).await.unwrap();
        again.close().await.unwrap();
        drop(again);
        let s = geo.stripe(target.stripe);
        for lost in (0..disks).filter(|&m| m != target.comp) {
            let d = Raid::assemble_md("cut", erased(&devs)).await.unwrap();
            d.fail(lost);
            let got = d.read(0, d.info().sectors, IoOpts::new()).await.unwrap();
            let at = (target.lblk * 512) as usize;
            let piece = &got[at..at + new.len()];
            assert!(
                piece == &old[at..at + new.len()] || piece == &new[..],
                "cut after {budget} writes, member {lost} lost: the written chunk is neither old nor new"
            );
            let mut rest = got.to_vec();
            rest[at..at + new.len()].copy_from_slice(&old[at..at + new.len()]);
            assert!(
                rest == old,
                "cut after {budget} writes, member {lost} lost (P on {}): another chunk changed",
                s.p
            );
        }
    }
    assert!(
        cuts_seen >= 5,
        "the cuts fell inside the write only {cuts_seen} times"
    );
}

/// A member that counts the reads it serves.
#[derive(Debug)]
struct Counted {
    inner: Arc<MemDevice>,
    reads: Arc<std::sync::atomic::AtomicU64>,
}

impl BlockDevice for Counted {
    fn info(&self) -> &tagstripe::DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.write(start, data, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.discard(start, sectors, opts).await
    }
}

/// A sequential writer of one chunk at a time: the first write to each stripe reads the
/// rest of the row, the next ones read nothing (the stripe is cached, written through),
/// and every member ends byte for byte as a healthy array written at once would hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_chunk_writes_read_once_a_stripe_and_stay_exact() {
    for (kind, disks) in [
        (Kind::Parity(5, ParityLayout::LeftSymmetric), 4),
        (Kind::Parity(6, ParityLayout::LeftAsymmetric), 6),
    ] {
        let m = members(disks);
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted: Vec<Arc<dyn DynBlockDevice>> = m
            .iter()
            .map(|d| {
                Arc::new(Counted {
                    inner: Arc::clone(d),
                    reads: Arc::clone(&reads),
                }) as _
            })
            .collect();
        let a = array(&kind, disks, counted);
        let total = a.info().sectors;
        let mut model = vec![0u8; (total * 512) as usize];
        let data_disks = (stripe_sectors(&kind, disks) / CHUNK) as usize;
        let mut at = 0;
        let mut reads_per_stripe = Vec::new();
        while at < total {
            let before = reads.load(std::sync::atomic::Ordering::SeqCst);
            for k in 0..data_disks as u64 {
                let data: Vec<u8> = (0..CHUNK * 512).map(|i| (at + k + i) as u8).collect();
                let s = at + k * CHUNK;
                a.write(s, Bytes::from(data.clone()), IoOpts::new())
                    .await
                    .unwrap();
                model[(s * 512) as usize..((s + CHUNK) * 512) as usize].copy_from_slice(&data);
            }
            reads_per_stripe.push(reads.load(std::sync::atomic::Ordering::SeqCst) - before);
            at += CHUNK * data_disks as u64;
        }
        // The first chunk's write reads the row's other data chunks; the rest none.
        assert!(
            reads_per_stripe
                .iter()
                .all(|&r| r == (data_disks - 1) as u64),
            "{kind:?}: member reads per stripe {reads_per_stripe:?}"
        );
        verify(&a, &model, &format!("{kind:?} sequential")).await;
        let fresh = members(disks);
        let f = array(&kind, disks, erased(&fresh));
        f.write(0, Bytes::from(model.clone()), IoOpts::new())
            .await
            .unwrap();
        for i in 0..disks {
            let want = fresh[i].read(0, MEMBER, IoOpts::new()).await.unwrap();
            let have = m[i].read(0, MEMBER, IoOpts::new()).await.unwrap();
            assert!(want == have, "{kind:?}: member {i} differs");
        }
    }
}

/// Behind tagged queues (as `serve` runs md arrays) the array is the same: a degraded
/// write, then a rebuild in the idle class while a client writes (to stripes already
/// rebuilt, which must reach the new member too, and to those not yet), leave every byte
/// right; the rebuild's progress is gone after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_tagged_queues_a_rebuild_runs_beside_clients() {
    let kind = Kind::Parity(6, ParityLayout::LeftSymmetric);
    let disks = 5;
    let m = members(disks);
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    let a = Arc::new(
        array(&kind, disks, erased(&m))
            .with_queues(Default::default())
            .on_event(move |e| seen.lock().unwrap().push(e.clone())),
    );
    let mut model = vec![0u8; (a.info().sectors * 512) as usize];
    let mut rng = Rng(4242);
    workload(&a, &mut model, &mut rng, 40, stripe_sectors(&kind, disks)).await;
    a.fail(3);
    workload(&a, &mut model, &mut rng, 20, stripe_sectors(&kind, disks)).await;
    let new = Arc::new(MemDevice::new("new", MEMBER));
    let rebuild = {
        let a = Arc::clone(&a);
        let new = Arc::clone(&new) as Arc<dyn DynBlockDevice>;
        tokio::spawn(async move { a.rebuild(3, new).await })
    };
    // A client writes while the rebuild runs (the stripe locks keep them apart).
    for _ in 0..20 {
        workload(&a, &mut model, &mut rng, 1, stripe_sectors(&kind, disks)).await;
        tokio::task::yield_now().await;
    }
    rebuild.await.unwrap().unwrap();
    assert!(a.rebuild_progress().is_none());
    {
        use tagstripe::MirrorEvent as E;
        let ev = events.lock().unwrap();
        assert!(matches!(ev[0], E::Dropped { component: 3, .. }), "{ev:?}");
        assert!(
            ev.iter().any(|e| matches!(e, E::ResyncStarted { components, whole: true, .. } if components == &[3])),
            "{ev:?}"
        );
        assert!(
            matches!(ev.last(), Some(E::ResyncComplete { components, .. }) if components == &[3]),
            "{ev:?}"
        );
    }
    assert!(a.failed().is_empty());
    verify(&a, &model, "queued, rebuilt").await;
    // The rebuilt member holds what it should: lose two others and read everything.
    let mut now = erased(&m);
    now[3] = new;
    let d = array(&kind, disks, now);
    d.fail(0);
    d.fail(1);
    verify(&d, &model, "rebuilt member serving with two lost").await;
}

/// A replacement member whose writes stall for good once a budget is spent: a rebuild onto
/// it stops part way (and the test drops it there, as a stop would).
#[derive(Debug)]
struct Stall {
    inner: Arc<MemDevice>,
    budget: std::sync::atomic::AtomicI64,
    stalled: tokio::sync::Notify,
}

impl BlockDevice for Stall {
    fn info(&self) -> &tagstripe::DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        self.inner.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        if self
            .budget
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            <= 0
        {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
        self.inner.write(start, data, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.discard(start, sectors, opts).await
    }
}

/// md's recovery offset: a rebuild stopped part way is recorded in the new member's
/// superblock (at its checkpoints and at the clean stop), the next assembly finds the member
/// partly rebuilt, and the rebuild is taken up there, not from the start; the array's data
/// (written before, and while it was paused) reads back, healthy and with any member lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_rebuild_is_taken_up_where_it_stopped_at_the_next_assembly() {
    let (disks, size, offset) = (4usize, 2048u64, 2048u64);
    let mems = md5_members("lab:resume", 4).await;
    let a = Raid::assemble_md("resume", erased(&mems)).await.unwrap();
    let total = a.info().sectors;
    let mut want: Vec<u8> = (0..total * 512).map(|i| (i * 13 % 251) as u8).collect();
    a.write(0, Bytes::from(want.clone()), IoOpts::new())
        .await
        .unwrap();
    a.close().await.unwrap();
    drop(a);

    // Member 2 is replaced by a blank device; the rebuild stalls after 12 of its writes.
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ev = Arc::clone(&events);
    let a = Raid::assemble_md("resume", erased(&mems))
        .await
        .unwrap()
        .on_event(move |e| ev.lock().unwrap().push(format!("{e:?}")));
    let fresh = Arc::new(MemDevice::new("sd2-new", offset + size));
    let stall = Arc::new(Stall {
        inner: Arc::clone(&fresh),
        budget: std::sync::atomic::AtomicI64::new(12),
        stalled: tokio::sync::Notify::new(),
    });
    tokio::select! {
        r = a.rebuild(2, Arc::clone(&stall) as Arc<dyn DynBlockDevice>) => panic!("the rebuild ended: {r:?}"),
        () = stall.stalled.notified() => {}
    }
    let (member, done, need) = a.rebuild_progress().expect("a paused rebuild");
    assert_eq!(member, 2);
    assert!(done > 0 && done < need, "{done} of {need}");
    assert_eq!(a.failed(), [2]);
    // The stall is over; writes while paused: below the rebuilt part they reach member 2.
    stall
        .budget
        .store(i64::MAX, std::sync::atomic::Ordering::SeqCst);
    let patch = vec![0xEEu8; 192 * 512];
    for at in [0u64, total - 192] {
        a.write(at, Bytes::from(patch.clone()), IoOpts::new())
            .await
            .unwrap();
        want[(at * 512) as usize..(at * 512) as usize + patch.len()].copy_from_slice(&patch);
    }
    a.close().await.unwrap();
    drop(a);

    // Assembled again with the new device in member 2's place: partly rebuilt.
    let mut devs = erased(&mems);
    devs[2] = Arc::clone(&fresh) as Arc<dyn DynBlockDevice>;
    let ev = Arc::clone(&events);
    let b = Raid::assemble_md("resume", devs.clone())
        .await
        .unwrap()
        .on_event(move |e| ev.lock().unwrap().push(format!("{e:?}")));
    assert_eq!(b.failed(), [2]);
    let (m, at, _) = b.rebuild_progress().unwrap();
    assert!(
        m == 2 && at > 0 && at <= done,
        "taken up at {at}, stopped at {done}"
    );
    assert_eq!(b.read(0, total, IoOpts::new()).await.unwrap(), want);
    assert!(b.resume_rebuild().await.unwrap());
    assert!(b.failed().is_empty() && b.rebuild_progress().is_none());
    assert!(
        !b.resume_rebuild().await.unwrap(),
        "nothing left to take up"
    );
    b.close().await.unwrap();
    drop(b);
    let log = events.lock().unwrap().join("\n");
    assert!(
        log.contains("whole: true"),
        "the first rebuild, from the start: {log}"
    );
    assert!(
        log.contains(&format!("sectors: {}, whole: false", need - at)),
        "taken up for the rest only: {log}"
    );

    // Whole again: read healthy, and with any member lost.
    for lost in 0..disks {
        let c = Raid::assemble_md("resume", devs.clone()).await.unwrap();
        assert!(c.failed().is_empty() && c.rebuild_progress().is_none());
        c.fail(lost);
        assert!(
            c.read(0, total, IoOpts::new()).await.unwrap() == want,
            "member {lost} lost"
        );
    }
}

/// A whole-stripe write (parity from the new data alone, no reads) after partial writes
/// that left the row in the stripe cache: the cache must not keep the old row, or the next partial write's parity is computed from stale data. Then a
/// member (data or parity) failing under a whole-stripe write: it is failed, the write
/// succeeds, and every byte reads back degraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_stripe_writes_forget_the_cached_row_and_survive_a_member_failing() {
    use tagstripe::{Fault, FaultDevice, FaultKind, FaultOp};
    for (kind, disks) in [
        (Kind::Parity(5, ParityLayout::LeftSymmetric), 4),
        (Kind::Parity(6, ParityLayout::LeftSymmetric), 6),
    ] {
        let stripe = stripe_sectors(&kind, disks);
        for victim in 0..disks {
            let m = members(disks);
            let faulty: Vec<Arc<FaultDevice<Arc<MemDevice>>>> = m
                .iter()
                .map(|d| Arc::new(FaultDevice::new(Arc::clone(d))))
                .collect();
            let a = array(
                &kind,
                disks,
                faulty
                    .iter()
                    .map(|d| Arc::clone(d) as Arc<dyn DynBlockDevice>)
                    .collect(),
            );
            let total = a.info().sectors;
            let mut model = vec![0u8; (total * 512) as usize];
            // Stripe 1: a chunk (the row read and cached), the whole stripe, then a chunk
            // again (from the cache, if it kept the row).
            put(&a, &mut model, stripe, CHUNK, 1).await;
            put(&a, &mut model, stripe, stripe, 2).await;
            put(&a, &mut model, stripe + CHUNK, CHUNK, 3).await;
            // Stripe 2: the victim fails under a whole-stripe write.
            faulty[victim].inject(Fault::always(FaultOp::Write, FaultKind::Error));
            put(&a, &mut model, 2 * stripe, stripe, 4).await;
            assert_eq!(a.failed(), vec![victim], "{kind:?}: member {victim} failed");
            verify(&a, &model, &format!("{kind:?} without {victim}")).await;
            // And the same bytes from a fresh assembly with the victim left out, which reads
            // stripe 1 through its parity wherever the victim held data.
            let d = array(&kind, disks, erased(&m));
            d.fail(victim);
            verify(&d, &model, &format!("{kind:?} assembled without {victim}")).await;
        }
    }
}
