//! The crash lab's log: what a [`Recorder`](crate::Recorder) writes and
//! [`CrashLog::open`] reads back.
//!
//! The file is a 24-byte header (`TSCRASH\0`, version 1, CRC32) and then records, each
//! `len: u32 | crc: u32 | body[len]`, little-endian, the CRC32 over the body. A body starts
//! with its kind:
//!
//! | kind | body after the kind byte |
//! |---|---|
//! | 1 device | `dev: u16, block: u32, sectors: u64, zero_base: u8, name: [u8]` |
//! | 2 submit | `seq: u64, dev: u16, op: u8, flags: u8, start: u64, sectors: u64, data` (writes only) |
//! | 3 complete | `seq: u64, ok: u8` |
//! | 4 end | nothing: the recording stopped cleanly |
//!
//! Records appear in the order the recorder saw them: a request's submit record before it
//! is passed down, its complete record before its caller hears of it. So "A completed before
//! B was submitted" is "A's complete record comes before B's submit record": the order
//! every crash state respects. A recorder that dies mid-record leaves a torn last record;
//! [`Tail::Salvage`] reads up to it, [`Tail::Strict`] refuses the log and names the offset.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::{Error, Result};

/// The file's first bytes.
pub(crate) const MAGIC: &[u8; 8] = b"TSCRASH\0";
/// The format's version.
pub(crate) const VERSION: u32 = 1;
/// Length of the file header.
pub(crate) const HEADER_LEN: u64 = 24;
/// The longest record body a reader accepts (a write of 1 GiB and its fields): a longer
/// length field is corruption, not a record.
const MAX_BODY: u32 = (1 << 30) + 64;

const KIND_DEVICE: u8 = 1;
const KIND_SUBMIT: u8 = 2;
const KIND_COMPLETE: u8 = 3;
const KIND_END: u8 = 4;

/// Length of a submit record's fields (kind included), before a write's data.
pub(crate) const SUBMIT_LEN: usize = 1 + 8 + 2 + 1 + 1 + 8 + 8;

/// What a logged request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogOp {
    /// A write; its data is in the log.
    Write,
    /// A write of zeroes (NBD's `WRITE_ZEROES`).
    WriteZeroes,
    /// A discard (trim): after it the sectors read as zeroes on tagstripe's backends, so
    /// the crash lab treats it as a write of zeroes that may or may not have landed.
    Trim,
    /// A flush: every write completed before it was submitted is durable once it completes.
    Flush,
}

impl LogOp {
    fn code(self) -> u8 {
        match self {
            Self::Write => 1,
            Self::WriteZeroes => 2,
            Self::Trim => 3,
            Self::Flush => 4,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::Write,
            2 => Self::WriteZeroes,
            3 => Self::Trim,
            4 => Self::Flush,
            _ => return None,
        })
    }

    /// The operation's name, as `crash info` prints it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::WriteZeroes => "write-zeroes",
            Self::Trim => "trim",
            Self::Flush => "flush",
        }
    }
}

/// A recorded device: what its states are images of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogDevice {
    /// The device's name when it was recorded.
    pub name: String,
    /// Its size in 512-byte sectors.
    pub sectors: u64,
    /// Its logical block in bytes.
    pub block: u32,
    /// It read as zeroes throughout when recording began, so a state needs no base image.
    pub zero_base: bool,
}

/// A request's submit record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submit {
    /// The request's number, unique in the log.
    pub seq: u64,
    /// Which device (an index into [`CrashLog::devices`]).
    pub dev: u16,
    /// What it does.
    pub op: LogOp,
    /// Forced unit access: durable when it completes.
    pub fua: bool,
    /// First sector (0 for a flush).
    pub start: u64,
    /// Length in sectors (0 for a flush).
    pub sectors: u64,
    /// Where a write's data starts in the log file (0 for the other ops).
    pub data_at: u64,
}

/// One record of the request stream, in the log's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogEvent {
    /// A request was passed down.
    Submit(Submit),
    /// The request numbered `seq` completed (`ok`: successfully).
    Complete {
        /// The request's number.
        seq: u64,
        /// It succeeded.
        ok: bool,
    },
}

/// How [`CrashLog::open`] treats a log that does not end with its end record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tail {
    /// Refuse it, naming the offset where it breaks (the default: a log cut short by a
    /// copy is not read as if whole).
    #[default]
    Strict,
    /// Read the whole records before the break (a recorder that was killed).
    Salvage,
}

