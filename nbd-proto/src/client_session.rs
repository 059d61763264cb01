//! The client's side of the NBD protocol as state machines with no I/O (sans-IO): the
//! negotiation ([`ClientHandshake`]: greeting, optional `STARTTLS`, `GO` with block sizes,
//! `EXPORT_NAME` for servers without `GO`) and the decoding of simple replies
//! ([`ReplyDecoder`]). The `tagstripe` library's `NbdDevice` is a thin tokio loop around them; tests drive
//! them directly.
//!
//! ```
//! use tagstripe_nbd_proto::client_session::{ClientHandshake, Status};
//! use tagstripe_nbd_proto::proto;
//!
//! let mut h = ClientHandshake::new("disk", false);
//! let hello = proto::Hello { flags: proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES };
//! assert_eq!(h.receive(&hello.encode())?, Status::NeedInput);
//! let sent = h.take_output(); // our flags, then NBD_OPT_GO for "disk"
//! assert_eq!(&sent[..4], &(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes());
//! let mut reply = proto::OptionReply::encode(proto::OPT_GO, proto::REP_INFO, &proto::info_export(1 << 20, 1));
//! reply.extend(proto::OptionReply::encode(proto::OPT_GO, proto::REP_ACK, &[]));
//! match h.receive(&reply)? {
//!     Status::Ready(info) => assert_eq!(info.size, 1 << 20),
//!     other => panic!("{other:?}"),
//! }
//! # Ok::<(), tagstripe_nbd_proto::proto::WireError>(())
//! ```

use bytes::{Buf, Bytes, BytesMut};

use super::proto::{
    self, ExportInfo, ExportNameReply, Hello, InfoRequest, OptionHeader, OptionReply, SimpleReply,
    WireError,
};

/// Where a [`ClientHandshake`] stands after taking in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// More bytes from the server are needed (send [`ClientHandshake::take_output`] first).
    NeedInput,
    /// The server accepted `STARTTLS`: run the TLS handshake on the connection, then call
    /// [`ClientHandshake::tls_established`] and go on inside TLS.
    StartTls,
    /// Negotiation is over: the export's size, flags and block sizes.
    Ready(ExportInfo),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Hello,
    StartTlsReply,
    InTls,
    StructuredReply,
    MetaContext,
    GoReplies,
    ExportName,
    Done,
}

/// The client's negotiation; see the [module](self) documentation.
#[derive(Debug)]
pub struct ClientHandshake {
    export: String,
    starttls: bool,
    state: State,
    input: BytesMut,
    output: Vec<u8>,
    no_zeroes: bool,
    info: ExportInfo,
    got_export: bool,
    /// Ask for structured replies and `base:allocation`.
    want_allocation: bool,
    structured: bool,
    allocation: Option<u32>,
}

/// Option replies longer than this are a broken or hostile server.
const MAX_OPTION_REPLY: usize = proto::MAX_STRING + 1024;

fn invalid(what: String) -> WireError {
    WireError::Invalid { what }
}

impl ClientHandshake {
    /// Negotiation for `export`, upgrading to TLS first if `starttls` (before any other
    /// option, so nothing is said in the clear).
    #[must_use]
    pub fn new(export: &str, starttls: bool) -> Self {
        Self {
            export: export.to_owned(),
            starttls,
            state: State::Hello,
            input: BytesMut::new(),
            output: Vec::new(),
            no_zeroes: false,
            info: ExportInfo::default(),
            got_export: false,
            want_allocation: false,
            structured: false,
            allocation: None,
        }
    }

    /// Also asks for structured replies and the `base:allocation` metadata context, so that
    /// the export's holes can be queried with block status (servers that offer neither are
    /// used as before).
    #[must_use]
    pub fn with_allocation(mut self, on: bool) -> Self {
        self.want_allocation = on;
        self
    }

    /// Structured replies were negotiated: decode with [`ReplyDecoder::structured`].
    #[must_use]
    pub fn structured(&self) -> bool {
        self.structured
    }

    /// The id of the `base:allocation` context, if the server selected it.
    #[must_use]
    pub fn allocation_context(&self) -> Option<u32> {
        self.allocation
    }

    /// The bytes to send now (empty if none).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Bytes received beyond the negotiation (the first replies, if a server sent them
    /// early); hand them to the [`ReplyDecoder`].
    pub fn take_leftover(&mut self) -> BytesMut {
        std::mem::take(&mut self.input)
    }

