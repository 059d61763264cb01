//! Model-based tests: random reads, writes, flushes and discards on volumes of every kind,
//! over memory and file backends, with and without injected faults, against a `Vec<u8>`
//! model. Every operation either matches the model or returns an error; a failed write
//! leaves its sectors unknown (old or new) until they are written again; data acknowledged
//! before a fault stays readable.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use tagstripe::quirks::QuirkSet;
use tagstripe::striping::Flavor;
use tagstripe::{
    BlockDevice, DynBlockDevice, FaultDevice, FaultKind, FileDevice, FileOptions, IoOpts,
    MemDevice, Volume,
};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Concat,
    Stripes,
    Uniform,
    Mirror,
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Mem,
    File,
    Loop,
    #[cfg(feature = "uring")]
    Uring,
    Sim,
}

mod common;

#[derive(Clone, Debug)]
enum Op {
    Write(u64, u64, u8),
    Read(u64, u64),
    Discard(u64, u64),
    /// `write_zeroes`, may-unmap or not.
    Zero(u64, u64, bool),
    /// The allocation query: extents cover the range, and what they call zero reads as zero.
    Alloc(u64, u64),
    Flush,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (any::<u64>(), 1u64..300, any::<u8>()).prop_map(|(s, n, b)| Op::Write(s, n, b)),
        4 => (any::<u64>(), 1u64..300).prop_map(|(s, n)| Op::Read(s, n)),
        1 => (any::<u64>(), 1u64..300).prop_map(|(s, n)| Op::Discard(s, n)),
        1 => (any::<u64>(), 1u64..300, any::<bool>()).prop_map(|(s, n, u)| Op::Zero(s, n, u)),
        2 => (any::<u64>(), 1u64..600).prop_map(|(s, n)| Op::Alloc(s, n)),
        1 => Just(Op::Flush),
    ];
    prop::collection::vec(op, 1..60)
}

fn sizes(kind: Kind) -> Vec<u64> {
    match kind {
        Kind::Concat | Kind::Stripes => vec![1000, 2000, 1500],
        Kind::Uniform => vec![1024, 2048, 1536],
        Kind::Mirror => vec![1040, 1040],
    }
}

struct Fixture {
    vol: Volume,
    faults: Vec<Arc<FaultDevice<Arc<dyn DynBlockDevice>>>>,
    _dir: Option<TempDir>,
    _loops: Vec<common::Loop>,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Zeroed image files of the kind's sizes in a fresh directory, each opened by `open`.
fn image_files(
    kind: Kind,
    case: u64,
    open: impl Fn(&std::path::Path) -> Arc<dyn DynBlockDevice>,
) -> (std::path::PathBuf, Vec<Arc<dyn DynBlockDevice>>) {
    // Unique per fixture: tests run in parallel threads of one process.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "tagstripe-model-{}-{n}-{case}-{kind:?}",
        std::process::id(),
    ));
    std::fs::create_dir_all(&path).unwrap();
    let devs = sizes(kind)
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let f = path.join(format!("c{i}.img"));
            drop(FileDevice::create(&f, s, FileOptions::default()).unwrap());
            open(&f)
        })
        .collect();
    (path, devs)
}

fn fixture(kind: Kind, backend: Backend, case: u64) -> Fixture {
    let mut dir = None;
    let mut loops = Vec::new();
    let base: Vec<Arc<dyn DynBlockDevice>> = match backend {
        Backend::Loop => sizes(kind)
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let lo = common::make_loop_bytes(&format!("model-{n}-{i}"), s * 512, 512)
                    .expect("loop device");
                let dev =
                    FileDevice::open_block(&lo.dev, FileOptions::default()).expect("open loop");
                loops.push(lo);
                Arc::new(dev) as Arc<dyn DynBlockDevice>
            })
            .collect(),
        Backend::Mem => sizes(kind)
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                Arc::new(MemDevice::new(&format!("mem{i}"), s)) as Arc<dyn DynBlockDevice>
            })
            .collect(),
        Backend::Sim => sizes(kind)
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let d = tagstripe::SimDevice::with_profile(
                    &format!("sim{i}"),
                    tagstripe::scheduler::Profile::Ssd,
                    s,
                )
                .unwrap();
                Arc::new(d) as Arc<dyn DynBlockDevice>
            })
            .collect(),
        #[cfg(feature = "uring")]
        Backend::Uring => {
            let (path, devs) = image_files(kind, case, |f| {
                Arc::new(
                    tagstripe::UringDevice::open(f, FileOptions::default(), false, 64)
                        .expect("io_uring"),
                )
            });
            dir = Some(TempDir(path));
            devs
        }
        Backend::File => {
            let (path, devs) = image_files(kind, case, |f| {
                Arc::new(FileDevice::open(f, FileOptions::default()).unwrap())
            });
            dir = Some(TempDir(path));
            devs
        }
    };
    let faults: Vec<_> = base
        .into_iter()
        .map(|d| Arc::new(FaultDevice::new(d)))
        .collect();
    let comps: Vec<Arc<dyn DynBlockDevice>> = faults
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn DynBlockDevice>)
        .collect();
    let b = Volume::builder(comps).quirks(QuirkSet::empty());
    let b = match kind {
        Kind::Concat => b.interleave(0),
        Kind::Stripes => b.interleave(16),
        Kind::Uniform => b.interleave(32).uniform(true),
        Kind::Mirror => b.interleave(16).flavor(Flavor::FreeBsd).mirror(true),
    };
    Fixture {
        vol: b.build().unwrap(),
        faults,
        _dir: dir,
        _loops: loops,
    }
}