/// A crash-lab log, read and checked: the devices and the events, with each write's data
/// left in the file (read as states need it).
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use tagstripe::crash::{CrashLog, LogOp, Tail};
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, Recorder};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dir = std::env::temp_dir().join(format!("ts-doc-log-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("log");
/// let rec = Recorder::create(&path)?;
/// let dev = rec.record(MemDevice::new("m", 64)).await?;
/// dev.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new()).await?;
/// dev.flush(IoOpts::new()).await?;
/// rec.finish().await?;
///
/// let log = CrashLog::open(&path, Tail::Strict)?;
/// assert_eq!(log.devices()[0].sectors, 64);
/// let s = log.summary();
/// assert_eq!((s.writes, s.flushes, s.epochs), (1, 1, 2));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct CrashLog {
    path: std::path::PathBuf,
    devices: Vec<LogDevice>,
    events: Vec<LogEvent>,
    ended: bool,
    bytes: u64,
    file: File,
}

/// What a log holds, as `tagstripe crash info` prints it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogSummary {
    /// Writes, write-zeroes and trims submitted.
    pub writes: u64,
    /// Of them, with FUA.
    pub fua: u64,
    /// Flushes submitted.
    pub flushes: u64,
    /// Epochs: the stretches between completed flushes (one more than them).
    pub epochs: u64,
    /// Bytes the writes carried (write-zeroes and trims counted by their length).
    pub bytes_written: u64,
    /// Requests that completed with an error.
    pub failed: u64,
    /// Requests that never completed (in flight when recording stopped).
    pub in_flight: u64,
    /// The log file's length.
    pub log_bytes: u64,
}