    /// Takes in server bytes.
    ///
    /// # Errors
    /// [`WireError`] for a server that breaks the protocol, refuses the export (the error
    /// names it and carries the server's message), or refuses `STARTTLS`.
    pub fn receive(&mut self, data: &[u8]) -> Result<Status, WireError> {
        self.input.extend_from_slice(data);
        loop {
            match self.state {
                State::Hello => {
                    if self.input.len() < Hello::LEN {
                        return Ok(Status::NeedInput);
                    }
                    let h = Hello::parse(&self.input[..Hello::LEN])?;
                    self.input.advance(Hello::LEN);
                    if h.flags & proto::FLAG_FIXED_NEWSTYLE == 0 {
                        return Err(invalid(
                            "the server does not speak fixed newstyle".to_owned(),
                        ));
                    }
                    self.no_zeroes = h.flags & proto::FLAG_NO_ZEROES != 0;
                    let mut c = proto::FLAG_C_FIXED_NEWSTYLE;
                    if self.no_zeroes {
                        c |= proto::FLAG_C_NO_ZEROES;
                    }
                    self.output.extend_from_slice(&c.to_be_bytes());
                    if self.starttls {
                        let h = OptionHeader {
                            option: proto::OPT_STARTTLS,
                            length: 0,
                        };
                        self.output.extend_from_slice(&h.encode());
                        self.state = State::StartTlsReply;
                    } else {
                        self.after_hello();
                    }
                }
                State::StartTlsReply => {
                    let Some((rep, d)) = self.option_reply()? else {
                        return Ok(Status::NeedInput);
                    };
                    if rep.reply != proto::REP_ACK {
                        return Err(invalid(format!(
                            "the server will not start TLS ({:#x}): {}",
                            rep.reply,
                            String::from_utf8_lossy(&d)
                        )));
                    }
                    if !self.input.is_empty() {
                        return Err(invalid("data in the clear after STARTTLS".to_owned()));
                    }
                    self.state = State::InTls;
                    return Ok(Status::StartTls);
                }
                State::InTls => return Ok(Status::NeedInput),
                State::StructuredReply => {
                    let Some((rep, _)) = self.option_reply()? else {
                        return Ok(Status::NeedInput);
                    };
                    if rep.reply == proto::REP_ACK {
                        self.structured = true;
                        let data = proto::MetaContextRequest {
                            name: self.export.clone(),
                            queries: vec![proto::CONTEXT_BASE_ALLOCATION.to_owned()],
                        }
                        .encode();
                        let h = OptionHeader {
                            option: proto::OPT_SET_META_CONTEXT,
                            length: u32::try_from(data.len()).unwrap_or(u32::MAX),
                        };
                        self.output.extend_from_slice(&h.encode());
                        self.output.extend_from_slice(&data);
                        self.state = State::MetaContext;
                    } else {
                        // No structured replies here: plain simple replies, no holes.
                        self.send_go();
                    }
                }
                State::MetaContext => {
                    let Some((rep, d)) = self.option_reply()? else {
                        return Ok(Status::NeedInput);
                    };
                    match rep.reply {
                        proto::REP_META_CONTEXT => {
                            let (id, name) = proto::parse_meta_context(&d)?;
                            if name == proto::CONTEXT_BASE_ALLOCATION {
                                self.allocation = Some(id);
                            }
                        }
                        // Done, or refused (then without block status).
                        _ => {
                            if rep.reply != proto::REP_ACK {
                                self.allocation = None;
                            }
                            self.send_go();
                        }
                    }
                }
                State::GoReplies => {
                    let Some((rep, d)) = self.option_reply()? else {
                        return Ok(Status::NeedInput);
                    };
                    match rep.reply {
                        proto::REP_INFO => {
                            self.info.absorb(&d)?;
                            self.got_export |=
                                d.len() >= 2 && d[..2] == proto::INFO_EXPORT.to_be_bytes();
                        }
                        proto::REP_ACK if self.got_export => {
                            self.state = State::Done;
                            return Ok(Status::Ready(self.info));
                        }
                        proto::REP_ACK => {
                            return Err(invalid("GO acknowledged without export info".to_owned()));
                        }
                        proto::REP_ERR_UNSUP => {
                            // An old server: NBD_OPT_EXPORT_NAME, which ends negotiation.
                            let h = OptionHeader {
                                option: proto::OPT_EXPORT_NAME,
                                length: u32::try_from(self.export.len()).unwrap_or(u32::MAX),
                            };
                            self.output.extend_from_slice(&h.encode());
                            self.output.extend_from_slice(self.export.as_bytes());
                            self.state = State::ExportName;
                        }
                        e if e & (1 << 31) != 0 => {
                            return Err(invalid(format!(
                                "export {:?} refused ({e:#x}): {}",
                                self.export,
                                String::from_utf8_lossy(&d)
                            )));
                        }
                        // Other replies (a future extension's) are skipped.
                        _ => {}
                    }
                }
                State::ExportName => {
                    let need = ExportNameReply::LEN
                        + if self.no_zeroes {
                            0
                        } else {
                            ExportNameReply::ZEROES
                        };
                    if self.input.len() < need {
                        return Ok(Status::NeedInput);
                    }
                    let r = ExportNameReply::parse(&self.input)?;
                    self.input.advance(need);
                    self.info.size = r.size;
                    self.info.flags = r.flags;
                    self.state = State::Done;
                    return Ok(Status::Ready(self.info));
                }
                State::Done => return Ok(Status::Ready(self.info)),
            }
        }
    }

