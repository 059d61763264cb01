//! The server's side of one NBD connection as a state machine with no I/O and no runtime
//! (sans-IO, in the manner of quinn-proto and rustls): it is fed the bytes the client sent,
//! and yields the bytes to send back and the requests ([`Op`]s) to run; the caller runs each
//! op against the export's device and hands the outcome back with
//! [`ServerSession::complete`]. A server's runtime glue (the `tagstripe` library's
//! `NbdServer`) is a thin loop around it; tests and the fuzz target drive it directly.
//!
//! It speaks fixed-newstyle negotiation (`EXPORT_NAME`, `INFO`, `GO`, `LIST`, `ABORT`,
//! `STRUCTURED_REPLY`, `LIST_META_CONTEXT`, `SET_META_CONTEXT`, `EXTENDED_HEADERS`) and
//! every command (`READ`, `WRITE`, `FLUSH`, `TRIM`, `CACHE`, `WRITE_ZEROES`, `BLOCK_STATUS`,
//! `DISC`), with simple, structured or extended replies as negotiated. Reads and writes
//! larger than the maximum request are cut into [`Op`]s of at most that size and let
//! out only as the connection's byte budget allows, so a request of any size streams
//! through bounded memory.
//!
//! ```
//! use std::sync::Arc;
//! use tagstripe_nbd_proto::session::{Catalog, ExportEntry, OpKind, Outcome, ServerSession, SessionConfig};
//! use tagstripe_nbd_proto::proto;
//!
//! let catalog = Arc::new(Catalog::new().with(ExportEntry::new("disk", 64 * 512)));
//! let mut s = ServerSession::new(catalog, SessionConfig::default());
//! let hello = s.take_output().unwrap();
//! assert_eq!(&hello[..8], &proto::NBDMAGIC.to_be_bytes());
//! // The client: fixed newstyle, no zeroes, then EXPORT_NAME "disk".
//! let mut c = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
//! c.extend(proto::OptionHeader { option: proto::OPT_EXPORT_NAME, length: 4 }.encode());
//! c.extend(b"disk");
//! c.extend(proto::Request { flags: 0, command: proto::Command::Read, handle: 7, offset: 0, length: 512 }.encode());
//! s.receive(&c).unwrap();
//! let _size_and_flags = s.take_output().unwrap();
//! let op = s.poll_op().unwrap();
//! assert_eq!((op.kind, op.offset, op.length), (OpKind::Read, 0, 512));
//! s.complete(op.id, Ok(Outcome::Data(vec![0u8; 512].into())));
//! let reply = s.take_output().unwrap();
//! assert_eq!(proto::SimpleReply::parse(&reply).unwrap().handle, 7);
//! ```

mod negotiation;
mod replies;
mod transmission;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};

use super::proto::{
    self, Chunk, ChunkHeader, Command, ExtendedRequest, InfoRequest, MetaContextRequest,
    OptionHeader, Request, SimpleReply, errno,
};

/// An export's block sizes, as its device reports them (see
/// [`ServerSession`]'s `NBD_INFO_BLOCK_SIZE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLimits {
    /// The smallest unit of I/O, in bytes (512 or 4096 mostly).
    pub logical_block_size: u32,
    /// The device's physical block, in bytes.
    pub physical_block_size: u32,
    /// The optimal I/O size in bytes (0: none said; a stripe's width).
    pub io_opt: u32,
}

impl Default for BlockLimits {
    fn default() -> Self {
        Self {
            logical_block_size: 512,
            physical_block_size: 512,
            io_opt: 0,
        }
    }
}

/// What an export's device can do, for its transmission flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportCaps {
    /// A flush makes writes durable (`NBD_FLAG_SEND_FLUSH`).
    pub flush: bool,
    /// Forced unit access is honoured (`NBD_FLAG_SEND_FUA`, with flush).
    pub fua: bool,
    /// Discards are taken (`NBD_FLAG_SEND_TRIM`).
    pub trim: bool,
    /// A spinning disk (`NBD_FLAG_ROTATIONAL`).
    pub rotational: bool,
}

/// Which component of a striped volume holds each part of it: what the session asks of a
/// volume, for the `tagstripe:component` metadata context.
pub trait ComponentLayout: Send + Sync + std::fmt::Debug {
    /// The runs of volume sectors `[start, start + sectors)`, in order: each run's length in
    /// sectors, the component that holds it and its mirror partner if any. `None` if the
    /// range cannot be mapped.
    fn component_map(&self, start: u64, sectors: u64) -> Option<Vec<(u64, usize, Option<usize>)>>;
}

/// One export as the session sees it: its name, size, block sizes and capabilities, how it
/// is offered, and, for a striped volume, its layout for the `tagstripe:component` context.
/// No device: the session only negotiates and validates; the runner runs the ops.
///
/// ```
/// use tagstripe_nbd_proto::session::{ExportCaps, ExportEntry};
/// let mut e = ExportEntry::new("disk", 1 << 30);
/// e.caps = ExportCaps { flush: true, fua: true, trim: true, rotational: false };
/// e.read_only = true;
/// assert_eq!(e.size, 1 << 30);
/// ```
#[derive(Clone, Debug)]
pub struct ExportEntry {
    /// The name clients ask for.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Block sizes.
    pub limits: BlockLimits,
    /// What the device can do.
    pub caps: ExportCaps,
    /// A description for `NBD_INFO_DESCRIPTION`.
    pub description: String,
    /// Refuse writes, zeroing and discards.
    pub read_only: bool,
    /// The volume's layout, for the `tagstripe:component` context.
    pub layout: Option<Arc<dyn ComponentLayout>>,
}

impl ExportEntry {
    /// A writable export of `size` bytes with 512-byte blocks and no capabilities.
    #[must_use]
    pub fn new(name: &str, size: u64) -> Self {
        Self {
            name: name.to_owned(),
            size,
            limits: BlockLimits::default(),
            caps: ExportCaps::default(),
            description: String::new(),
            read_only: false,
            layout: None,
        }
    }
}

/// The exports a server offers; the first added is the default (the empty name).
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    exports: BTreeMap<String, Arc<ExportEntry>>,
    default: Option<String>,
}

impl Catalog {
    /// No exports.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) an export.
    #[must_use]
    pub fn with(mut self, e: ExportEntry) -> Self {
        self.insert(e);
        self
    }

    /// Adds (or replaces) an export.
    pub fn insert(&mut self, e: ExportEntry) {
        if self.default.is_none() {
            self.default = Some(e.name.clone());
        }
        self.exports.insert(e.name.clone(), Arc::new(e));
    }

    /// The export called `name` ("" is the default one).
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Arc<ExportEntry>> {
        let key = if name.is_empty() {
            self.default.as_deref()?
        } else {
            name
        };
        self.exports.get(key)
    }

    /// Every export, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<ExportEntry>> {
        self.exports.values()
    }
}

/// Whether a connection may, or must, upgrade to TLS with `NBD_OPT_STARTTLS` (the
/// protocol's NOTLS, SELECTIVETLS with every export offered both ways, and FORCEDTLS modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsPolicy {
    /// No TLS: `STARTTLS` gets `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// TLS if the client asks; plain connections are served too.
    On,
    /// Every option before TLS other than `STARTTLS` and `ABORT` gets
    /// `NBD_REP_ERR_TLS_REQD`; no export's name, size or data is given in the clear.
    Require,
}

