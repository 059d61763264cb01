//! Layer behaviours: nested volumes, torn writes, statistics, quirks applied by identity.

use std::sync::Arc;

mod common;

use bytes::Bytes;
use tagstripe::quirks::{Identity, QuirkSet};
use tagstripe::{
    BlockDevice, DeviceInfo, DynBlockDevice, Error, Fault, FaultDevice, FaultKind, FaultOp, IoOpts,
    MemDevice, Volume,
};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn mem(n: usize, sectors: u64) -> Vec<Arc<dyn DynBlockDevice>> {
    (0..n)
        .map(|i| Arc::new(MemDevice::new(&format!("m{i}"), sectors)) as Arc<dyn DynBlockDevice>)
        .collect()
}

#[test]
fn a_volume_is_a_component_of_another_volume() {
    rt().block_on(async {
        let inner_a = Arc::new(
            Volume::builder(mem(2, 4096))
                .interleave(16)
                .build()
                .unwrap(),
        );
        let inner_b = Arc::new(
            Volume::builder(mem(3, 4096))
                .interleave(32)
                .build()
                .unwrap(),
        );
        let outer = Volume::builder(vec![inner_a as Arc<dyn DynBlockDevice>, inner_b])
            .interleave(64)
            .build()
            .unwrap();
        assert_eq!(outer.info().sectors, 8192 + 12288);
        let data: Vec<u8> = (0..outer.info().bytes()).map(|i| (i % 241) as u8).collect();
        outer
            .write(0, Bytes::from(data.clone()), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(
            outer
                .read(0, outer.info().sectors, IoOpts::new())
                .await
                .unwrap(),
            data
        );
    });
}

#[test]
fn a_torn_write_is_an_error_and_leaves_a_prefix() {
    rt().block_on(async {
        let dev = FaultDevice::new(MemDevice::new("m", 1024));
        dev.inject(Fault {
            nth: Some(1),
            ..Fault::always(FaultOp::Write, FaultKind::TornWrite)
        });
        let e = dev
            .write(0, Bytes::from(vec![9u8; 8 * 512]), IoOpts::new())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Io { op: "write", .. }), "{e}");
        let back = dev.read(0, 8, IoOpts::new()).await.unwrap();
        assert_eq!(
            &back[..4 * 512],
            &vec![9u8; 4 * 512][..],
            "the first half landed"
        );
        assert_eq!(
            &back[4 * 512..],
            &vec![0u8; 4 * 512][..],
            "the rest did not"
        );
        // Only the first write was torn.
        dev.write(0, Bytes::from(vec![1u8; 512]), IoOpts::new())
            .await
            .unwrap();
    });
}

#[test]
fn volume_stats_count_transfers_and_latency() {
    rt().block_on(async {
        let vol = Volume::builder(mem(2, 4096)).build().unwrap();
        let before = vol.stats().snapshot();
        for i in 0..10 {
            vol.write(i * 8, Bytes::from(vec![1u8; 4096]), IoOpts::new())
                .await
                .unwrap();
            vol.read(i * 8, 8, IoOpts::new()).await.unwrap();
        }
        let _ = vol.read(1 << 30, 8, IoOpts::new()).await;
        let after = vol.stats().snapshot();
        assert_eq!(after.transfers() - before.transfers(), 20);
        assert_eq!(after.errors, 1);
        assert_eq!(after.kb_per_transfer(&before), 4.0);
        assert!(after.latency_percentile(99.0).is_some());
        assert_eq!(after.in_flight, 0);
    });
}

#[test]
fn quirks_apply_by_identity_when_building_a_volume() {
    rt().block_on(async {
        // A listed mod-15 Seagate behind a 2560-sector controller: Linux's 15-sector cap.
        let mut info = DeviceInfo::new("st", 1 << 16);
        info.identity = Identity::new("ATA", "ST380023AS", "3.01");
        info.limits.max_hw_sectors = 2560;
        let seagate = Arc::new(MemDevice::with_info(info)) as Arc<dyn DynBlockDevice>;
        let vol = Volume::builder(vec![seagate])
            .interleave(0)
            .quirks(QuirkSet::builtin())
            .build()
            .unwrap();
        assert_eq!(vol.components()[0].info().limits.max_sectors, 2560);
        vol.write(0, Bytes::from(vec![5u8; 2576 * 512]), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(
            vol.read(0, 2576, IoOpts::new()).await.unwrap(),
            vec![5u8; 2576 * 512]
        );
    });
}

/// Found by the loop-device model test in CI: when one piece of a request failed, the
/// others were abandoned while still running (a file's discard runs on the blocking pool
/// and cannot be cancelled), so a discard could zero a write issued after it had returned.
/// Now a request returns only when every piece has finished.
#[test]
fn a_failed_piece_does_not_leave_the_others_running() {
    use tagstripe::Striped;
    use tagstripe::striping::Geometry;
    rt().block_on(async {
        let a = Arc::new(FaultDevice::new(MemDevice::new("a", 64)));
        let b = Arc::new(FaultDevice::new(MemDevice::new("b", 64)));
        b.inner()
            .write(0, Bytes::from(vec![7u8; 8 * 512]), IoOpts::new())
            .await
            .unwrap();
        a.inject(Fault::always(FaultOp::Discard, FaultKind::Error));
        b.set_latency(std::time::Duration::from_millis(20));
        let g = Geometry::builder([64, 64], 8).build().unwrap();
        let comps: Vec<Arc<dyn DynBlockDevice>> = vec![a.clone(), b.clone()];
        let v = Striped::new("v", g, comps).unwrap();
        // Units 0 (on a, fails at once) and 1 (on b, slow but fine).
        assert!(v.discard(0, 16, IoOpts::new()).await.is_err());
        // By the time the error is reported, b's piece has run: its sectors are zeroes.
        let back = b.inner().read(0, 8, IoOpts::new()).await.unwrap();
        assert_eq!(back, vec![0u8; 8 * 512]);
    });
}

/// A volume's queues are reachable by type: their events reach a subscriber (completions,
/// openings set at run time), bulk is cut to the policy's piece size while interactive I/O
/// is active, and every byte lands.
#[test]
fn queue_events_reach_the_caller_and_bulk_is_cut_while_interactive_is_active() {
    use tagstripe::scheduler::{Event, IoClass};
    rt().block_on(async {
        let vol = Volume::builder(mem(1, 1 << 16))
            .interleave(1 << 15)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        let q = vol.queues()[0].clone();
        let mut events = q.subscribe();
        q.set_openings(8);
        assert_eq!(q.openings(), 8);
        // Interactive I/O makes the policy shape bulk: a 4 MiB bulk write goes in pieces.
        vol.read(0, 8, IoOpts::new().class(IoClass::Interactive))
            .await
            .unwrap();
        let piece = q.shape().unwrap().piece_sectors;
        assert!(piece < 8192, "piece {piece}");
        let data = Bytes::from((0..4 << 20).map(|i| (i % 253) as u8).collect::<Vec<_>>());
        vol.write(0, data.clone(), IoOpts::new().class(IoClass::Bulk))
            .await
            .unwrap();
        assert_eq!(vol.read(0, 8192, IoOpts::new()).await.unwrap(), data);
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push(e);
        }
        assert!(seen.contains(&Event::Openings { openings: 8 }), "{seen:?}");
        let completed = seen
            .iter()
            .filter(|e| matches!(e, Event::Completed { .. }))
            .count() as u64;
        // The read, the write's pieces, the read back (whole: not bulk).
        assert!(
            completed >= 2 + 8192 / piece,
            "{completed} completions, pieces of {piece}"
        );
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.pending(), 0);
    });
}