    /// The TLS handshake succeeded: negotiation goes on inside it.
    pub fn tls_established(&mut self) {
        if self.state == State::InTls {
            self.after_hello();
        }
    }

    /// The first option after the greeting (and TLS): structured replies if asked for,
    /// else `GO`.
    fn after_hello(&mut self) {
        if self.want_allocation {
            let h = OptionHeader {
                option: proto::OPT_STRUCTURED_REPLY,
                length: 0,
            };
            self.output.extend_from_slice(&h.encode());
            self.state = State::StructuredReply;
        } else {
            self.send_go();
        }
    }

    fn send_go(&mut self) {
        let data = InfoRequest {
            name: self.export.clone(),
            requests: vec![proto::INFO_BLOCK_SIZE],
        }
        .encode();
        let h = OptionHeader {
            option: proto::OPT_GO,
            length: u32::try_from(data.len()).unwrap_or(u32::MAX),
        };
        self.output.extend_from_slice(&h.encode());
        self.output.extend_from_slice(&data);
        self.state = State::GoReplies;
    }

    /// One whole option reply, if it has arrived.
    fn option_reply(&mut self) -> Result<Option<(OptionReply, Bytes)>, WireError> {
        if self.input.len() < OptionReply::LEN {
            return Ok(None);
        }
        let rep = OptionReply::parse(&self.input[..OptionReply::LEN])?;
        let n = rep.length as usize;
        if n > MAX_OPTION_REPLY {
            return Err(invalid(format!("option reply of {n} bytes")));
        }
        if self.input.len() < OptionReply::LEN + n {
            return Ok(None);
        }
        self.input.advance(OptionReply::LEN);
        Ok(Some((rep, self.input.split_to(n).freeze())))
    }
}

/// One reply of the transmission phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The request's handle.
    pub handle: u64,
    /// 0 or the errno the server answered.
    pub error: u32,
    /// A successful read's data.
    pub data: Bytes,
    /// A block status reply's extents `(bytes, status)`, of the context asked for.
    pub extents: Vec<(u64, u64)>,
}

/// What a request in flight expects of its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Bytes of data a successful reply carries (a read's length; 0 otherwise).
    pub read_len: usize,
    /// The request's offset (structured read chunks say where their data goes by it).
    pub offset: u64,
}

/// A structured reply being gathered from its chunks.
#[derive(Debug, Default)]
struct Gathering {
    data: Vec<u8>,
    /// The whole read in one data chunk (the common case): its bytes as received, no copy.
    whole: Option<Bytes>,
    extents: Vec<(u64, u64)>,
    error: u32,
}

impl Gathering {
    /// The read's buffer, made (zeroed, with a whole chunk already received copied in) on
    /// first use.
    fn buffer(&mut self, len: usize) -> &mut [u8] {
        if self.data.is_empty() {
            self.data = vec![0u8; len];
            if let Some(w) = self.whole.take() {
                self.data.copy_from_slice(&w);
            }
        }
        &mut self.data
    }
}

/// Chunk payloads larger than this are a broken or hostile server (the maximum payload is
/// at most 32 MiB here, plus a chunk's few bytes of header fields).
const MAX_CHUNK: u64 = (64 << 20) + 64;

/// Decodes replies from the bytes a server sends, simple or (if negotiated) structured;
/// see the [module](self) documentation.
#[derive(Debug, Default)]
pub struct ReplyDecoder {
    input: BytesMut,
    /// A header whose data has not all arrived: handle, error, data length.
    partial: Option<(u64, u32, usize)>,
    structured: bool,
    gathering: std::collections::HashMap<u64, Gathering>,
}

