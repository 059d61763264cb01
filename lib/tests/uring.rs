//! The io_uring backend (feature `uring`): the same data as the file backend, with and
//! without O_DIRECT, under concurrency; where io_uring is unavailable the test says so.
#![cfg(feature = "uring")]

use std::sync::Arc;

use bytes::Bytes;
use tagstripe::{BlockDevice, Error, FileDevice, FileOptions, IoOpts, UringDevice};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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

#[test]
fn uring_reads_back_what_it_wrote_concurrently() {
    for direct in [false, true] {
        let path = std::env::temp_dir().join(format!(
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
                        // read_into, through the buffer pool, twice (the second reuses).
                        for _ in 0..2 {
                            let mut buf = vec![0u8; 8192];
                            dev.read_into(i * 16, &mut buf, IoOpts::new())
                                .await
                                .unwrap();
                            assert_eq!(buf, data);
                        }
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
