//! The crash lab: the state generator's rules (property tests over random request streams),
//! images against a byte-by-byte oracle, logs that are cut or corrupted, and the lab turned
//! on tagstripe's own mirror: its components recorded, every prefix state and sampled subset
//! and torn states reopened, resynced and checked.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use tagstripe::crash::{
    BaseRule, CrashLog, CrashState, Images, LogEvent, LogOp, Mode, Source, StateId, Submit, Tail,
    Timeline,
};
use tagstripe::striping::Flavor;
use tagstripe::{
    BlockDevice, DynBlockDevice, Error, FileDevice, FileOptions, IoOpts, MemDevice, Recorder,
    Volume, Zeroes,
};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ts-crash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A deterministic stream of numbers (xorshift64).
struct Xs(u64);
impl Xs {
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

/// A random request stream over `devices` devices of 256 sectors: submissions and
/// completions interleaved, several requests in flight, some failing, some never completing.
fn random_events(seed: u64, n: usize, devices: u16) -> Vec<LogEvent> {
    let mut r = Xs(seed | 1);
    let mut ev = Vec::new();
    let mut open: Vec<u64> = Vec::new();
    let mut seq = 0;
    while ev.len() < n {
        if !open.is_empty() && (open.len() >= 6 || r.below(2) == 0) {
            let i = r.below(open.len() as u64) as usize;
            let s = open.swap_remove(i);
            ev.push(LogEvent::Complete {
                seq: s,
                ok: r.below(20) != 0,
            });
            continue;
        }
        let dev = r.below(u64::from(devices)) as u16;
        let op = match r.below(10) {
            0..=1 => LogOp::Flush,
            2 => LogOp::WriteZeroes,
            3 => LogOp::Trim,
            _ => LogOp::Write,
        };
        let (start, sectors) = if op == LogOp::Flush {
            (0, 0)
        } else {
            let s = r.below(240);
            (s, 1 + r.below(16))
        };
        ev.push(LogEvent::Submit(Submit {
            seq,
            dev,
            op,
            fua: op != LogOp::Flush && r.below(8) == 0,
            start,
            sectors,
            data_at: 0,
        }));
        open.push(seq);
        seq += 1;
    }
    ev
}

/// The rules, written again from the definitions: is write `w` durable at `point`?
fn durable(events: &[LogEvent], w_sub: usize, point: usize) -> bool {
    let LogEvent::Submit(w) = events[w_sub] else {
        unreachable!()
    };
    let comp = events[..point]
        .iter()
        .position(|e| matches!(e, LogEvent::Complete { seq, ok: true } if *seq == w.seq));
    let Some(comp) = comp else { return false };
    if w.fua {
        return true;
    }
    // A flush on the same device, submitted after the write completed, completed before
    // the crash.
    events[..point].iter().enumerate().any(|(i, e)| match e {
        LogEvent::Submit(f) if f.op == LogOp::Flush && f.dev == w.dev && i > comp => events
            [i..point]
            .iter()
            .any(|c| matches!(c, LogEvent::Complete { seq, ok: true } if *seq == f.seq)),
        _ => false,
    })
}

fn overlaps(a: &tagstripe::crash::Write, b: &tagstripe::crash::Write) -> bool {
    a.dev == b.dev && a.start < b.start + b.sectors && b.start < a.start + a.sectors
}

/// Checks one state against the rules.
fn check_state(events: &[LogEvent], t: &Timeline, s: &CrashState) {
    let point = s.point as usize;
    let writes = t.writes();
    let subs: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, LogEvent::Submit(x) if x.op != LogOp::Flush))
        .map(|(i, _)| i)
        .collect();
    // The base is exactly the durable writes (or the completed ones, for prefix states).
    for (w, &sub) in subs.iter().enumerate() {
        let expect = match s.base {
            BaseRule::Durable => durable(events, sub, point),
            BaseRule::Completed => writes[w].comp.is_some_and(|c| (c as usize) < point),
        };
        assert_eq!(
            t.in_base(s.base, s.point, w),
            expect,
            "state {}: write {w} (submitted at {sub})",
            s.id
        );
    }
    // The other writes that land: submitted before the crash, not in the base, in landing
    // order, each landing inside its time in flight.
    let mut last = 0;
    let mut torn = 0;
    for o in &s.overlay {
        let w = &writes[o.write];
        assert!(
            (w.sub as usize) < point,
            "state {}: a write from after the crash",
            s.id
        );
        assert!(!t.in_base(s.base, s.point, o.write), "state {}", s.id);
        assert!(
            o.landing >= last,
            "state {}: overlay out of landing order",
            s.id
        );
        last = o.landing;
        let end = w.comp.map_or(s.point, |c| c.min(s.point));
        assert!(o.landing >= u64::from(w.sub) << 20 && o.landing <= u64::from(end) << 20);
        if let Some(kept) = &o.kept {
            torn += 1;
            let total: u64 = kept.iter().map(|k| k.1).sum();
            assert!(total > 0 && total <= w.sectors, "state {}: {kept:?}", s.id);
            for &(ks, kn) in kept {
                assert!(ks >= w.start && ks + kn <= w.start + w.sectors);
            }
        }
    }
    assert!(torn <= 1, "state {}: {torn} torn writes", s.id);
    if s.id.mode != Mode::Torn {
        assert_eq!(torn, 0);
    }
    if s.id.mode == Mode::Prefix {
        assert!(s.overlay.is_empty());
    }
    // What completed before another write was submitted lands before it, wherever they
    // overlap: never old data over new.
    let landing: HashMap<usize, u64> = (0..writes.len())
        .filter(|&w| t.in_base(s.base, s.point, w))
        .map(|w| (w, t.base_landing(w)))
        .chain(s.overlay.iter().map(|o| (o.write, o.landing)))
        .collect();
    for (&a, &la) in &landing {
        for (&b, &lb) in &landing {
            let (wa, wb) = (&writes[a], &writes[b]);
            if overlaps(wa, wb) && wa.comp.is_some_and(|c| c < wb.sub) {
                assert!(la < lb, "state {}: write {a} lands after {b}", s.id);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every state of every mode respects flush and FUA semantics and the order of writes
    /// that did not overlap in time; the same seed gives the same states.
    #[test]
    fn states_respect_flush_and_fua(seed in any::<u64>(), n in 1usize..160, devices in 1u16..3) {
        let events = random_events(seed, n, devices);
        let t = Timeline::from_events(usize::from(devices), &events);
        for mode in [Mode::Prefix, Mode::Subset, Mode::Torn] {
            let states = t.states(mode, 40, seed);
            for s in &states {
                check_state(&events, &t, s);
                // Each id rebuilds its state alone.
                let again = t.state(s.id);
                prop_assert_eq!(again.as_ref(), Some(s));
            }
            let again = Timeline::from_events(usize::from(devices), &events).states(mode, 40, seed);
            prop_assert_eq!(&states, &again);
            let points: Vec<u32> = states.iter().map(|s| s.point).collect();
            prop_assert!(points.windows(2).all(|w| w[0] <= w[1]), "not in point order");
        }
    }
}

#[test]
fn a_different_seed_gives_different_states_and_prefix_states_are_every_flush_and_fua() {
    let events = random_events(7, 400, 1);
    let t = Timeline::from_events(1, &events);
    assert_ne!(t.states(Mode::Subset, 50, 1), t.states(Mode::Subset, 50, 2));
    let flushes = events
        .iter()
        .filter(|e| matches!(e, LogEvent::Submit(s) if s.op == LogOp::Flush))
        .count() as u64;
    let fua_done = t
        .writes()
        .iter()
        .filter(|w| w.fua && w.comp.is_some())
        .count() as u64;
    // One a flush and FUA write, and the end (points that coincide count once).
    assert!(t.prefix_states() <= flushes + fua_done + 1);
    assert!(t.prefix_states() >= flushes.min(1));
    assert_eq!(
        t.states(Mode::Prefix, u64::MAX, 0).len() as u64,
        t.prefix_states()
    );
    assert_eq!(t.states(Mode::Prefix, 5, 0).len(), 5);
    assert!(
        t.state(StateId {
            mode: Mode::Prefix,
            seed: 0,
            index: t.prefix_states()
        })
        .is_none()
    );
}

/// Records a random concurrent workload (writes, FUA, write-zeroes, trims, flushes) on a
/// memory device of 512 sectors; returns the log's path.
fn record_random(dir: &Path, seed: u64, tasks: u64, ops: u64) -> PathBuf {
    let path = dir.join(format!("log-{seed}"));
    rt().block_on(async {
        let rec = Recorder::create(&path).unwrap();
        let dev = Arc::new(rec.record(MemDevice::new("m", 512)).await.unwrap());
        let mut joins = Vec::new();
        for t in 0..tasks {
            let dev = Arc::clone(&dev);
            joins.push(tokio::spawn(async move {
                let mut r = Xs((seed * 31 + t) | 1);
                for _ in 0..ops {
                    let start = r.below(500);
                    let n = 1 + r.below(12.min(512 - start));
                    let opts = IoOpts::new().fua(r.below(10) == 0);
                    match r.below(12) {
                        0 | 1 => dev.flush(IoOpts::new()).await.unwrap(),
                        2 => dev
                            .write_zeroes(start, n, Zeroes::new(), opts)
                            .await
                            .unwrap(),
                        3 => dev.discard(start, n, opts).await.unwrap(),
                        _ => {
                            let b = r.next().to_le_bytes()[0];
                            let data = Bytes::from(vec![b; n as usize * 512]);
                            dev.write(start, data, opts).await.unwrap();
                        }
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
        for j in joins {
            j.await.unwrap();
        }
        rec.finish().await.unwrap();
    });
    path
}

/// A write landing: when, which, and (torn) which of its sectors.
type Landing = (u64, usize, Option<Vec<(u64, u64)>>);

/// A state's image, byte by byte from its definition: every write of the base and the
/// overlay, sorted by landing, over zeroes.
fn oracle(log: &CrashLog, t: &Timeline, s: &CrashState, dev: u16) -> Vec<u8> {
    let sectors = log.devices()[usize::from(dev)].sectors;
    let mut img = vec![0u8; sectors as usize * 512];
    let mut land: Vec<Landing> = (0..t.writes().len())
        .filter(|&w| t.in_base(s.base, s.point, w))
        .map(|w| (t.base_landing(w), w, None))
        .chain(
            s.overlay
                .iter()
                .map(|o| (o.landing, o.write, o.kept.clone())),
        )
        .collect();
    land.sort_by_key(|l| (l.0, l.1));
    for (_, w, kept) in land {
        let wr = t.writes()[w];
        if wr.dev != dev {
            continue;
        }
        let mut data = vec![0u8; wr.sectors as usize * 512];
        if let Source::Log(at) = wr.src {
            log.read_data(at, &mut data).unwrap();
        }
        let ranges = kept.unwrap_or_else(|| vec![(wr.start, wr.sectors)]);
        for (ks, kn) in ranges {
            let from = (ks - wr.start) as usize * 512;
            let len = kn as usize * 512;
            img[ks as usize * 512..ks as usize * 512 + len]
                .copy_from_slice(&data[from..from + len]);
        }
    }
    img
}

#[test]
fn images_match_the_oracle_in_every_mode_even_when_a_check_modifies_them() {
    let dir = scratch("oracle");
    for seed in 1..=3 {
        let path = record_random(&dir, seed, 4, 120);
        let log = CrashLog::open(&path, Tail::Strict).unwrap();
        let t = Timeline::new(&log);
        let mut images = Images::new(&log, dir.join(format!("work-{seed}")), &[]).unwrap();
        let img = images.paths()[0].clone();
        for mode in [Mode::Prefix, Mode::Subset, Mode::Torn] {
            for (k, s) in t.states(mode, 60, seed).iter().enumerate() {
                images.materialize(&log, &t, s).unwrap();
                let got = std::fs::read(&img).unwrap();
                assert!(got == oracle(&log, &t, s, 0), "state {} differs", s.id);
                // Every fifth check scribbles on the image, as fsck would.
                if k % 5 == 0 {
                    use std::os::unix::fs::FileExt;
                    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
                    f.write_all_at(&[0xEE; 4096], 8192).unwrap();
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_last_prefix_state_is_what_the_device_holds() {
    let dir = scratch("last");
    let path = dir.join("log");
    let mem = Arc::new(MemDevice::new("m", 512));
    rt().block_on(async {
        let rec = Recorder::create(&path).unwrap();
        let dev = rec.record(Arc::clone(&mem)).await.unwrap();
        let mut r = Xs(99);
        for i in 0..300u64 {
            let start = r.below(500);
            let n = 1 + r.below(12.min(512 - start));
            match i % 7 {
                0 => dev.flush(IoOpts::new()).await.unwrap(),
                1 => dev.discard(start, n, IoOpts::new()).await.unwrap(),
                _ => dev
                    .write(
                        start,
                        Bytes::from(vec![i as u8; n as usize * 512]),
                        IoOpts::new(),
                    )
                    .await
                    .unwrap(),
            }
        }
        rec.finish().await.unwrap();
    });
    let log = CrashLog::open(&path, Tail::Strict).unwrap();
    let t = Timeline::new(&log);
    let last = t
        .state(StateId {
            mode: Mode::Prefix,
            seed: 0,
            index: t.prefix_states() - 1,
        })
        .unwrap();
    let mut images = Images::new(&log, dir.join("work"), &[]).unwrap();
    images.materialize(&log, &t, &last).unwrap();
    let want = rt().block_on(mem.read(0, 512, IoOpts::new())).unwrap();
    assert!(std::fs::read(&images.paths()[0]).unwrap() == want);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cut_or_corrupted_log_is_refused_with_the_offset_where_it_breaks() {
    let dir = scratch("corrupt");
    let path = record_random(&dir, 5, 2, 40);
    let whole = std::fs::read(&path).unwrap();
    let good = CrashLog::open(&path, Tail::Strict).unwrap();
    let n = good.events().len();
    let cut = dir.join("cut");
    // Every length short of the whole file.
    for len in (0..whole.len())
        .step_by(97)
        .chain([whole.len() - 1, 23, 24, 25])
    {
        std::fs::write(&cut, &whole[..len]).unwrap();
        match CrashLog::open(&cut, Tail::Strict) {
            Err(Error::CrashLog { offset, .. }) => assert!(offset <= len as u64, "{len}"),
            other => panic!("a log cut at {len} read as {other:?}"),
        }
        // Salvaged, it reads the whole records before the cut (if the header is whole).
        match CrashLog::open(&cut, Tail::Salvage) {
            Ok(l) => {
                assert!(len >= 24 && l.events().len() <= n);
                assert_eq!(l.events(), &good.events()[..l.events().len()]);
            }
            Err(Error::CrashLog { offset, .. }) => assert!(len < 24 && offset == 0, "{len}"),
            Err(e) => panic!("{e}"),
        }
    }
    // A flipped byte anywhere is refused (strict), at or before the byte.
    for at in (0..whole.len()).step_by(131) {
        let mut bad = whole.clone();
        bad[at] ^= 0x40;
        std::fs::write(&cut, &bad).unwrap();
        match CrashLog::open(&cut, Tail::Strict) {
            Err(Error::CrashLog { offset, what, .. }) => {
                assert!(
                    offset <= at as u64,
                    "byte {at}: refused at {offset}: {what}"
                );
            }
            other => panic!("a log with byte {at} flipped read as {other:?}"),
        }
    }
    // Not a log at all.
    std::fs::write(&cut, b"hello, this is not a log at all, not at all").unwrap();
    let e = CrashLog::open(&cut, Tail::Salvage).unwrap_err();
    assert!(e.to_string().contains("not a tagstripe crash log"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn requests_after_the_recording_finished_are_refused_not_lost() {
    let dir = scratch("finished");
    rt().block_on(async {
        let rec = Recorder::create(dir.join("log")).unwrap();
        let dev = rec.record(MemDevice::new("m", 64)).await.unwrap();
        assert!(dev.zero_base());
        dev.write(0, Bytes::from(vec![1u8; 512]), IoOpts::new())
            .await
            .unwrap();
        rec.finish().await.unwrap();
        let e = dev
            .write(0, Bytes::from(vec![2u8; 512]), IoOpts::new())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Recording { .. }), "{e}");
        // Not written either: nothing happened that the log does not show.
        assert_eq!(dev.read(0, 1, IoOpts::new()).await.unwrap(), vec![1u8; 512]);
        // A bad request is refused before it is recorded.
        assert!(
            dev.write(63, Bytes::from(vec![0u8; 1024]), IoOpts::new())
                .await
                .is_err()
        );
        // A device that holds data is marked so.
        let rec2 = Recorder::create(dir.join("log2")).unwrap();
        let m = MemDevice::new("held", 64);
        m.write(0, Bytes::from(vec![3u8; 512]), IoOpts::new())
            .await
            .unwrap();
        assert!(!rec2.record(m).await.unwrap().zero_base());
        rec2.finish().await.unwrap();
    });
    let log = CrashLog::open(dir.join("log"), Tail::Strict).unwrap();
    assert_eq!(log.summary().writes, 1);
    // A base image is then required for it.
    let log2 = CrashLog::open(dir.join("log2"), Tail::Strict).unwrap();
    let e = Images::new(&log2, dir.join("w"), &[]).unwrap_err();
    assert!(e.to_string().contains("held data"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------
// The mirror, recorded below itself.

const SIDE: u64 = 4096; // sectors a component

fn mirror_builder(
    a: Arc<dyn DynBlockDevice>,
    b: Arc<dyn DynBlockDevice>,
) -> tagstripe::VolumeBuilder {
    Volume::builder([a, b])
        .flavor(Flavor::FreeBsd)
        .no_offset(true)
        .mirror(true)
        .interleave(16)
        .metadata(true)
        .bitmap_delay(std::time::Duration::ZERO)
}

/// Sector `s` as write `id` fills it.
fn tagged(id: u32, s: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&id.to_le_bytes());
    b[4..].copy_from_slice(&(s as u32).to_le_bytes());
    b
}

/// What the client did: each flush's log position when it returned and the volume's
/// content (a write id a sector) when it was submitted; each write's range in order.
struct History {
    flushes: Vec<(u64, Vec<u32>, usize)>,
    writes: Vec<(u64, u64)>,
    sectors: u64,
}

fn record_mirror(dir: &Path) -> History {
    rt().block_on(async {
        let rec = Recorder::create(dir.join("log")).unwrap();
        let a = rec.record(MemDevice::new("a", SIDE)).await.unwrap();
        let b = rec.record(MemDevice::new("b", SIDE)).await.unwrap();
        let v = mirror_builder(Arc::new(a), Arc::new(b))
            .open()
            .await
            .unwrap();
        let sectors = v.info().sectors;
        let mut model = vec![0u32; sectors as usize];
        let mut h = History {
            flushes: Vec::new(),
            writes: Vec::new(),
            sectors,
        };
        let mut r = Xs(2024);
        for i in 0..120u32 {
            if i % 6 == 5 {
                let snapshot = model.clone();
                v.flush(IoOpts::new()).await.unwrap();
                h.flushes.push((rec.events(), snapshot, h.writes.len()));
                continue;
            }
            let start = r.below(sectors / 8 - 8) * 8;
            let n = 8 * (1 + r.below(8)).min((sectors - start) / 8);
            let id = h.writes.len() as u32 + 1;
            let data: Vec<u8> = (start..start + n)
                .flat_map(|s| tagged(id, s).repeat(64))
                .collect();
            v.write(start, Bytes::from(data), IoOpts::new())
                .await
                .unwrap();
            for s in start..start + n {
                model[s as usize] = id;
            }
            h.writes.push((start, n));
        }
        v.close().await.unwrap();
        rec.finish().await.unwrap();
        h
    })
}

/// Reopens the mirror over a state's images, lets it resync, and checks: both sides equal,
/// and every sector holds what it held at the last flush completed before the crash, or
/// what a later write put there.
async fn check_mirror_state(h: &History, images: &[PathBuf], point: u32, id: &StateId) {
    let open = |p: &PathBuf| {
        Arc::new(FileDevice::open(p, FileOptions::default()).unwrap()) as Arc<dyn DynBlockDevice>
    };
    let v = mirror_builder(open(&images[0]), open(&images[1]))
        .open()
        .await
        .unwrap_or_else(|e| panic!("state {id}: the mirror does not reopen: {e}"));
    v.wait_resync().await;
    assert!(
        v.degraded().is_empty(),
        "state {id}: degraded {:?}",
        v.degraded()
    );
    let data = v.read(0, h.sectors, IoOpts::new()).await.unwrap();
    v.close().await.unwrap();
    drop(v);
    // Both sides hold the same data (the mirror's sides lie at the same offsets).
    let a = std::fs::read(&images[0]).unwrap();
    let b = std::fs::read(&images[1]).unwrap();
    let n = h.sectors as usize * 512;
    assert!(
        a[..n] == b[..n],
        "state {id}: the sides differ after the resync"
    );
    check_tags(h, &data, point, id, "mirror");
}

#[test]
fn the_mirror_survives_every_prefix_state_and_sampled_subset_and_torn_states() {
    let dir = scratch("mirror");
    let h = record_mirror(&dir);
    let log = CrashLog::open(dir.join("log"), Tail::Strict).unwrap();
    assert_eq!(log.devices().len(), 2);
    let t = Timeline::new(&log);
    let mut images = Images::new(&log, dir.join("work"), &[]).unwrap();
    let paths = images.paths();
    let rt = rt();
    let mut counts = Vec::new();
    for (mode, n) in [
        (Mode::Prefix, u64::MAX),
        (Mode::Subset, 150),
        (Mode::Torn, 150),
    ] {
        let states = t.states(mode, n, 11);
        for s in &states {
            images.materialize(&log, &t, s).unwrap();
            rt.block_on(check_mirror_state(&h, &paths, s.point, &s.id));
        }
        counts.push((mode, states.len()));
    }
    // Every flush of the client's is at least one prefix state.
    assert!(counts[0].1 >= h.flushes.len(), "{counts:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------
// An md raid5 array, recorded below itself: no write hole in any state.

/// Member size (data) and md's data offset, in sectors; 64-sector chunks over 4 members.
const RAID_SIZE: u64 = 2048;
const RAID_OFFSET: u64 = 2048;

fn raid_superblock(i: usize) -> Vec<u8> {
    use tagstripe::striping::md::{ParityLayout, Superblock1};
    Superblock1 {
        feature_map: 0,
        set_uuid: [7; 16],
        set_name: "lab:crash".into(),
        level: 5,
        layout: ParityLayout::LeftSymmetric.md_algorithm(),
        size: RAID_SIZE,
        chunk: 64,
        raid_disks: 4,
        data_offset: RAID_OFFSET,
        data_size: RAID_SIZE,
        super_offset: 8,
        dev_number: i as u32,
        events: 1,
        resync_offset: u64::MAX,
        recovery_offset: 0,
        dev_roles: (0..4).collect(),
    }
    .encode()
}

/// Records the members' superblocks being written (recording from zeroes), then a client's
/// small and full-stripe writes and flushes; returns the history and the log position where
/// the array existed.
fn record_raid(dir: &Path) -> (History, u64) {
    rt().block_on(async {
        let rec = Recorder::create(dir.join("log")).unwrap();
        let mut members: Vec<Arc<dyn DynBlockDevice>> = Vec::new();
        for i in 0..4 {
            let m = rec
                .record(MemDevice::new(&format!("sd{i}"), RAID_OFFSET + RAID_SIZE))
                .await
                .unwrap();
            m.write(8, Bytes::from(raid_superblock(i)), IoOpts::new())
                .await
                .unwrap();
            m.flush(IoOpts::new()).await.unwrap();
            members.push(Arc::new(m));
        }
        let made = rec.events();
        let a = tagstripe::Raid::assemble_md("crash", members)
            .await
            .unwrap();
        let sectors = a.info().sectors;
        let mut model = vec![0u32; sectors as usize];
        let mut h = History {
            flushes: Vec::new(),
            writes: Vec::new(),
            sectors,
        };
        let mut r = Xs(77);
        for i in 0..90u32 {
            if i % 5 == 4 {
                let snapshot = model.clone();
                a.flush(IoOpts::new()).await.unwrap();
                h.flushes.push((rec.events(), snapshot, h.writes.len()));
                continue;
            }
            // Small writes (read-modify-write) and now and then a whole stripe (3 chunks).
            let (start, n) = if i % 7 == 0 {
                (r.below(sectors / 192) * 192, 192)
            } else {
                let s = r.below(sectors / 8 - 4) * 8;
                (s, 8 * (1 + r.below(4)))
            };
            let id = h.writes.len() as u32 + 1;
            let data: Vec<u8> = (start..start + n)
                .flat_map(|s| tagged(id, s).repeat(64))
                .collect();
            a.write(start, Bytes::from(data), IoOpts::new())
                .await
                .unwrap();
            for s in start..start + n {
                model[s as usize] = id;
            }
            h.writes.push((start, n));
        }
        a.close().await.unwrap();
        rec.finish().await.unwrap();
        (h, made)
    })
}

/// Every sector of `data` holds what it held at the last client flush that had returned by
/// the crash at `point`, or what a later write put there (each sector tagged with its
/// write and its own number, so misplaced data fails too).
fn check_tags(h: &History, data: &[u8], point: u32, id: &StateId, how: &str) {
    let done = h.flushes.iter().rev().find(|f| f.0 <= u64::from(point));
    let (snapshot, after) = match done {
        Some((_, snap, w)) => (snap.clone(), *w),
        None => (vec![0; h.sectors as usize], 0),
    };
    for s in 0..h.sectors {
        let sector = &data[s as usize * 512..s as usize * 512 + 8];
        let got = u32::from_le_bytes(sector[..4].try_into().unwrap());
        let ok = (got == snapshot[s as usize] && (got == 0 || sector == tagged(got, s)))
            || h.writes[after..].iter().enumerate().any(|(k, &(ws, wn))| {
                let wid = (after + k + 1) as u32;
                got == wid && (ws..ws + wn).contains(&s) && sector == tagged(wid, s)
            });
        assert!(
            ok,
            "state {id} ({how}) at {point}: sector {s} holds write {got}; flushed, it held {} (flushes at {:?})",
            snapshot[s as usize],
            h.flushes.iter().map(|f| f.0).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_raid5_array_has_no_write_hole_in_any_prefix_state_nor_sampled_subset_and_torn_states() {
    let dir = scratch("raid5");
    let (h, made) = record_raid(&dir);
    let log = CrashLog::open(dir.join("log"), Tail::Strict).unwrap();
    let t = Timeline::new(&log);
    let mut images = Images::new(&log, dir.join("work"), &[]).unwrap();
    let paths = images.paths();
    let open = |p: &PathBuf| {
        Arc::new(FileDevice::open(p, FileOptions::default()).unwrap()) as Arc<dyn DynBlockDevice>
    };
    let rt = rt();
    let mut checked = 0;
    for (mode, n) in [
        (Mode::Prefix, u64::MAX),
        (Mode::Subset, 100),
        (Mode::Torn, 100),
    ] {
        for s in t.states(mode, n, 5) {
            if u64::from(s.point) < made {
                continue; // the members' superblocks were still being written
            }
            images.materialize(&log, &t, &s).unwrap();
            rt.block_on(async {
                // Assembled after the cut: a dirty array resyncs its parity before it serves.
                let a = tagstripe::Raid::assemble_md("crash", paths.iter().map(open).collect())
                    .await
                    .unwrap_or_else(|e| panic!("state {}: the array does not assemble: {e}", s.id));
                let healthy = a.read(0, h.sectors, IoOpts::new()).await.unwrap();
                a.close().await.unwrap();
                drop(a);
                check_tags(&h, &healthy, s.point, &s.id, "healthy");
                // Any member lost now: the parity agrees with the data, so a degraded read
                // returns the same bytes (a write hole would return others, silently).
                for lost in 0..4 {
                    let d = tagstripe::Raid::assemble_md("crash", paths.iter().map(open).collect())
                        .await
                        .unwrap();
                    d.fail(lost);
                    let got = d.read(0, h.sectors, IoOpts::new()).await.unwrap();
                    drop(d);
                    assert!(
                        got == healthy,
                        "state {}: member {lost} lost, other bytes",
                        s.id
                    );
                }
            });
            checked += 1;
        }
    }
    assert!(checked >= 150, "{checked} states checked");
    std::fs::remove_dir_all(&dir).unwrap();
}
