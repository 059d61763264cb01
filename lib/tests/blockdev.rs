//! The Linux block-device backend on real loop devices (512-byte and 4 KiB sectors). Needs
//! root and `losetup`; elsewhere each test prints why it skips. CI runs as root.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe::quirks::QuirkSet;
use tagstripe::{BlockDevice, DynBlockDevice, Error, FileDevice, FileOptions, IoOpts, Volume};

mod common;
use common::{can_use_loop, make_loop};

macro_rules! need_loop {
    () => {
        if let Err(why) = can_use_loop() {
            eprintln!("skipping loop-device test: {why}");
            return;
        }
    };
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn loop_device_512_size_limits_and_io() {
    need_loop!();
    let lo = make_loop("512", 64, 512).expect("loop device");
    rt().block_on(async {
        let d = FileDevice::open_block(&lo.dev, FileOptions::default()).unwrap();
        let info = d.info();
        assert_eq!(info.sectors, 64 * 2048);
        assert_eq!(info.limits.logical_block_size, 512);
        // Limits come from sysfs: a loop device reports a hardware cap.
        assert!(info.limits.max_hw_sectors > 0, "{:?}", info.limits);
        let data = Bytes::from((0..64 * 1024).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        d.write(1000, data.clone(), IoOpts::new().fua(true))
            .await
            .unwrap();
        assert_eq!(d.read(1000, 128, IoOpts::new()).await.unwrap(), data);
        d.flush(IoOpts::new()).await.unwrap();
        // The bytes are in the backing file where the device says.
        let raw = std::fs::read(&lo.file).unwrap();
        assert_eq!(&raw[1000 * 512..1000 * 512 + data.len()], &data[..]);
        assert!(matches!(
            d.read(64 * 2048, 1, IoOpts::new()).await,
            Err(Error::OutOfRange { .. })
        ));
    });
}

#[test]
fn loop_device_4k_sectors_enforce_alignment_with_o_direct() {
    need_loop!();
    let lo = make_loop("4k", 32, 4096).expect("loop device");
    rt().block_on(async {
        let opts = FileOptions {
            direct: true,
            ..FileOptions::default()
        };
        let d = FileDevice::open_block(&lo.dev, opts).unwrap();
        assert_eq!(d.info().limits.logical_block_size, 4096);
        assert_eq!(d.info().limits.lbs_sectors(), 8);
        // Misaligned requests are refused before reaching the kernel.
        assert!(matches!(
            d.read(4, 8, IoOpts::new()).await,
            Err(Error::Misaligned { .. })
        ));
        assert!(matches!(
            d.write(8, Bytes::from(vec![1u8; 512]), IoOpts::new()).await,
            Err(Error::Misaligned { .. })
        ));
        // Aligned I/O works with O_DIRECT (buffers aligned by the backend).
        let data = Bytes::from(vec![0x3Cu8; 16384]);
        d.write(16, data.clone(), IoOpts::new()).await.unwrap();
        assert_eq!(d.read(16, 32, IoOpts::new()).await.unwrap(), data);
        // A gathered write whose parts are whole sectors but not whole logical blocks (as
        // a caller's 512-byte parts reach a component): the write as a whole is aligned,
        // so it lands, on the file backend and through io_uring alike.
        let parts: Vec<Bytes> = (0..16u8).map(|i| Bytes::from(vec![i; 512])).collect();
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        #[cfg_attr(not(feature = "uring"), allow(unused_mut))]
        let mut devs: Vec<Box<dyn DynBlockDevice>> = vec![Box::new(d)];
        #[cfg(feature = "uring")]
        match tagstripe::UringDevice::open(&lo.dev, opts, true, 8) {
            Ok(u) => devs.push(Box::new(u)),
            Err(e) => eprintln!("io_uring not checked: {e}"),
        }
        for dev in &devs {
            dev.write_vectored(64, parts.clone(), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(
                &dev.read(64, 16, IoOpts::new()).await.unwrap()[..],
                &want[..]
            );
            // Parts that leave the write short of a whole logical block are refused.
            let short = dev
                .write_vectored(64, parts[..3].to_vec(), IoOpts::new())
                .await;
            assert!(matches!(short, Err(Error::Misaligned { .. })), "{short:?}");
        }
    });
}

#[test]
fn volume_striped_over_loop_devices() {
    need_loop!();
    let a = make_loop("va", 16, 512).expect("loop device");
    let b = make_loop("vb", 24, 512).expect("loop device");
    rt().block_on(async {
        let comps: Vec<Arc<dyn DynBlockDevice>> = [&a, &b]
            .iter()
            .map(|l| {
                Arc::new(FileDevice::open_block(&l.dev, FileOptions::default()).unwrap())
                    as Arc<dyn DynBlockDevice>
            })
            .collect();
        let vol = Volume::builder(comps)
            .interleave(64)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        let total = vol.info().sectors;
        assert_eq!(total, 40 * 2048);
        let data = Bytes::from(
            (0..total as usize * 512 / 8)
                .map(|i| (i % 253) as u8)
                .collect::<Vec<_>>(),
        );
        let n = data.len() as u64 / 512;
        vol.write(total - n, data.clone(), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(vol.read(total - n, n, IoOpts::new()).await.unwrap(), data);
        vol.flush(IoOpts::new()).await.unwrap();
        // The last sectors lie beyond component 0's end: on component 1 only.
        let g = vol.geometry();
        let last = g.locate(total - 1).unwrap();
        assert_eq!(last.component, 1);
        let raw = std::fs::read(&b.file).unwrap();
        let at = last.cblk as usize * 512;
        assert_eq!(raw[at..at + 512], data[data.len() - 512..]);
    });
}

/// io_uring over a loop device through its page cache: writes are `pwrite`s (on the calling
/// thread, or on the blocking pool after one waited), reads try the page cache at once and
/// else the ring. What was written reads back through the device, and after a flush through
/// O_DIRECT too (it reached the device, not only the page cache).
#[cfg(feature = "uring")]
#[test]
fn uring_buffered_block_device_writes_reach_the_device() {
    need_loop!();
    let lo = make_loop("ubuf", 16, 512).expect("loop device");
    rt().block_on(async {
        let d = match tagstripe::UringDevice::open(&lo.dev, FileOptions::default(), true, 32) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                eprintln!("io_uring not checked: {e}");
                return;
            }
        };
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let d = Arc::clone(&d);
            tasks.push(tokio::spawn(async move {
                let data = Bytes::from(vec![i as u8 + 1; 4096]);
                d.write(i * 8, data, IoOpts::new()).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let parts: Vec<Bytes> = (0..4u8).map(|i| Bytes::from(vec![0xA0 + i; 512])).collect();
        d.write_vectored(1000, parts.clone(), IoOpts::new().fua(true))
            .await
            .unwrap();
        for i in 0..64u64 {
            let got = d.read(i * 8, 8, IoOpts::new()).await.unwrap();
            assert!(got.iter().all(|&b| b == i as u8 + 1), "block {i}");
        }
        d.flush(IoOpts::new()).await.unwrap();
        let direct = FileDevice::open_block(
            &lo.dev,
            FileOptions {
                direct: true,
                ..FileOptions::default()
            },
        )
        .unwrap();
        for i in [0u64, 31, 63] {
            let got = direct.read(i * 8, 8, IoOpts::new()).await.unwrap();
            assert!(
                got.iter().all(|&b| b == i as u8 + 1),
                "block {i} on the device"
            );
        }
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(
            &direct.read(1000, 4, IoOpts::new()).await.unwrap()[..],
            &want[..]
        );
        // Past the end: refused before the kernel sees it.
        let end = d.info().sectors;
        assert!(
            d.write(end, Bytes::from(vec![0u8; 512]), IoOpts::new())
                .await
                .is_err()
        );
    });
}