fn pattern(start: u64, n: u64, seed: u8) -> Vec<u8> {
    (0..n * 512)
        .map(|i| {
            (i / 7 + start)
                .wrapping_mul(31)
                .wrapping_add(u64::from(seed)) as u8
        })
        .collect()
}

async fn run(
    kind: Kind,
    backend: Backend,
    ops: Vec<Op>,
    fault_rate: f64,
    case: u64,
) -> Result<(), TestCaseError> {
    let f = fixture(kind, backend, case);
    let total = f.vol.info().sectors;
    let mut m = tagstripe::ByteModel::new(total);
    if fault_rate > 0.0 {
        for (i, d) in f.faults.iter().enumerate() {
            d.random(
                fault_rate,
                FaultKind::Error,
                case.wrapping_mul(31).wrapping_add(i as u64),
            );
        }
    }
    for op in ops {
        match op {
            Op::Write(s, n, seed) => {
                let s = s % total;
                let n = n.min(total - s);
                let data = pattern(s, n, seed);
                let r = f
                    .vol
                    .write(s, Bytes::from(data.clone()), IoOpts::new())
                    .await;
                prop_assert!(
                    r.is_ok() || fault_rate > 0.0,
                    "write failed with no faults injected"
                );
                m.write(s, &data, r.is_ok());
            }
            Op::Read(s, n) => {
                let s = s % total;
                let n = n.min(total - s);
                // Lengths divisible by 3 go through `read_vectored_into` (into two buffers,
                // a third and the rest), other odd ones through `read_into`, even ones
                // through `read`.
                let r = if n % 3 == 0 {
                    let cut = n as usize / 3 * 512;
                    let (mut a, mut b) = (vec![0u8; cut], vec![0u8; n as usize * 512 - cut]);
                    f.vol
                        .read_vectored_into(s, vec![&mut a, &mut b], IoOpts::new())
                        .await
                        .map(|()| Bytes::from([a, b].concat()))
                } else if n % 2 == 1 {
                    let mut buf = vec![0u8; n as usize * 512];
                    f.vol
                        .read_into(s, &mut buf, IoOpts::new())
                        .await
                        .map(|()| Bytes::from(buf))
                } else {
                    f.vol.read(s, n, IoOpts::new()).await
                };
                match r {
                    Ok(got) => {
                        prop_assert_eq!(got.len() as u64, n * 512);
                        let c = m.check(s, &got);
                        prop_assert!(c.mismatched.is_empty(), "sectors {:?} differ", c.mismatched);
                    }
                    Err(_) => prop_assert!(fault_rate > 0.0, "read failed with no faults injected"),
                }
            }
            Op::Discard(s, n) => {
                let s = s % total;
                let n = n.min(total - s);
                let ok = f.vol.discard(s, n, IoOpts::new()).await.is_ok();
                prop_assert!(
                    ok || fault_rate > 0.0,
                    "discard failed with no faults injected"
                );
                m.zero(s, n, ok);
            }
            Op::Zero(s, n, unmap) => {
                let s = s % total;
                let n = n.min(total - s);
                let z = tagstripe::Zeroes::new().unmap(unmap);
                let ok = f.vol.write_zeroes(s, n, z, IoOpts::new()).await.is_ok();
                prop_assert!(
                    ok || fault_rate > 0.0,
                    "write-zeroes failed with no faults injected"
                );
                m.zero(s, n, ok);
            }
            Op::Alloc(s, n) => {
                let s = s % total;
                let n = n.min(total - s);
                let extents = f
                    .vol
                    .allocation(s, n)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let covered: u64 = extents.iter().map(|e| e.sectors).sum();
                prop_assert_eq!(covered, n, "extents {:?} do not cover {}+{}", extents, s, n);
                let mut at = s;
                for e in &extents {
                    prop_assert!(e.sectors > 0);
                    if e.zero {
                        for sec in at..at + e.sectors {
                            prop_assert!(
                                m.expected(sec).is_none_or(|b| b.iter().all(|&x| x == 0)),
                                "sector {} is in a zero extent but holds data",
                                sec
                            );
                        }
                    }
                    at += e.sectors;
                }
            }
            Op::Flush => {
                let r = f.vol.flush(IoOpts::new()).await;
                prop_assert!(r.is_ok() || fault_rate > 0.0);
            }
        }
    }
    // Faults off: everything acknowledged reads back.
    for d in &f.faults {
        d.clear();
    }
    let all = f
        .vol
        .read(0, total, IoOpts::new())
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let c = m.check(0, &all);
    prop_assert!(c.mismatched.is_empty(), "sectors {:?} lost", c.mismatched);
    Ok(())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Concat),
        Just(Kind::Stripes),
        Just(Kind::Uniform),
        Just(Kind::Mirror)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_volumes_match_the_model(kind in kind(), ops in ops()) {
        rt().block_on(run(kind, Backend::Mem, ops, 0.0, 0))?;
    }

    #[test]
    fn memory_volumes_with_faults_lose_nothing_acknowledged(kind in kind(), ops in ops(), case in any::<u64>()) {
        rt().block_on(run(kind, Backend::Mem, ops, 0.05, case))?;
    }

    #[test]
    fn file_volumes_match_the_model(kind in kind(), ops in ops(), case in any::<u64>()) {
        rt().block_on(run(kind, Backend::File, ops, 0.0, case))?;
    }

    #[test]
    fn file_volumes_with_faults_lose_nothing_acknowledged(kind in kind(), ops in ops(), case in any::<u64>()) {
        rt().block_on(run(kind, Backend::File, ops, 0.05, case))?;
    }
}

