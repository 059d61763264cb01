//! The recording layer: [`Recorder`] writes the log, [`Recorded`] wraps a device and tells
//! it every write, write-zeroes, trim and flush, with its data and flags, in submission and
//! completion order.
//!
//! The request path only hands the recorder its record (the data as `Bytes`, shared, not
//! copied) over a bounded channel; a thread of the recorder's own checksums and appends them,
//! writing out its buffer whenever it catches up. A request's submit record is queued before
//! the request goes down and its complete record before its caller hears of it, so the log's
//! order is an order the device really saw.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::log::{self, LogDevice, LogOp, Submit};
use crate::device::{check_parts, check_zeroes};
use crate::{BlockDevice, DeviceInfo, Error, IoOpts, Result, Zeroes};

/// How many records may wait for the recorder's thread before requests wait for it.
const QUEUE: usize = 4096;
/// The recorder's thread's nap between polls of a busy queue.
const NAP: std::time::Duration = std::time::Duration::from_micros(50);
/// Naps with nothing queued before the thread parks (about a millisecond).
const IDLE_POLLS: u32 = 20;

/// What the request path hands the recorder's thread.
enum Entry {
    /// A whole record body (device, complete).
    Body(Vec<u8>),
    /// A submit record: its fields and a write's data.
    Submit([u8; log::SUBMIT_LEN], Vec<Bytes>),
    /// A complete record: the request's number, and whether it succeeded.
    Complete(u64, bool),
    /// Write the end record, write out and sync the file, answer.
    Finish(oneshot::Sender<std::result::Result<(), String>>),
}

#[derive(Debug)]
struct Inner {
    path: String,
    tx: mpsc::Sender<Entry>,
    next_seq: AtomicU64,
    /// Submit and complete records queued so far.
    events: AtomicU64,
    devices: Mutex<u16>,
    /// Why the log cannot be written any more (set by the thread, or by `finish`).
    failed: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Body(_) => "Body",
            Self::Submit(..) => "Submit",
            Self::Complete(..) => "Complete",
            Self::Finish(_) => "Finish",
        })
    }
}

/// Records what devices are asked to write into a crash-lab log (the format is in
/// [`crash::log`](crate::crash)), for [`crash`](crate::crash) to replay as the states a power
/// cut could leave. One recorder may record several devices (a mirror's components, say):
/// their requests share one order, so a state is a state of all of them at once.
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, Recorder};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let path = std::env::temp_dir().join(format!("ts-doc-rec-{}", std::process::id()));
/// let rec = Recorder::create(&path)?;
/// let dev = rec.record(MemDevice::new("disk", 2048)).await?;
/// dev.write(8, Bytes::from(vec![7u8; 4096]), IoOpts::new().fua(true)).await?;
/// rec.finish().await?;
/// let log = tagstripe::crash::CrashLog::open(&path, tagstripe::crash::Tail::Strict)?;
/// assert_eq!(log.summary().fua, 1);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Recorder {
    inner: Arc<Inner>,
}

