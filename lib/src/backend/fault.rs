//! A device that injects faults, for users' own tests.

use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tagstripe_scheduler::Rng;

use crate::{BlockDevice, DeviceInfo, Error, IoOpts, Result};

/// Which operations a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// Reads.
    Read,
    /// Writes.
    Write,
    /// Flushes.
    Flush,
    /// Discards.
    Discard,
    /// All of them.
    Any,
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// An I/O error (EIO); nothing is done.
    Error,
    /// QUEUE FULL; nothing is done (the queue layer retries).
    QueueFull,
    /// BUSY; nothing is done (the queue layer retries later).
    Busy,
    /// A torn write: the first half of the write's sectors (rounded down to whole logical
    /// blocks) reaches the device, then an I/O error is returned. Other operations: as
    /// [`FaultKind::Error`].
    TornWrite,
}

/// One rule: which requests fail, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Operations it applies to.
    pub op: FaultOp,
    /// What happens.
    pub kind: FaultKind,
    /// Only requests overlapping `[start, end)` sectors (flush has no range and always
    /// matches).
    pub sectors: Option<(u64, u64)>,
    /// Only the n-th matching request (1-based); `None`: every matching request.
    pub nth: Option<u64>,
}

impl Fault {
    /// Every request of `op` fails with `kind`.
    #[must_use]
    pub fn always(op: FaultOp, kind: FaultKind) -> Self {
        Self {
            op,
            kind,
            sectors: None,
            nth: None,
        }
    }
}

#[derive(Debug)]
struct State {
    faults: Vec<(Fault, u64)>,
    random: Option<(f64, FaultKind, Rng)>,
    latency: Duration,
    dead: bool,
    injected: u64,
}

/// Wraps a device and fails chosen requests: by operation, sector range, the n-th request,
/// at random with a seeded rate, or all of them once [`kill`](Self::kill)ed (a component
/// failed for good). Adds latency. Faults are checked before anything reaches the inner
/// device, except the torn write, which writes a prefix first.
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, Fault, FaultDevice, FaultKind, FaultOp, IoOpts, MemDevice};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dev = FaultDevice::new(MemDevice::new("mem0", 1024));
/// dev.inject(Fault { sectors: Some((100, 200)), ..Fault::always(FaultOp::Write, FaultKind::Error) });
/// assert!(dev.write(150, Bytes::from(vec![1u8; 512]), IoOpts::new()).await.is_err());
/// assert!(dev.write(0, Bytes::from(vec![1u8; 512]), IoOpts::new()).await.is_ok());
/// # });
/// ```
#[derive(Debug)]
pub struct FaultDevice<D> {
    inner: D,
    state: Mutex<State>,
}

