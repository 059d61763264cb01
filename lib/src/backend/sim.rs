//! A simulated disk: the scheduler crate's `DiskModel` timing, on tokio's clock, with the
//! data kept in memory.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use tagstripe_scheduler::sim::{read as read_cmd, write as write_cmd};
use tagstripe_scheduler::{DiskCommand, DiskConfig, DiskEvent, DiskModel, Profile};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::{BlockDevice, DeviceInfo, Error, IoOpts, MemDevice, Result};

struct State {
    disk: DiskModel,
    epoch: Instant,
    waiters: HashMap<u32, oneshot::Sender<bool>>,
    next_tag: u32,
    driver: bool,
}

impl State {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn complete(&mut self, events: Vec<DiskEvent>) {
        for e in events {
            if let DiskEvent::Completed { tag, ok, .. } = e {
                if let Some(w) = self.waiters.remove(&tag) {
                    let _ = w.send(ok);
                }
            }
        }
    }
}

/// A device whose timing is a [`DiskModel`] (seek, rotation, tag window with QUEUE FULL,
/// write cache, SSD dies) running on tokio's clock: with a paused clock in tests, minutes
/// of disk time pass in milliseconds, deterministically. Data lives in memory, so it reads
/// back what was written. QUEUE FULL and BUSY surface as [`Error::QueueFull`] /
/// [`Error::Busy`] for a [`crate::Queue`] above it to handle; the model's mod-15 fault as
/// an I/O error.
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::scheduler::Profile;
/// use tagstripe::{BlockDevice, IoOpts, SimDevice};
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
/// let d = SimDevice::new("sim0", Profile::Hdd1998.config(), 1 << 20)?;
/// let too_big = Profile::Hdd1998.config().capacity_sectors + 1;
/// assert!(SimDevice::new("sim1", Profile::Hdd1998.config(), too_big).is_err());
/// let t = tokio::time::Instant::now();
/// d.write(2048, Bytes::from(vec![1u8; 4096]), IoOpts::new()).await?;
/// assert_eq!(d.read(2048, 8, IoOpts::new()).await?, vec![1u8; 4096]);
/// assert!(t.elapsed().as_micros() > 50, "the model's time passed");
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct SimDevice {
    data: MemDevice,
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl SimDevice {
    /// A simulated disk of `sectors` sectors with the model's parameters; its tag window is
    /// also its `max_tags`.
    ///
    /// # Errors
    /// [`Error::BadLength`] if `sectors` is 0 or more than the model's capacity (the model
    /// could not place the sectors beyond it).
    pub fn new(name: &str, cfg: DiskConfig, sectors: u64) -> Result<Self> {
        if sectors == 0 || sectors > cfg.capacity_sectors {
            return Err(Error::BadLength {
                device: name.to_owned(),
                what: format!(
                    "a simulated disk of {sectors} sectors: the model holds 1 to {}",
                    cfg.capacity_sectors
                ),
            });
        }
        let mut info = DeviceInfo::new(name, sectors);
        // A disk with heads unless the model is a solid-state one; zeroes written as data.
        info.caps.rotational = cfg.ssd.is_none();
        info.limits.max_tags = cfg.window.max(1);
        info.limits.min_tags = info.limits.min_tags.min(info.limits.max_tags);
        Ok(Self {
            data: MemDevice::with_info(info),
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    disk: DiskModel::new(cfg),
                    epoch: Instant::now(),
                    waiters: HashMap::new(),
                    next_tag: 0,
                    driver: false,
                }),
                wake: Notify::new(),
            }),
        })
    }

    /// Advertises `tags` as the device's `max_tags` while its real window stays the model's:
    /// a drive that reports QUEUE FULL below what it advertises (the Quantum Atlas quirk),
    /// so the queue above must back off.
    #[must_use]
    pub fn advertise_tags(mut self, tags: u32) -> Self {
        let l = &mut self.data.info_mut().limits;
        l.max_tags = tags.max(1);
        l.min_tags = l.min_tags.min(l.max_tags);
        self
    }

    /// A simulated disk with a named profile's parameters.
    ///
    /// # Errors
    /// As [`SimDevice::new`].
    pub fn with_profile(name: &str, profile: Profile, sectors: u64) -> Result<Self> {
        Self::new(name, profile.config(), sectors)
    }

    /// Runs one command through the model; resolves when the model completes it.
    async fn timed(&self, cmd: DiskCommand) -> Result<()> {
        let name = || self.data.info().name.clone();
        let rx = {
            let mut s = self.shared.state.lock();
            let now = s.now();
            let tag = s.next_tag;
            s.next_tag = s.next_tag.wrapping_add(1);
            let ev = s.disk.submit(now, tag, cmd).map_err(|e| Error::Io {
                device: name(),
                op: "submit",
                start: cmd.lba,
                sectors: cmd.sectors,
                source: std::io::Error::other(e.to_string()),
            })?;
            match ev {
                DiskEvent::QueueFull => return Err(Error::QueueFull { device: name() }),
                DiskEvent::Busy => return Err(Error::Busy { device: name() }),
                _ => {}
            }
            let (tx, rx) = oneshot::channel();
            s.waiters.insert(tag, tx);
            let events = s.disk.advance(now);
            s.complete(events);
            if !s.driver {
                s.driver = true;
                tokio::spawn(drive(Arc::downgrade(&self.shared)));
            }
            rx
        };
        self.shared.wake.notify_one();
        match rx.await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Io {
                device: name(),
                op: "write",
                start: cmd.lba,
                sectors: cmd.sectors,
                source: std::io::Error::other("simulated media error"),
            }),
            Err(_) => Err(Error::Closed { device: name() }),
        }
    }
}

/// Sleeps until the model's next event, completes what finished, and repeats; ends when the
/// device is dropped.
async fn drive(shared: Weak<Shared>) {
    loop {
        let Some(sh) = shared.upgrade() else { return };
        let next = {
            let mut s = sh.state.lock();
            let now = s.now();
            let events = s.disk.advance(now);
            s.complete(events);
            s.disk
                .next_event()
                .map(|t| s.epoch + std::time::Duration::from_nanos(t))
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = sh.wake.notified() => {}
                }
            }
            None => sh.wake.notified().await,
        }
    }
}

impl BlockDevice for SimDevice {
    fn info(&self) -> &DeviceInfo {
        self.data.info()
    }

    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        self.info().check(start, sectors)?;
        let cmd = DiskCommand {
            kind: opts.kind,
            ..read_cmd(start, sectors)
        };
        self.timed(cmd).await?;
        self.data.read(start, sectors, opts).await
    }

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let sectors = crate::device::sectors_of(self.info(), buf.len())?;
        self.info().check(start, sectors)?;
        let cmd = DiskCommand {
            kind: opts.kind,
            ..read_cmd(start, sectors)
        };
        self.timed(cmd).await?;
        self.data.read_into(start, buf, opts).await
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info().check_write(start, data.len())?;
        let cmd = DiskCommand {
            kind: opts.kind,
            ..write_cmd(start, sectors)
        };
        self.timed(cmd).await?;
        self.data.write(start, data, opts).await
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.data.flush(opts).await
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.data.discard(start, sectors, opts).await
    }
}