/// Limits of one connection.
#[derive(Clone, Copy, Debug)]
pub struct SessionConfig {
    /// The maximum payload advertised (default 32 MiB); also the size of the pieces larger
    /// requests are cut into.
    pub max_request: u32,
    /// Ops in flight at once (default 128).
    pub max_in_flight: usize,
    /// Bytes of request and reply data held (default 128 MiB); no new request is read
    /// beyond it (one request's payload may finish arriving).
    pub max_buffered: u64,
    /// TLS: off, offered, or required (the caller does the handshake when
    /// [`ServerSession::take_starttls`] says so).
    pub tls: TlsPolicy,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            max_request: 32 << 20,
            max_in_flight: 128,
            max_buffered: 128 << 20,
            tls: TlsPolicy::Off,
        }
    }
}

/// Why the session ended the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The client broke the protocol; the connection must be closed.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A read failed after its simple reply's header was sent: the protocol's only answer
    /// is to hang up.
    #[error(
        "read failed after its reply began (errno {0}): disconnecting, as the protocol requires"
    )]
    ReplyBroken(u32),
}

/// What an op is to do. Offsets and lengths are bytes; alignment to the device's blocks is
/// the runner's affair when no block sizes were agreed ([`Op::strict`] false).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Read; answer [`Outcome::Data`] (or [`Outcome::DataParts`]) of exactly `length` bytes.
    Read,
    /// Write these bytes (`length` of them; fewer when [`Op::on_stream`] is not 0: the rest
    /// follows them on the stream, for the caller to take itself).
    Write(Bytes),
    /// Flush.
    Flush,
    /// Discard (advisory).
    Trim,
    /// Make the range read as zeroes.
    WriteZeroes {
        /// May deallocate.
        unmap: bool,
        /// Only if fast, else fail with `ENOTSUP`.
        fast: bool,
    },
    /// Prefetch (no data returned).
    Cache,
    /// The allocation of the range; answer [`Outcome::Extents`].
    Allocation,
}

/// One request for the runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// Give this back to [`ServerSession::complete`].
    pub id: u64,
    /// What to do.
    pub kind: OpKind,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u64,
    /// Forced unit access.
    pub fua: bool,
    /// Block sizes were agreed: offset and length are whole logical blocks.
    pub strict: bool,
    /// Bytes of a write's payload not in [`OpKind::Write`]'s data but still on the stream,
    /// the next bytes the client sends: the caller takes them itself, then calls
    /// [`ServerSession::payload_taken`]. Always 0 unless the caller asked for it with
    /// [`ServerSession::hand_off_payloads`].
    pub on_stream: u64,
}

/// What an op produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done, nothing to return.
    Done,
    /// A read's data.
    Data(Bytes),
    /// A read's data in parts, one after the other (a striped volume's pieces, each as its
    /// device gave it): sent as they are, with no copy into one buffer.
    DataParts(Vec<Bytes>),
    /// An allocation query's extents (in sectors, from the op's offset, covering its
    /// range; the op's range is whole logical blocks).
    Extents(Vec<Extent>),
}

/// A run of an export's sectors with one allocation state (`NBD_STATE_HOLE`,
/// `NBD_STATE_ZERO`), as an allocation query answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Length in sectors (never 0).
    pub sectors: u64,
    /// Not allocated on the backing store (`NBD_STATE_HOLE`).
    pub hole: bool,
    /// Reads as zeroes (`NBD_STATE_ZERO`).
    pub zero: bool,
}

/// A failed op: the errno to answer and a message for the client's user.
pub type Failure = (u32, String);

/// Counts of one session, for the server's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Requests read in the transmission phase.
    pub requests: u64,
    /// Requests answered.
    pub replies: u64,
    /// Requests answered with an error.
    pub error_replies: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the client's 32-bit flags.
    Hello,
    Options,
    /// `STARTTLS` was acknowledged: nothing is read until the caller has done the TLS
    /// handshake ([`ServerSession::tls_established`]).
    StartTls,
    Transmission,
    /// Nothing more is read; closes once nothing is in flight.
    Draining,
    Closed,
}

/// The metadata contexts a connection can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Context {
    Allocation,
    Component,
}

impl Context {
    fn name(self) -> &'static str {
        match self {
            Self::Allocation => proto::CONTEXT_BASE_ALLOCATION,
            Self::Component => proto::CONTEXT_TAGSTRIPE_COMPONENT,
        }
    }
    fn id(self) -> u32 {
        match self {
            Self::Allocation => 1,
            Self::Component => 2,
        }
    }
}

/// A client request being answered, perhaps in several ops.
#[derive(Debug)]
struct Pending {
    cookie: u64,
    command: Command,
    flags: u16,
    offset: u64,
    length: u64,
    /// Ops of this request not yet completed.
    open: usize,
    /// Ops still to be let out (a large read's next piece starts at `next`).
    next: u64,
    /// Read pieces held for a simple reply, sent together once all are in (a simple
    /// reply's data cannot be interleaved with other replies).
    held: BTreeMap<u64, Bytes>,
    /// The reply was sent already (a structured read answered in one chunk).
    answered: bool,
    /// The first failure.
    failed: Option<(u64, Failure)>,
    /// A large write's payload still to arrive.
    to_receive: u64,
}

impl Pending {
    /// Nothing of the request is left: no op open, none to let out, no payload to come.
    fn done(&self) -> bool {
        self.open == 0 && self.next >= self.offset + self.length && self.to_receive == 0
    }
}

/// Where a large write's payload starts in memory: a page, the alignment `O_DIRECT` asks of
/// every device here.
pub(crate) const PAYLOAD_ALIGN: usize = 4096;
/// The smallest write payload piece received aligned.
pub(crate) const ALIGN_FROM: usize = 32 << 10;
/// Request headers are read alone (see [`ServerSession::input_limit`]) while the bytes of
/// writes long enough to hand off come to at least this much a request, on a moving
/// average over about the last [`STEER_WEIGHT`] requests. A header read alone costs a read
/// of the socket of its own, and short requests then come one a read where they came many:
/// with every header read alone after each long write, 4 KiB random writes to the shm file
/// over a Unix socket mixed with one 64 KiB write in ten ran at 0.85-0.87x, one in four at
/// 0.81-0.86x, where 64 KiB random 50/50 gained 1.08-1.12x. With this average: 0.98-1.02x,
/// 0.97-1.04x and 1.06-1.10x.
pub(crate) const STEER_FROM: u64 = 16 << 10;
/// The moving average's weight: each request counts 1/16 (see [`STEER_FROM`]).
pub(crate) const STEER_WEIGHT: u64 = 16;
/// A write counts at most this much in the average (a rare huge write would otherwise keep
/// headers read alone for long after it).
pub(crate) const STEER_CAP: u64 = 1 << 20;
/// The room each buffer of replies' headers and small data is made with (see
/// `ServerSession::seal`).
pub(crate) const SMALL_ROOM: usize = 4 << 10;
/// Room the input buffer has for reads (and keeps beyond a large payload).
pub(crate) const INPUT_ROOM: usize = 64 << 10;

/// Bytes being received for a request: a write's payload, or payload to throw away.
#[derive(Debug)]
enum Payload {
    /// The next `left` bytes belong to request `req` at `at`.
    Write { req: u64, at: u64, left: u64 },
    /// The caller is taking the next bytes of the stream, a piece of a write handed off
    /// (see [`ServerSession::hand_off_payloads`]); then the next `left` bytes belong to
    /// request `req` at `at`.
    HandedOff { req: u64, at: u64, left: u64 },
    /// The next `left` bytes of option data are discarded, then the option is refused.
    SkipOption { left: u64, option: u32 },
    /// The next `left` bytes are discarded, then `error` is sent for the request.
    Skip {
        left: u64,
        cookie: u64,
        offset: u64,
        error: u32,
    },
}

