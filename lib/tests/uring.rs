//! The io_uring backend (feature `uring`): the same data as the file backend, with and
//! without O_DIRECT, under concurrency; where io_uring is unavailable the test says so.
#![cfg(feature = "uring")]

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::join_all;
use tagstripe::quirks::QuirkSet;
use tagstripe::{
    BlockDevice, DynBlockDevice, Error, FileDevice, FileOptions, IoOpts, UringDevice, Volume,
};

mod common;
use common::{can_use_loop, make_loop_with};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime of one thread: requests are all submitted before the reaper can run.
fn one_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn open(path: &std::path::Path, direct: bool) -> Option<UringDevice> {
    let opts = FileOptions {
        direct,
        ..FileOptions::default()
    };
    match UringDevice::open(path, opts, false, 64) {
        Ok(d) => Some(d),
        Err(Error::Unsupported { .. }) => {
            eprintln!("skipping: io_uring is not available here");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Buffered (reads served at once from the page cache where they can be), O_DIRECT, and
/// on tmpfs where there is one (reads done at once as copies).
#[test]
fn uring_reads_back_what_it_wrote_concurrently() {
    let mut cases = vec![(std::env::temp_dir(), false), (std::env::temp_dir(), true)];
    let shm = std::path::PathBuf::from("/dev/shm");
    if shm.is_dir() {
        cases.push((shm, false));
    } else {
        eprintln!("no /dev/shm: the tmpfs case is skipped");
    }
    for (dir, direct) in cases {
        let path = dir.join(format!(
            "tagstripe-uring-{}-{direct}.img",
            std::process::id()
        ));
        drop(FileDevice::create(&path, 8192, FileOptions::default()).unwrap());
        let Some(dev) = open(&path, direct) else {
            return;
        };
        let dev = Arc::new(dev);
        rt().block_on(async {
            let tasks: Vec<_> = (0..64u64)
                .map(|i| {
                    let dev = Arc::clone(&dev);
                    tokio::spawn(async move {
                        let data = Bytes::from(vec![i as u8 + 1; 8192]);
                        dev.write(i * 16, data.clone(), IoOpts::new().fua(i % 8 == 0))
                            .await
                            .unwrap();
                        assert_eq!(dev.read(i * 16, 16, IoOpts::new()).await.unwrap(), data);
                        // read_into, twice (straight into the buffer where the read
                        // cannot wait, else through the buffer pool, which the second
                        // reuses).
                        for _ in 0..2 {
                            let mut buf = vec![0u8; 8192];
                            dev.read_into(i * 16, &mut buf, IoOpts::new())
                                .await
                                .unwrap();
                            assert_eq!(buf, data);
                        }
                        // Vectored: three buffers of 1, 4 and 3 KiB, in order.
                        let (mut a, mut b, mut c) =
                            (vec![0u8; 1024], vec![0u8; 4096], vec![0u8; 3072]);
                        dev.read_vectored_into(
                            i * 16,
                            vec![&mut a[..], &mut b[..], &mut c[..]],
                            IoOpts::new(),
                        )
                        .await
                        .unwrap();
                        assert_eq!([a, b, c].concat(), data);
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            dev.flush(IoOpts::new()).await.unwrap();
            dev.discard(0, 16, IoOpts::new()).await.unwrap();
            assert_eq!(
                dev.read(0, 16, IoOpts::new()).await.unwrap(),
                vec![0u8; 8192]
            );
            assert!(matches!(
                dev.read(8192, 1, IoOpts::new()).await,
                Err(Error::OutOfRange { .. })
            ));
            // Vectored past the end, or not whole sectors: refused, the buffers untouched.
            let (mut a, mut b) = (vec![7u8; 512], vec![7u8; 1024]);
            assert!(matches!(
                dev.read_vectored_into(8190, vec![&mut a[..], &mut b[..]], IoOpts::new())
                    .await,
                Err(Error::OutOfRange { .. })
            ));
            let mut odd = vec![7u8; 100];
            assert!(
                dev.read_vectored_into(0, vec![&mut a[..], &mut odd[..]], IoOpts::new())
                    .await
                    .is_err()
            );
            assert!(a.iter().chain(&b).chain(&odd).all(|&x| x == 7));
        });
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(
            raw[16 * 512 * 5],
            6,
            "the bytes reached the file (direct: {direct})"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn uring_survives_a_new_runtime_and_drops_with_requests_in_flight() {
    let path = std::env::temp_dir().join(format!("tagstripe-uring-rt-{}.img", std::process::id()));
    drop(FileDevice::create(&path, 8192, FileOptions::default()).unwrap());
    let Some(dev) = open(&path, true) else {
        return;
    };
    let dev = Arc::new(dev);
    // First runtime: write, then the runtime goes away (and its reaper with it).
    rt().block_on(async {
        dev.write(0, Bytes::from(vec![9u8; 4096]), IoOpts::new())
            .await
            .unwrap();
    });
    // A second runtime: the device starts a new reaper and keeps working.
    rt().block_on(async {
        assert_eq!(
            dev.read(0, 8, IoOpts::new()).await.unwrap(),
            vec![9u8; 4096]
        );
        // Requests abandoned in flight: their futures are dropped at once...
        for i in 0..32u64 {
            let d = Arc::clone(&dev);
            let f = async move { d.read(i * 8, 8, IoOpts::new()).await };
            let _ = tokio::time::timeout(std::time::Duration::ZERO, f).await;
        }
    });
    // ...and the device, dropped last, waits for the kernel before freeing their buffers.
    drop(dev);
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(raw[..4096], vec![9u8; 4096][..]);
    std::fs::remove_file(&path).unwrap();
}

/// More requests at once than the ring's completion queue holds, all submitted before the
/// reaper can run (one thread): the extra ones wait in user space instead of overflowing the
/// completion queue, and every one completes with the right data.
#[test]
fn uring_takes_more_requests_than_its_completion_queue_holds() {
    let path = std::env::temp_dir().join(format!("tagstripe-uring-cq-{}.img", std::process::id()));
    drop(FileDevice::create(&path, 8192, FileOptions::default()).unwrap());
    let opts = FileOptions::default();
    let dev = match UringDevice::open(&path, opts, false, 4) {
        Ok(d) => d,
        Err(Error::Unsupported { .. }) => {
            eprintln!("skipping: io_uring is not available here");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let cap = dev.ring_capacity();
    assert!(
        cap <= 16,
        "a 4-entry ring has a small completion queue, got {cap}"
    );
    let n = 4096u64;
    assert!(n as usize > 100 * cap);
    let single = one_thread();
    single.block_on(async {
        let writes = (0..n).map(|i| {
            let data = Bytes::from(vec![(i % 251) as u8; 1024]);
            dev.write(i * 2, data, IoOpts::new())
        });
        let done = tokio::time::timeout(std::time::Duration::from_secs(120), join_all(writes))
            .await
            .expect("writes hung: completions were lost");
        assert!(done.iter().all(Result::is_ok));
        let reads = (0..n).map(|i| dev.read(i * 2, 2, IoOpts::new()));
        let got = tokio::time::timeout(std::time::Duration::from_secs(120), join_all(reads))
            .await
            .expect("reads hung: completions were lost");
        // Each request had its own two sectors.
        for (i, r) in got.into_iter().enumerate() {
            assert_eq!(r.unwrap(), vec![(i % 251) as u8; 1024], "request {i}");
        }
    });
    std::fs::remove_file(&path).unwrap();
}

/// The hang of a volume with no queue over a loop device with direct I/O and a 4 KiB
/// `max_sectors_kb`: 16 writes of 1 MiB become 4,096 pieces at once, far more than the
/// ring's completion queue; they all complete, and the bytes are on the device.
#[test]
fn uring_unqueued_volume_over_a_loop_device_with_small_max_sectors() {
    if let Err(why) = can_use_loop() {
        eprintln!("skipping loop-device test: {why}");
        return;
    }
    let lo = make_loop_with("uring-cap", 64 << 20, 512, true).expect("loop device");
    let name = lo.dev.file_name().unwrap().to_string_lossy().into_owned();
    let knob = format!("/sys/block/{name}/queue/max_sectors_kb");
    // The setting outlives the loop device's attachment: put it back when done.
    struct Restore(String, String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, &self.1);
        }
    }
    let old = std::fs::read_to_string(&knob).expect("read max_sectors_kb");
    let _restore = Restore(knob.clone(), old.trim().to_owned());
    std::fs::write(&knob, "4").expect("set max_sectors_kb");
    let opts = FileOptions {
        direct: true,
        ..FileOptions::default()
    };
    let dev = match UringDevice::open(&lo.dev, opts, true, 256) {
        Ok(d) => d,
        Err(Error::Unsupported { .. }) => {
            eprintln!("skipping: io_uring is not available here");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(dev.info().limits.max_sectors, 8, "{:?}", dev.info().limits);
    let single = one_thread();
    single.block_on(async {
        let vol = Volume::builder(vec![Arc::new(dev) as Arc<dyn DynBlockDevice>])
            .quirks(QuirkSet::empty())
            .queue(false)
            .build()
            .unwrap();
        let writes = (0..16u64).map(|i| {
            let data = Bytes::from(vec![i as u8 + 1; 1 << 20]);
            vol.write(i * 2048, data, IoOpts::new())
        });
        let done = tokio::time::timeout(std::time::Duration::from_secs(120), join_all(writes))
            .await
            .expect("writes hung: completions were lost");
        assert!(done.iter().all(Result::is_ok), "{done:?}");
        vol.flush(IoOpts::new()).await.unwrap();
        for i in 0..16u64 {
            let got = vol.read(i * 2048, 2048, IoOpts::new()).await.unwrap();
            assert!(got.iter().all(|&b| b == i as u8 + 1), "write {i}");
        }
    });
    drop(lo);
}

/// write_zeroes through io_uring (fallocate zero-range and punch-hole), O_DIRECT or not:
/// the ranges read as zeroes, the rest is untouched.
#[test]
fn uring_write_zeroes() {
    use tagstripe::Zeroes;
    for direct in [false, true] {
        let path = std::env::temp_dir().join(format!(
            "tagstripe-uring-zero-{}-{direct}.img",
            std::process::id()
        ));
        drop(FileDevice::create(&path, 2048, FileOptions::default()).unwrap());
        let Some(dev) = open(&path, direct) else {
            return;
        };
        rt().block_on(async {
            let data: Vec<u8> = (0..1 << 20).map(|i| (i % 249) as u8 + 1).collect();
            dev.write(0, Bytes::from(data.clone()), IoOpts::new())
                .await
                .unwrap();
            dev.write_zeroes(8, 8, Zeroes::new(), IoOpts::new())
                .await
                .unwrap();
            dev.write_zeroes(
                64,
                128,
                Zeroes::new().unmap(true).fast_only(true),
                IoOpts::new(),
            )
            .await
            .unwrap();
            let mut model = data;
            model[8 * 512..16 * 512].fill(0);
            model[64 * 512..192 * 512].fill(0);
            assert_eq!(dev.read(0, 2048, IoOpts::new()).await.unwrap(), model);
        });
        std::fs::remove_file(&path).unwrap();
    }
}

/// O_DIRECT writes from a page-aligned buffer (`aligned_bytes`, sent as it is) and from
/// buffers that start anywhere (copied to an aligned one first), through io_uring and the
/// file backend: the same bytes come back.
#[test]
fn direct_writes_from_aligned_and_unaligned_buffers() {
    let path = std::env::temp_dir().join(format!("tagstripe-align-{}.img", std::process::id()));
    drop(FileDevice::create(&path, 4096, FileOptions::default()).unwrap());
    let Some(uring) = open(&path, true) else {
        std::fs::remove_file(&path).unwrap();
        return;
    };
    let file = FileDevice::open(
        &path,
        FileOptions {
            direct: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    let devs: [Arc<dyn DynBlockDevice>; 2] = [Arc::new(uring), Arc::new(file)];
    let big: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + 7) as u8).collect();
    rt().block_on(async {
        for (d, dev) in devs.iter().enumerate() {
            for (k, from) in [0usize, 1, 16, 512, 4095].into_iter().enumerate() {
                let start = (d * 5 + k) as u64 * 128;
                let want = &big[from..from + 65_536];
                let whole = Bytes::from(big.clone()).slice(from..from + 65_536);
                let aligned = tagstripe::aligned_bytes(want);
                assert_eq!(aligned.as_ptr() as usize % 4096, 0);
                for data in [whole, aligned] {
                    dev.write(start, data, IoOpts::new()).await.unwrap();
                    let back = dev.read(start, 128, IoOpts::new()).await.unwrap();
                    assert_eq!(&back[..], want, "device {d}, buffer from byte {from}");
                    dev.write_zeroes(start, 128, tagstripe::Zeroes::new(), IoOpts::new())
                        .await
                        .unwrap();
                }
            }
        }
    });
    std::fs::remove_file(&path).unwrap();
}

/// Gathered writes (`IORING_OP_WRITEV`; the file backend's one trip to its thread pool):
/// buffered, O_DIRECT with aligned parts (sent as
/// they are) and with unaligned ones (gathered into one aligned buffer first), more parts
/// than one command takes (1,024), and FUA; each reads back as the parts one after the
/// other, and the sectors around it are untouched.
#[test]
fn uring_gathered_writes_land_in_order() {
    let path = std::env::temp_dir().join(format!("tagstripe-writev-{}.img", std::process::id()));
    drop(FileDevice::create(&path, 16384, FileOptions::default()).unwrap());
    let pattern: Vec<u8> = (0..1_200_000u32).map(|i| (i * 13 + 5) as u8).collect();
    let whole = Bytes::from(pattern.clone());
    for (direct, uring) in [(false, true), (true, true), (false, false), (true, false)] {
        let dev: Arc<dyn DynBlockDevice> = if uring {
            let Some(dev) = open(&path, direct) else {
                std::fs::remove_file(&path).unwrap();
                return;
            };
            Arc::new(dev)
        } else {
            let opts = FileOptions {
                direct,
                ..FileOptions::default()
            };
            Arc::new(FileDevice::open(&path, opts).unwrap())
        };
        rt().block_on(async {
            let aligned = tagstripe::aligned_bytes(&pattern[..1 << 20]);
            // (parts, FUA): 4 aligned units of 64 KiB; unaligned parts of odd sizes;
            // 1,500 parts of one sector (two commands).
            let cases: Vec<(Vec<Bytes>, bool)> = vec![
                (
                    (0..4)
                        .map(|i| aligned.slice(i * 65_536..(i + 1) * 65_536))
                        .collect(),
                    false,
                ),
                (
                    vec![
                        whole.slice(1..1025),
                        whole.slice(7..3079),
                        whole.slice(100..612),
                    ],
                    true,
                ),
                (
                    (0..1500)
                        .map(|i| whole.slice(i * 512..(i + 1) * 512))
                        .collect(),
                    false,
                ),
            ];
            for (k, (parts, fua)) in cases.into_iter().enumerate() {
                let start = 4096 * k as u64 + 8;
                let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
                let sectors = want.len() as u64 / 512;
                dev.write_zeroes(
                    start - 8,
                    sectors + 16,
                    tagstripe::Zeroes::new(),
                    IoOpts::new(),
                )
                .await
                .unwrap();
                dev.write_vectored(start, parts, IoOpts::new().fua(fua))
                    .await
                    .unwrap();
                let back = dev
                    .read(start - 8, sectors + 16, IoOpts::new())
                    .await
                    .unwrap();
                assert!(back[..4096].iter().all(|&b| b == 0), "case {k}: before it");
                assert_eq!(
                    &back[4096..4096 + want.len()],
                    &want[..],
                    "case {k}, direct {direct}"
                );
                assert!(
                    back[4096 + want.len()..].iter().all(|&b| b == 0),
                    "case {k}: after it"
                );
            }
            // Refused whole: a part that is not whole sectors, and a write past the end.
            let bad = dev
                .write_vectored(
                    0,
                    vec![whole.slice(..512), whole.slice(..100)],
                    IoOpts::new(),
                )
                .await;
            assert!(bad.is_err(), "a part of 100 bytes is refused");
            let past = dev
                .write_vectored(
                    16383,
                    vec![whole.slice(..512), whole.slice(..512)],
                    IoOpts::new(),
                )
                .await;
            assert!(matches!(past, Err(Error::OutOfRange { .. })), "{past:?}");
        });
    }
    std::fs::remove_file(&path).unwrap();
}

/// Creates `path` with `sectors` sectors and opens it with the io_uring backend (`uring`)
/// or the file backend; `None` (the file removed) where io_uring is not available.
fn create_either(
    path: &std::path::Path,
    sectors: u64,
    uring: bool,
    direct: bool,
) -> Option<Arc<dyn DynBlockDevice>> {
    drop(FileDevice::create(path, sectors, FileOptions::default()).unwrap());
    if uring {
        let Some(d) = open(path, direct) else {
            std::fs::remove_file(path).unwrap();
            return None;
        };
        return Some(Arc::new(d));
    }
    let opts = FileOptions {
        direct,
        ..FileOptions::default()
    };
    Some(Arc::new(FileDevice::open(path, opts).unwrap()))
}

/// `read_to_send` through the page cache answers a cached range of 32 KiB or more with a
/// view of the cached pages (a later write shows through the bytes held: no copy was made),
/// and everything else (a small read, a range not cached, O_DIRECT) with a copy; the data
/// is right either way, and a range past the end is refused as `read` refuses it. Both
/// backends that open files: io_uring and the file backend.
#[test]
fn read_to_send_views_cached_pages_and_copies_the_rest() {
    // Not tmpfs: its pages cannot be dropped from the cache.
    let dir = std::path::PathBuf::from("/var/tmp");
    for (uring, direct) in [(true, false), (true, true), (false, false), (false, true)] {
        let path = dir.join(format!(
            "tagstripe-send-{}-{uring}-{direct}.img",
            std::process::id()
        ));
        let Some(dev) = create_either(&path, 8192, uring, direct) else {
            return;
        };
        let what = format!("io_uring {uring}, O_DIRECT {direct}");
        rt().block_on(async {
            let (a, b) = (vec![0xa5u8; 1 << 20], vec![0x5au8; 1 << 20]);
            dev.write(0, Bytes::from(a.clone()), IoOpts::new())
                .await
                .unwrap();
            let held = dev.read_to_send(0, 2048, IoOpts::new()).await.unwrap();
            let small = dev.read_to_send(0, 8, IoOpts::new()).await.unwrap();
            assert!(held == a && small == a[..4096], "{what}");
            dev.write(0, Bytes::from(b.clone()), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(small, a[..4096], "a small read is a copy ({what})");
            if direct {
                assert_eq!(held, a, "O_DIRECT reads are copies ({what})");
            } else {
                assert_eq!(
                    held, b,
                    "a cached range is a view of the page cache ({what})"
                );
            }
            // A range written, made durable and dropped from the page cache: read from the
            // file, into a copy.
            let c = vec![0x3cu8; 1 << 20];
            dev.write(4096, Bytes::from(c.clone()), IoOpts::new())
                .await
                .unwrap();
            dev.flush(IoOpts::new()).await.unwrap();
            let f = std::fs::File::open(&path).unwrap();
            // SAFETY: an advisory call on a descriptor we hold open; it touches no memory.
            let rc = unsafe {
                use std::os::fd::AsRawFd;
                libc::posix_fadvise(f.as_raw_fd(), 2 << 20, 1 << 20, libc::POSIX_FADV_DONTNEED)
            };
            assert_eq!(rc, 0);
            let cold = dev.read_to_send(4096, 2048, IoOpts::new()).await.unwrap();
            assert_eq!(cold, c, "{what}");
            dev.write(4096, Bytes::from(a.clone()), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(cold, c, "a range not cached is read into a copy ({what})");
            // Out of range: refused, as by `read`.
            assert!(matches!(
                dev.read_to_send(8192 - 64, 128, IoOpts::new()).await,
                Err(Error::OutOfRange { .. })
            ));
            let tail = dev
                .read_to_send(8192 - 64, 64, IoOpts::new())
                .await
                .unwrap();
            assert_eq!(tail, vec![0u8; 32768], "{what}");
        });
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }
}

/// Through a volume's layers (striped, split, tagged queue) over io_uring devices through
/// the page cache: a `read_to_send` of one interleave piece is its component's view (a later
/// write shows through), one of several pieces is gathered into a copy, and
/// `read_parts_to_send` gives each piece as its component's view; all right, queued or not.
#[test]
fn volume_read_to_send_views_one_piece_and_gathers_several() {
    for queued in [true, false] {
        let dir = std::path::PathBuf::from("/var/tmp");
        let paths: Vec<_> = (0..4)
            .map(|i| {
                dir.join(format!(
                    "tagstripe-vsend-{}-{queued}-{i}.img",
                    std::process::id()
                ))
            })
            .collect();
        let mut comps: Vec<Arc<dyn DynBlockDevice>> = Vec::new();
        for p in &paths {
            drop(FileDevice::create(p, 4096, FileOptions::default()).unwrap());
            let Some(d) = open(p, false) else {
                return;
            };
            comps.push(Arc::new(d));
        }
        rt().block_on(async {
            let vol = Volume::builder(comps)
                .interleave(128)
                .quirks(QuirkSet::empty())
                .queue(queued)
                .build()
                .unwrap();
            let (a, b) = (vec![0x11u8; 256 << 10], vec![0x22u8; 256 << 10]);
            vol.write(0, Bytes::from(a.clone()), IoOpts::new())
                .await
                .unwrap();
            let one = vol.read_to_send(128, 128, IoOpts::new()).await.unwrap();
            let several = vol.read_to_send(0, 512, IoOpts::new()).await.unwrap();
            assert!(one == a[..64 << 10] && several == a, "queued {queued}");
            // In parts: each piece its component's view, in volume order (from mid-piece).
            let parts = vol
                .read_parts_to_send(64, 448, IoOpts::new())
                .await
                .unwrap();
            let lens: Vec<usize> = parts.iter().map(Bytes::len).collect();
            assert_eq!(
                lens,
                [32 << 10, 64 << 10, 64 << 10, 64 << 10],
                "queued {queued}"
            );
            assert!(parts.concat() == a[32 << 10..], "queued {queued}");
            vol.write(0, Bytes::from(b.clone()), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(one, b[..64 << 10], "one piece is a view (queued {queued})");
            assert_eq!(several, a, "several pieces are a copy (queued {queued})");
            assert!(
                parts.concat() == b[32 << 10..],
                "parts are views (queued {queued})"
            );
            assert!(matches!(
                vol.read_to_send(vol.info().sectors, 128, IoOpts::new())
                    .await,
                Err(Error::OutOfRange { .. })
            ));
        });
        for p in &paths {
            std::fs::remove_file(p).unwrap();
        }
    }
}

/// A file shrunk by another process while it is served: a `read_to_send` of a range past
/// its new end is not handed out as a view of the mapping (whose pages there would fault),
/// it is read, and fails as a read past the end of a file does; the range still inside is
/// served as before.
#[test]
fn read_to_send_past_the_end_of_a_file_shrunk_meanwhile_is_an_error() {
    let dir = std::path::PathBuf::from("/var/tmp");
    for uring in [true, false] {
        let path = dir.join(format!(
            "tagstripe-shrunk-{}-{uring}.img",
            std::process::id()
        ));
        let Some(dev) = create_either(&path, 4096, uring, false) else {
            return;
        };
        rt().block_on(async {
            dev.write(0, Bytes::from(vec![7u8; 2 << 20]), IoOpts::new())
                .await
                .unwrap();
            let before = dev.read_to_send(2048, 256, IoOpts::new()).await.unwrap();
            assert!(before.iter().all(|&b| b == 7));
            drop(before);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(512 << 10)
                .unwrap();
            let inside = dev.read_to_send(0, 128, IoOpts::new()).await.unwrap();
            assert!(inside.iter().all(|&b| b == 7), "io_uring {uring}");
            let past = dev.read_to_send(2048, 256, IoOpts::new()).await;
            assert!(
                past.is_err(),
                "io_uring {uring}: a read past the end succeeded"
            );
        });
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }
}

/// `n` new files of 4 MiB in /var/tmp (on disk, where O_DIRECT works), named after `tag`.
fn scratch_files(tag: &str, n: usize) -> Vec<std::path::PathBuf> {
    (0..n)
        .map(|i| {
            let p = std::path::PathBuf::from("/var/tmp")
                .join(format!("tagstripe-{tag}-{}-{i}.img", std::process::id()));
            drop(FileDevice::create(&p, 8192, FileOptions::default()).unwrap());
            p
        })
        .collect()
}

/// Polls `futs` together under one plug (`Plugged`); they must all be done within two
/// minutes (a hang would be completions lost).
async fn all_plugged<F: Future>(futs: impl IntoIterator<Item = F>, what: &str) -> Vec<F::Output> {
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tagstripe::Plugged::new(Box::pin(join_all(futs))),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} hung: completions were lost"))
}

/// Requests started under a plug (`Plugged`) with O_DIRECT are held in the submission queue
/// and entered together when the poll returns: more of them than the ring holds (the rest
/// wait in user space), on one device and on a volume of two, all complete (a hang would
/// fail the timeout) and read back what was written.
#[test]
fn plugged_requests_are_all_submitted_and_read_back() {
    let paths = scratch_files("plug", 3);
    let mut devs = Vec::new();
    for p in &paths {
        match open(p, true) {
            Some(d) => devs.push(Arc::new(d) as Arc<dyn DynBlockDevice>),
            None => {
                for p in &paths {
                    let _ = std::fs::remove_file(p);
                }
                return;
            }
        }
    }
    let one = Arc::clone(&devs[0]);
    let vol: Arc<dyn DynBlockDevice> = Arc::new(
        Volume::builder(devs[1..].to_vec())
            .interleave(16)
            .no_offset(true)
            .build()
            .unwrap(),
    );
    rt().block_on(async {
        for dev in [one, vol] {
            // 200 writes, each in a slot of its own (16 KiB, in a scattered order; 37 is
            // prime to 200): 4 KiB, every 25th 16 KiB across the volume's stripes. In flight
            // together, they must not overlap for the result to be known.
            let writes: Vec<(u64, Vec<u8>)> = (0..200u64)
                .map(|i| {
                    let len = if i % 25 == 0 { 16 << 10 } else { 4 << 10 };
                    ((i * 37 % 200) * 32, vec![(i % 251) as u8 + 1; len])
                })
                .collect();
            assert!(200 * 32 <= dev.info().sectors);
            let futs = writes
                .iter()
                .map(|(start, data)| dev.write(*start, Bytes::from(data.clone()), IoOpts::new()));
            let done = all_plugged(futs, "plugged writes").await;
            assert!(done.iter().all(Result::is_ok), "{done:?}");
            let reads = writes
                .iter()
                .map(|(start, data)| dev.read(*start, data.len() as u64 / 512, IoOpts::new()));
            let got = all_plugged(reads, "plugged reads").await;
            for (g, (start, data)) in got.into_iter().zip(&writes) {
                assert!(g.unwrap() == *data, "sector {start}");
            }
        }
    });
    for p in &paths {
        std::fs::remove_file(p).unwrap();
    }
}

/// A payload from a pipe (`write_piped`) lands whole and in order on every path of the
/// backend: a file in memory (spliced on the calling thread), a file on disk (on the
/// blocking pool), a loop device through its page cache (as its buffered writes), and with
/// O_DIRECT (read into memory first: no piped writes taken); a range past the end is
/// refused before a byte is written.
#[test]
fn uring_writes_a_piped_payload_on_every_path() {
    let mut targets: Vec<(String, std::path::PathBuf, bool, bool)> = Vec::new();
    let var_tmp = std::path::Path::new("/var/tmp");
    let disk = if var_tmp.is_dir() {
        var_tmp.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    for (dir, name) in [
        (std::path::PathBuf::from("/dev/shm"), "shm"),
        (disk, "disk"),
    ] {
        if dir.is_dir() {
            let p = dir.join(format!(
                "tagstripe-uring-piped-{name}-{}",
                std::process::id()
            ));
            drop(FileDevice::create(&p, 8192, FileOptions::default()).unwrap());
            targets.push((name.to_owned(), p.clone(), false, false));
            if name == "disk" {
                targets.push(("disk, O_DIRECT".to_owned(), p, true, false));
            }
        }
    }
    let lo = match can_use_loop() {
        Ok(()) => Some(make_loop_with("uring-piped", 4 << 20, 512, true).expect("loop device")),
        Err(why) => {
            eprintln!("skipping the loop device: {why}");
            None
        }
    };
    if let Some(lo) = &lo {
        targets.push(("loop".to_owned(), lo.dev.clone(), false, true));
    }
    let rt = rt();
    for (name, path, direct, block) in &targets {
        let opts = FileOptions {
            direct: *direct,
            ..FileOptions::default()
        };
        let dev = match UringDevice::open(path, opts, *block, 64) {
            Ok(d) => d,
            Err(Error::Unsupported { .. }) => {
                eprintln!("skipping: io_uring is not available here");
                return;
            }
            Err(e) if *direct => {
                eprintln!("skipping {name}: {e}");
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
        };
        assert_eq!(dev.takes_piped_writes(), !opts.direct, "{name}");
        let head: Vec<u8> = (0..4096u32).map(|i| (i % 241) as u8).collect();
        let body: Vec<u8> = (0..1u32 << 20).map(|i| (i % 239) as u8 ^ 0x5a).collect();
        rt.block_on(async {
            dev.write_piped(512, common::piped_payload(&head, &body), IoOpts::new())
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = dev.read(512, 2056, IoOpts::new()).await.unwrap();
            assert!(got[..4096] == head[..] && got[4096..] == body[..], "{name}");
            let end = dev.info().sectors;
            let e = dev
                .write_piped(end - 8, common::piped_payload(&head, &body), IoOpts::new())
                .await
                .expect_err("past the end");
            assert!(matches!(e, Error::OutOfRange { .. }), "{name}: {e}");
            let tail = dev.read(end - 8, 8, IoOpts::new()).await.unwrap();
            assert!(tail.iter().all(|&b| b == 0), "{name}: nothing written");
        });
    }
    drop(lo);
    for (name, path, direct, _) in targets {
        if !direct && name != "loop" {
            std::fs::remove_file(path).unwrap();
        }
    }
}

/// Three files on one small ring (O_DIRECT where the filesystem takes it, and one through
/// the page cache): thousands of requests across them at once, many more than the ring's
/// completion queue holds, on one thread and under a plug; each file gets its own bytes
/// back, through the ring and in the file itself. A device dropped with requests abandoned in
/// flight leaves the ring serving the others, and the ring, dropped last, waits for the
/// kernel.
#[test]
fn devices_sharing_a_ring_keep_their_data_apart() {
    let paths = scratch_files("ring", 3);
    let cleanup = || {
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
    };
    let ring = match tagstripe::UringRing::new(4) {
        Ok(r) => r,
        Err(Error::Unsupported { .. }) => {
            eprintln!("skipping: io_uring is not available here");
            cleanup();
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let cap = ring.capacity();
    assert!(cap <= 16, "a 4-entry ring, got a completion queue of {cap}");
    let devs: Vec<Arc<UringDevice>> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let opts = FileOptions {
                direct: i < 2,
                ..FileOptions::default()
            };
            let d = UringDevice::open_on(&ring, p, opts, false)
                .or_else(|_| UringDevice::open_on(&ring, p, FileOptions::default(), false))
                .unwrap();
            assert_eq!(d.ring_capacity(), cap);
            Arc::new(d)
        })
        .collect();
    // 600 writes a device of 4 KiB, each device's bytes its own (device i, write k: 3k + i).
    let n = 600u64;
    let byte = |dev: usize, k: u64| ((k * 3 + dev as u64) % 251) as u8 + 1;
    let single = one_thread();
    single.block_on(async {
        let writes = (0..n).flat_map(|k| {
            devs.iter().enumerate().map(move |(i, d)| {
                d.write(k * 8, Bytes::from(vec![byte(i, k); 4096]), IoOpts::new())
            })
        });
        let done = all_plugged(writes, "writes across the ring").await;
        assert!(done.iter().all(Result::is_ok), "a write failed");
        let reads = (0..n).flat_map(|k| {
            devs.iter()
                .enumerate()
                .map(move |(i, d)| async move { (i, k, d.read(k * 8, 8, IoOpts::new()).await) })
        });
        let got = tokio::time::timeout(std::time::Duration::from_secs(120), join_all(reads))
            .await
            .expect("reads hung: completions were lost");
        for (i, k, r) in got {
            assert!(
                r.unwrap() == vec![byte(i, k); 4096],
                "device {i}, block {k}"
            );
        }
    });
    // The ring's reaper ran on that runtime: gone with it, the next runtime starts its own.
    drop(single);
    // Device 0's requests abandoned in flight, then device 0 dropped: the others go on.
    let mut devs = devs;
    let first = devs.remove(0);
    rt().block_on(async {
        for k in 0..64u64 {
            let d = Arc::clone(&first);
            let f = async move { d.read(k * 8, 8, IoOpts::new()).await };
            let _ = tokio::time::timeout(std::time::Duration::ZERO, f).await;
        }
        drop(first);
        for (i, d) in devs.iter().enumerate() {
            let i = i + 1;
            d.write(0, Bytes::from(vec![0xEE; 4096]), IoOpts::new())
                .await
                .unwrap();
            assert!(d.read(0, 8, IoOpts::new()).await.unwrap() == vec![0xEE; 4096]);
            assert!(d.read(8, 8, IoOpts::new()).await.unwrap() == vec![byte(i, 1); 4096]);
        }
    });
    drop(devs);
    drop(ring);
    for (i, p) in paths.iter().enumerate() {
        let raw = std::fs::read(p).unwrap();
        for k in 1..n {
            let at = k as usize * 4096;
            assert!(
                raw[at..at + 4096].iter().all(|&b| b == byte(i, k)),
                "file {i}, block {k}"
            );
        }
    }
    cleanup();
}
