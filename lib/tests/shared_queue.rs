//! Components on one physical device share one tagged queue: the fair policy holds bulk
//! sent to one of them while an interactive read is at another, as it would for one disk.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tagstripe::scheduler::{Fair, FairConfig, IoClass};
use tagstripe::{
    BlockDevice, DeviceInfo, DynBlockDevice, FileDevice, FileOptions, IoOpts, MemDevice, Queue,
    Result, Volume,
};
use tokio::sync::Semaphore;

/// A memory device whose reads wait for a permit (the test decides when they finish) and
/// which counts the writes that reach it.
#[derive(Debug)]
struct Gated {
    mem: MemDevice,
    gate: Semaphore,
    writes: AtomicU64,
}

impl Gated {
    fn new(name: &str) -> Self {
        Self {
            mem: MemDevice::new(name, 4096),
            gate: Semaphore::new(0),
            writes: AtomicU64::new(0),
        }
    }
}

impl BlockDevice for Gated {
    fn info(&self) -> &DeviceInfo {
        self.mem.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        let _permit = self.gate.acquire().await.expect("gate open");
        self.mem.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.mem.write(start, data, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.mem.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.mem.discard(start, sectors, opts).await
    }
}

/// Lets every ready task run (the paused clock does not move while any can).
async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

/// An interactive read held at device `a`, then a bulk write to device `b`: whether the
/// write reached `b` while the read was still there, and that everything completed after.
async fn bulk_reaches_b_during_the_read(shared: bool) -> bool {
    let policy = || Box::new(Fair::new(FairConfig::default()));
    let (a, b) = (Arc::new(Gated::new("a")), Arc::new(Gated::new("b")));
    let (qa, qb) = if shared {
        let mut qs = Queue::group(vec![Arc::clone(&a), Arc::clone(&b)], policy());
        let qb = qs.pop().unwrap();
        (qs.pop().unwrap(), qb)
    } else {
        (
            Queue::with_policy(Arc::clone(&a), policy()),
            Queue::with_policy(Arc::clone(&b), policy()),
        )
    };
    assert_eq!(qa.handle().same_queue(&qb.handle()), shared);
    let (qa, qb) = (Arc::new(qa), Arc::new(qb));
    let interactive = IoOpts::new().class(IoClass::Interactive);
    let read = tokio::spawn({
        let qa = Arc::clone(&qa);
        async move { qa.read(0, 8, interactive).await }
    });
    settle().await;
    assert_eq!(
        qa.handle().active(IoClass::Interactive),
        1,
        "the read is at the device"
    );
    let write = tokio::spawn({
        let qb = Arc::clone(&qb);
        async move {
            qb.write(
                0,
                Bytes::from(vec![9u8; 4096]),
                IoOpts::new().class(IoClass::Bulk),
            )
            .await
        }
    });
    settle().await;
    let during = b.writes.load(Ordering::SeqCst) > 0;
    a.gate.add_permits(1);
    read.await.unwrap().unwrap();
    // The paused clock runs on to whatever the policy waits for (its anticipation of the
    // reader's next request), then the write goes.
    write.await.unwrap().unwrap();
    assert_eq!(b.writes.load(Ordering::SeqCst), 1);
    assert_eq!(b.mem.read(0, 8, IoOpts::new()).await.unwrap()[0], 9);
    during
}

#[tokio::test(start_paused = true)]
async fn a_shared_queue_holds_bulk_to_one_device_while_a_read_is_at_another() {
    assert!(
        !bulk_reaches_b_during_the_read(true).await,
        "one queue: bulk waits for the read"
    );
}

#[tokio::test(start_paused = true)]
async fn separate_queues_do_not_see_each_others_reads() {
    assert!(
        bulk_reaches_b_during_the_read(false).await,
        "two queues: nothing holds the bulk write back"
    );
}

#[test]
fn a_shared_pool_has_every_members_tags() {
    let devs = vec![
        MemDevice::new("a", 64),
        MemDevice::new("b", 64),
        MemDevice::new("c", 64),
    ];
    let qs = Queue::group(devs, Box::new(Fair::new(FairConfig::default())));
    assert_eq!(qs.len(), 3);
    assert!(qs.iter().all(|q| q.openings() == 3 * 64));
    qs[2].set_openings(8);
    assert_eq!(qs[0].openings(), 8, "one pool: set through any member");
    assert!(
        Queue::group(
            Vec::<MemDevice>::new(),
            Box::new(Fair::new(FairConfig::default()))
        )
        .is_empty()
    );
}

/// Files in one directory are on one filesystem: a volume over them gets one queue (and
/// keeps separate ones when asked, or for devices with no known media).
#[tokio::test]
async fn a_volume_over_files_on_one_filesystem_shares_its_queue() {
    let dir = std::env::temp_dir().join(format!("tagstripe-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let open = || -> Vec<Arc<dyn DynBlockDevice>> {
        (0..3)
            .map(|i| {
                let f = dir.join(format!("c{i}.img"));
                if !f.exists() {
                    drop(FileDevice::create(&f, 2048, FileOptions::default()).unwrap());
                }
                Arc::new(FileDevice::open(&f, FileOptions::default()).unwrap())
                    as Arc<dyn DynBlockDevice>
            })
            .collect()
    };
    let comps = open();
    assert!(comps[0].info().media.is_some());
    assert_eq!(comps[0].info().media, comps[2].info().media);
    let v = Volume::builder(comps).interleave(16).build().unwrap();
    let q = v.queues();
    assert!(q[0].same_queue(&q[1]) && q[1].same_queue(&q[2]));
    // Data still goes to the right component through the one pool.
    let data: Vec<u8> = (0..3 * 16 * 512).map(|i| (i / 512) as u8).collect();
    v.write(0, Bytes::from(data.clone()), IoOpts::new())
        .await
        .unwrap();
    assert_eq!(v.read(0, 48, IoOpts::new()).await.unwrap(), data);
    for (i, c) in v.components().iter().enumerate() {
        let first = c.read(0, 1, IoOpts::new()).await.unwrap()[0];
        assert_eq!(first, (i * 16) as u8, "component {i} holds its own stripe");
    }

    let v = Volume::builder(open())
        .interleave(16)
        .share_queues(false)
        .build()
        .unwrap();
    assert!(!v.queues()[0].same_queue(&v.queues()[1]));
    let mems: Vec<Arc<dyn DynBlockDevice>> = vec![
        Arc::new(MemDevice::new("a", 1024)),
        Arc::new(MemDevice::new("b", 1024)),
    ];
    let v = Volume::builder(mems).interleave(16).build().unwrap();
    assert!(
        !v.queues()[0].same_queue(&v.queues()[1]),
        "memory has no media"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