impl Recorder {
    /// Creates (or truncates) the log at `path` and starts the recorder's thread.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be created or its header written.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io = |e: std::io::Error| Error::Io {
            device: name.clone(),
            op: "create",
            start: 0,
            sectors: 0,
            source: e,
        };
        let mut file = File::create(path).map_err(io)?;
        file.write_all(&log::file_header()).map_err(io)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let failed = Arc::new(Mutex::new(None));
        let f2 = Arc::clone(&failed);
        // The thread ends when the last sender (the recorder's and its devices') is dropped.
        std::thread::Builder::new()
            .name("tagstripe-recorder".into())
            .spawn(move || writer(file, rx, &f2))
            .map_err(io)?;
        Ok(Self {
            inner: Arc::new(Inner {
                path: name,
                tx,
                next_seq: AtomicU64::new(0),
                events: AtomicU64::new(0),
                devices: Mutex::new(0),
                failed,
            }),
        })
    }

    /// Wraps `dev`: what it is asked to write from now on is recorded. Its content now is
    /// the states' starting point: a device that reads as zeroes throughout (new sparse
    /// files, say) is marked so and needs no base image; for any other, keep a copy of it as
    /// it is now to check the states against (`crash check --base`).
    ///
    /// # Errors
    /// [`Error::Recording`] if the log can no longer be written; the device's own error if
    /// its allocation cannot be read; [`Error::BadLength`] past 65,535 devices.
    pub async fn record<D: BlockDevice>(&self, dev: D) -> Result<Recorded<D>> {
        let info = dev.info().clone();
        let zero_base = dev
            .allocation(0, info.sectors)
            .await?
            .iter()
            .all(|e| e.zero);
        let id = {
            let mut n = self.inner.devices.lock();
            let id = *n;
            *n = n.checked_add(1).ok_or_else(|| Error::BadLength {
                device: info.name.clone(),
                what: "a log records at most 65,535 devices".into(),
            })?;
            id
        };
        let d = LogDevice {
            name: info.name.clone(),
            sectors: info.sectors,
            block: info.limits.logical_block_size,
            zero_base,
        };
        self.inner
            .send(&info.name, Entry::Body(log::device_body(id, &d)))
            .await?;
        Ok(Recorded {
            inner: dev,
            dev: id,
            zero_base,
            rec: Arc::clone(&self.inner),
        })
    }

    /// Ends the recording: the end record, the log written out and synced. Requests to the
    /// recorded devices fail after it ([`Error::Recording`]) rather than go unrecorded.
    ///
    /// # Errors
    /// [`Error::Recording`] if the log could not be written (now or earlier).
    pub async fn finish(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.inner.send(&self.inner.path, Entry::Finish(tx)).await?;
        let r = rx
            .await
            .unwrap_or_else(|_| Err("the recorder's thread stopped".into()));
        r.map_err(|what| Error::Recording {
            device: self.inner.path.clone(),
            what,
        })
    }

    /// How many submit and complete records have been queued so far: a position in the
    /// log's events ([`CrashLog::events`](crate::crash::CrashLog::events)) past every record
    /// of every request that has completed by now. A test that notes it after a flush
    /// returns knows that in a crash state at that point or later the flush had completed.
    #[must_use]
    pub fn events(&self) -> u64 {
        self.inner.events.load(Ordering::SeqCst)
    }

    /// The log's path.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.inner.path
    }
}

impl Inner {
    fn failure(&self, device: &str) -> Option<Error> {
        self.failed.lock().as_ref().map(|what| Error::Recording {
            device: device.to_owned(),
            what: what.clone(),
        })
    }

    async fn send(&self, device: &str, e: Entry) -> Result<()> {
        if let Some(e) = self.failure(device) {
            return Err(e);
        }
        self.tx.send(e).await.map_err(|_| Error::Recording {
            device: device.to_owned(),
            what: "the recorder's thread stopped".into(),
        })
    }
}

