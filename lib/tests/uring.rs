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