/// The server side of one NBD connection; see the [module](self) documentation.
#[derive(Debug)]
pub struct ServerSession {
    catalog: Arc<Catalog>,
    config: SessionConfig,
    phase: Phase,
    input: BytesMut,
    output: VecDeque<Bytes>,
    /// Replies' headers and small data, gathered to be sent as one item.
    small: BytesMut,
    /// Bytes of payload held for each output item (returned to the budget when taken).
    out_budget: VecDeque<u64>,
    no_zeroes: bool,
    structured: bool,
    extended: bool,
    /// Contexts selected, and the export they were selected for.
    contexts: Vec<Context>,
    contexts_for: Option<String>,
    export: Option<Arc<ExportEntry>>,
    strict: bool,
    payload: Option<Payload>,
    next_id: u64,
    /// Client requests answered in parts, by internal request id.
    requests: IdMap<Pending>,
    /// Ops in flight: op id -> (request id, offset of the piece).
    ops: IdMap<(u64, u64)>,
    ready: VecDeque<Op>,
    /// Requests with read pieces still to let out, in arrival order.
    streaming: VecDeque<u64>,
    buffered: u64,
    stopping: bool,
    stats: SessionStats,
    error: Option<SessionError>,
    /// The connection runs inside TLS.
    tls_active: bool,
    /// The caller is to start the TLS handshake now.
    starttls: bool,
    /// Write pieces handed off to the caller: (at least this many bytes on the stream, at
    /// most this long).
    hand_off: Option<(u64, u64)>,
    /// The bytes of writes long enough to hand off, a request, on a moving average (see
    /// [`STEER_FROM`]).
    landable: u64,
}

/// Option data larger than this is thrown away and refused (`NBD_REP_ERR_TOO_BIG`).
const MAX_OPTION: u64 = 64 << 10;
/// Runs of zeroes at least this long are sent as holes in structured read replies.
const HOLE_MIN: usize = 64 << 10;
/// Extents per block-status chunk at most (the protocol asks for no more than 2^20).
const MAX_EXTENTS: usize = 1 << 16;
/// The longest read or block-status range served on one request (larger: `EOVERFLOW`).
const MAX_SPAN: u64 = u32::MAX as u64;

impl ServerSession {
    /// A new connection: the server's greeting is already in the output.
    #[must_use]
    pub fn new(catalog: Arc<Catalog>, mut config: SessionConfig) -> Self {
        config.max_in_flight = config.max_in_flight.max(1);
        config.max_request = (config.max_request / 4096 * 4096).max(4096);
        config.max_buffered = config.max_buffered.max(config.max_request.into());
        let mut s = Self {
            catalog,
            config,
            phase: Phase::Hello,
            input: BytesMut::with_capacity(INPUT_ROOM),
            output: VecDeque::new(),
            small: BytesMut::with_capacity(SMALL_ROOM),
            out_budget: VecDeque::new(),
            no_zeroes: false,
            structured: false,
            extended: false,
            contexts: Vec::new(),
            contexts_for: None,
            export: None,
            strict: true,
            payload: None,
            next_id: 1,
            requests: IdMap::default(),
            ops: IdMap::default(),
            ready: VecDeque::new(),
            streaming: VecDeque::new(),
            buffered: 0,
            stopping: false,
            stats: SessionStats::default(),
            error: None,
            tls_active: false,
            starttls: false,
            hand_off: None,
            landable: 0,
        };
        let hello = proto::Hello {
            flags: proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES,
        };
        s.emit(&hello.encode());
        s
    }

    /// The buffer the caller reads client bytes into (then calls [`process`](Self::process)).
    pub fn input_buffer(&mut self) -> &mut BytesMut {
        &mut self.input
    }

    /// Takes in client bytes and handles what they complete.
    ///
    /// # Errors
    /// As [`process`](Self::process).
    pub fn receive(&mut self, data: &[u8]) -> Result<(), SessionError> {
        self.input.extend_from_slice(data);
        self.process()
    }