/// Runs `cases` random sequences (with and without faults) on `backend`.
fn run_cases(backend: Backend, cases: u32) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                kind(),
                ops(),
                any::<u64>(),
                prop_oneof![Just(0.0), Just(0.05)],
            ),
            |(kind, ops, case, rate)| rt().block_on(run(kind, backend, ops, rate, case)),
        )
        .unwrap();
}

/// The same sequences on real loop devices (root only; CI runs as root).
#[test]
fn loop_device_volumes_match_the_model() {
    if let Err(why) = common::can_use_loop() {
        eprintln!("skipping loop-device model test: {why}");
        return;
    }
    run_cases(Backend::Loop, 12);
}

/// The same sequences on the io_uring backend (feature `uring`).
#[cfg(feature = "uring")]
#[test]
fn uring_volumes_match_the_model() {
    run_cases(Backend::Uring, 24);
}

/// The same sequences on simulated disks (timing from the disk model, data in memory).
#[test]
fn simulated_volumes_match_the_model() {
    run_cases(Backend::Sim, 16);
}

/// A mirror keeps serving reads and writes with one side dead, and says it is degraded.
#[test]
fn mirror_reads_survive_a_dead_side() {
    rt().block_on(async {
        let f = fixture(Kind::Mirror, Backend::Mem, 1);
        let data = pattern(0, 64, 9);
        f.vol
            .write(0, Bytes::from(data.clone()), IoOpts::new())
            .await
            .unwrap();
        f.faults[0].kill();
        assert_eq!(f.vol.read(0, 64, IoOpts::new()).await.unwrap(), data);
        f.faults[0].clear();
        f.faults[1].kill();
        assert_eq!(f.vol.read(0, 64, IoOpts::new()).await.unwrap(), data);
        // A write with one side dead is served by the other: the dead side is dropped from
        // the mirror and the volume says it is degraded.
        let new = pattern(0, 64, 10);
        f.vol
            .write(0, Bytes::from(new.clone()), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(f.vol.degraded(), [1]);
        // The dropped side stays out even once it answers again: its data is stale.
        f.faults[1].clear();
        assert_eq!(f.vol.read(0, 64, IoOpts::new()).await.unwrap(), new);
        // The last side is never dropped: its failure fails the write, naming it.
        f.faults[0].kill();
        let e = f
            .vol
            .write(0, Bytes::from(data), IoOpts::new())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("component 0"), "{e}");
        assert_eq!(f.vol.degraded(), [1]);
    });
}