impl CrashLog {
    /// Reads and checks the log at `path`: the header, every record's CRC, and that the
    /// records make sense (known devices, requests inside them, each request completed at
    /// most once, after it was submitted).
    ///
    /// # Errors
    /// [`Error::CrashLog`] with the byte offset where the log breaks: not a log, a torn or
    /// corrupted record, a record that contradicts the ones before it, or (with
    /// [`Tail::Strict`]) no end record; [`Error::Io`] if the file cannot be read.
    pub fn open(path: impl AsRef<Path>, tail: Tail) -> Result<Self> {
        let path = path.as_ref();
        let io = |e: std::io::Error| Error::Io {
            device: path.display().to_string(),
            op: "read",
            start: 0,
            sectors: 0,
            source: e,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut p = Parser {
            path: path.display().to_string(),
            r: BufReader::with_capacity(1 << 20, file.try_clone().map_err(io)?),
            at: 0,
            len,
            torn_tail: false,
        };
        p.header()?;
        let mut log = Self {
            path: path.to_owned(),
            devices: Vec::new(),
            events: Vec::new(),
            ended: false,
            bytes: len,
            file,
        };
        let mut open = std::collections::HashMap::<u64, u64>::new(); // seq -> offset
        let mut seen = std::collections::HashSet::<u64>::new();
        loop {
            let at = p.at;
            let body = match p.record() {
                Ok(Some(b)) => b,
                Ok(None) => break,
                Err(e) if tail == Tail::Salvage && p.torn_tail => {
                    tracing::warn!("{e}: reading the whole records before it");
                    log.bytes = at;
                    break;
                }
                Err(e) => return Err(e),
            };
            if log.ended {
                return Err(p.bad(at, "a record after the end record"));
            }
            log.apply(&p, at, &body, &mut open, &mut seen)?;
        }
        if !log.ended && tail == Tail::Strict {
            return Err(p.bad(
                log.bytes.min(p.at),
                "the log has no end record: the recording did not stop cleanly (the recorder \
                 was killed, or the file was cut short); salvage it to use the whole records \
                 before this point",
            ));
        }
        Ok(log)
    }

    fn apply(
        &mut self,
        p: &Parser,
        at: u64,
        body: &[u8],
        open: &mut std::collections::HashMap<u64, u64>,
        seen: &mut std::collections::HashSet<u64>,
    ) -> Result<()> {
        let mut f = Fields { b: body, at: 1 };
        let need = |what: &str| p.bad(at, &format!("a short {what} record"));
        match body[0] {
            KIND_DEVICE => {
                let (Some(dev), Some(block), Some(sectors), Some(zero)) =
                    (f.u16(), f.u32(), f.u64(), f.u8())
                else {
                    return Err(need("device"));
                };
                if usize::from(dev) != self.devices.len() {
                    return Err(p.bad(at, &format!("device {dev} declared out of order")));
                }
                if block < 512 || !block.is_power_of_two() || sectors == 0 {
                    return Err(p.bad(at, &format!("device {dev}: bad size or block")));
                }
                let name = String::from_utf8_lossy(f.rest()).into_owned();
                self.devices.push(LogDevice {
                    name,
                    sectors,
                    block,
                    zero_base: zero != 0,
                });
            }
            KIND_SUBMIT => {
                let (Some(seq), Some(dev), Some(op), Some(flags), Some(start), Some(sectors)) =
                    (f.u64(), f.u16(), f.u8(), f.u8(), f.u64(), f.u64())
                else {
                    return Err(need("submit"));
                };
                let op = LogOp::from_code(op)
                    .ok_or_else(|| p.bad(at, &format!("request {seq}: unknown op {op}")))?;
                let d = self.devices.get(usize::from(dev)).ok_or_else(|| {
                    p.bad(at, &format!("request {seq}: device {dev} is not declared"))
                })?;
                if op != LogOp::Flush && (sectors == 0 || start.saturating_add(sectors) > d.sectors)
                {
                    return Err(p.bad(
                        at,
                        &format!(
                            "request {seq}: {sectors} sectors at {start} are not inside device \
                             {dev} ({} sectors)",
                            d.sectors
                        ),
                    ));
                }
                let data_len = if op == LogOp::Write { sectors * 512 } else { 0 };
                if f.rest().len() as u64 != data_len {
                    return Err(p.bad(
                        at,
                        &format!(
                            "request {seq}: {} bytes of data for {data_len}",
                            f.rest().len()
                        ),
                    ));
                }
                if !seen.insert(seq) {
                    return Err(p.bad(at, &format!("request {seq} submitted twice")));
                }
                open.insert(seq, at);
                let data_at = if op == LogOp::Write {
                    at + 8 + SUBMIT_LEN as u64
                } else {
                    0
                };
                self.events.push(LogEvent::Submit(Submit {
                    seq,
                    dev,
                    op,
                    fua: flags & 1 != 0,
                    start,
                    sectors,
                    data_at,
                }));
            }
            KIND_COMPLETE => {
                let (Some(seq), Some(ok)) = (f.u64(), f.u8()) else {
                    return Err(need("complete"));
                };
                if open.remove(&seq).is_none() {
                    return Err(p.bad(at, &format!("request {seq} completed but not in flight")));
                }
                self.events.push(LogEvent::Complete { seq, ok: ok != 0 });
            }
            KIND_END => self.ended = true,
            k => return Err(p.bad(at, &format!("unknown record kind {k}"))),
        }
        Ok(())
    }

    /// The log file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recorded devices, in the order they were declared.
    #[must_use]
    pub fn devices(&self) -> &[LogDevice] {
        &self.devices
    }

    /// The request stream, in the log's order.
    #[must_use]
    pub fn events(&self) -> &[LogEvent] {
        &self.events
    }

    /// The recording stopped cleanly (the log has its end record).
    #[must_use]
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Reads `buf.len()` bytes of a write's data at `at` in the log (from [`Submit::data_at`]).
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read.
    pub fn read_data(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.read_exact_at(buf, at).map_err(|e| Error::Io {
            device: self.path.display().to_string(),
            op: "read",
            start: at / 512,
            sectors: buf.len() as u64 / 512,
            source: e,
        })
    }

    /// Counts of what the log holds.
    #[must_use]
    pub fn summary(&self) -> LogSummary {
        let mut s = LogSummary {
            epochs: 1,
            log_bytes: self.bytes,
            ..LogSummary::default()
        };
        let mut flushes = std::collections::HashSet::new();
        let mut open = std::collections::HashSet::new();
        for e in &self.events {
            match *e {
                LogEvent::Submit(r) => {
                    open.insert(r.seq);
                    if r.op == LogOp::Flush {
                        s.flushes += 1;
                        flushes.insert(r.seq);
                    } else {
                        s.writes += 1;
                        s.fua += u64::from(r.fua);
                        s.bytes_written += r.sectors * 512;
                    }
                }
                LogEvent::Complete { seq, ok } => {
                    open.remove(&seq);
                    if !ok {
                        s.failed += 1;
                    } else if flushes.contains(&seq) {
                        s.epochs += 1;
                    }
                }
            }
        }
        s.in_flight = open.len() as u64;
        s
    }
}

/// Reads records off the file, tracking the offset.
struct Parser {
    path: String,
    r: BufReader<File>,
    at: u64,
    len: u64,
    torn_tail: bool,
}

impl Parser {
    fn bad(&self, offset: u64, what: &str) -> Error {
        Error::CrashLog {
            path: self.path.clone(),
            offset,
            what: what.to_owned(),
        }
    }