impl<D: BlockDevice> FaultDevice<D> {
    /// Wraps `inner` with no faults.
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            state: Mutex::new(State {
                faults: Vec::new(),
                random: None,
                latency: Duration::ZERO,
                dead: false,
                injected: 0,
            }),
        }
    }

    /// Adds a rule.
    pub fn inject(&self, fault: Fault) {
        self.state.lock().faults.push((fault, 0));
    }

    /// Fails each request with probability `p` (seeded, so runs repeat).
    pub fn random(&self, p: f64, kind: FaultKind, seed: u64) {
        self.state.lock().random = Some((p, kind, Rng::new(seed)));
    }

    /// Adds `latency` before every request.
    pub fn set_latency(&self, latency: Duration) {
        self.state.lock().latency = latency;
    }

    /// Every request fails from now on, as a dead disk.
    pub fn kill(&self) {
        self.state.lock().dead = true;
    }

    /// Removes every rule and revives the device.
    pub fn clear(&self) {
        let mut s = self.state.lock();
        s.faults.clear();
        s.random = None;
        s.dead = false;
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.state.lock().injected
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The fault for this request, if any, and the latency to add.
    fn decide(&self, op: FaultOp, range: Option<(u64, u64)>) -> (Option<FaultKind>, Duration) {
        let mut s = self.state.lock();
        let latency = s.latency;
        if s.dead {
            s.injected += 1;
            return (Some(FaultKind::Error), latency);
        }
        let mut hit = None;
        for (f, seen) in &mut s.faults {
            if f.op != FaultOp::Any && f.op != op {
                continue;
            }
            let overlaps = match (f.sectors, range) {
                (Some((a, b)), Some((s0, s1))) => s0 < b && a < s1,
                _ => true,
            };
            if !overlaps {
                continue;
            }
            *seen += 1;
            if f.nth.is_none_or(|n| n == *seen) {
                hit = Some(f.kind);
                break;
            }
        }
        if hit.is_none() {
            if let Some((p, kind, rng)) = &mut s.random {
                if rng.unit() < *p {
                    hit = Some(*kind);
                }
            }
        }
        if hit.is_some() {
            s.injected += 1;
        }
        (hit, latency)
    }

    fn error(&self, kind: FaultKind, op: &'static str, start: u64, sectors: u64) -> Error {
        let device = self.inner.info().name.clone();
        match kind {
            FaultKind::QueueFull => Error::QueueFull { device },
            FaultKind::Busy => Error::Busy { device },
            FaultKind::Error | FaultKind::TornWrite => Error::Io {
                device,
                op,
                start,
                sectors,
                // What a failing disk returns: EIO, so callers that look at the errno (and
                // the NBD server's replies) see a real one.
                source: std::io::Error::from_raw_os_error(libc::EIO),
            },
        }
    }
}

async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        self.info().check(start, sectors)?;
        let (fault, latency) = self.decide(FaultOp::Read, Some((start, start + sectors)));
        pause(latency).await;
        match fault {
            Some(k) => Err(self.error(k, "read", start, sectors)),
            None => self.inner.read(start, sectors, opts).await,
        }
    }

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let sectors = crate::device::sectors_of(self.info(), buf.len())?;
        self.info().check(start, sectors)?;
        let (fault, latency) = self.decide(FaultOp::Read, Some((start, start + sectors)));
        pause(latency).await;
        match fault {
            Some(k) => Err(self.error(k, "read", start, sectors)),
            None => self.inner.read_into(start, buf, opts).await,
        }
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info().check_write(start, data.len())?;
        let (fault, latency) = self.decide(FaultOp::Write, Some((start, start + sectors)));
        pause(latency).await;
        match fault {
            Some(FaultKind::TornWrite) => {
                let lbs = self.info().limits.lbs_sectors();
                let half = sectors / 2 / lbs * lbs;
                if half > 0 {
                    let prefix = data.slice(..half as usize * 512);
                    self.inner.write(start, prefix, opts).await?;
                }
                Err(self.error(FaultKind::TornWrite, "write", start, sectors))
            }
            Some(k) => Err(self.error(k, "write", start, sectors)),
            None => self.inner.write(start, data, opts).await,
        }
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        let (fault, latency) = self.decide(FaultOp::Flush, None);
        pause(latency).await;
        match fault {
            Some(k) => Err(self.error(k, "flush", 0, 0)),
            None => self.inner.flush(opts).await,
        }
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        crate::device::check_zeroes(self.info(), start, sectors)?;
        // Counted and failed as writes.
        let (fault, latency) = self.decide(FaultOp::Write, Some((start, start + sectors)));
        pause(latency).await;
        match fault {
            Some(k) => Err(self.error(k, "write-zeroes", start, sectors)),
            None => self.inner.write_zeroes(start, sectors, z, opts).await,
        }
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.info().check_discard(start, sectors)?;
        let (fault, latency) = self.decide(FaultOp::Discard, Some((start, start + sectors)));
        pause(latency).await;
        match fault {
            Some(k) => Err(self.error(k, "discard", start, sectors)),
            None => self.inner.discard(start, sectors, opts).await,
        }
    }

    /// Passed through: faults are for I/O, not for the allocation query.
    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        self.inner.allocation(start, sectors).await
    }
}