/// QUEUE FULL and BUSY from a component are retried by its queue, not surfaced.
#[test]
fn queue_full_and_busy_are_retried() {
    rt().block_on(async {
        let f = fixture(Kind::Stripes, Backend::Mem, 2);
        // One request at a time: each BUSY would otherwise pause its queue for CAM's 1 s.
        for q in f.vol.queues() {
            q.set_busy_delay(std::time::Duration::from_millis(1));
        }
        for (i, d) in f.faults.iter().enumerate() {
            d.random(
                0.3,
                if i % 2 == 0 {
                    FaultKind::QueueFull
                } else {
                    FaultKind::Busy
                },
                i as u64,
            );
        }
        // A request is one command a component (its units there gathered): enough of them
        // that the 30% faults hit some.
        for round in 0..4u64 {
            let data = pattern(0, 512, 3 + round as u8);
            f.vol
                .write(round * 64, Bytes::from(data.clone()), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(
                f.vol.read(round * 64, 512, IoOpts::new()).await.unwrap(),
                data
            );
        }
        assert!(f.faults.iter().map(|d| d.injected()).sum::<u64>() > 0);
    });
}

/// Bad input is refused before anything is issued.
#[test]
fn bad_input_is_refused() {
    rt().block_on(async {
        let f = fixture(Kind::Stripes, Backend::Mem, 3);
        let total = f.vol.info().sectors;
        let io = IoOpts::new();
        assert!(matches!(
            f.vol.read(total, 1, io).await,
            Err(tagstripe::Error::OutOfRange { .. })
        ));
        assert!(matches!(
            f.vol.read(u64::MAX, 2, io).await,
            Err(tagstripe::Error::Overflow { .. })
        ));
        assert!(matches!(
            f.vol.read(0, 0, io).await,
            Err(tagstripe::Error::BadLength { .. })
        ));
        assert!(matches!(
            f.vol.write(0, Bytes::from(vec![0u8; 100]), io).await,
            Err(tagstripe::Error::BadLength { .. })
        ));
        assert!(f.faults.iter().all(|d| d.injected() == 0));
    });
}

/// Zeroing with unmap really deallocates where the filesystem can punch holes: the file's
/// allocated blocks (what `du` counts) shrink, and the allocation query calls the range a
/// hole; zeroing without unmap keeps the blocks and reads as zeroes.
#[test]
fn zeroing_with_unmap_punches_holes_in_files() {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::temp_dir().join(format!("tagstripe-punch-{}.img", std::process::id()));
    let d = FileDevice::create(&path, 16384, FileOptions::default()).unwrap();
    rt().block_on(async {
        d.write(0, Bytes::from(vec![9u8; 8 << 20]), IoOpts::new())
            .await
            .unwrap();
        d.flush(IoOpts::new()).await.unwrap();
        let full = std::fs::metadata(&path).unwrap().blocks();
        d.write_zeroes(2048, 4096, tagstripe::Zeroes::new().unmap(false), IoOpts::new())
            .await
            .unwrap();
        let kept = std::fs::metadata(&path).unwrap().blocks();
        d.write_zeroes(8192, 4096, tagstripe::Zeroes::new().unmap(true), IoOpts::new())
            .await
            .unwrap();
        let punched = std::fs::metadata(&path).unwrap().blocks();
        println!("allocated 512-byte blocks: {full} written, {kept} after zeroing, {punched} after zeroing with unmap");
        assert!(kept >= full - 8, "zeroing without unmap freed blocks: {full} -> {kept}");
        // 4096 blocks zeroed with unmap: nearly all freed (the filesystem may allocate a
        // block of its own bookkeeping for the split extent).
        assert!(
            full.saturating_sub(punched) >= 4096 - 64,
            "2 MiB zeroed with unmap, yet {full} -> {punched} blocks"
        );
        let ext = d.allocation(0, 16384).await.unwrap();
        assert_eq!(ext.iter().map(|e| e.sectors).sum::<u64>(), 16384);
        let mut at = 0;
        for e in &ext {
            if (at..at + e.sectors).contains(&8192) {
                assert!(e.hole && e.zero, "the punched range: {ext:?}");
                assert!(at <= 8192 && at + e.sectors >= 12288, "{ext:?}");
            }
            at += e.sectors;
        }
        let back = d.read(2048, 4096, IoOpts::new()).await.unwrap();
        assert!(back.iter().all(|&b| b == 0));
    });
    std::fs::remove_file(&path).unwrap();
}