    /// Handles what the bytes in the input buffer complete: negotiation, requests, payload.
    /// Stops at the in-flight and byte limits (it continues when ops complete).
    ///
    /// # Errors
    /// [`SessionError`] when the client broke the protocol: the connection is over (send
    /// what [`take_output`](Self::take_output) still gives, then close).
    pub fn process(&mut self) -> Result<(), SessionError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let r = self.process_inner();
        if let Err(e) = &r {
            self.error = Some(e.clone());
            self.phase = Phase::Closed;
            self.input.clear();
        }
        r
    }

    /// The client closed its side: nothing more will arrive. What is in flight is still
    /// answered.
    pub fn end_of_input(&mut self) {
        if self.phase != Phase::Closed {
            self.phase = Phase::Draining;
        }
        self.payload = None;
        self.input.clear();
    }

    /// Hands write payloads off to the caller from now on (or no more, with `None`): a
    /// piece of a write of at most `max_piece` bytes of which at least `min_on_stream` have
    /// not yet been read into the [input buffer](Self::input_buffer) is let out at once as
    /// an [`Op`] with what has (all the buffer holds) and [`Op::on_stream`] the bytes that
    /// follow on the stream. The caller then reads those bytes from the stream itself
    /// (into a pipe, say, to `splice` them to a file with no copy through its memory),
    /// and calls [`payload_taken`](Self::payload_taken); until then the session asks for
    /// no input ([`wants_input`](Self::wants_input) is false) and reads none.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tagstripe_nbd_proto::session::{Catalog, ExportEntry, OpKind, Outcome, ServerSession, SessionConfig};
    /// # use tagstripe_nbd_proto::proto;
    /// # let catalog = Arc::new(Catalog::new().with(ExportEntry::new("disk", 1 << 20)));
    /// # let mut s = ServerSession::new(catalog, SessionConfig::default());
    /// # let mut c = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    /// # c.extend(proto::OptionHeader { option: proto::OPT_EXPORT_NAME, length: 4 }.encode());
    /// # c.extend(b"disk");
    /// # s.receive(&c).unwrap();
    /// # while s.take_output().is_some() {}
    /// s.hand_off_payloads(Some((64 << 10, 1 << 20)));
    /// // A 256 KiB write: its header and the first 4 KiB of its payload have been read.
    /// let w = proto::Request { flags: 0, command: proto::Command::Write, handle: 1, offset: 0, length: 256 << 10 };
    /// let mut wire = w.encode().to_vec();
    /// wire.extend([7u8; 4096]);
    /// s.receive(&wire).unwrap();
    /// let op = s.poll_op().unwrap();
    /// assert!(matches!(&op.kind, OpKind::Write(head) if head.len() == 4096));
    /// assert_eq!(op.on_stream, 252 << 10);
    /// assert!(!s.wants_input());
    /// // ... the caller reads the 252 KiB from the stream itself ...
    /// s.payload_taken();
    /// assert!(s.wants_input());
    /// s.complete(op.id, Ok(Outcome::Done));
    /// assert_eq!(proto::SimpleReply::parse(&s.take_output().unwrap()).unwrap().error, 0);
    /// ```
    pub fn hand_off_payloads(&mut self, pieces: Option<(u64, u64)>) {
        self.hand_off = pieces.map(|(min, max)| (min.max(1), max));
        // What was long enough before need not be now.
        self.landable = 0;
    }

    /// The caller has taken from the stream the bytes the last op it was given with
    /// [`Op::on_stream`] named (see [`hand_off_payloads`](Self::hand_off_payloads)): the
    /// session reads on (the rest of that write, if it is in pieces, then the next
    /// request). Ignored if no bytes were handed off.
    pub fn payload_taken(&mut self) {
        if let Some(Payload::HandedOff { req, at, left }) = self.payload {
            self.payload = (left > 0).then_some(Payload::Write { req, at, left });
            // The write's next piece (handed off at once if nothing of it is here yet), or
            // what follows (an error here ends the session, as `error()` then says).
            let _ = self.process();
        }
    }

    /// Stop reading requests (a shutdown); those already read are answered.
    pub fn stop(&mut self) {
        self.stopping = true;
        if matches!(self.phase, Phase::Hello | Phase::Options | Phase::StartTls) {
            self.phase = Phase::Closed;
        } else if self.phase == Phase::Transmission && self.payload.is_none() {
            self.phase = Phase::Draining;
        }
    }

    /// True once, when the client's `STARTTLS` was acknowledged: send what
    /// [`take_output`](Self::take_output) gives (the acknowledgement), then run the TLS
    /// handshake on the connection and call [`tls_established`](Self::tls_established);
    /// if the handshake fails, close.
    pub fn take_starttls(&mut self) -> bool {
        std::mem::take(&mut self.starttls)
    }

    /// The TLS handshake succeeded: negotiation starts again inside TLS.
    ///
    /// # Errors
    /// [`SessionError::Protocol`] if the client sent bytes in the clear after `STARTTLS`
    /// (they would have been the handshake's).
    pub fn tls_established(&mut self) -> Result<(), SessionError> {
        if !self.input.is_empty() {
            let e = SessionError::Protocol("data in the clear after STARTTLS".to_owned());
            self.error = Some(e.clone());
            self.phase = Phase::Closed;
            return Err(e);
        }
        self.tls_active = true;
        if self.phase == Phase::StartTls {
            self.phase = Phase::Options;
        }
        Ok(())
    }

    /// Whether the connection runs inside TLS.
    #[must_use]
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// At most how many bytes the caller should read next, if it matters: the bytes up to
    /// the end of the next request header, while payloads are
    /// [handed off](Self::hand_off_payloads) and writes long enough to be handed off make
    /// up much of what the client sends lately (on average 16 KiB or more of them a
    /// request, over about the last 16 requests). A header read alone leaves a write's whole payload on the
    /// stream, to be handed off (a read of as much as the buffer holds takes it in with its
    /// header, often all of it, and the caller then writes it from memory); it costs a read
    /// of its own, which a few long writes among many short requests do not repay. Never
    /// `Some(0)`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tagstripe_nbd_proto::session::{Catalog, ExportEntry, OpKind, Outcome, ServerSession, SessionConfig};
    /// # use tagstripe_nbd_proto::proto;
    /// # let catalog = Arc::new(Catalog::new().with(ExportEntry::new("disk", 1 << 20)));
    /// # let mut s = ServerSession::new(catalog, SessionConfig::default());
    /// # let mut c = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    /// # c.extend(proto::OptionHeader { option: proto::OPT_EXPORT_NAME, length: 4 }.encode());
    /// # c.extend(b"disk");
    /// # s.receive(&c).unwrap();
    /// # while s.take_output().is_some() {}
    /// s.hand_off_payloads(Some((32 << 10, 1 << 20)));
    /// assert_eq!(s.input_limit(), None);
    /// // 64 KiB writes came whole with their headers: they are written from memory ...
    /// let w = proto::Request { flags: 0, command: proto::Command::Write, handle: 1, offset: 0, length: 64 << 10 };
    /// for _ in 0..5 {
    ///     let mut wire = w.encode().to_vec();
    ///     wire.extend([7u8; 64 << 10]);
    ///     s.receive(&wire).unwrap();
    ///     let op = s.poll_op().unwrap();
    ///     assert_eq!(op.on_stream, 0);
    ///     s.complete(op.id, Ok(Outcome::Done));
    /// }
    /// // ... and the next header is read alone (28 bytes, a compact request).
    /// assert_eq!(s.input_limit(), Some(28));
    /// s.receive(&w.encode()[..10]).unwrap();
    /// assert_eq!(s.input_limit(), Some(18));
    /// ```
    #[must_use]
    pub fn input_limit(&self) -> Option<usize> {
        if self.hand_off.is_none()
            || self.landable < STEER_FROM
            || self.phase != Phase::Transmission
        {
            return None;
        }
        let header = if self.extended {
            ExtendedRequest::LEN
        } else {
            Request::LEN
        } as u64;
        let have = self.input.len() as u64;
        let to_header_end = match self.payload {
            None => header,
            Some(Payload::Write { left, .. }) => {
                // The rest of the piece being read, then the next header if it is the last.
                let step = u64::from(self.config.max_request);
                left.min(step) + if left <= step { header } else { 0 }
            }
            Some(_) => return None,
        };
        usize::try_from(to_header_end.checked_sub(have)?)
            .ok()
            .filter(|n| *n > 0)
    }

    /// Whether the caller should read more client bytes now.
    #[must_use]
    pub fn wants_input(&self) -> bool {
        match self.phase {
            Phase::Hello | Phase::Options => true,
            Phase::Transmission => match self.payload {
                // The caller is taking the bytes itself.
                Some(Payload::HandedOff { .. }) => false,
                Some(_) => true,
                None => {
                    self.ops.len() < self.config.max_in_flight
                        && self.buffered < self.config.max_buffered
                        && self.streaming.is_empty()
                }
            },
            Phase::StartTls | Phase::Draining | Phase::Closed => false,
        }
    }

    /// Still negotiating (the caller bounds this with a timeout).
    #[must_use]
    pub fn negotiating(&self) -> bool {
        matches!(self.phase, Phase::Hello | Phase::Options | Phase::StartTls)
    }

    /// In the transmission phase (or past it).
    #[must_use]
    pub fn transmitting(&self) -> bool {
        self.export.is_some()
    }

    /// The export chosen, once in transmission.
    #[must_use]
    pub fn export(&self) -> Option<&Arc<ExportEntry>> {
        self.export.as_ref()
    }

    /// The connection is over: nothing in flight, nothing more to read. Send what
    /// [`take_output`](Self::take_output) gives, then close.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Draining | Phase::Closed) && self.ops.is_empty()
    }

    /// Ops handed out and not yet completed.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    /// The error that ended the connection, if one did.
    #[must_use]
    pub fn error(&self) -> Option<&SessionError> {
        self.error.as_ref()
    }

    /// What the session has counted.
    #[must_use]
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// The next bytes to send, if any. Bytes taken count as sent: their data leaves the
    /// connection's byte budget.
    pub fn take_output(&mut self) -> Option<Bytes> {
        if !self.small.is_empty() {
            self.seal();
        }
        let b = self.output.pop_front()?;
        let held = self.out_budget.pop_front().unwrap_or(0);
        if held > 0 {
            self.buffered = self.buffered.saturating_sub(held);
            self.release_streams();
            // Budget came free: requests already received may go on (an error here ends
            // the session, as `error()` and `is_finished()` then say).
            let _ = self.process();
        }
        Some(b)
    }

    /// The next op to run, if any.
    pub fn poll_op(&mut self) -> Option<Op> {
        self.release_streams();
        self.ready.pop_front()
    }

    /// The outcome of op `id`. Unknown ids are ignored.
    pub fn complete(&mut self, id: u64, result: Result<Outcome, Failure>) {
        let Some((req, at)) = self.ops.remove(&id) else {
            return;
        };
        let Some(mut p) = self.requests.remove(&req) else {
            return;
        };
        p.open -= 1;
        match p.command {
            Command::Write => {
                self.buffered = self.buffered.saturating_sub(self.piece_len(&p, at));
            }
            Command::Read => {
                // The piece's bytes stay in the budget until they are sent.
                let len = self.piece_len(&p, at);
                match result {
                    Ok(Outcome::Data(d)) if d.len() as u64 == len => {
                        self.read_piece(&mut p, at, d);
                    }
                    Ok(Outcome::DataParts(parts))
                        if parts.iter().map(|d| d.len() as u64).sum::<u64>() == len =>
                    {
                        self.read_parts(&mut p, at, parts);
                    }
                    Ok(_) => {
                        self.buffered = self.buffered.saturating_sub(len);
                        let msg = "the device returned a read of the wrong length".to_owned();
                        p.failed.get_or_insert((at, (errno::EIO, msg)));
                    }
                    Err(f) => {
                        self.buffered = self.buffered.saturating_sub(len);
                        p.failed.get_or_insert((at, f));
                    }
                }
                self.finish_or_keep(req, p);
                let _ = self.process();
                return;
            }
            _ => {}
        }
        match result {
            Ok(Outcome::Extents(ext)) if p.command == Command::BlockStatus => {
                self.block_status_reply(&p, Some(ext));
                self.count_reply(false);
                let _ = self.process();
                return;
            }
            Ok(_) if p.command == Command::BlockStatus => {
                let msg = "the device gave no extents".to_owned();
                p.failed.get_or_insert((at, (errno::EIO, msg)));
            }
            Ok(_) => {}
            Err(f) => {
                p.failed.get_or_insert((at, f));
            }
        }
        self.finish_or_keep(req, p);
        let _ = self.process();
    }
}