/// The recorder's thread: appends records, writes its buffer out whenever it has caught up
/// with the request path.
fn writer(file: File, mut rx: mpsc::Receiver<Entry>, failed: &Mutex<Option<String>>) {
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let fail = |e: &std::io::Error| {
        let mut f = failed.lock();
        if f.is_none() {
            *f = Some(format!("cannot write the log: {e}"));
        }
    };
    let mut dirty = false;
    // Polls that found the queue empty in a row. While requests keep coming the thread
    // naps between polls instead of parking, so the request path never pays to wake it; after
    // a millisecond with nothing it parks until the next record.
    let mut idle = 0;
    loop {
        let entry = match rx.try_recv() {
            Ok(e) => e,
            Err(mpsc::error::TryRecvError::Empty) => {
                if dirty {
                    if let Err(e) = w.flush() {
                        fail(&e);
                    }
                    dirty = false;
                }
                if idle < IDLE_POLLS {
                    idle += 1;
                    std::thread::sleep(NAP);
                    continue;
                }
                match rx.blocking_recv() {
                    Some(e) => e,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        idle = 0;
        if failed.lock().is_some() {
            if let Entry::Finish(tx) = entry {
                let _ = tx.send(Err(failed.lock().clone().unwrap_or_default()));
            }
            continue;
        }
        dirty = true;
        let r = match &entry {
            Entry::Body(b) => append(&mut w, b, &[]),
            Entry::Submit(fields, data) => append(&mut w, fields, data),
            Entry::Complete(seq, ok) => append(&mut w, &log::complete_body(*seq, *ok), &[]),
            Entry::Finish(_) => append(&mut w, &log::END_BODY, &[])
                .and_then(|()| w.flush())
                .and_then(|()| w.get_ref().sync_all()),
        };
        if let Err(e) = &r {
            fail(e);
        }
        if let Entry::Finish(tx) = entry {
            // Nothing is recorded after the end record: marked before the caller hears of
            // it, so a request it sends next is refused (marked after, a write sent at once
            // could slip in unrecorded; CI saw it). A write error kept, if there was one.
            failed
                .lock()
                .get_or_insert_with(|| "the recording has finished".into());
            let _ = tx.send(r.map_err(|e| format!("cannot write the log: {e}")));
        }
    }
    if let Err(e) = w.flush() {
        fail(&e);
    }
}

/// One record: length, CRC32 over the body, the body (`head` then `data`).
fn append(w: &mut BufWriter<File>, head: &[u8], data: &[Bytes]) -> std::io::Result<()> {
    let mut h = crc32fast::Hasher::new();
    h.update(head);
    let mut len = head.len();
    for d in data {
        h.update(d);
        len += d.len();
    }
    let len = u32::try_from(len)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "record over 4 GiB"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&h.finalize().to_le_bytes())?;
    w.write_all(head)?;
    for d in data {
        w.write_all(d)?;
    }
    Ok(())
}

/// A device whose writes, write-zeroes, trims and flushes are recorded by a [`Recorder`]
/// (made by [`Recorder::record`]); reads pass straight through. A request that fails its
/// checks is refused before it is recorded; one whose future is dropped before it completes
/// stays in flight in the log (it may or may not have landed, as after a power cut).
#[derive(Debug)]
pub struct Recorded<D> {
    inner: D,
    dev: u16,
    zero_base: bool,
    rec: Arc<Inner>,
}

impl<D: BlockDevice> Recorded<D> {
    /// The device under the recording.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The device read as zeroes throughout when recording began: its states need no base
    /// image. When it did not, keep a copy of it as it was for `crash check --base`.
    #[must_use]
    pub fn zero_base(&self) -> bool {
        self.zero_base
    }

    /// Its number in the log.
    #[must_use]
    pub fn index(&self) -> u16 {
        self.dev
    }

    /// Records a request around `io`: its submit record first, its outcome after.
    async fn logged(
        &self,
        op: LogOp,
        fua: bool,
        start: u64,
        sectors: u64,
        data: Vec<Bytes>,
        io: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        let seq = self.rec.next_seq.fetch_add(1, Ordering::Relaxed);
        let s = Submit {
            seq,
            dev: self.dev,
            op,
            fua,
            start,
            sectors,
            data_at: 0,
        };
        let name = &self.inner.info().name;
        // Counted before it is queued: `events()` never falls behind a queued record.
        self.rec.events.fetch_add(1, Ordering::SeqCst);
        self.rec
            .send(name, Entry::Submit(log::submit_fields(&s), data))
            .await?;
        let r = io.await;
        self.rec.events.fetch_add(1, Ordering::SeqCst);
        let done = self.rec.send(name, Entry::Complete(seq, r.is_ok())).await;
        r.and(done)
    }
}

impl<D: BlockDevice> BlockDevice for Recorded<D> {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        self.inner.read(start, sectors, opts).await
    }

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        self.inner.read_into(start, buf, opts).await
    }

    async fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> Result<()> {
        self.inner.read_vectored_into(start, bufs, opts).await
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info().check_write(start, data.len())?;
        let d = data.clone();
        self.logged(LogOp::Write, opts.fua, start, sectors, vec![d], async {
            self.inner.write(start, data, opts).await
        })
        .await
    }

    async fn write_vectored(&self, start: u64, parts: Vec<Bytes>, opts: IoOpts) -> Result<()> {
        let sectors = check_parts(self.info(), start, &parts)?;
        let d = parts.clone();
        self.logged(LogOp::Write, opts.fua, start, sectors, d, async {
            self.inner.write_vectored(start, parts, opts).await
        })
        .await
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        self.logged(LogOp::Flush, false, 0, 0, Vec::new(), async {
            self.inner.flush(opts).await
        })
        .await
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.info().check_discard(start, sectors)?;
        self.logged(LogOp::Trim, opts.fua, start, sectors, Vec::new(), async {
            self.inner.discard(start, sectors, opts).await
        })
        .await
    }

    async fn write_zeroes(&self, start: u64, sectors: u64, z: Zeroes, opts: IoOpts) -> Result<()> {
        check_zeroes(self.info(), start, sectors)?;
        self.logged(
            LogOp::WriteZeroes,
            opts.fua,
            start,
            sectors,
            Vec::new(),
            async { self.inner.write_zeroes(start, sectors, z, opts).await },
        )
        .await
    }

    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        self.inner.allocation(start, sectors).await
    }
}
