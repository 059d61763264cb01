//! Capabilities in one place: what each backend says it has, what the quirk table takes
//! away (and how the split layer then keeps the promise: FUA as write and flush, every write
//! FUA with the write cache off), what a volume of mixed components has, and what an NBD
//! export advertises and its client reads back.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tagstripe::quirks::QuirkSet;
use tagstripe::scheduler::Profile;
use tagstripe::{
    BlockDevice, Caps, DynBlockDevice, FileDevice, FileOptions, IoOpts, MemDevice, SimDevice,
    Volume, Zeroing,
};

mod common;
use common::rt;

/// Records what reaches a device: `write` or `write+fua`, and `flush`; it says it has a
/// volatile write cache (as a disk does).
#[derive(Debug)]
struct Recorder {
    inner: Arc<dyn DynBlockDevice>,
    info: tagstripe::DeviceInfo,
    log: Arc<Mutex<Vec<&'static str>>>,
}

impl BlockDevice for Recorder {
    fn info(&self) -> &tagstripe::DeviceInfo {
        &self.info
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        self.inner.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(if opts.fua { "write+fua" } else { "write" });
        self.inner.write(start, data, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.log.lock().unwrap().push("flush");
        self.inner.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.discard(start, sectors, opts).await
    }
}

/// A one-component volume over memory with `force` quirks, and what reaches the memory.
fn recorded(force: &str) -> (Volume, Arc<Mutex<Vec<&'static str>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let quirks = if force.is_empty() {
        QuirkSet::empty()
    } else {
        QuirkSet::empty().with_force(force).unwrap()
    };
    let vol = Volume::builder([Arc::new(MemDevice::new("m", 4096))])
        .interleave(0)
        .quirks(quirks)
        .queue(false)
        .layer(
            move |_: usize, dev: Arc<dyn DynBlockDevice>| -> Arc<dyn DynBlockDevice> {
                let mut info = dev.info().clone();
                info.caps.write_cache = true;
                Arc::new(Recorder {
                    inner: dev,
                    info,
                    log: l.clone(),
                })
            },
        )
        .build()
        .unwrap();
    (vol, log)
}

#[test]
fn quirks_take_fua_and_the_write_cache_away_and_the_promise_is_kept() {
    rt().block_on(async {
        let data = || Bytes::from(vec![1u8; 4096]);
        // Nothing forced: FUA passes through.
        let (v, log) = recorded("");
        assert!(v.caps().fua && v.caps().write_cache);
        v.write(0, data(), IoOpts::new().fua(true)).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["write+fua"]);
        // nofua: a FUA write becomes a write and a flush.
        let (v, log) = recorded("*:nofua");
        assert!(!v.caps().fua);
        v.write(0, data(), IoOpts::new().fua(true)).await.unwrap();
        v.write(8, data(), IoOpts::new()).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["write", "flush", "write"]);
        // nowcache: every write is FUA.
        let (v, log) = recorded("*:nowcache");
        assert!(!v.caps().write_cache);
        v.write(0, data(), IoOpts::new()).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["write+fua"]);
        // Both: every write is a write and a flush.
        let (v, log) = recorded("*:nowcache,nofua");
        v.write(0, data(), IoOpts::new()).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["write", "flush"]);
    });
}

#[test]
fn each_backend_says_what_it_has_and_a_volume_what_all_have() {
    let mem = MemDevice::new("m", 1 << 16).caps();
    assert_eq!(
        (mem.zeroing, mem.fast_zero, mem.allocation, mem.write_cache),
        (Zeroing::Native, true, true, false)
    );
    let dir = std::env::temp_dir().join(format!("tagstripe-caps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = FileDevice::create(dir.join("f.img"), 1 << 16, FileOptions::default()).unwrap();
    let file = f.caps();
    assert!(file.flush && file.fua && file.trim && file.allocation && !file.rotational);
    assert_eq!(file.zeroing, Zeroing::Native);
    let hdd = SimDevice::with_profile("hdd", Profile::HddModern, 1 << 16)
        .unwrap()
        .caps();
    assert!(hdd.rotational);
    assert_eq!(hdd.zeroing, Zeroing::Emulated);
    assert!(
        !SimDevice::with_profile("ssd", Profile::Ssd, 1 << 16)
            .unwrap()
            .caps()
            .rotational
    );
    // A volume over memory and a simulated disk: rotational (one is), zeroes emulated
    // (one must), allocation unknown (one cannot tell), a write cache (one has).
    let v = Volume::builder([
        Arc::new(MemDevice::new("m", 1 << 16)) as Arc<dyn DynBlockDevice>,
        Arc::new(SimDevice::with_profile("hdd", Profile::HddModern, 1 << 16).unwrap()),
    ])
    .interleave(128)
    .quirks(QuirkSet::empty())
    .build()
    .unwrap();
    let c = v.caps();
    assert!(c.rotational && c.write_cache && !c.allocation && !c.fast_zero);
    assert_eq!(c.zeroing, Zeroing::Emulated);
    assert_eq!(
        Caps::stack([mem, mem]).zeroing,
        Zeroing::Native,
        "all native: native"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a block device the kernel's own view: rotational and the write cache from sysfs.
#[test]
fn a_loop_device_reports_the_kernels_rotational_and_write_cache() {
    let l = match common::make_loop("caps", 8, 512) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipping: {why}");
            return;
        }
    };
    let dev = FileDevice::open_block(&l.dev, FileOptions::default()).unwrap();
    let q = std::path::Path::new("/sys/block")
        .join(l.dev.file_name().unwrap())
        .join("queue");
    let rot = std::fs::read_to_string(q.join("rotational")).unwrap();
    let wc = std::fs::read_to_string(q.join("write_cache")).unwrap();
    assert_eq!(dev.caps().rotational, rot.trim() == "1");
    assert_eq!(dev.caps().write_cache, wc.trim() != "write through");
    assert!(!dev.caps().allocation, "a block device cannot tell holes");
}

/// An export advertises what its device has (flush, FUA, trim, rotational, WRITE_ZEROES,
/// block status), and tagstripe's client reads the same capabilities back.
#[cfg(feature = "nbd")]
#[test]
fn an_nbd_export_carries_its_capabilities_to_the_client() {
    use tagstripe::nbd::{NbdDevice, NbdServer, ServerConfig};
    rt().block_on(async {
        for (dev, rotational) in [
            (
                Arc::new(SimDevice::with_profile("hdd", Profile::HddModern, 1 << 16).unwrap())
                    as Arc<dyn DynBlockDevice>,
                true,
            ),
            (
                Arc::new(MemDevice::new("m", 1 << 16)) as Arc<dyn DynBlockDevice>,
                false,
            ),
        ] {
            let server = Arc::new(NbdServer::new(ServerConfig::default()).export("e", dev));
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let serving = tokio::spawn(Arc::clone(&server).serve(l));
            let c = NbdDevice::connect(&format!("nbd://{addr}/e"))
                .await
                .unwrap();
            let caps = c.caps();
            assert_eq!(caps.rotational, rotational);
            assert!(caps.flush && caps.fua && caps.trim && caps.fast_zero && caps.allocation);
            assert_eq!(caps.zeroing, Zeroing::Native, "WRITE_ZEROES is offered");
            drop(c);
            serving.abort();
        }
    });
}