    fn header(&mut self) -> Result<()> {
        let mut h = [0u8; HEADER_LEN as usize];
        if self.len < HEADER_LEN || self.r.read_exact(&mut h).is_err() {
            return Err(self.bad(0, "not a tagstripe crash log (shorter than its header)"));
        }
        if &h[..8] != MAGIC {
            return Err(self.bad(0, "not a tagstripe crash log (no TSCRASH magic)"));
        }
        let crc = u32::from_le_bytes(h[20..24].try_into().unwrap_or_default());
        if crc32fast::hash(&h[..20]) != crc {
            return Err(self.bad(0, "the log's header fails its checksum"));
        }
        let v = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
        if v != VERSION {
            return Err(self.bad(8, &format!("log format version {v}; this reads {VERSION}")));
        }
        self.at = HEADER_LEN;
        Ok(())
    }
}

impl Parser {
    /// The next record's body: `Ok(None)` at a clean end of file. After an error,
    /// `torn_tail` says whether it was the file's last record that broke (running past the
    /// end, or the last record failing its checksum): what a killed recorder leaves.
    fn record(&mut self) -> Result<Option<Vec<u8>>> {
        let at = self.at;
        if at == self.len {
            return Ok(None);
        }
        self.torn_tail = true;
        if self.len - at < 8 {
            return Err(self.bad(
                at,
                "a torn record: the file ends inside its length and checksum",
            ));
        }
        let mut h = [0u8; 8];
        self.r
            .read_exact(&mut h)
            .map_err(|e| self.bad(at, &format!("cannot read: {e}")))?;
        let len = u32::from_le_bytes(h[..4].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(h[4..].try_into().unwrap_or_default());
        let end = at + 8 + u64::from(len);
        if len == 0 || len > MAX_BODY {
            self.torn_tail = false;
            return Err(self.bad(at, &format!("a record of impossible length {len}")));
        }
        if end > self.len {
            return Err(self.bad(
                at,
                &format!(
                    "a torn record: {len} bytes long, but the file ends {} bytes into it",
                    self.len - at - 8
                ),
            ));
        }
        let mut body = vec![0u8; len as usize];
        self.r
            .read_exact(&mut body)
            .map_err(|e| self.bad(at, &format!("cannot read: {e}")))?;
        if crc32fast::hash(&body) != crc {
            self.torn_tail = end >= self.len;
            return Err(self.bad(at, "a record fails its checksum"));
        }
        self.torn_tail = false;
        self.at = end;
        Ok(Some(body))
    }
}

/// Little-endian fields of a record body.
struct Fields<'a> {
    b: &'a [u8],
    at: usize,
}

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let v = self.b.get(self.at..self.at + N)?.try_into().ok()?;
        self.at += N;
        Some(v)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn rest(&self) -> &[u8] {
        self.b.get(self.at..).unwrap_or_default()
    }
}

/// The file header.
pub(crate) fn file_header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    let crc = crc32fast::hash(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A device record's body.
pub(crate) fn device_body(dev: u16, d: &LogDevice) -> Vec<u8> {
    let mut b = vec![KIND_DEVICE];
    b.extend_from_slice(&dev.to_le_bytes());
    b.extend_from_slice(&d.block.to_le_bytes());
    b.extend_from_slice(&d.sectors.to_le_bytes());
    b.push(u8::from(d.zero_base));
    b.extend_from_slice(d.name.as_bytes());
    b
}

/// A submit record's fields (the data, for a write, follows them in the body).
pub(crate) fn submit_fields(s: &Submit) -> [u8; SUBMIT_LEN] {
    let mut b = [0u8; SUBMIT_LEN];
    b[0] = KIND_SUBMIT;
    b[1..9].copy_from_slice(&s.seq.to_le_bytes());
    b[9..11].copy_from_slice(&s.dev.to_le_bytes());
    b[11] = s.op.code();
    b[12] = u8::from(s.fua);
    b[13..21].copy_from_slice(&s.start.to_le_bytes());
    b[21..29].copy_from_slice(&s.sectors.to_le_bytes());
    b
}

/// A complete record's body.
pub(crate) fn complete_body(seq: u64, ok: bool) -> [u8; 10] {
    let mut b = [0u8; 10];
    b[0] = KIND_COMPLETE;
    b[1..9].copy_from_slice(&seq.to_le_bytes());
    b[9] = u8::from(ok);
    b
}

/// The end record's body.
pub(crate) const END_BODY: [u8; 1] = [KIND_END];