impl ReplyDecoder {
    /// A decoder of simple replies, with bytes that arrived during negotiation.
    #[must_use]
    pub fn new(leftover: BytesMut) -> Self {
        Self {
            input: leftover,
            ..Self::default()
        }
    }

    /// A decoder that also takes structured reply chunks (negotiated with
    /// `NBD_OPT_STRUCTURED_REPLY`).
    #[must_use]
    pub fn structured(leftover: BytesMut) -> Self {
        Self {
            input: leftover,
            structured: true,
            ..Self::default()
        }
    }

    /// The buffer to read server bytes into.
    pub fn input_buffer(&mut self) -> &mut BytesMut {
        &mut self.input
    }

    /// The next whole reply, if it has arrived. `read_len` says, for a handle in flight,
    /// how many bytes of data its reply carries on success (0 for anything but a read), or
    /// `None` for a handle not in flight.
    ///
    /// # Errors
    /// [`WireError`] for a bad magic or a reply to a handle not in flight: the connection
    /// can no longer be decoded.
    pub fn next(
        &mut self,
        mut expect: impl FnMut(u64) -> Option<Expect>,
    ) -> Result<Option<Reply>, WireError> {
        loop {
            if self.partial.is_none()
                && self.structured
                && self.input.len() >= 4
                && self.input[..4] == proto::STRUCTURED_REPLY_MAGIC.to_be_bytes()
            {
                match self.chunk(&mut expect)? {
                    Chunked::Reply(r) => return Ok(Some(r)),
                    Chunked::More => continue,
                    Chunked::NeedInput => return Ok(None),
                }
            }
            return self.simple(|h| expect(h).map(|e| e.read_len));
        }
    }

    /// One structured chunk, if whole: folded into its reply, which is returned when done.
    fn chunk(
        &mut self,
        expect: &mut impl FnMut(u64) -> Option<Expect>,
    ) -> Result<Chunked, WireError> {
        use proto::{Chunk, ChunkHeader};
        if self.input.len() < ChunkHeader::STRUCTURED_LEN {
            return Ok(Chunked::NeedInput);
        }
        let (h, _) = ChunkHeader::parse(&self.input[..ChunkHeader::STRUCTURED_LEN])?;
        if h.length > MAX_CHUNK {
            return Err(invalid(format!("a reply chunk of {} bytes", h.length)));
        }
        let total = ChunkHeader::STRUCTURED_LEN + h.length as usize;
        if self.input.len() < total {
            self.input.reserve(total - self.input.len());
            return Ok(Chunked::NeedInput);
        }
        let e = expect(h.handle)
            .ok_or_else(|| invalid(format!("reply chunk for unknown handle {:#x}", h.handle)))?;
        self.input.advance(ChunkHeader::STRUCTURED_LEN);
        let payload = self.input.split_to(h.length as usize).freeze();
        let g = self.gathering.entry(h.handle).or_default();
        let place = |offset: u64, len: u64| -> Result<usize, WireError> {
            let at = offset
                .checked_sub(e.offset)
                .filter(|&at| at.saturating_add(len) <= e.read_len as u64)
                .ok_or_else(|| {
                    invalid(format!(
                        "read chunk at {offset}+{len} outside the request at {}+{}",
                        e.offset, e.read_len
                    ))
                })?;
            Ok(at as usize)
        };
        match Chunk::parse(h.kind, false, &payload)? {
            Chunk::None => {}
            Chunk::OffsetData { offset } => {
                let data = &payload[8..];
                let at = place(offset, data.len() as u64)?;
                if at == 0 && data.len() == e.read_len && g.data.is_empty() && g.whole.is_none() {
                    g.whole = Some(payload.slice(8..));
                } else {
                    g.buffer(e.read_len)[at..at + data.len()].copy_from_slice(data);
                }
            }
            Chunk::OffsetHole { offset, size } => {
                let at = place(offset, size.into())?;
                g.buffer(e.read_len)[at..at + size as usize].fill(0);
            }
            Chunk::BlockStatus { extents, .. } => g.extents = extents,
            Chunk::Error { error, .. } => {
                if g.error == 0 {
                    g.error = error;
                }
            }
        }
        if h.flags & proto::REPLY_FLAG_DONE == 0 {
            return Ok(Chunked::More);
        }
        let g = self.gathering.remove(&h.handle).unwrap_or_default();
        let data = if g.error != 0 {
            Bytes::new()
        } else if let Some(w) = g.whole {
            w
        } else if g.data.is_empty() {
            Bytes::from(vec![0u8; e.read_len])
        } else {
            Bytes::from(g.data)
        };
        Ok(Chunked::Reply(Reply {
            handle: h.handle,
            error: g.error,
            data,
            extents: g.extents,
        }))
    }

