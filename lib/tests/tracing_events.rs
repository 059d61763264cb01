//! What `tracing` reports, captured with a scoped subscriber. This test is alone in its
//! binary on purpose: `tracing` caches whether a callsite is enabled process-wide, and a
//! callsite first reached by another test's thread while this test installs its subscriber
//! can be cached as disabled for good. In CI that once dropped the QUEUE FULL and
//! slow-request events here while the test shared a binary with the layer tests.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe::quirks::QuirkSet;
use tagstripe::{
    BlockDevice, DynBlockDevice, Fault, FaultDevice, FaultKind, FaultOp, IoOpts, MemDevice, Volume,
};

/// `tracing` sees what a storage engineer wants to know: a mirror side dropped, QUEUE FULL
/// back-off and the openings it changed.
#[test]
fn tracing_events_for_mirror_drops_back_off_and_slow_requests() {
    use std::io::Write;
    use std::sync::Mutex;
    use tagstripe::striping::Flavor;

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let cap = Capture::default();
    let writer = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        // tokio's paused clock: the queue's back-off after QUEUE FULL and the slow request
        // below take simulated time, not real time.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            // A mirror whose side 1 fails every write: dropped, the write still succeeds.
            let b = Arc::new(FaultDevice::new(MemDevice::new("side1", 1024)));
            b.inject(Fault::always(FaultOp::Write, FaultKind::Error));
            let comps: Vec<Arc<dyn DynBlockDevice>> =
                vec![Arc::new(MemDevice::new("side0", 1024)), b.clone()];
            let vol = Volume::builder(comps)
                .flavor(Flavor::FreeBsd)
                .mirror(true)
                .quirks(QuirkSet::empty())
                .build()
                .unwrap();
            vol.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(vol.degraded(), [1]);
            // QUEUE FULL from a device with requests in flight: the queue backs off.
            let d = Arc::new(FaultDevice::new(MemDevice::new("full", 1024)));
            d.inject(Fault {
                nth: Some(3),
                ..Fault::always(FaultOp::Read, FaultKind::QueueFull)
            });
            let q = Arc::new(tagstripe::Queue::new(d.clone()));
            let reads = (0..8u64).map(|i| {
                let q = Arc::clone(&q);
                async move { q.read(i * 8, 8, IoOpts::new()).await }
            });
            for r in futures_util::future::join_all(reads).await {
                r.unwrap();
            }
        });
        // Requests of a second or more through a queue are reported, reads into the
        // caller's buffer too.
        rt.block_on(async {
            let d = Arc::new(FaultDevice::new(MemDevice::new("slowdev", 1024)));
            let q = tagstripe::Queue::new(d.clone());
            q.write(0, Bytes::from(vec![7u8; 512]), IoOpts::new())
                .await
                .unwrap();
            d.set_latency(std::time::Duration::from_secs(2));
            let mut buf = vec![0u8; 512];
            q.read_into(0, &mut buf, IoOpts::new()).await.unwrap();
            assert_eq!(buf, vec![7u8; 512]);
        });
    });
    let text = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    let slow: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("slow request") && l.contains("device=slowdev"))
        .collect();
    assert_eq!(slow.len(), 1, "only the slow read: {text}");
    assert!(slow[0].contains("op=Read"), "{text}");
    assert!(slow[0].contains("ms=2000"), "{text}");
    assert!(text.contains("mirror side dropped"), "{text}");
    assert!(text.contains("component=1"), "{text}");
    assert!(text.contains("QUEUE FULL: backing off"), "{text}");
}