/// A request whose caller gives up (its future dropped mid-flight) leaves the in-flight
/// counts of the volume and of its queue; under a paused tokio clock the volume's and the
/// queue's latencies agree (one clock).
#[test]
fn stats_survive_cancellation_and_share_one_clock() {
    use std::time::Duration;
    use tagstripe::SimDevice;
    use tagstripe::scheduler::Profile;
    let rt = common::paused_rt();
    rt.block_on(async {
        let sim: Arc<dyn DynBlockDevice> =
            Arc::new(SimDevice::with_profile("hdd", Profile::HddModern, 1 << 20).unwrap());
        let vol = Volume::builder(vec![sim])
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        let give_up = tokio::time::timeout(Duration::from_micros(1), vol.read(0, 8, IoOpts::new()));
        assert!(
            give_up.await.is_err(),
            "the simulated disk takes milliseconds"
        );
        assert_eq!(vol.stats().snapshot().in_flight, 0);
        assert_eq!(vol.component_stats()[0].snapshot().in_flight, 0);
        for i in 0..20 {
            vol.read(i * 4096, 8, IoOpts::new()).await.unwrap();
        }
        let v = vol.stats().snapshot();
        let q = vol.component_stats()[0].snapshot();
        let (vp, qp) = (
            v.latency_percentile(50.0).unwrap(),
            q.latency_percentile(50.0).unwrap(),
        );
        assert!(
            vp >= Duration::from_micros(100),
            "simulated time elapsed: {vp:?}"
        );
        // One clock: the volume's time includes the queue's, and little else (under a
        // paused clock nothing else takes time).
        assert!(vp >= qp, "volume {vp:?}, queue {qp:?}");
        assert!(
            vp.as_secs_f64() <= qp.as_secs_f64() * 1.05,
            "volume {vp:?}, queue {qp:?}"
        );
        // Per class: bulk reads are counted apart from the best-effort ones.
        use tagstripe::scheduler::IoClass;
        for i in 0..5 {
            vol.read(i * 8192, 8, IoOpts::new().class(IoClass::Bulk))
                .await
                .unwrap();
        }
        let v = vol.stats().snapshot();
        assert_eq!(v.class_completions(IoClass::BestEffort), 20);
        assert_eq!(v.class_completions(IoClass::Bulk), 5);
        assert!(v.class_latency_percentile(IoClass::Bulk, 99.0).is_some());
        assert_eq!(v.class_latency_percentile(IoClass::Interactive, 50.0), None);
    });
}

/// An injected I/O error is what it says: EIO.
#[test]
fn injected_errors_are_eio() {
    rt().block_on(async {
        let f = FaultDevice::new(MemDevice::new("f", 64));
        f.inject(Fault::always(FaultOp::Read, FaultKind::Error));
        match f.read(0, 1, IoOpts::new()).await {
            Err(Error::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EIO)),
            other => panic!("{other:?}"),
        }
    });
}