/// A map keyed by the session's own ids (requests and ops, numbered one after another from
/// one counter): keys no client chooses, so a multiplication spreads them over the table
/// where the default hasher (SipHash, made to resist keys chosen to collide) costs several
/// times as much, a few times a request.
type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Hashes a session id with one multiplication by an odd constant (Fibonacci hashing, the
/// golden ratio's 64-bit multiple): consecutive ids land in distinct buckets (the low bits
/// are a bijection) with their high bits, which the table's tags take, spread.
#[derive(Default)]
struct IdHasher(u64);

/// 2^64 divided by the golden ratio, made odd.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u64` keys; any other bytes mixed in one at a time.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(GOLDEN);
    }
}

#[cfg(test)]
mod tests {
    use super::replies::{all_zero, zero_runs};
    use super::*;

    #[test]
    fn consecutive_ids_hash_to_distinct_buckets_and_spread_tags() {
        let hash = |id: u64| {
            let mut h = IdHasher::default();
            h.write_u64(id);
            h.finish()
        };
        // Any run of 4,096 consecutive ids fills a table of 4,096 buckets once each.
        for base in [1u64, 1 << 20, u64::MAX - 4096] {
            let mut seen = vec![false; 4096];
            for id in base..base + 4096 {
                seen[(hash(id) & 4095) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s), "from {base}");
        }
        // And their top 7 bits (the table's tags) take every value.
        let tags: std::collections::BTreeSet<u64> = (1..4097).map(|id| hash(id) >> 57).collect();
        assert_eq!(tags.len(), 128);
        // As a map: what goes in comes out.
        let mut m = IdMap::default();
        for id in 1..1000u64 {
            m.insert(id, id * 3);
        }
        assert!((1..1000u64).all(|id| m.remove(&id) == Some(id * 3)) && m.is_empty());
        let mut h = IdHasher::default();
        h.write(b"ab");
        assert_ne!(h.finish(), IdHasher::default().finish());
    }

    fn session(tls: TlsPolicy) -> ServerSession {
        session_sized(tls, 64 * 512)
    }

