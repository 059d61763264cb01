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

use std::collections::{BTreeMap, HashMap, VecDeque};
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
    /// Read; answer [`Outcome::Data`] of exactly `length` bytes.
    Read,
    /// Write these bytes (`length` of them).
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
}

/// What an op produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done, nothing to return.
    Done,
    /// A read's data.
    Data(Bytes),
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

/// Bytes being received for a request: a write's payload, or payload to throw away.
#[derive(Debug)]
enum Payload {
    /// The next `left` bytes belong to request `req` at `at`.
    Write { req: u64, at: u64, left: u64 },
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
    small: Vec<u8>,
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
    requests: HashMap<u64, Pending>,
    /// Ops in flight: op id -> (request id, offset of the piece).
    ops: HashMap<u64, (u64, u64)>,
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
            input: BytesMut::with_capacity(64 << 10),
            output: VecDeque::new(),
            small: Vec::new(),
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
            requests: HashMap::new(),
            ops: HashMap::new(),
            ready: VecDeque::new(),
            streaming: VecDeque::new(),
            buffered: 0,
            stopping: false,
            stats: SessionStats::default(),
            error: None,
            tls_active: false,
            starttls: false,
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

    /// Whether the caller should read more client bytes now.
    #[must_use]
    pub fn wants_input(&self) -> bool {
        match self.phase {
            Phase::Hello | Phase::Options => true,
            Phase::Transmission => {
                self.payload.is_some()
                    || (self.ops.len() < self.config.max_in_flight
                        && self.buffered < self.config.max_buffered
                        && self.streaming.is_empty())
            }
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

    fn piece_len(&self, p: &Pending, at: u64) -> u64 {
        let step = u64::from(self.config.max_request);
        step.min(p.offset + p.length - at)
    }

    /// Stores the request back, or answers it if nothing of it is left.
    fn finish_or_keep(&mut self, req: u64, mut p: Pending) {
        let done = p.open == 0 && p.next >= p.offset + p.length && p.to_receive == 0;
        if !done {
            self.requests.insert(req, p);
            return;
        }
        let failed = p.failed.take();
        self.count_reply(failed.is_some());
        if p.answered {
            return;
        }
        match (failed, p.command) {
            (None, Command::Read) if self.structured => {
                // Pieces went out as they came; this ends the reply.
                self.chunk(
                    p.cookie,
                    p.offset,
                    proto::REPLY_FLAG_DONE,
                    &Chunk::None,
                    None,
                );
            }
            (None, Command::Read) => {
                self.emit(
                    &SimpleReply {
                        error: 0,
                        handle: p.cookie,
                    }
                    .encode(),
                );
                for (_, d) in std::mem::take(&mut p.held) {
                    let n = d.len() as u64;
                    self.emit_data(d, n);
                }
            }
            (None, _) => self.ok_reply(p.cookie, p.offset),
            (Some((at, (e, msg))), cmd) => {
                let held: u64 = p.held.values().map(|d| d.len() as u64).sum();
                self.buffered = self.buffered.saturating_sub(held);
                let offset = matches!(cmd, Command::Read | Command::Write).then_some(at);
                self.error_reply(p.cookie, p.offset, e, &msg, offset);
            }
        }
    }

    /// A completed read piece: sent at once with structured replies; held until the whole
    /// read is in with simple replies.
    fn read_piece(&mut self, p: &mut Pending, at: u64, d: Bytes) {
        if !self.structured {
            p.held.insert(at, d);
            return;
        }
        // A read of one piece: its data chunk ends the reply.
        let single = p.length <= u64::from(self.config.max_request);
        let df = p.flags & proto::CMD_FLAG_DF != 0;
        self.data_chunks(p.cookie, p.offset, at, d, single, !df);
        p.answered = single;
    }

    /// A read's data as structured chunks: runs of zeroes as holes (unless `holes` is
    /// false, for DF), the rest as data.
    fn data_chunks(
        &mut self,
        cookie: u64,
        req_off: u64,
        at: u64,
        d: Bytes,
        done: bool,
        holes: bool,
    ) {
        let runs = if holes { zero_runs(&d) } else { Vec::new() };
        let mut pieces: Vec<(usize, usize, bool)> = Vec::new();
        let mut pos = 0;
        for (s, e) in runs {
            if s > pos {
                pieces.push((pos, s, false));
            }
            pieces.push((s, e, true));
            pos = e;
        }
        if pos < d.len() || pieces.is_empty() {
            pieces.push((pos, d.len(), false));
        }
        let n = pieces.len();
        for (i, (s, e, hole)) in pieces.into_iter().enumerate() {
            let flags = if done && i + 1 == n {
                proto::REPLY_FLAG_DONE
            } else {
                0
            };
            let off = at + s as u64;
            if hole {
                let c = Chunk::OffsetHole {
                    offset: off,
                    size: (e - s) as u32,
                };
                self.chunk(cookie, req_off, flags, &c, None);
                self.buffered = self.buffered.saturating_sub((e - s) as u64);
            } else {
                let c = Chunk::OffsetData { offset: off };
                self.chunk(cookie, req_off, flags, &c, Some(d.slice(s..e)));
            }
        }
    }

    fn count_reply(&mut self, error: bool) {
        self.stats.replies += 1;
        if error {
            self.stats.error_replies += 1;
        }
    }

    /// Lets out the next pieces of large reads, as the budget allows.
    fn release_streams(&mut self) {
        let step = u64::from(self.config.max_request);
        while let Some(&req) = self.streaming.front() {
            if self.ops.len() >= self.config.max_in_flight
                || self.buffered + step > self.config.max_buffered
            {
                return;
            }
            let Some(mut p) = self.requests.remove(&req) else {
                self.streaming.pop_front();
                continue;
            };
            let end = p.offset + p.length;
            if p.failed.is_some() {
                // Stop reading after an error: the rest is not wanted.
                p.next = end;
            }
            if p.next < end {
                let at = p.next;
                let len = step.min(end - at);
                p.next += len;
                p.open += 1;
                self.buffered += len;
                let op = self.new_op(req, at, OpKind::Read, at, len, p.flags);
                self.ready.push_back(op);
            }
            let exhausted = p.next >= end;
            if exhausted {
                self.streaming.pop_front();
                self.finish_or_keep(req, p);
            } else {
                self.requests.insert(req, p);
            }
        }
    }

    fn new_op(
        &mut self,
        req: u64,
        at: u64,
        kind: OpKind,
        offset: u64,
        length: u64,
        flags: u16,
    ) -> Op {
        let id = self.next_id;
        self.next_id += 1;
        self.ops.insert(id, (req, at));
        Op {
            id,
            kind,
            offset,
            length,
            fua: flags & proto::CMD_FLAG_FUA != 0,
            strict: self.strict,
        }
    }

    fn emit(&mut self, b: &[u8]) {
        self.small.extend_from_slice(b);
    }

    /// Moves the small bytes gathered so far into the output as one item.
    fn seal(&mut self) {
        let b = std::mem::take(&mut self.small);
        self.output.push_back(Bytes::from(b));
        self.out_budget.push_back(0);
    }

    fn emit_data(&mut self, d: Bytes, budget: u64) {
        if d.len() < 4096 {
            self.small.extend_from_slice(&d);
            // Copied: the budget it held is free at once.
            self.buffered = self.buffered.saturating_sub(budget);
            return;
        }
        if !self.small.is_empty() {
            self.seal();
        }
        self.output.push_back(d);
        self.out_budget.push_back(budget);
    }

    /// One structured (or extended) chunk, with `data` after its payload.
    fn chunk(&mut self, cookie: u64, req_off: u64, flags: u16, c: &Chunk, data: Option<Bytes>) {
        let payload = c.encode(self.extended);
        let dlen = data.as_ref().map_or(0, |d| d.len() as u64);
        let h = ChunkHeader {
            flags,
            kind: c.kind(self.extended),
            handle: cookie,
            offset: req_off,
            length: payload.len() as u64 + dlen,
        };
        h.encode_into(self.extended, &mut self.small);
        self.small.extend_from_slice(&payload);
        if let Some(d) = data {
            self.emit_data(d, dlen);
        }
    }

    fn ok_reply(&mut self, cookie: u64, offset: u64) {
        if self.extended {
            self.chunk(cookie, offset, proto::REPLY_FLAG_DONE, &Chunk::None, None);
        } else {
            self.emit(
                &SimpleReply {
                    error: 0,
                    handle: cookie,
                }
                .encode(),
            );
        }
    }

    fn error_reply(&mut self, cookie: u64, offset: u64, error: u32, msg: &str, at: Option<u64>) {
        if self.structured {
            let c = Chunk::Error {
                error,
                message: msg.to_owned(),
                offset: at,
            };
            self.chunk(cookie, offset, proto::REPLY_FLAG_DONE, &c, None);
        } else {
            self.emit(
                &SimpleReply {
                    error,
                    handle: cookie,
                }
                .encode(),
            );
        }
    }

    /// An immediate answer (no op): counted as a reply.
    fn refuse(&mut self, cookie: u64, offset: u64, error: u32, msg: &str) {
        self.count_reply(true);
        self.error_reply(cookie, offset, error, msg, None);
    }

    fn process_inner(&mut self) -> Result<(), SessionError> {
        loop {
            let progressed = match self.phase {
                Phase::Hello => self.hello()?,
                Phase::Options => self.option()?,
                Phase::Transmission => self.transmission()?,
                Phase::StartTls | Phase::Draining | Phase::Closed => false,
            };
            if !progressed {
                return Ok(());
            }
        }
    }

    fn hello(&mut self) -> Result<bool, SessionError> {
        if self.input.len() < 4 {
            return Ok(false);
        }
        let flags = self.input.get_u32();
        if flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
            return Err(SessionError::Protocol(format!(
                "unknown client flags {flags:#x}"
            )));
        }
        self.no_zeroes = flags & proto::FLAG_C_NO_ZEROES != 0;
        self.phase = Phase::Options;
        Ok(true)
    }

    fn reply(&mut self, option: u32, kind: u32, data: &[u8]) {
        let b = proto::OptionReply::encode(option, kind, data);
        self.emit(&b);
    }

    fn option(&mut self) -> Result<bool, SessionError> {
        // Option data being thrown away (too large to hold).
        if let Some(Payload::SkipOption { left, option }) = &mut self.payload {
            let n = (*left).min(self.input.len() as u64);
            self.input.advance(n as usize);
            *left -= n;
            if *left > 0 {
                return Ok(false);
            }
            let option = *option;
            self.payload = None;
            self.reply(option, proto::REP_ERR_TOO_BIG, b"option data too large");
            return Ok(true);
        }
        if self.input.len() < OptionHeader::LEN {
            return Ok(false);
        }
        let h = OptionHeader::parse(&self.input[..OptionHeader::LEN])
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        if u64::from(h.length) > MAX_OPTION {
            self.input.advance(OptionHeader::LEN);
            self.payload = Some(Payload::SkipOption {
                left: h.length.into(),
                option: h.option,
            });
            return Ok(true);
        }
        if self.input.len() < OptionHeader::LEN + h.length as usize {
            self.input.reserve(OptionHeader::LEN + h.length as usize);
            return Ok(false);
        }
        self.input.advance(OptionHeader::LEN);
        let data = self.input.split_to(h.length as usize).freeze();
        self.handle_option(h.option, &data)?;
        Ok(true)
    }

    fn handle_option(&mut self, option: u32, data: &[u8]) -> Result<(), SessionError> {
        if self.config.tls == TlsPolicy::Require
            && !self.tls_active
            && !matches!(option, proto::OPT_STARTTLS | proto::OPT_ABORT)
        {
            if option == proto::OPT_EXPORT_NAME {
                // No error reply is possible for this option: close.
                return Err(SessionError::Protocol(
                    "NBD_OPT_EXPORT_NAME before TLS on a server that requires it".to_owned(),
                ));
            }
            self.reply(
                option,
                proto::REP_ERR_TLS_REQD,
                b"TLS is required: send NBD_OPT_STARTTLS",
            );
            return Ok(());
        }
        match option {
            proto::OPT_STARTTLS => {
                if self.config.tls == TlsPolicy::Off {
                    self.reply(
                        option,
                        proto::REP_ERR_UNSUP,
                        b"this server has no TLS configured",
                    );
                } else if self.tls_active {
                    self.reply(option, proto::REP_ERR_INVALID, b"TLS is already running");
                } else if !data.is_empty() {
                    self.reply(option, proto::REP_ERR_INVALID, b"STARTTLS takes no data");
                } else {
                    self.reply(option, proto::REP_ACK, &[]);
                    // Everything negotiated in the clear is forgotten: it starts again inside.
                    self.structured = false;
                    self.extended = false;
                    self.contexts.clear();
                    self.contexts_for = None;
                    self.phase = Phase::StartTls;
                    self.starttls = true;
                }
            }
            proto::OPT_EXPORT_NAME => {
                if self.extended {
                    return Err(SessionError::Protocol(
                        "NBD_OPT_EXPORT_NAME after extended headers were negotiated".to_owned(),
                    ));
                }
                let name = String::from_utf8_lossy(data).into_owned();
                let Some(e) = self.catalog.get(&name).cloned() else {
                    // No error reply is possible for this option: close.
                    return Err(SessionError::Protocol(format!("no export named {name:?}")));
                };
                let reply = proto::ExportNameReply {
                    size: e.size,
                    flags: self.flags(&e),
                };
                self.emit(&reply.encode(self.no_zeroes));
                // No block sizes were agreed.
                self.start(e, false, &name);
            }
            proto::OPT_ABORT => {
                self.reply(option, proto::REP_ACK, &[]);
                self.phase = Phase::Closed;
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    self.reply(option, proto::REP_ERR_INVALID, b"LIST takes no data");
                } else {
                    let names: Vec<String> = self.catalog.iter().map(|e| e.name.clone()).collect();
                    for name in names {
                        self.reply(option, proto::REP_SERVER, &proto::server_entry(&name));
                    }
                    self.reply(option, proto::REP_ACK, &[]);
                }
            }
            proto::OPT_INFO | proto::OPT_GO => self.info(option, data),
            proto::OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.reply(
                        option,
                        proto::REP_ERR_INVALID,
                        b"STRUCTURED_REPLY takes no data",
                    );
                } else if self.extended {
                    self.reply(
                        option,
                        proto::REP_ERR_INVALID,
                        b"extended headers are already negotiated",
                    );
                } else {
                    self.structured = true;
                    self.reply(option, proto::REP_ACK, &[]);
                }
            }
            proto::OPT_EXTENDED_HEADERS => {
                if !data.is_empty() {
                    self.reply(
                        option,
                        proto::REP_ERR_INVALID,
                        b"EXTENDED_HEADERS takes no data",
                    );
                } else {
                    self.extended = true;
                    self.structured = true;
                    self.reply(option, proto::REP_ACK, &[]);
                }
            }
            proto::OPT_LIST_META_CONTEXT | proto::OPT_SET_META_CONTEXT => {
                self.meta_context(option, data);
            }
            other => {
                let msg = format!("option {other} is not supported");
                self.reply(option, proto::REP_ERR_UNSUP, msg.as_bytes());
            }
        }
        Ok(())
    }

    /// The export called `name`, or `NBD_REP_ERR_UNKNOWN` sent for `option`.
    fn export_or_refuse(&mut self, option: u32, name: &str) -> Option<Arc<ExportEntry>> {
        let e = self.catalog.get(name).cloned();
        if e.is_none() {
            let msg = format!("no export named {name:?}");
            self.reply(option, proto::REP_ERR_UNKNOWN, msg.as_bytes());
        }
        e
    }

    fn info(&mut self, option: u32, data: &[u8]) {
        let req = match InfoRequest::parse(data) {
            Ok(r) => r,
            Err(e) => {
                self.reply(option, proto::REP_ERR_INVALID, e.to_string().as_bytes());
                return;
            }
        };
        let Some(e) = self.export_or_refuse(option, &req.name) else {
            return;
        };
        let (min, pref, max) = self.block_sizes(&e);
        self.reply(
            option,
            proto::REP_INFO,
            &proto::info_export(e.size, self.flags(&e)),
        );
        self.reply(
            option,
            proto::REP_INFO,
            &proto::info_block_size(min, pref, max),
        );
        if req.requests.contains(&proto::INFO_NAME) {
            let d = proto::info_string(proto::INFO_NAME, &e.name);
            self.reply(option, proto::REP_INFO, &d);
        }
        if req.requests.contains(&proto::INFO_DESCRIPTION) && !e.description.is_empty() {
            let d = proto::info_string(proto::INFO_DESCRIPTION, &e.description);
            self.reply(option, proto::REP_INFO, &d);
        }
        self.reply(option, proto::REP_ACK, &[]);
        if option == proto::OPT_GO {
            let strict = req.requests.contains(&proto::INFO_BLOCK_SIZE);
            self.start(e, strict, &req.name);
        }
    }

    /// Enters transmission on export `e` (asked for as `asked`).
    fn start(&mut self, e: Arc<ExportEntry>, strict: bool, asked: &str) {
        // Contexts count only if selected for the export that was then chosen.
        let same = self
            .contexts_for
            .as_deref()
            .is_some_and(|n| self.catalog.get(n).is_some_and(|x| Arc::ptr_eq(x, &e)));
        if !same || self.catalog.get(asked).is_none() {
            self.contexts.clear();
        }
        self.strict = strict;
        self.export = Some(e);
        self.phase = if self.stopping {
            Phase::Draining
        } else {
            Phase::Transmission
        };
    }

    fn available_contexts(&self, e: &ExportEntry) -> Vec<Context> {
        let mut v = vec![Context::Allocation];
        if e.layout.is_some() {
            v.push(Context::Component);
        }
        v
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) {
        let set = option == proto::OPT_SET_META_CONTEXT;
        if set {
            // Replaced, even when this fails.
            self.contexts.clear();
            self.contexts_for = None;
        }
        if !self.structured {
            self.reply(
                option,
                proto::REP_ERR_INVALID,
                b"negotiate structured replies or extended headers first",
            );
            return;
        }
        let req = match MetaContextRequest::parse(data) {
            Ok(r) => r,
            Err(e) => {
                self.reply(option, proto::REP_ERR_INVALID, e.to_string().as_bytes());
                return;
            }
        };
        let Some(e) = self.export_or_refuse(option, &req.name) else {
            return;
        };
        let avail = self.available_contexts(&e);
        let mut chosen: Vec<Context> = Vec::new();
        if req.queries.is_empty() && !set {
            chosen = avail.clone();
        }
        for q in &req.queries {
            for &c in &avail {
                let (ns, _) = c.name().split_once(':').unwrap_or((c.name(), ""));
                let wildcard = !set && q.strip_suffix(':') == Some(ns);
                if (q == c.name() || wildcard) && !chosen.contains(&c) {
                    chosen.push(c);
                }
            }
        }
        for &c in &chosen {
            let id = if set { c.id() } else { 0 };
            self.reply(
                option,
                proto::REP_META_CONTEXT,
                &proto::meta_context(id, c.name()),
            );
        }
        self.reply(option, proto::REP_ACK, &[]);
        if set {
            self.contexts = chosen;
            self.contexts_for = Some(req.name);
        }
    }

    /// Transmission flags of export `e` for this connection.
    fn flags(&self, e: &ExportEntry) -> u16 {
        let caps = e.caps;
        let mut f = proto::TF_HAS_FLAGS | proto::TF_CAN_MULTI_CONN | proto::TF_SEND_CACHE;
        // Flush and FUA are offered only if every component honours them (a read-only
        // export's flush is a no-op, and offered as other servers do).
        if e.read_only || caps.flush {
            f |= proto::TF_SEND_FLUSH;
        }
        if caps.rotational {
            f |= proto::TF_ROTATIONAL;
        }
        if self.structured {
            f |= proto::TF_SEND_DF;
        }
        if e.read_only {
            f |= proto::TF_READ_ONLY;
        } else {
            if caps.flush && caps.fua {
                f |= proto::TF_SEND_FUA;
            }
            f |= proto::TF_SEND_WRITE_ZEROES | proto::TF_SEND_FAST_ZERO;
            if caps.trim {
                f |= proto::TF_SEND_TRIM;
            }
        }
        f
    }

    /// Minimum, preferred and maximum block sizes: the logical block; the optimal I/O size
    /// (or the physical block), reduced to the largest power of two dividing it as the
    /// protocol requires (a 3-member stripe of 8 KiB units prefers 8 KiB, not 24); and the
    /// request cap rounded down to whole minimum blocks.
    fn block_sizes(&self, e: &ExportEntry) -> (u32, u32, u32) {
        let l = &e.limits;
        let min = l.logical_block_size.clamp(512, 65536).next_power_of_two();
        let max = (self.config.max_request / min * min).max(min);
        let pref = if l.io_opt > 0 {
            l.io_opt
        } else {
            l.physical_block_size.max(4096)
        };
        let pref = (1u32 << pref.trailing_zeros()).clamp(min, max);
        let pref = if pref.is_power_of_two() {
            pref
        } else {
            1 << (31 - max.leading_zeros())
        };
        (min, pref, max)
    }

    fn transmission(&mut self) -> Result<bool, SessionError> {
        if let Some(p) = self.payload.take() {
            return self.receive_payload(p);
        }
        if self.stopping {
            self.phase = Phase::Draining;
            return Ok(false);
        }
        if self.ops.len() >= self.config.max_in_flight
            || self.buffered >= self.config.max_buffered
            || !self.streaming.is_empty()
        {
            return Ok(false);
        }
        let (flags, command, cookie, offset, length) = if self.extended {
            if self.input.len() < ExtendedRequest::LEN {
                return Ok(false);
            }
            let r = ExtendedRequest::parse(&self.input[..ExtendedRequest::LEN])
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            self.input.advance(ExtendedRequest::LEN);
            // The extension asks writes to set PAYLOAD_LEN; qemu 10's client does not, and
            // a write always carries its data: take it as set.
            let flags = if r.command == Command::Write {
                r.flags | proto::CMD_FLAG_PAYLOAD_LEN
            } else {
                r.flags
            };
            (flags, r.command, r.handle, r.offset, r.length)
        } else {
            if self.input.len() < Request::LEN {
                return Ok(false);
            }
            let r = Request::parse(&self.input[..Request::LEN])
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            self.input.advance(Request::LEN);
            let mut flags = r.flags;
            if r.command == Command::Write {
                // A compact write always carries its payload.
                flags |= proto::CMD_FLAG_PAYLOAD_LEN;
            } else if flags & proto::CMD_FLAG_PAYLOAD_LEN != 0 {
                // Not a flag in compact requests: refused below, and no payload follows.
                flags = (flags & !proto::CMD_FLAG_PAYLOAD_LEN) | 0x8000;
            }
            (flags, r.command, r.handle, r.offset, u64::from(r.length))
        };
        if command == Command::Disc {
            self.phase = Phase::Draining;
            return Ok(false);
        }
        self.stats.requests += 1;
        self.request(flags, command, cookie, offset, length)?;
        Ok(true)
    }

    fn receive_payload(&mut self, p: Payload) -> Result<bool, SessionError> {
        match p {
            Payload::SkipOption { .. } => Err(SessionError::Protocol(
                "option data in transmission".to_owned(),
            )),
            Payload::Skip {
                mut left,
                cookie,
                offset,
                error,
            } => {
                let n = left.min(self.input.len() as u64);
                self.input.advance(n as usize);
                left -= n;
                if left > 0 {
                    self.payload = Some(Payload::Skip {
                        left,
                        cookie,
                        offset,
                        error,
                    });
                    return Ok(false);
                }
                self.refuse(
                    cookie,
                    offset,
                    error,
                    "request refused (its payload was read and dropped)",
                );
                Ok(true)
            }
            Payload::Write { req, at, left } => {
                let step = u64::from(self.config.max_request);
                let piece = step.min(left);
                if (self.input.len() as u64) < piece {
                    self.input.reserve(piece as usize - self.input.len());
                    self.payload = Some(Payload::Write { req, at, left });
                    return Ok(false);
                }
                let data = self.input.split_to(piece as usize).freeze();
                let Some(mut r) = self.requests.remove(&req) else {
                    return Err(SessionError::Protocol(
                        "write payload without a request".to_owned(),
                    ));
                };
                r.to_receive -= piece;
                r.open += 1;
                r.next = at + piece;
                self.buffered += piece;
                let flags = r.flags;
                self.requests.insert(req, r);
                let op = self.new_op(req, at, OpKind::Write(data), at, piece, flags);
                self.ready.push_back(op);
                if left > piece {
                    self.payload = Some(Payload::Write {
                        req,
                        at: at + piece,
                        left: left - piece,
                    });
                }
                Ok(true)
            }
        }
    }

    /// Validates one request and turns it into ops (or answers it at once).
    fn request(
        &mut self,
        flags: u16,
        command: Command,
        cookie: u64,
        offset: u64,
        length: u64,
    ) -> Result<(), SessionError> {
        let Some(e) = self.export.clone() else {
            return Err(SessionError::Protocol(
                "request before an export was chosen".to_owned(),
            ));
        };
        let has_payload = flags & proto::CMD_FLAG_PAYLOAD_LEN != 0;
        // A payload over the agreed maximum is read and dropped and the request refused
        // (EINVAL, below), as nbdkit does: the spec lets a server disconnect instead, but a
        // client that sent one too large keeps its connection and its other requests.
        let max = u64::from(self.config.max_request);
        let refuse_after_payload = |s: &mut Self, error: u32, msg: &str| {
            if has_payload && length > 0 {
                s.payload = Some(Payload::Skip {
                    left: length,
                    cookie,
                    offset,
                    error,
                });
            } else {
                s.refuse(cookie, offset, error, msg);
            }
        };
        // Flags: FUA on any command; the others only where they belong.
        let allowed = proto::CMD_FLAG_FUA
            | match command {
                Command::WriteZeroes => proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO,
                Command::Read if self.structured => proto::CMD_FLAG_DF,
                Command::BlockStatus => proto::CMD_FLAG_REQ_ONE,
                Command::Write => proto::CMD_FLAG_PAYLOAD_LEN,
                _ => 0,
            };
        if flags & !allowed != 0 {
            refuse_after_payload(
                self,
                errno::EINVAL,
                &format!("flags {flags:#x} are not valid on {command:?}"),
            );
            return Ok(());
        }
        let writes = matches!(
            command,
            Command::Write | Command::Trim | Command::WriteZeroes
        );
        if writes && e.read_only {
            refuse_after_payload(self, errno::EPERM, "the export is read-only");
            return Ok(());
        }
        let ranged = !matches!(command, Command::Flush | Command::Other(_) | Command::Disc);
        let size = e.size;
        if let Command::Other(c) = command {
            refuse_after_payload(self, errno::EINVAL, &format!("unknown command {c}"));
            return Ok(());
        }
        let end = offset.checked_add(length);
        if ranged && end.is_none_or(|end| end > size) {
            let error = if writes { errno::ENOSPC } else { errno::EINVAL };
            refuse_after_payload(self, error, "the request runs past the end of the export");
            return Ok(());
        }
        let min = u64::from(e.limits.logical_block_size.max(512));
        if ranged && self.strict && (offset % min != 0 || length % min != 0) {
            refuse_after_payload(
                self,
                errno::EINVAL,
                &format!("offset and length must be multiples of the {min}-byte block agreed"),
            );
            return Ok(());
        }
        let req = self.next_id;
        self.next_id += 1;
        let pending = Pending {
            cookie,
            command,
            flags,
            offset,
            length,
            open: 0,
            next: offset,
            held: BTreeMap::new(),
            answered: false,
            failed: None,
            to_receive: 0,
        };
        let zero_len = ranged && length == 0;
        match command {
            Command::Read => {
                let df = flags & proto::CMD_FLAG_DF != 0;
                if length > max && (self.strict || df) {
                    let error = if df { errno::EOVERFLOW } else { errno::EINVAL };
                    self.refuse(
                        cookie,
                        offset,
                        error,
                        "the read is larger than the maximum payload",
                    );
                    return Ok(());
                }
                if length > MAX_SPAN {
                    self.refuse(
                        cookie,
                        offset,
                        errno::EOVERFLOW,
                        "reads are served up to 4 GiB",
                    );
                    return Ok(());
                }
                if !self.structured && length > self.config.max_buffered {
                    // A simple reply's data is sent whole, so it is gathered whole first.
                    self.refuse(
                        cookie,
                        offset,
                        errno::EOVERFLOW,
                        "reads larger than the connection's buffer need structured replies",
                    );
                    return Ok(());
                }
                if zero_len {
                    self.count_reply(false);
                    if self.structured {
                        self.chunk(cookie, offset, proto::REPLY_FLAG_DONE, &Chunk::None, None);
                    } else {
                        self.ok_reply(cookie, offset);
                    }
                    return Ok(());
                }
                self.requests.insert(req, pending);
                self.streaming.push_back(req);
                self.release_streams();
            }
            Command::Write => {
                if length > max && self.strict {
                    refuse_after_payload(
                        self,
                        errno::EINVAL,
                        "the write is larger than the maximum payload",
                    );
                    return Ok(());
                }
                if zero_len {
                    self.count_reply(false);
                    self.ok_reply(cookie, offset);
                    return Ok(());
                }
                let mut p = pending;
                p.to_receive = length;
                self.requests.insert(req, p);
                self.payload = Some(Payload::Write {
                    req,
                    at: offset,
                    left: length,
                });
            }
            Command::BlockStatus => {
                if self.contexts.is_empty() {
                    self.refuse(
                        cookie,
                        offset,
                        errno::EINVAL,
                        "no metadata context was selected",
                    );
                    return Ok(());
                }
                if zero_len {
                    self.refuse(cookie, offset, errno::EINVAL, "block status of zero bytes");
                    return Ok(());
                }
                let mut p = pending;
                // A hint: at most MAX_SPAN at a time (the client asks again for the rest).
                p.length = length.min(MAX_SPAN);
                if self.contexts.contains(&Context::Allocation) {
                    let (off, len) = (p.offset, p.length);
                    p.open = 1;
                    p.next = off + len;
                    self.requests.insert(req, p);
                    // Whole logical blocks around the range (the extents' first is cut to
                    // the offset asked for).
                    let a0 = off / min * min;
                    let a1 = ((off + len).div_ceil(min) * min)
                        .min(size / min * min)
                        .max(a0 + min);
                    let op = self.new_op(req, off, OpKind::Allocation, a0, a1 - a0, flags);
                    self.ready.push_back(op);
                } else {
                    self.block_status_reply(&p, None);
                    self.count_reply(false);
                }
            }
            _ => {
                if zero_len {
                    self.count_reply(false);
                    self.ok_reply(cookie, offset);
                    return Ok(());
                }
                let kind = match command {
                    Command::Flush => OpKind::Flush,
                    Command::Trim => OpKind::Trim,
                    Command::Cache => OpKind::Cache,
                    Command::WriteZeroes => OpKind::WriteZeroes {
                        unmap: flags & proto::CMD_FLAG_NO_HOLE == 0,
                        fast: flags & proto::CMD_FLAG_FAST_ZERO != 0,
                    },
                    _ => {
                        unreachable!("read, write, block status, disc and others are handled above")
                    }
                };
                // A flush has no range: whatever the header carried is not passed on (nor
                // added up: unchecked, its offset and length may overflow).
                let (o, l) = if kind == OpKind::Flush {
                    (0, 0)
                } else {
                    (offset, length)
                };
                let mut p = pending;
                p.open = 1;
                p.length = l;
                p.next = p.offset + l;
                self.requests.insert(req, p);
                let op = self.new_op(req, offset, kind, o, l, flags);
                self.ready.push_back(op);
            }
        }
        Ok(())
    }

    /// Answers a block status request: one chunk per selected context.
    fn block_status_reply(&mut self, p: &Pending, alloc: Option<Vec<Extent>>) {
        let req_one = p.flags & proto::CMD_FLAG_REQ_ONE != 0;
        let contexts = self.contexts.clone();
        let n = contexts.len();
        for (i, c) in contexts.into_iter().enumerate() {
            let mut extents: Vec<(u64, u64)> = match c {
                Context::Allocation => {
                    let min = self
                        .export
                        .as_ref()
                        .map_or(512, |e| u64::from(e.limits.logical_block_size.max(512)));
                    let skip = p.offset % min;
                    let mut v: Vec<(u64, u64)> = Vec::new();
                    let mut first = true;
                    for x in alloc.iter().flatten() {
                        let mut len = x.sectors * 512;
                        if first {
                            len -= skip.min(len);
                            first = false;
                        }
                        if len == 0 {
                            continue;
                        }
                        let status = u64::from(if x.hole { proto::STATE_HOLE } else { 0 })
                            | u64::from(if x.zero { proto::STATE_ZERO } else { 0 });
                        v.push((len, status));
                    }
                    v
                }
                Context::Component => self.component_extents(p.offset, p.length),
            };
            if extents.is_empty() {
                // Nothing known: report the range as plain data (status 0 is always safe).
                extents.push((p.length.max(1), 0));
            }
            extents.truncate(MAX_EXTENTS);
            if !self.extended {
                // 32-bit lengths: cut to whole 512-byte units under 4 GiB.
                for x in &mut extents {
                    x.0 = x.0.min(u64::from(u32::MAX) / 512 * 512);
                }
            }
            if req_one {
                extents.truncate(1);
                extents[0].0 = extents[0].0.min(p.length);
            } else {
                // Extents wholly past the range requested are not sent.
                let mut sum = 0u64;
                let mut keep = 0;
                for x in &extents {
                    keep += 1;
                    sum += x.0;
                    if sum >= p.length {
                        break;
                    }
                }
                extents.truncate(keep);
            }
            let chunk = Chunk::BlockStatus {
                context: c.id(),
                extents,
            };
            let flags = if i + 1 == n {
                proto::REPLY_FLAG_DONE
            } else {
                0
            };
            self.chunk(p.cookie, p.offset, flags, &chunk, None);
        }
    }

    /// The `tagstripe:component` extents of a byte range (status: component index, and a
    /// mirror partner's index plus one in bits 16-31).
    fn component_extents(&self, offset: u64, length: u64) -> Vec<(u64, u64)> {
        let Some(e) = self.export.as_ref() else {
            return Vec::new();
        };
        let Some(vol) = e.layout.as_ref() else {
            return Vec::new();
        };
        let s0 = offset / 512;
        let s1 = (offset + length).div_ceil(512).min(e.size / 512);
        if s1 <= s0 {
            return Vec::new();
        }
        // Bound the work: a hint may be huge, the reply is cut anyway.
        let s1 = s1.min(s0 + (1 << 24));
        let Some(map) = vol.component_map(s0, s1 - s0) else {
            return Vec::new();
        };
        let skip = offset % 512;
        let mut out = Vec::with_capacity(map.len().min(MAX_EXTENTS));
        for (i, (sectors, c, m)) in map.into_iter().enumerate() {
            if i >= MAX_EXTENTS {
                break;
            }
            let mut len = sectors * 512;
            if i == 0 {
                len -= skip.min(len);
            }
            let partner = m.map_or(0, |m| (m as u64 + 1) & 0xffff);
            out.push((len, (c as u64 & 0xffff) | (partner << 16)));
        }
        out
    }
}

/// 4 KiB-aligned runs of zero bytes of at least [`HOLE_MIN`] in `d`, as byte ranges.
fn zero_runs(d: &[u8]) -> Vec<(usize, usize)> {
    const B: usize = 4096;
    let mut out = Vec::new();
    if d.len() < HOLE_MIN {
        return out;
    }
    let mut run: Option<usize> = None;
    let mut i = 0;
    while i + B <= d.len() {
        let zero = d[i..i + B].iter().all(|&b| b == 0);
        match (zero, run) {
            (true, None) => run = Some(i),
            (false, Some(s)) => {
                if i - s >= HOLE_MIN {
                    out.push((s, i));
                }
                run = None;
            }
            _ => {}
        }
        i += B;
    }
    if let Some(s) = run {
        let e = if d[i..].iter().all(|&b| b == 0) {
            d.len()
        } else {
            i
        };
        if e - s >= HOLE_MIN {
            out.push((s, e));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(tls: TlsPolicy) -> ServerSession {
        let catalog = Arc::new(Catalog::new().with(ExportEntry::new("vol", 64 * 512)));
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
}