/// A `notrim` quirk takes discard away end to end: the volume says it has none and refuses
/// a discard with a typed error, nothing changed; without it the same volume discards.
#[test]
fn notrim_makes_discard_unsupported_end_to_end() {
    rt().block_on(async {
        let quirks = QuirkSet::empty().with_force("*:notrim").unwrap();
        let vol = Volume::builder(mem(2, 4096))
            .interleave(64)
            .quirks(quirks)
            .build()
            .unwrap();
        assert!(!vol.caps().trim);
        assert_eq!(vol.info().limits.max_discard_sectors, 0);
        vol.write(0, Bytes::from(vec![1u8; 65536]), IoOpts::new())
            .await
            .unwrap();
        assert!(matches!(
            vol.discard(0, 128, IoOpts::new()).await,
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(
            vol.read(0, 128, IoOpts::new()).await.unwrap(),
            vec![1u8; 65536]
        );

        let vol = Volume::builder(mem(2, 4096))
            .interleave(64)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        assert!(vol.caps().trim);
        vol.write(0, Bytes::from(vec![1u8; 65536]), IoOpts::new())
            .await
            .unwrap();
        vol.discard(0, 128, IoOpts::new()).await.unwrap();
        assert_eq!(
            vol.read(0, 128, IoOpts::new()).await.unwrap(),
            vec![0u8; 65536]
        );
    });
}

/// `write_zeroes` against a byte model on every backend here (memory, file, a simulated
/// disk, a striped volume and a mirror over them): the range reads as zeroes, the rest is
/// untouched; with `unmap` a file really gets a hole (its allocated blocks shrink); `fast_only`
/// is refused where zeroing would be emulated (the simulated disk), with nothing written.
#[test]
fn write_zeroes_on_every_backend_against_a_model() {
    use std::os::unix::fs::MetadataExt;
    use tagstripe::scheduler::Profile;
    use tagstripe::striping::Flavor;
    use tagstripe::{FileDevice, FileOptions, SimDevice, Zeroes};
    let dir = std::env::temp_dir().join(format!("tagstripe-zeroes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    rt().block_on(async {
        let file_path = dir.join("f.img");
        let file: Arc<dyn DynBlockDevice> =
            Arc::new(FileDevice::create(&file_path, 8192, FileOptions::default()).unwrap());
        let mirror = Volume::builder(mem(2, 8192))
            .flavor(Flavor::FreeBsd)
            .mirror(true)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        let devices: Vec<(&str, Arc<dyn DynBlockDevice>)> = vec![
            ("memory", mem(1, 8192).remove(0)),
            ("file", file.clone()),
            (
                "sim",
                Arc::new(SimDevice::with_profile("sim", Profile::Ssd, 8192).unwrap()),
            ),
            (
                "stripes",
                Arc::new(
                    Volume::builder(mem(3, 4096))
                        .interleave(16)
                        .quirks(QuirkSet::empty())
                        .build()
                        .unwrap(),
                ),
            ),
            ("mirror", Arc::new(mirror)),
        ];
        for (name, d) in devices {
            let n = d.info().sectors.min(8192) as usize;
            let mut model: Vec<u8> = (0..n * 512).map(|i| (i % 251) as u8 + 1).collect();
            d.write(0, Bytes::from(model.clone()), IoOpts::new())
                .await
                .unwrap();
            for (start, len, z) in [
                (8u64, 24u64, Zeroes::new()),
                (100, 2048, Zeroes::new().unmap(true)),
                (3000, 1, Zeroes::new().unmap(true)),
            ] {
                d.write_zeroes(start, len, z, IoOpts::new()).await.unwrap();
                model[start as usize * 512..(start + len) as usize * 512].fill(0);
            }
            let fast = d
                .write_zeroes(5000, 16, Zeroes::new().fast_only(true), IoOpts::new())
                .await;
            if name == "sim" {
                assert!(
                    matches!(fast, Err(Error::Unsupported { .. })),
                    "{name}: {fast:?}"
                );
            } else {
                fast.unwrap();
                model[5000 * 512..5016 * 512].fill(0);
            }
            let back = d.read(0, n as u64, IoOpts::new()).await.unwrap();
            assert!(back == model, "{name}: contents differ from the model");
            // Bad input: past the end, and overflowing.
            let end = d.info().sectors;
            assert!(
                d.write_zeroes(end, 1, Zeroes::new(), IoOpts::new())
                    .await
                    .is_err()
            );
            assert!(
                d.write_zeroes(u64::MAX, 2, Zeroes::new(), IoOpts::new())
                    .await
                    .is_err()
            );
        }
        // A hole really is a hole: unmapping 2 MiB of the written file frees its blocks.
        let before = std::fs::metadata(&file_path).unwrap().blocks();
        file.write_zeroes(4096, 4096, Zeroes::new().unmap(true), IoOpts::new())
            .await
            .unwrap();
        file.flush(IoOpts::new()).await.unwrap();
        let after = std::fs::metadata(&file_path).unwrap().blocks();
        eprintln!("file blocks (512 B) before {before}, after punching 2 MiB {after}");
        assert!(after + 2048 <= before, "before {before}, after {after}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A component's error names the component, the volume sector of the failed piece and (in
/// its source) the component's own sector; `errno()` and `io::Error` carry the EIO through.
#[test]
fn component_errors_name_both_sectors() {
    rt().block_on(async {
        let bad = Arc::new(FaultDevice::new(MemDevice::new("c1", 4096)));
        bad.inject(Fault::always(FaultOp::Read, FaultKind::Error));
        let comps: Vec<Arc<dyn DynBlockDevice>> = vec![Arc::new(MemDevice::new("c0", 4096)), bad];
        let vol = Volume::builder(comps)
            .interleave(16)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        // Sectors 16..32 of the volume are component 1's (the geometry says where there).
        let at = vol.geometry().locate(16).unwrap();
        assert_eq!(at.component, 1);
        let e = vol.read(16, 8, IoOpts::new()).await.unwrap_err();
        assert_eq!(e.component(), Some(1));
        match &e {
            Error::Component { volume_sector, .. } => assert_eq!(*volume_sector, Some(16)),
            other => panic!("{other:?}"),
        }
        match e.root() {
            Error::Io { start, .. } => assert_eq!(*start, at.cblk),
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("volume sector 16"), "{e}");
        assert_eq!(e.errno(), libc::EIO);
        let io: std::io::Error = e.into();
        assert_eq!(
            io.kind(),
            std::io::Error::from_raw_os_error(libc::EIO).kind()
        );
        assert!(io.to_string().contains("component 1"), "{io}");
    });
}

/// A request's pieces that are contiguous on one component go to it as one command (a
/// single-component or concatenated volume), as the Linux block layer merges adjacent bios;
/// units that are adjacent on one component but not in the request go as one gathered (or
/// scattered) command. The data is the same either way.
#[test]
fn contiguous_pieces_go_to_a_component_as_one_command() {
    rt().block_on(async {
        let ops = |v: &Volume| -> Vec<(u64, u64)> {
            v.component_stats()
                .iter()
                .map(|s| {
                    let s = s.snapshot();
                    (s.reads, s.writes)
                })
                .collect()
        };
        let data: Vec<u8> = (0..2048 * 512).map(|i| (i % 251) as u8).collect();
        // One component, 16-sector interleave: 1 MiB is 128 interleave units, one command.
        let one = Volume::builder(mem(1, 8192))
            .interleave(16)
            .build()
            .unwrap();
        one.write(100, Bytes::from(data.clone()), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(one.read(100, 2048, IoOpts::new()).await.unwrap(), data);
        let mut buf = vec![0u8; data.len()];
        one.read_into(100, &mut buf, IoOpts::new()).await.unwrap();
        assert_eq!(buf, data);
        assert_eq!(ops(&one), [(2, 1)]);
        // Concatenated: one command on each component the range touches.
        let cat = Volume::builder(mem(2, 4096)).interleave(0).build().unwrap();
        cat.write(3072, Bytes::from(data.clone()), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(cat.read(3072, 2048, IoOpts::new()).await.unwrap(), data);
        assert_eq!(ops(&cat), [(1, 1), (1, 1)]);
        // Striped over two: units alternate, so none are adjacent in the request, but each
        // component's units are back to back there: a read and a write are each one command
        // a component (gathered).
        let two = Volume::builder(mem(2, 4096))
            .interleave(16)
            .build()
            .unwrap();
        two.write(0, Bytes::from(data.clone()), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(two.read(0, 2048, IoOpts::new()).await.unwrap(), data);
        assert_eq!(ops(&two), [(1, 1), (1, 1)]);
    });
}

/// A device that takes 4 KiB at a time turns each 1 MiB request into 256 pieces, and
/// twenty of them overfill the host queue (4,096 requests). The queue used to refuse the
/// rest with "queue full", so the writes failed after writing part of their data (seen on a
/// loop device with `max_sectors_kb` 4: `bench throughput --op write --bs 1M --depth 64`
/// failed 25,771 requests in 2 s). Now a submitter waits for room, every write lands whole,
/// and an interactive read sent behind the backlog does not wait for it (one waiting line
/// for every class would put it behind 1,000 bulk pieces, about 16 ms here).
#[test]
fn a_full_host_queue_makes_submitters_wait_and_interactive_reads_pass_the_backlog() {
    use tagstripe::scheduler::IoClass;
    use tokio::time::{Duration, Instant};
    common::paused_rt().block_on(async {
        let mut info = DeviceInfo::new("tiny", 1 << 16);
        info.limits.max_hw_sectors = 8;
        let dev = Arc::new(FaultDevice::new(MemDevice::with_info(info)));
        dev.set_latency(Duration::from_millis(1));
        let comps: Vec<Arc<dyn DynBlockDevice>> = vec![dev.clone()];
        let vol = Arc::new(Volume::builder(comps).interleave(0).build().unwrap());
        let bulk = IoOpts::new().class(IoClass::Bulk);
        let started = Instant::now();
        let writes: Vec<_> = (0..20u8)
            .map(|i| {
                let vol = Arc::clone(&vol);
                tokio::spawn(async move {
                    let data = Bytes::from(vec![i + 1; 1 << 20]);
                    vol.write(u64::from(i) * 2048, data, bulk).await
                })
            })
            .collect();
        // Let the writers fill the host queue, then read from the far end of the device.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let asked = Instant::now();
        let read = vol
            .read(60_000, 8, IoOpts::new().class(IoClass::Interactive))
            .await
            .unwrap();
        let read_took = asked.elapsed();
        assert_eq!(read, vec![0u8; 8 * 512]);
        for w in writes {
            w.await
                .unwrap()
                .expect("a write waits for room instead of failing");
        }
        let bulk_took = started.elapsed();
        for i in 0..20u8 {
            let back = vol
                .read(u64::from(i) * 2048, 2048, IoOpts::new())
                .await
                .unwrap();
            assert!(back.iter().all(|&b| b == i + 1), "write {i} landed whole");
        }
        // 5,120 pieces of 1 ms each through 64 tags take about 80 ms; the read waits for
        // at most the pieces it finds at the device (1 ms) and a few timer ticks.
        assert!(
            bulk_took >= Duration::from_millis(75),
            "bulk took {bulk_took:?}"
        );
        assert!(
            read_took <= Duration::from_millis(10),
            "the read waited {read_took:?} behind a bulk backlog of {bulk_took:?}"
        );
    });
}

/// Records the write commands that reach a device, (start, parts, sectors), and the reads,
/// (start, sectors).
#[derive(Debug)]
struct Commands {
    inner: MemDevice,
    log: parking_lot::Mutex<Vec<(u64, usize, u64)>>,
    reads: parking_lot::Mutex<Vec<(u64, u64)>>,
}

impl Commands {
    fn new(name: &str, sectors: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: MemDevice::new(name, sectors),
            log: parking_lot::Mutex::new(Vec::new()),
            reads: parking_lot::Mutex::new(Vec::new()),
        })
    }

    fn take_reads(&self) -> Vec<(u64, u64)> {
        let mut v = std::mem::take(&mut *self.reads.lock());
        v.sort_unstable();
        v
    }

    fn take(&self) -> Vec<(u64, usize, u64)> {
        let mut v = std::mem::take(&mut *self.log.lock());
        v.sort_unstable();
        v
    }
}

impl BlockDevice for Commands {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        self.reads.lock().push((start, sectors));
        self.inner.read(start, sectors, opts).await
    }
    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> tagstripe::Result<()> {
        self.reads.lock().push((start, buf.len() as u64 / 512));
        self.inner.read_into(start, buf, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        self.log.lock().push((start, 1, data.len() as u64 / 512));
        self.inner.write(start, data, opts).await
    }
    async fn write_vectored(
        &self,
        start: u64,
        parts: Vec<Bytes>,
        opts: IoOpts,
    ) -> tagstripe::Result<()> {
        let sectors = parts.iter().map(|p| p.len() as u64).sum::<u64>() / 512;
        self.log.lock().push((start, parts.len(), sectors));
        self.inner.write_vectored(start, parts, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.discard(start, sectors, opts).await
    }
}

fn pattern(bytes: usize, seed: u32) -> Bytes {
    Bytes::from(
        (0..bytes as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13 ^ seed) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// A striped write's units that lie back to back on a component reach it as one gathered
/// command (one a component, not one a unit), through the volume's queue and split layers,
/// with queues and without, whether the write starts on a unit boundary or not; a read's
/// units likewise, as one read a component scattered into place; what reads back is what
/// was written. A split layer whose limit is smaller cuts the gathered command
/// at its limit, across parts.
#[test]
fn a_striped_write_reaches_each_component_as_one_gathered_command() {
    rt().block_on(async {
        for queue in [true, false] {
            let comps: Vec<Arc<Commands>> = (0..4)
                .map(|i| Commands::new(&format!("c{i}"), 8192))
                .collect();
            let erased: Vec<Arc<dyn DynBlockDevice>> = comps
                .iter()
                .map(|c| Arc::clone(c) as Arc<dyn DynBlockDevice>)
                .collect();
            let vol = Volume::builder(erased)
                .interleave(128)
                .queue(queue)
                .build()
                .unwrap();
            // 1 MiB on a stripe boundary: 16 units, 4 on each component, back to back there.
            let data = pattern(1 << 20, 1);
            vol.write(0, data.clone(), IoOpts::new()).await.unwrap();
            for c in &comps {
                assert_eq!(c.take(), [(0, 4, 512)], "queue {queue}");
            }
            assert_eq!(vol.read(0, 2048, IoOpts::new()).await.unwrap(), data);
            // The read, likewise: one command a component, scattered into place.
            for c in &comps {
                assert_eq!(c.take_reads(), [(0, 512)], "queue {queue}");
            }
            // From half a unit in: component 0 gets half a unit, three whole ones, half a
            // unit again (5 parts, 512 sectors from its sector 64).
            let data = pattern(1 << 20, 2);
            vol.write(64, data.clone(), IoOpts::new()).await.unwrap();
            let got: Vec<_> = comps.iter().map(|c| c.take()).collect();
            assert_eq!(got[0], [(64, 5, 512)], "queue {queue}");
            for g in &got[1..] {
                assert_eq!(g, &[(0, 4, 512)], "queue {queue}");
            }
            let mut buf = vec![0u8; 2048 * 512];
            vol.read_into(64, &mut buf, IoOpts::new()).await.unwrap();
            assert_eq!(buf, data);
            let got: Vec<_> = comps.iter().map(|c| c.take_reads()).collect();
            assert_eq!(got[0], [(64, 512)], "queue {queue}");
            assert_eq!(got[1..], vec![vec![(0, 512)]; 3], "queue {queue}");
            // Into the caller's buffers, cut where the units are not (one sector; 200
            // sectors across two units; an empty one; the rest): the same one read a
            // component, every byte in its place.
            let (mut a, mut b, mut c, mut d) = (
                vec![0u8; 512],
                vec![0u8; 200 * 512],
                Vec::new(),
                vec![0u8; 1847 * 512],
            );
            vol.read_vectored_into(64, vec![&mut a, &mut b, &mut c, &mut d], IoOpts::new())
                .await
                .unwrap();
            assert_eq!([a, b, d].concat(), data, "queue {queue}");
            let got: Vec<_> = comps.iter().map(|c| c.take_reads()).collect();
            assert_eq!(got[0], [(64, 512)], "queue {queue}");
            assert_eq!(got[1..], vec![vec![(0, 512)]; 3], "queue {queue}");
            // Buffers that are not whole sectors, or longer than the volume, are refused.
            let mut odd = vec![0u8; 100];
            let e = vol
                .read_vectored_into(0, vec![&mut odd], IoOpts::new())
                .await
                .unwrap_err();
            assert!(matches!(e, Error::BadLength { .. }), "{e}");
            let mut big = vec![0u8; 512];
            let sectors = vol.info().sectors;
            let e = vol
                .read_vectored_into(sectors, vec![&mut big], IoOpts::new())
                .await
                .unwrap_err();
            assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
            // A gathered write given to the volume itself: gathered again on each component.
            let parts = vec![pattern(3 << 16, 3), pattern(1 << 16, 4)];
            vol.write_vectored(4096, parts.clone(), IoOpts::new())
                .await
                .unwrap();
            let got: Vec<_> = comps.iter().map(|c| c.take()).collect();
            assert_eq!(got, vec![vec![(1024, 1, 128)]; 4], "queue {queue}");
            let back = vol.read(4096, 512, IoOpts::new()).await.unwrap();
            assert_eq!(back, [parts[0].clone(), parts[1].clone()].concat());
            // And read back into two buffers of the caller's.
            comps.iter().for_each(|c| drop(c.take_reads()));
            let (mut a, mut b) = (vec![0u8; 3 << 16], vec![0u8; 1 << 16]);
            vol.read_vectored_into(4096, vec![&mut a, &mut b], IoOpts::new())
                .await
                .unwrap();
            assert_eq!((&a[..], &b[..]), (&parts[0][..], &parts[1][..]));
            for c in &comps {
                assert_eq!(c.take_reads(), [(1024, 128)], "queue {queue}");
            }
        }
    });
}

#[test]
fn a_split_layer_cuts_a_gathered_write_at_its_limit_across_parts() {
    use tagstripe::quirks::{Limits, Mod15, Settings};
    rt().block_on(async {
        let dev = Commands::new("c", 4096);
        let mut hw = Limits::default();
        hw.max_hw_sectors = 64;
        let applied = Settings::default().apply(&hw).unwrap();
        let split = tagstripe::Split::new(Arc::clone(&dev), &applied, Mod15::Cap15).unwrap();
        let parts: Vec<Bytes> = (0..3).map(|i| pattern(48 * 512, 10 + i)).collect();
        split
            .write_vectored(100, parts.clone(), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(dev.take(), [(100, 2, 64), (164, 2, 64), (228, 1, 16)]);
        let back = split.read(100, 144, IoOpts::new()).await.unwrap();
        assert_eq!(back, parts.concat());
        // Bad parts are refused whole, before anything is written.
        let bad = split
            .write_vectored(0, vec![pattern(512, 1), pattern(100, 1)], IoOpts::new())
            .await;
        assert!(matches!(bad, Err(Error::BadLength { .. })), "{bad:?}");
        assert!(dev.take().is_empty());
    });
}

/// A device that answers BUSY with nothing else in flight stalls its queue for the busy
/// delay (CAM's 1 s); a shorter delay set on the queue's handle ends the stall sooner, one
/// already in progress too. On tokio's paused clock, so the times are exact.
#[test]
fn the_busy_delay_is_the_callers_to_set() {
    common::paused_rt().block_on(async {
        let busy = |nth| Fault {
            nth: Some(nth),
            ..Fault::always(FaultOp::Read, FaultKind::Busy)
        };
        let d = Arc::new(FaultDevice::new(MemDevice::new("busy", 1024)));
        let q = Arc::new(tagstripe::Queue::new(d.clone()));
        q.write(0, Bytes::from(vec![5u8; 512]), IoOpts::new())
            .await
            .unwrap();
        // The default: one BUSY costs a second.
        d.inject(busy(1));
        let t = tokio::time::Instant::now();
        assert_eq!(q.read(0, 1, IoOpts::new()).await.unwrap()[0], 5);
        assert_eq!(t.elapsed(), std::time::Duration::from_secs(1));
        // Set before: 10 ms.
        q.set_busy_delay(std::time::Duration::from_millis(10));
        d.clear();
        d.inject(busy(1));
        let t = tokio::time::Instant::now();
        assert_eq!(q.read(0, 1, IoOpts::new()).await.unwrap()[0], 5);
        assert_eq!(t.elapsed(), std::time::Duration::from_millis(10));
        // Set during a stall of a second: it ends 20 ms after it began.
        q.handle().set_busy_delay(std::time::Duration::from_secs(1));
        d.clear();
        d.inject(busy(1));
        let t = tokio::time::Instant::now();
        let read = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.read(0, 1, IoOpts::new()).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert!(!read.is_finished(), "stalled by BUSY");
        q.handle()
            .set_busy_delay(std::time::Duration::from_millis(20));
        assert_eq!(read.await.unwrap().unwrap()[0], 5);
        assert_eq!(t.elapsed(), std::time::Duration::from_millis(20));
        assert_eq!(d.injected(), 3);
    });
}

/// Vectored reads through the queue and the split layer reach the device's own
/// `read_vectored_into` and land in order: after a QUEUE FULL and a BUSY (each attempt lends
/// the buffers again), and through a split that cuts them (read whole, then laid out).
#[test]
fn vectored_reads_through_queue_and_split_land_in_order_after_retries() {
    use tagstripe::{Queue, Split};
    rt().block_on(async {
        let mem = MemDevice::new("m", 4096);
        let data = pattern(256 << 10, 9);
        mem.write(0, data.clone(), IoOpts::new()).await.unwrap();
        let dev = FaultDevice::new(mem);
        for (nth, kind) in [(1, FaultKind::QueueFull), (2, FaultKind::Busy)] {
            dev.inject(Fault {
                nth: Some(nth),
                ..Fault::always(FaultOp::Read, kind)
            });
        }
        let q = Queue::new(dev);
        q.handle()
            .set_busy_delay(std::time::Duration::from_millis(1));
        let (mut a, mut b, mut c) = (vec![0u8; 512], vec![0u8; 64 << 10], vec![0u8; 7 * 512]);
        q.read_vectored_into(8, vec![&mut a[..], &mut b[..], &mut c[..]], IoOpts::new())
            .await
            .unwrap();
        assert_eq!(
            [a, b, c].concat(),
            &data[4096..4096 + 512 + (64 << 10) + 3584]
        );
        // A split that cuts at 16 sectors: the same bytes.
        let mut limits = q.info().limits.clone();
        limits.max_hw_sectors = 16;
        limits.max_sectors = 16;
        let applied = QuirkSet::empty()
            .apply(&q.info().identity, &limits)
            .unwrap();
        let split = Split::new(q, &applied, tagstripe::quirks::Mod15::Off).unwrap();
        assert!(
            split.info().limits.max_sectors <= 16,
            "45 sectors go as pieces"
        );
        let (mut a, mut b) = (vec![0u8; 5 * 512], vec![0u8; 40 * 512]);
        split
            .read_vectored_into(3, vec![&mut a[..], &mut b[..]], IoOpts::new())
            .await
            .unwrap();
        assert_eq!([a, b].concat(), &data[1536..1536 + 45 * 512]);
    });
}

/// A read of several pieces is gathered into a kept buffer: read after read (and after a read
/// that failed part-way) each gets its own bytes, never what the buffer held before.
#[test]
fn gathered_reads_reuse_buffers_and_show_only_their_own_bytes() {
    rt().block_on(async {
        let mut comps = mem(3, 2048);
        let faulty = FaultDevice::new(MemDevice::new("f", 2048));
        // The 3rd read at the fourth component fails.
        faulty.inject(Fault {
            nth: Some(3),
            ..Fault::always(FaultOp::Read, FaultKind::Error)
        });
        comps.push(Arc::new(faulty));
        let vol = Volume::builder(comps)
            .interleave(8)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        let total = vol.info().sectors;
        let data = pattern(total as usize * 512, 3);
        vol.write(0, data.clone(), IoOpts::new()).await.unwrap();
        let mut failed = 0;
        for round in 0..12u64 {
            // 64 sectors: 8 pieces over the 4 components.
            let at = (round * 40) % (total - 64);
            match vol.read(at, 64, IoOpts::new()).await {
                Ok(b) => {
                    let from = at as usize * 512;
                    assert_eq!(b, data.slice(from..from + 64 * 512), "round {round}");
                }
                Err(_) => failed += 1,
            }
        }
        assert_eq!(failed, 1, "the one injected failure, and no other");
    });
}

/// A device whose reads come back one sector short (a broken backend).
#[derive(Debug)]
struct ShortReads(MemDevice);

impl BlockDevice for ShortReads {
    fn info(&self) -> &DeviceInfo {
        self.0.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        let d = self.0.read(start, sectors, opts).await?;
        Ok(d.slice(..d.len().saturating_sub(512)))
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        self.0.write(start, data, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.0.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.0.discard(start, sectors, opts).await
    }
}

/// A striped read in parts (`read_parts_to_send`) over components whose reads come back
/// short is an error naming the component, not a panic or a short answer; a volume of
/// sound components answers the same read whole, in order.
#[test]
fn a_read_in_parts_over_short_reads_is_an_error() {
    rt().block_on(async {
        for short in [true, false] {
            let comps: Vec<Arc<dyn DynBlockDevice>> = (0..4)
                .map(|i| {
                    let m = MemDevice::new(&format!("m{i}"), 4096);
                    if short {
                        Arc::new(ShortReads(m)) as Arc<dyn DynBlockDevice>
                    } else {
                        Arc::new(m) as Arc<dyn DynBlockDevice>
                    }
                })
                .collect();
            let vol = Volume::builder(comps)
                .interleave(16)
                .quirks(QuirkSet::empty())
                .build()
                .unwrap();
            let data = pattern(256 * 512, 9);
            vol.write(0, data.clone(), IoOpts::new()).await.unwrap();
            let got = vol.read_parts_to_send(8, 200, IoOpts::new()).await;
            if short {
                assert!(matches!(got, Err(Error::Component { .. })), "{got:?}");
            } else {
                let parts = got.unwrap();
                assert_eq!(parts.len(), 13, "one part a piece");
                assert_eq!(parts.concat(), data[8 * 512..208 * 512]);
            }
        }
    });
}

/// A striped volume over files (through the page cache) takes a piped payload: each
/// component's run is cut from the pipe in the payload's order (pipe to pipe) and written
/// from it, at any start (on a unit boundary or not), over unequal components (the
/// stripe narrowing at the end), through the volume's queues and without them; what
/// reads back, through the volume and from each component, is what the same write in
/// memory leaves on a twin volume. A mirror (a pipe cannot go to two sides) and a volume
/// over memory take the payload in memory, with the same result.
#[test]
fn a_striped_volume_writes_a_piped_payload_as_its_components_runs() {
    use tagstripe::striping::Flavor;
    use tagstripe::{FileDevice, FileOptions};
    let dir = std::env::temp_dir().join(format!("tagstripe-piped-vol-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    rt().block_on(async {
        let sizes = [4096u64, 3072, 2048];
        let files = |tag: &str| -> Vec<Arc<dyn DynBlockDevice>> {
            sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    let f = FileDevice::create(
                        dir.join(format!("{tag}{i}")),
                        s,
                        FileOptions::default(),
                    );
                    Arc::new(f.unwrap()) as Arc<dyn DynBlockDevice>
                })
                .collect()
        };
        for queue in [true, false] {
            let (a, b) = (files("a"), files("b"));
            let build = |c: Vec<Arc<dyn DynBlockDevice>>| {
                Volume::builder(c)
                    .interleave(16)
                    .queue(queue)
                    .quirks(QuirkSet::empty())
                    .build()
                    .unwrap()
            };
            let (piped, plain) = (build(a.clone()), build(b.clone()));
            assert!(piped.takes_piped_writes(), "queue {queue}");
            let total = piped.info().sectors;
            // One unit; several, from a boundary; from inside a unit; into the narrow end.
            for (n, (start, sectors)) in [(3u64, 8u64), (0, 200), (21, 333), (total - 300, 300)]
                .into_iter()
                .enumerate()
            {
                let data = pattern(sectors as usize * 512, n as u32);
                let head = n * 1000 % 4096 / 512 * 512;
                let p = common::piped_payload(&data[..head], &data[head..]);
                piped.write_piped(start, p, IoOpts::new()).await.unwrap();
                plain
                    .write(start, data.clone(), IoOpts::new())
                    .await
                    .unwrap();
                let got = piped.read(start, sectors, IoOpts::new()).await.unwrap();
                assert!(got == data, "queue {queue}, write {n}: read back");
            }
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                let s = x.info().sectors;
                let (x, y) = (
                    x.read(0, s, IoOpts::new()).await,
                    y.read(0, s, IoOpts::new()).await,
                );
                assert!(x.unwrap() == y.unwrap(), "queue {queue}: component {i}");
            }
        }
        // In memory: a mirror, and memory devices.
        let mirror = Volume::builder(files("m")[..2].to_vec())
            .flavor(Flavor::FreeBsd)
            .mirror(true)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        let memory = Volume::builder(mem(3, 4096))
            .interleave(16)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        for (what, v) in [("mirror", &mirror), ("memory", &memory)] {
            assert!(!v.takes_piped_writes(), "{what}");
            let data = pattern(100 * 512, 7);
            let p = common::piped_payload(&data[..512], &data[512..]);
            v.write_piped(40, p, IoOpts::new()).await.unwrap();
            assert!(
                v.read(40, 100, IoOpts::new()).await.unwrap() == data,
                "{what}"
            );
        }
        // A payload shorter than it says is refused before a byte is written.
        let p = common::piped_payload(&[], &[1u8; 1000]);
        let short = memory.write_piped(0, p, IoOpts::new()).await;
        assert!(short.is_err(), "1,000 bytes are not whole sectors");
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Takes piped writes, and answers the first with QUEUE FULL (having read its pipe).
#[derive(Debug)]
struct FullOnce {
    inner: MemDevice,
    answered: std::sync::atomic::AtomicBool,
}

impl BlockDevice for FullOnce {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        self.inner.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.write(start, data, opts).await
    }
    fn takes_piped_writes(&self) -> bool {
        true
    }
    async fn write_piped(
        &self,
        start: u64,
        data: tagstripe::Piped,
        opts: IoOpts,
    ) -> tagstripe::Result<()> {
        if self
            .answered
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let bytes = data.into_bytes().unwrap();
            return self.inner.write(start, bytes, opts).await;
        }
        drop(data);
        Err(Error::QueueFull {
            device: self.inner.info().name.clone(),
        })
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.discard(start, sectors, opts).await
    }
}

/// The tagged queue passes a piped write to a device that takes them, once: a device that
/// answers QUEUE FULL to it (its pipe read) fails the write with a clear error rather than
/// a retry with no bytes; the next piped write goes through.
#[test]
fn a_queue_sends_a_piped_write_once() {
    rt().block_on(async {
        let d = FullOnce {
            inner: MemDevice::new("full", 1024),
            answered: std::sync::atomic::AtomicBool::new(false),
        };
        let q = tagstripe::Queue::new(d);
        assert!(q.takes_piped_writes());
        let data = pattern(64 * 512, 3);
        let p = common::piped_payload(&data[..512], &data[512..]);
        let e = q.write_piped(8, p, IoOpts::new()).await.unwrap_err();
        assert!(e.to_string().contains("sent already"), "{e}");
        assert!(
            q.read(8, 64, IoOpts::new())
                .await
                .unwrap()
                .iter()
                .all(|&b| b == 0)
        );
        let p = common::piped_payload(&data[..512], &data[512..]);
        q.write_piped(8, p, IoOpts::new()).await.unwrap();
        assert!(q.read(8, 64, IoOpts::new()).await.unwrap() == data);
    });
}

/// A small request's future through a volume's whole stack (the volume, its striped layer,
/// each component's split layer and tagged queue, down to the erased device's boxed
/// future) stays under 1 KiB: a server boxes one a request, and glibc's malloc serves
/// blocks up to 1,032 bytes from its per-thread cache (larger ones take its slower path).
/// A write's was 2,112 bytes and a read's 1,312 with `async fn`s, each keeping room for its
/// arguments twice, and the rare paths' (pieces, mirrors) state inline.
#[test]
fn a_volume_request_future_stays_small() {
    let vol = Volume::builder(mem(4, 4096))
        .interleave(128)
        .build()
        .unwrap();
    let write = vol.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new());
    let size = size_of_val(&write);
    assert!(size <= 1024, "a volume's write future is {size} bytes");
    let parts = vec![Bytes::from(vec![1u8; 2048]), Bytes::from(vec![2u8; 2048])];
    let gathered = vol.write_vectored(0, parts, IoOpts::new());
    let size = size_of_val(&gathered);
    assert!(
        size <= 1024,
        "a volume's gathered write future is {size} bytes"
    );
    let read = vol.read_to_send(0, 8, IoOpts::new());
    let size = size_of_val(&read);
    assert!(size <= 1024, "a volume's read future is {size} bytes");
    // Nothing polled: dropping the futures sends nothing.
    drop((write, gathered, read));
    let back = rt().block_on(vol.read(0, 8, IoOpts::new())).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "an unpolled write wrote nothing"
    );
}