    fn session_sized(tls: TlsPolicy, bytes: u64) -> ServerSession {
        let catalog = Arc::new(Catalog::new().with(ExportEntry::new("vol", bytes)));
        let mut s = ServerSession::new(
            catalog,
            SessionConfig {
                tls,
                ..SessionConfig::default()
            },
        );
        assert_eq!(s.take_output().unwrap().len(), proto::Hello::LEN);
        s.receive(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
            .unwrap();
        s
    }

    fn option(s: &mut ServerSession, option: u32, data: &[u8]) -> Vec<u32> {
        let h = OptionHeader {
            option,
            length: data.len() as u32,
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(data);
        let _ = s.receive(&b);
        let mut out = Vec::new();
        while let Some(o) = s.take_output() {
            out.extend_from_slice(&o);
        }
        let mut kinds = Vec::new();
        let mut at = 0;
        while at + proto::OptionReply::LEN <= out.len() {
            let r = proto::OptionReply::parse(&out[at..]).unwrap();
            kinds.push(r.reply);
            at += proto::OptionReply::LEN + r.length as usize;
        }
        kinds
    }

    /// A session in transmission on export "vol" (64 MiB), the options `opts` (each without
    /// data) acknowledged before `NBD_OPT_GO`.
    fn transmitting(opts: &[u32]) -> ServerSession {
        let catalog = Arc::new(Catalog::new().with(ExportEntry::new("vol", 64 << 20)));
        let mut s = ServerSession::new(catalog, SessionConfig::default());
        while s.take_output().is_some() {}
        s.receive(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
            .unwrap();
        for &o in opts {
            assert_eq!(option(&mut s, o, &[]), [proto::REP_ACK], "option {o}");
        }
        assert_eq!(
            option(&mut s, proto::OPT_GO, &go_data()).last(),
            Some(&proto::REP_ACK)
        );
        s
    }

    fn go_data() -> Vec<u8> {
        InfoRequest {
            name: "vol".to_owned(),
            requests: vec![],
        }
        .encode()
    }

    #[test]
    fn tls_required_answers_nothing_but_starttls_in_the_clear() {
        let mut s = session(TlsPolicy::Require);
        assert_eq!(
            option(&mut s, proto::OPT_LIST, &[]),
            [proto::REP_ERR_TLS_REQD]
        );
        assert_eq!(
            option(&mut s, proto::OPT_GO, &go_data()),
            [proto::REP_ERR_TLS_REQD]
        );
        assert!(!s.transmitting());
        assert_eq!(
            option(&mut s, proto::OPT_STRUCTURED_REPLY, &[]),
            [proto::REP_ERR_TLS_REQD]
        );
        assert_eq!(option(&mut s, proto::OPT_STARTTLS, &[]), [proto::REP_ACK]);
        assert!(s.take_starttls() && !s.wants_input());
        s.tls_established().unwrap();
        assert!(s.tls_active());
        assert_eq!(
            option(&mut s, proto::OPT_STARTTLS, &[]),
            [proto::REP_ERR_INVALID]
        );
        let kinds = option(&mut s, proto::OPT_GO, &go_data());
        assert_eq!(kinds.last(), Some(&proto::REP_ACK));
        assert!(s.transmitting());
    }

    #[test]
    fn tls_required_closes_a_plain_export_name() {
        let mut s = session(TlsPolicy::Require);
        let h = OptionHeader {
            option: proto::OPT_EXPORT_NAME,
            length: 3,
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(b"vol");
        assert!(s.receive(&b).is_err());
        assert!(s.take_output().is_none() && !s.transmitting());
    }

    #[test]
    fn tls_on_serves_plain_clients_and_forgets_clear_negotiation() {
        let mut s = session(TlsPolicy::On);
        assert_eq!(
            option(&mut s, proto::OPT_STRUCTURED_REPLY, &[]),
            [proto::REP_ACK]
        );
        assert_eq!(option(&mut s, proto::OPT_STARTTLS, &[]), [proto::REP_ACK]);
        assert!(s.take_starttls());
        // Plain bytes where the handshake should be: refused.
        s.input_buffer().extend_from_slice(b"junk");
        assert!(s.tls_established().is_err());
        // A plain client on the same policy is served.
        let mut p = session(TlsPolicy::On);
        let kinds = option(&mut p, proto::OPT_GO, &go_data());
        assert_eq!(kinds.last(), Some(&proto::REP_ACK));
        assert!(p.transmitting() && !p.tls_active());
        // Off: STARTTLS is unsupported.
        let mut o = session(TlsPolicy::Off);
        assert_eq!(
            option(&mut o, proto::OPT_STARTTLS, &[]),
            [proto::REP_ERR_UNSUP]
        );
    }

    /// A flush whose header carries an offset and length that would overflow when added
    /// (they must be zero, and are not checked for a command without a range) is served,
    /// with no range passed on: found by the `nbd_tls` fuzz target.
    #[test]
    fn a_flush_with_garbage_offset_and_length_is_served() {
        let mut s = session(TlsPolicy::Off);
        assert_eq!(
            option(&mut s, proto::OPT_GO, &go_data()).last(),
            Some(&proto::REP_ACK)
        );
        let r = Request {
            flags: 0,
            command: Command::Flush,
            handle: 9,
            offset: u64::MAX - 3,
            length: u32::MAX,
        };
        s.receive(&r.encode()).unwrap();
        let op = s.poll_op().expect("the flush is passed on");
        assert_eq!(
            (op.kind.clone(), op.offset, op.length),
            (OpKind::Flush, 0, 0)
        );
        s.complete(op.id, Ok(Outcome::Done));
        let mut out = Vec::new();
        while let Some(o) = s.take_output() {
            out.extend_from_slice(&o);
        }
        let reply = SimpleReply::parse(&out).unwrap();
        assert_eq!((reply.error, reply.handle), (0, 9));
    }

    /// A 1 MiB write whose payload arrives in pieces (after a byte of its header's neighbour
    /// shifted everything off any alignment) is handed on starting on a page, with its bytes
    /// intact; so is a second one right behind it.
    #[test]
    fn a_large_write_payload_arriving_in_pieces_is_handed_on_page_aligned() {
        let mut s = session_sized(TlsPolicy::Off, 4 << 20);
        assert_eq!(
            option(&mut s, proto::OPT_GO, &go_data()).last(),
            Some(&proto::REP_ACK)
        );
        for (handle, first) in [(1u64, 3usize), (2, 70_001)] {
            let data: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8).collect();
            let r = Request {
                flags: 0,
                command: Command::Write,
                handle,
                offset: 0,
                length: data.len() as u32,
            };
            let mut wire = r.encode().to_vec();
            wire.extend_from_slice(&data);
            // The header and a few bytes, then the rest in 64 KiB reads.
            let (head, rest) = wire.split_at(Request::LEN + first);
            s.receive(head).unwrap();
            assert!(s.poll_op().is_none());
            for piece in rest.chunks(64 << 10) {
                s.receive(piece).unwrap();
            }
            let op = s.poll_op().expect("the write");
            let OpKind::Write(got) = &op.kind else {
                panic!("{:?}", op.kind)
            };
            assert_eq!(got.as_ptr() as usize % PAYLOAD_ALIGN, 0, "write {handle}");
            assert_eq!(&got[..], &data[..]);
            s.complete(op.id, Ok(Outcome::Done));
            while s.take_output().is_some() {}
        }
    }

    /// Write payloads handed off to the caller: a write in three pieces is let out piece by
    /// piece, each with what the buffer held and the rest on the stream, nothing read
    /// meanwhile; the next request is parsed only once the last piece was taken; a write
    /// mostly here already, or small, is not handed off; a single reply answers the three
    /// pieces. A stop while a payload is being taken lets it finish, then reads nothing more.
    #[test]
    fn handed_off_payloads_leave_the_stream_to_the_caller_in_order() {
        let catalog = Arc::new(Catalog::new().with(ExportEntry::new("vol", 64 << 20)));
        let config = SessionConfig {
            max_request: 1 << 20,
            ..SessionConfig::default()
        };
        let mut s = ServerSession::new(catalog, config);
        while s.take_output().is_some() {}
        s.receive(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
            .unwrap();
        assert_eq!(
            option(&mut s, proto::OPT_GO, &go_data()).last(),
            Some(&proto::REP_ACK)
        );
        s.hand_off_payloads(Some((64 << 10, 1 << 20)));
        let write = |handle: u64, offset: u64, length: u32| {
            Request {
                flags: 0,
                command: Command::Write,
                handle,
                offset,
                length,
            }
            .encode()
            .to_vec()
        };
        // 3 MiB: the header and 10 bytes arrive.
        let mut wire = write(1, 0, 3 << 20);
        wire.extend([1u8; 10]);
        s.receive(&wire).unwrap();
        let op = s.poll_op().expect("the first piece");
        assert_eq!(
            (op.offset, op.length, op.on_stream),
            (0, 1 << 20, (1 << 20) - 10)
        );
        assert!(matches!(&op.kind, OpKind::Write(h) if h[..] == [1u8; 10]));
        assert!(!s.wants_input());
        // Bytes that come meanwhile are not the session's to parse.
        s.receive(&write(2, 0, 4096)).unwrap();
        assert!(s.poll_op().is_none());
        s.input_buffer().clear();
        let mut ids = vec![op.id];
        for at in [1u64 << 20, 2 << 20] {
            s.payload_taken();
            let op = s.poll_op().expect("the next piece, at once");
            assert_eq!((op.offset, op.length, op.on_stream), (at, 1 << 20, 1 << 20));
            assert!(matches!(&op.kind, OpKind::Write(h) if h.is_empty()));
            assert!(!s.wants_input());
            ids.push(op.id);
        }
        s.payload_taken();
        assert!(s.poll_op().is_none() && s.wants_input());
        // A 64 KiB write, and a 1 MiB one with all but 1000 bytes here: not handed off.
        let mut wire = write(3, 4 << 20, 64 << 10);
        wire.extend(vec![3u8; 64 << 10]);
        wire.extend(write(4, 8 << 20, 1 << 20));
        wire.extend(vec![4u8; (1 << 20) - 1000]);
        s.receive(&wire).unwrap();
        let op = s.poll_op().expect("the 64 KiB write");
        assert_eq!((op.length, op.on_stream), (64 << 10, 0));
        ids.push(op.id);
        assert!(s.poll_op().is_none() && s.wants_input());
        s.receive(&[4u8; 1000]).unwrap();
        let op = s.poll_op().expect("the 1 MiB write, whole");
        assert!(matches!(&op.kind, OpKind::Write(d) if d.len() == 1 << 20));
        assert_eq!(op.on_stream, 0);
        ids.push(op.id);
        for id in ids {
            s.complete(id, Ok(Outcome::Done));
        }
        let mut out = Vec::new();
        while let Some(o) = s.take_output() {
            out.extend_from_slice(&o);
        }
        let handles: Vec<u64> = out
            .chunks(SimpleReply::LEN)
            .map(|r| SimpleReply::parse(r).unwrap())
            .inspect(|r| assert_eq!(r.error, 0))
            .map(|r| r.handle)
            .collect();
        assert_eq!(handles, [1, 3, 4], "one reply for the three pieces");
        // A stop while a payload is being taken: it finishes; the next request is not read.
        let mut wire = write(5, 0, 512 << 10);
        wire.extend([5u8; 512]);
        s.receive(&wire).unwrap();
        let op = s.poll_op().expect("handed off");
        assert_eq!(op.on_stream, (512 << 10) - 512);
        s.stop();
        assert!(!s.is_finished());
        s.payload_taken();
        s.receive(&write(6, 0, 4096)).unwrap();
        assert!(s.poll_op().is_none() && !s.wants_input());
        s.complete(op.id, Ok(Outcome::Done));
        let reply = s.take_output().unwrap();
        assert_eq!(SimpleReply::parse(&reply).unwrap().handle, 5);
        assert!(s.is_finished());
    }

    /// While writes long enough to hand off make up much of the traffic, the session asks
    /// for each request header to be read alone (the bytes up to its end, whatever was read
    /// of it), and for a short write's payload with the next header, so that the next long
    /// write's payload stays on the stream and is handed off whole. One long write in ten
    /// requests never starts it (a read of its own for every request costs more than the
    /// few payloads landed repay); long writes one after the other do, within a few; reads
    /// wear it off; a 1 MiB write starts it at once. With extended headers a header is 32
    /// bytes. Without hand-offs it never asks.
    #[test]
    fn while_long_writes_make_up_the_traffic_each_request_header_is_read_alone() {
        for extended in [false, true] {
            let mut s = transmitting(if extended {
                &[proto::OPT_EXTENDED_HEADERS]
            } else {
                &[]
            });
            let header = if extended { 32 } else { 28 };
            let request = |command: Command, handle: u64, length: u32| {
                if extended {
                    ExtendedRequest {
                        flags: if command == Command::Write {
                            proto::CMD_FLAG_PAYLOAD_LEN
                        } else {
                            0
                        },
                        command,
                        handle,
                        offset: (handle % 48) << 20,
                        length: u64::from(length),
                    }
                    .encode()
                    .to_vec()
                } else {
                    Request {
                        flags: 0,
                        command,
                        handle,
                        offset: (handle % 48) << 20,
                        length,
                    }
                    .encode()
                    .to_vec()
                }
            };
            // Answers what was let out (with no more than a few ops in flight at once).
            let take = |s: &mut ServerSession, ids: &mut Vec<u64>| {
                while let Some(op) = s.poll_op() {
                    ids.push(op.id);
                }
                for id in ids.drain(..) {
                    s.complete(id, Ok(Outcome::Done));
                }
                while s.take_output().is_some() {}
            };
            let mut handle = 0u64;
            // Sends a write whose payload comes whole with its header (or a read), and
            // answers it.
            let mut send = |s: &mut ServerSession, command: Command, length: u32| {
                handle += 1;
                let mut wire = request(command, handle, length);
                if command == Command::Write {
                    wire.extend(vec![handle as u8; length as usize]);
                }
                s.receive(&wire).unwrap();
                take(s, &mut Vec::new());
            };
            // No hand-offs: long writes change nothing.
            for _ in 0..4 {
                send(&mut s, Command::Write, 64 << 10);
                assert_eq!(s.input_limit(), None, "extended {extended}");
            }
            s.hand_off_payloads(Some((32 << 10, 1 << 20)));
            // One long write in ten requests, the others short writes and reads: never.
            for _ in 0..8 {
                for i in 0..9 {
                    let c = if i % 2 == 0 {
                        Command::Write
                    } else {
                        Command::Read
                    };
                    send(&mut s, c, 4096);
                    assert_eq!(s.input_limit(), None, "extended {extended}");
                }
                send(&mut s, Command::Write, 64 << 10);
                assert_eq!(s.input_limit(), None, "extended {extended}");
            }
            // Long writes one after the other: within a few, the next header is read alone.
            let mut long = 0;
            while s.input_limit().is_none() {
                send(&mut s, Command::Write, 48 << 10);
                long += 1;
                assert!(long <= 8, "extended {extended}: {long} long writes");
            }
            assert!(long >= 2, "extended {extended}: {long} long writes");
            assert_eq!(s.input_limit(), Some(header), "extended {extended}");
            // Part of a header came: the rest of it.
            let next = request(Command::Write, 500, 64 << 10);
            s.receive(&next[..10]).unwrap();
            assert_eq!(s.input_limit(), Some(header - 10), "extended {extended}");
            s.receive(&next[10..]).unwrap();
            let op = s.poll_op().expect("handed off whole");
            assert_eq!(op.on_stream, 64 << 10, "extended {extended}");
            assert!(matches!(&op.kind, OpKind::Write(h) if h.is_empty()));
            s.payload_taken();
            take(&mut s, &mut vec![op.id]);
            assert_eq!(s.input_limit(), Some(header), "extended {extended}");
            // A short write: its payload, then the next header.
            s.receive(&request(Command::Write, 501, 4096)).unwrap();
            assert_eq!(s.input_limit(), Some(4096 + header), "extended {extended}");
            s.receive(&[6u8; 1000]).unwrap();
            assert_eq!(s.input_limit(), Some(3096 + header), "extended {extended}");
            s.receive(&[6u8; 3096]).unwrap();
            take(&mut s, &mut Vec::new());
            assert_eq!(s.input_limit(), Some(header), "extended {extended}");
            // Reads wear it off.
            let mut alone = 0;
            while s.input_limit().is_some() {
                send(&mut s, Command::Read, 4096);
                alone += 1;
                assert!(alone <= 64, "extended {extended}: {alone} reads");
            }
            assert!(alone >= 1, "extended {extended}");
            // A 1 MiB write starts it at once: its header came alone, its payload handed off.
            s.receive(&request(Command::Write, 502, 1 << 20)).unwrap();
            let op = s.poll_op().expect("handed off");
            assert_eq!(op.on_stream, 1 << 20);
            s.payload_taken();
            assert_eq!(s.input_limit(), Some(header), "extended {extended}");
            take(&mut s, &mut vec![op.id]);
            // No more hand-offs: no more headers read alone.
            s.hand_off_payloads(None);
            assert_eq!(s.input_limit(), None, "extended {extended}");
            assert!(s.error.is_none() && s.in_flight() == 0);
        }
    }

    /// The headers of structured replies are split off one buffer, one after the other (no
    /// allocation of their own per reply), and each says what it should.
    #[test]
    fn reply_headers_share_one_buffer() {
        let mut s = transmitting(&[proto::OPT_STRUCTURED_REPLY]);
        let mut heads: Vec<Bytes> = Vec::new();
        for handle in 1..=20u64 {
            let r = Request {
                flags: 0,
                command: Command::Read,
                handle,
                offset: handle * 4096,
                length: 4096,
            };
            s.receive(&r.encode()).unwrap();
            let op = s.poll_op().expect("the read");
            let data = Bytes::from(vec![handle as u8; 4096]);
            s.complete(op.id, Ok(Outcome::Data(data)));
            let head = s.take_output().expect("the header");
            assert_eq!(s.take_output().expect("the data")[..], [handle as u8; 4096]);
            let (h, _) = ChunkHeader::parse(&head).unwrap();
            assert_eq!(
                (h.handle, h.kind, h.flags, h.length),
                (
                    handle,
                    proto::REPLY_TYPE_OFFSET_DATA,
                    proto::REPLY_FLAG_DONE,
                    8 + 4096
                )
            );
            assert_eq!(
                head[ChunkHeader::STRUCTURED_LEN..],
                (handle * 4096).to_be_bytes()
            );
            heads.push(head);
        }
        for w in heads.windows(2) {
            assert_eq!(w[1].as_ptr(), w[0].as_ptr().wrapping_add(w[0].len()));
        }
    }

    /// Rebuilds a read's data from the chunks of its structured reply: (data, holes, data
    /// chunks, whether the last chunk said done).
    fn structured_data(out: &[u8], len: usize) -> (Vec<u8>, usize, usize, bool) {
        let mut data = vec![0xeeu8; len];
        let (mut at, mut holes, mut chunks, mut done) = (0, 0, 0, false);
        while at < out.len() {
            let (h, _) = ChunkHeader::parse(&out[at..]).unwrap();
            at += ChunkHeader::STRUCTURED_LEN;
            let body = &out[at..at + h.length as usize];
            match Chunk::parse(h.kind, false, body).unwrap() {
                Chunk::OffsetData { offset } => {
                    let d = &body[8..];
                    data[offset as usize..offset as usize + d.len()].copy_from_slice(d);
                    chunks += 1;
                }
                Chunk::OffsetHole { offset, size } => {
                    data[offset as usize..(offset + u64::from(size)) as usize].fill(0);
                    holes += 1;
                }
                c => panic!("{c:?}"),
            }
            done = h.flags & proto::REPLY_FLAG_DONE != 0;
            at += h.length as usize;
        }
        (data, holes, chunks, done)
    }

    /// A read answered in parts (a striped volume's pieces) reaches the client as the same
    /// bytes, in order: one data chunk for all of them with structured replies, or each
    /// part's own chunks when one holds a run of zeroes to send as a hole; one simple reply
    /// with the data behind it otherwise. Parts that do not add up to the read fail it.
    #[test]
    fn a_read_answered_in_parts_reaches_the_client_whole_and_in_order() {
        let part = |seed: u8| -> Bytes {
            (0..64usize << 10)
                .map(|i| (i % 241) as u8 ^ seed)
                .collect::<Vec<u8>>()
                .into()
        };
        for (structured, zero_middle) in
            [(true, false), (true, true), (false, false), (false, true)]
        {
            let mut s = session_sized(TlsPolicy::Off, 1 << 20);
            if structured {
                assert_eq!(
                    option(&mut s, proto::OPT_STRUCTURED_REPLY, &[]),
                    [proto::REP_ACK]
                );
            }
            assert_eq!(
                option(&mut s, proto::OPT_GO, &go_data()).last(),
                Some(&proto::REP_ACK)
            );
            let middle = if zero_middle {
                Bytes::from(vec![0u8; 64 << 10])
            } else {
                part(2)
            };
            let parts = vec![part(1), middle, Bytes::new(), part(3)];
            let want: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
            let r = Request {
                flags: 0,
                command: Command::Read,
                handle: 5,
                offset: 0,
                length: 192 << 10,
            };
            s.receive(&r.encode()).unwrap();
            let op = s.poll_op().expect("the read");
            s.complete(op.id, Ok(Outcome::DataParts(parts)));
            let mut out = Vec::new();
            while let Some(o) = s.take_output() {
                out.extend_from_slice(&o);
            }
            let what = format!("structured {structured}, zeroes {zero_middle}");
            if structured {
                let (data, holes, chunks, done) = structured_data(&out, 192 << 10);
                assert!(data == want && done, "{what}");
                assert_eq!(
                    (holes, chunks),
                    if zero_middle { (1, 2) } else { (0, 1) },
                    "{what}"
                );
            } else {
                let reply = SimpleReply::parse(&out).unwrap();
                assert_eq!((reply.error, reply.handle), (0, 5), "{what}");
                assert!(out[SimpleReply::LEN..] == want[..], "{what}");
            }
            // Parts short of the read: an error, not a short reply.
            s.receive(&Request { handle: 6, ..r }.encode()).unwrap();
            let op = s.poll_op().expect("the second read");
            s.complete(op.id, Ok(Outcome::DataParts(vec![part(1)])));
            let mut out = Vec::new();
            while let Some(o) = s.take_output() {
                out.extend_from_slice(&o);
            }
            if structured {
                let (h, _) = ChunkHeader::parse(&out).unwrap();
                assert!(
                    h.kind == proto::REPLY_TYPE_ERROR || h.kind == proto::REPLY_TYPE_ERROR_OFFSET,
                    "{what}"
                );
            } else {
                assert_ne!(SimpleReply::parse(&out).unwrap().error, 0, "{what}");
            }
        }
    }

    #[test]
    fn zero_runs_finds_long_aligned_runs_only() {
        let mut d = vec![1u8; 256 << 10];
        d[64 << 10..192 << 10].fill(0);
        assert_eq!(zero_runs(&d), [(64 << 10, 192 << 10)]);
        let mut short = vec![1u8; 256 << 10];
        short[4096..8192].fill(0);
        assert!(zero_runs(&short).is_empty());
        assert_eq!(zero_runs(&vec![0u8; 100 << 10]), [(0, 100 << 10)]);
    }

    /// The runs, found the slow way: every 4 KiB block's zeroes, then the blocks in a row
    /// (and a zero tail after the last whole one).
    fn zero_runs_by_every_block(d: &[u8]) -> Vec<(usize, usize)> {
        let mut ends: Vec<(usize, bool)> = d
            .chunks(4096)
            .scan(0, |at, c| {
                *at += c.len();
                Some((*at, c.iter().all(|&b| b == 0)))
            })
            .collect();
        if d.len() % 4096 != 0 && ends.len() > 1 {
            // A tail counts only as the end of a run of whole blocks.
            let (end, z) = ends.pop().unwrap();
            if z && ends.last().is_some_and(|e| e.1) {
                ends.last_mut().unwrap().0 = end;
            }
        }
        let (mut out, mut start, mut from) = (Vec::new(), None, 0);
        for (end, z) in ends {
            match (z, start) {
                (true, None) => start = Some(from),
                (false, Some(s)) => {
                    out.push((s, from));
                    start = None;
                }
                _ => {}
            }
            from = end;
        }
        if let Some(s) = start {
            out.push((s, from));
        }
        out.retain(|(s, e)| e - s >= HOLE_MIN);
        out
    }

    #[test]
    fn one_byte_not_zero_anywhere_is_seen() {
        // Lengths around the 64-byte lines it reads at once, and the tail after them.
        for len in [0, 1, 63, 64, 65, 127, 128, 200, 4095, 4096, 4097] {
            let mut d = vec![0u8; len];
            assert!(all_zero(&d), "{len} zero bytes");
            for at in 0..len {
                for b in [1u8, 0x80] {
                    d[at] = b;
                    assert!(!all_zero(&d), "{len} bytes, {b:#x} at {at}");
                }
                d[at] = 0;
            }
        }
    }

    #[test]
    fn zero_runs_are_found_wherever_they_lie() {
        // Runs of 15, 16 and 17 blocks (and of half a block more) at every block offset
        // of the first 40, in payloads ending on a block or inside one: the probe of one
        // block in 16 finds each run of 16 or more, and tells the rest apart.
        for len in [256 << 10, (256 << 10) + 1000, 200 << 10] {
            for blocks in [15usize, 16, 17] {
                for start in 0..40usize {
                    for extra in [0usize, 2048] {
                        let mut d = vec![7u8; len];
                        let s = start * 4096;
                        let e = (s + blocks * 4096 + extra).min(len);
                        if s >= len {
                            continue;
                        }
                        d[s..e].fill(0);
                        assert_eq!(
                            zero_runs(&d),
                            zero_runs_by_every_block(&d),
                            "len {len}, {blocks} blocks from block {start}, {extra} more"
                        );
                    }
                }
            }
        }
        // The tail: 15 whole zero blocks and a zero tail are not a run; 16 and a tail are,
        // to the end.
        let mut d = vec![7u8; (20 << 12) + 100];
        d[5 << 12..].fill(0);
        assert!(zero_runs(&d).is_empty());
        d[4 << 12..].fill(0);
        assert_eq!(zero_runs(&d), [(4 << 12, d.len())]);
    }
}