    fn simple(
        &mut self,
        read_len: impl FnOnce(u64) -> Option<usize>,
    ) -> Result<Option<Reply>, WireError> {
        let (handle, error, len) = match self.partial {
            Some(p) => p,
            None => {
                if self.input.len() < SimpleReply::LEN {
                    return Ok(None);
                }
                let r = SimpleReply::parse(&self.input[..SimpleReply::LEN])?;
                let n = read_len(r.handle)
                    .ok_or_else(|| invalid(format!("reply for unknown handle {:#x}", r.handle)))?;
                self.input.advance(SimpleReply::LEN);
                let len = if r.error == 0 { n } else { 0 };
                self.partial = Some((r.handle, r.error, len));
                (r.handle, r.error, len)
            }
        };
        if self.input.len() < len {
            self.input.reserve(len - self.input.len());
            return Ok(None);
        }
        self.partial = None;
        let data = self.input.split_to(len).freeze();
        Ok(Some(Reply {
            handle,
            error,
            data,
            extents: Vec::new(),
        }))
    }
}

/// What one structured chunk did.
enum Chunked {
    NeedInput,
    More,
    Reply(Reply),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_servers_get_export_name_and_zeroes_are_skipped() {
        let mut h = ClientHandshake::new("d", false);
        let hello = Hello {
            flags: proto::FLAG_FIXED_NEWSTYLE,
        };
        assert_eq!(h.receive(&hello.encode()), Ok(Status::NeedInput));
        let _ = h.take_output();
        let unsup = OptionReply::encode(proto::OPT_GO, proto::REP_ERR_UNSUP, b"no");
        assert_eq!(h.receive(&unsup), Ok(Status::NeedInput));
        let sent = h.take_output();
        assert_eq!(
            OptionHeader::parse(&sent).unwrap().option,
            proto::OPT_EXPORT_NAME
        );
        let r = ExportNameReply {
            size: 4096,
            flags: proto::TF_HAS_FLAGS,
        }
        .encode(false);
        // The reply in two pieces, the zeroes last.
        assert_eq!(h.receive(&r[..50]), Ok(Status::NeedInput));
        match h.receive(&r[50..]) {
            Ok(Status::Ready(i)) => assert_eq!((i.size, i.flags), (4096, proto::TF_HAS_FLAGS)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_and_garbage_are_errors() {
        let mut h = ClientHandshake::new("d", true);
        assert!(h.receive(b"NOTMAGIC-at-all-18").is_err());
        let mut h = ClientHandshake::new("d", true);
        let hello = Hello {
            flags: proto::FLAG_FIXED_NEWSTYLE,
        };
        h.receive(&hello.encode()).unwrap();
        let no = OptionReply::encode(proto::OPT_STARTTLS, proto::REP_ERR_UNSUP, b"no TLS");
        let e = h.receive(&no).unwrap_err();
        assert!(e.to_string().contains("will not start TLS"), "{e}");
        let mut h = ClientHandshake::new("d", false);
        h.receive(&hello.encode()).unwrap();
        let unknown = OptionReply::encode(proto::OPT_GO, proto::REP_ERR_UNKNOWN, b"nope");
        assert!(
            h.receive(&unknown)
                .unwrap_err()
                .to_string()
                .contains("\"d\" refused")
        );
    }

    #[test]
    fn structured_chunks_gather_into_replies() {
        use proto::{Chunk, ChunkHeader};
        fn chunk(out: &mut Vec<u8>, handle: u64, done: bool, c: &Chunk, data: &[u8]) {
            let p = c.encode(false);
            ChunkHeader {
                flags: if done { proto::REPLY_FLAG_DONE } else { 0 },
                kind: c.kind(false),
                handle,
                offset: 0,
                length: (p.len() + data.len()) as u64,
            }
            .encode_into(false, out);
            out.extend_from_slice(&p);
            out.extend_from_slice(data);
        }
        let mut b = Vec::new();
        // Handle 1: a 2 KiB read at 8192 in two chunks out of order, a hole and data.
        chunk(
            &mut b,
            1,
            false,
            &Chunk::OffsetData { offset: 9216 },
            &[5u8; 1024],
        );
        chunk(
            &mut b,
            1,
            false,
            &Chunk::OffsetHole {
                offset: 8192,
                size: 1024,
            },
            &[],
        );
        chunk(&mut b, 1, true, &Chunk::None, &[]);
        // Handle 2: block status.
        let bs = Chunk::BlockStatus {
            context: 1,
            extents: vec![(4096, 3), (512, 0)],
        };
        chunk(&mut b, 2, true, &bs, &[]);
        // Handle 3: an error.
        let e = Chunk::Error {
            error: 5,
            message: "bad".to_owned(),
            offset: None,
        };
        chunk(&mut b, 3, true, &e, &[]);
        // Handle 4: one data chunk for the whole read (kept as received), then a hole over
        // its second half (the bytes must then be copied out and the half zeroed).
        chunk(
            &mut b,
            4,
            false,
            &Chunk::OffsetData { offset: 0 },
            &[7u8; 1024],
        );
        let hole = Chunk::OffsetHole {
            offset: 512,
            size: 512,
        };
        chunk(&mut b, 4, true, &hole, &[]);
        // Handle 5: one data chunk, done.
        chunk(
            &mut b,
            5,
            true,
            &Chunk::OffsetData { offset: 4096 },
            &[8u8; 512],
        );
        let expect = |h: u64| match h {
            4 => Some(Expect {
                read_len: 1024,
                offset: 0,
            }),
            5 => Some(Expect {
                read_len: 512,
                offset: 4096,
            }),
            1 => Some(Expect {
                read_len: 2048,
                offset: 8192,
            }),
            2 | 3 => Some(Expect {
                read_len: 0,
                offset: 0,
            }),
            _ => None,
        };
        for cut in [1, 20, 29, 1000, b.len()] {
            let mut d = ReplyDecoder::structured(BytesMut::new());
            let mut got = Vec::new();
            for part in [&b[..cut], &b[cut..]] {
                d.input_buffer().extend_from_slice(part);
                while let Some(r) = d.next(expect).unwrap() {
                    got.push(r);
                }
            }
            assert_eq!(got.len(), 5, "cut at {cut}");
            let mut half = vec![7u8; 512];
            half.extend_from_slice(&[0u8; 512]);
            assert_eq!(got[3].data, half);
            assert_eq!(got[4].data, vec![8u8; 512]);
            let mut want = vec![0u8; 1024];
            want.extend_from_slice(&[5u8; 1024]);
            assert_eq!(got[0].data, want);
            assert_eq!(got[1].extents, [(4096, 3), (512, 0)]);
            assert_eq!((got[2].error, got[2].data.len()), (5, 0));
        }
        // Data outside the request: refused.
        let mut bad = Vec::new();
        chunk(
            &mut bad,
            1,
            true,
            &Chunk::OffsetData { offset: 0 },
            &[1u8; 512],
        );
        let mut d = ReplyDecoder::structured(BytesMut::from(&bad[..]));
        assert!(d.next(expect).is_err());
    }

    #[test]
    fn replies_decode_in_any_split() {
        let mut b = SimpleReply {
            error: 0,
            handle: 1,
        }
        .encode()
        .to_vec();
        b.extend_from_slice(&[7u8; 1024]);
        b.extend_from_slice(
            &SimpleReply {
                error: 5,
                handle: 2,
            }
            .encode(),
        );
        let lens = |h: u64| {
            let read_len = match h {
                1 => 1024,
                2 => 512,
                _ => return None,
            };
            Some(Expect {
                read_len,
                offset: 0,
            })
        };
        for cut in [1, 16, 17, 1040, b.len()] {
            let mut d = ReplyDecoder::new(BytesMut::new());
            let mut got = Vec::new();
            for part in [&b[..cut], &b[cut..]] {
                d.input_buffer().extend_from_slice(part);
                while let Some(r) = d.next(lens).unwrap() {
                    got.push(r);
                }
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0].data.len(), 1024);
            // An error reply carries no data, whatever the request.
            assert_eq!((got[1].error, got[1].data.len()), (5, 0));
        }
        let mut d = ReplyDecoder::new(BytesMut::new());
        d.input_buffer().extend_from_slice(
            &SimpleReply {
                error: 0,
                handle: 9,
            }
            .encode(),
        );
        assert!(d.next(lens).is_err());
    }
}
