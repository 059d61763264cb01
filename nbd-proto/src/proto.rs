//! The NBD wire format: constants and the parsing and encoding of every message tagstripe
//! sends or receives, as pure functions (no I/O), so they can be tested and fuzzed alone.
//!
//! Source: the NBD protocol, `doc/proto.md` in the NetworkBlockDevice/nbd repository
//! (fixed-newstyle negotiation, the `INFO` extension's `NBD_OPT_INFO` / `NBD_OPT_GO`, simple
//! and structured replies, metadata contexts and block status), and the extended headers of
//! the `extension-ext-header` branch of the same document (64-bit lengths, as qemu 8.2+ and
//! libnbd 1.18+ negotiate). All integers are big-endian.

use bytes::BufMut;

/// `NBDMAGIC`, the first 8 bytes a newstyle server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle negotiation, and the prefix of every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// The magic of an option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// The magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// The magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// The magic of an extended request header (32 bytes, 64-bit length).
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// The magic of an extended reply chunk header (32 bytes).
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

/// Handshake flag: fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: no 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: read-only export.
pub const TF_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` supported.
pub const TF_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` supported.
pub const TF_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: rotational medium.
pub const TF_ROTATIONAL: u16 = 1 << 4;
/// Transmission flag: `NBD_CMD_TRIM` supported.
pub const TF_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` supported.
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: `NBD_CMD_FLAG_DF` (one content chunk per read) supported.
pub const TF_SEND_DF: u16 = 1 << 7;
/// Transmission flag: flush and FUA are visible across connections.
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: `NBD_CMD_CACHE` supported.
pub const TF_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag: `NBD_CMD_FLAG_FAST_ZERO` supported on `WRITE_ZEROES`.
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;
/// Transmission flag: `NBD_CMD_BLOCK_STATUS` accepts a payload naming the contexts wanted.
pub const TF_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

/// Option: choose an export and start transmission (no error reply possible).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option: end negotiation.
pub const OPT_ABORT: u32 = 2;
/// Option: list exports.
pub const OPT_LIST: u32 = 3;
/// Option: start TLS (not supported).
pub const OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const OPT_INFO: u32 = 6;
/// Option: describe an export and start transmission.
pub const OPT_GO: u32 = 7;
/// Option: structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select metadata contexts for block status.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// Option: extended headers (64-bit lengths).
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply: accepted / end of list.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of a list.
pub const REP_SERVER: u32 = 2;
/// Option reply: one piece of information about an export.
pub const REP_INFO: u32 = 3;
/// Option reply: one metadata context (its id and name).
pub const REP_META_CONTEXT: u32 = 4;
/// Option reply error: unknown option.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// Option reply error: not allowed.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// Option reply error: malformed option.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// Option reply error: TLS is required first.
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// Option reply error: no such export.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// Option reply error: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
/// Option reply error: the request is too big.
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Information type: size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// Information type: the export's name.
pub const INFO_NAME: u16 = 1;
/// Information type: a description.
pub const INFO_DESCRIPTION: u16 = 2;
/// Information type: minimum, preferred and maximum block sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command flag: forced unit access.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag: write zeroes without punching a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag: answer a read in one content chunk ("don't fragment").
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag: block status with one extent per context.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag: fail fast if zeroing is not fast.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Command flag (extended headers): the length is a payload that follows the header.
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

/// Reply chunk flag: the last chunk of its reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Reply chunk type: nothing (success, final).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Reply chunk type: data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Reply chunk type: a run of zeroes at an offset.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Reply chunk type: block status extents of one context (32-bit).
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Reply chunk type: block status extents of one context (64-bit, extended headers).
pub const REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
/// Reply chunk type: an error.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
/// Reply chunk type: an error at an offset.
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

/// `base:allocation` status flag: not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` status flag: reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

/// The standard allocation context.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
/// tagstripe's context: which component holds each extent. Status bits 0-15 are the
/// component's index; bits 16-31 are a mirror partner's index plus one (0: no mirror).
pub const CONTEXT_TAGSTRIPE_COMPONENT: &str = "tagstripe:component";

/// Errors the protocol allows in a reply (Linux errno values).
pub mod errno {
    /// Operation not permitted (write to a read-only export).
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid request.
    pub const EINVAL: u32 = 22;
    /// Write past the end.
    pub const ENOSPC: u32 = 28;
    /// Request too large.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported.
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// A transmission command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE`, followed by `length` bytes of data.
    Write,
    /// `NBD_CMD_DISC`: the client is leaving.
    Disc,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
    /// `NBD_CMD_CACHE`.
    Cache,
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS`.
    BlockStatus,
    /// Any other command (answered with `EINVAL`).
    Other(u16),
}

impl Command {
    /// The wire value.
    #[must_use]
    pub fn code(self) -> u16 {
        match self {
            Self::Read => 0,
            Self::Write => 1,
            Self::Disc => 2,
            Self::Flush => 3,
            Self::Trim => 4,
            Self::Cache => 5,
            Self::WriteZeroes => 6,
            Self::BlockStatus => 7,
            Self::Other(c) => c,
        }
    }

    /// From the wire value.
    #[must_use]
    pub fn from_code(c: u16) -> Self {
        match c {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::Disc,
            3 => Self::Flush,
            4 => Self::Trim,
            5 => Self::Cache,
            6 => Self::WriteZeroes,
            7 => Self::BlockStatus,
            c => Self::Other(c),
        }
    }
}

/// What is wrong with bytes received from a peer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A magic number that is not the expected one.
    #[error("bad magic {got:#x} in {what} (expected {expected:#x})")]
    BadMagic {
        /// Which message.
        what: &'static str,
        /// The value received.
        got: u64,
        /// The value required.
        expected: u64,
    },
    /// A message shorter than its fields.
    #[error("{what} is truncated: {got} bytes, {need} needed")]
    Truncated {
        /// Which message.
        what: &'static str,
        /// Bytes present.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A field with a value the protocol forbids.
    #[error("{what}")]
    Invalid {
        /// What is wrong.
        what: String,
    },
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// The header of a transmission request (28 bytes on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// The command.
    pub command: Command,
    /// The client's handle (cookie), echoed in the reply.
    pub handle: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

impl Request {
    /// Bytes on the wire.
    pub const LEN: usize = 28;

    /// Parses a request header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadMagic`].
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Truncated {
                what: "request",
                got: b.len(),
                need: Self::LEN,
            });
        }
        let magic = be32(b, 0);
        if magic != REQUEST_MAGIC {
            return Err(WireError::BadMagic {
                what: "request",
                got: magic.into(),
                expected: REQUEST_MAGIC.into(),
            });
        }
        Ok(Self {
            flags: be16(b, 4),
            command: Command::from_code(be16(b, 6)),
            handle: be64(b, 8),
            offset: be64(b, 16),
            length: be32(b, 24),
        })
    }

    /// Encodes the header.
    #[must_use]
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.code().to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply header (16 bytes); a successful read's data follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    /// 0 or an errno value (see [`errno`]).
    pub error: u32,
    /// The request's handle.
    pub handle: u64,
}

impl SimpleReply {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// Parses a reply header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadMagic`] (also for a structured reply
    /// chunk: parse those with [`ChunkHeader::parse`]; tagstripe's client never negotiates
    /// them).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Truncated {
                what: "reply",
                got: b.len(),
                need: Self::LEN,
            });
        }
        let magic = be32(b, 0);
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(WireError::BadMagic {
                what: "reply",
                got: magic.into(),
                expected: SIMPLE_REPLY_MAGIC.into(),
            });
        }
        Ok(Self {
            error: be32(b, 4),
            handle: be64(b, 8),
        })
    }

    /// Encodes the header.
    #[must_use]
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&self.error.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b
    }
}

/// The header of an option the client sends (16 bytes; `length` bytes of data follow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option (`OPT_*`).
    pub option: u32,
    /// Length of the data that follows.
    pub length: u32,
}

impl OptionHeader {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// Parses an option header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadMagic`].
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Truncated {
                what: "option",
                got: b.len(),
                need: Self::LEN,
            });
        }
        let magic = be64(b, 0);
        if magic != IHAVEOPT {
            return Err(WireError::BadMagic {
                what: "option",
                got: magic,
                expected: IHAVEOPT,
            });
        }
        Ok(Self {
            option: be32(b, 8),
            length: be32(b, 12),
        })
    }

    /// Encodes the header.
    #[must_use]
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// The header of an option reply (20 bytes; `length` bytes of data follow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReply {
    /// The option answered.
    pub option: u32,
    /// The reply type (`REP_*`).
    pub reply: u32,
    /// Length of the data that follows.
    pub length: u32,
}

impl OptionReply {
    /// Bytes on the wire.
    pub const LEN: usize = 20;

    /// Parses an option reply header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadMagic`].
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < Self::LEN {
            return Err(WireError::Truncated {
                what: "option reply",
                got: b.len(),
                need: Self::LEN,
            });
        }
        let magic = be64(b, 0);
        if magic != OPT_REPLY_MAGIC {
            return Err(WireError::BadMagic {
                what: "option reply",
                got: magic,
                expected: OPT_REPLY_MAGIC,
            });
        }
        Ok(Self {
            option: be32(b, 8),
            reply: be32(b, 12),
            length: be32(b, 16),
        })
    }

    /// Encodes the header followed by `data`.
    #[must_use]
    pub fn encode(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::LEN + data.len());
        b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&reply.to_be_bytes());
        b.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
        b.extend_from_slice(data);
        b
    }
}

/// The longest string the protocol allows (export names, messages).
pub const MAX_STRING: usize = 4096;

/// The data of `NBD_OPT_INFO` / `NBD_OPT_GO`: an export name and the information
/// requested.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    /// The export's name ("" for the default).
    pub name: String,
    /// The information types requested (`INFO_*`).
    pub requests: Vec<u16>,
}

impl InfoRequest {
    /// Parses the option's data.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the lengths run past the data, [`WireError::Invalid`]
    /// for trailing bytes, an over-long or non-UTF-8 name.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let trunc = |need| WireError::Truncated {
            what: "info request",
            got: b.len(),
            need,
        };
        if b.len() < 4 {
            return Err(trunc(4));
        }
        let n = be32(b, 0) as usize;
        if n > MAX_STRING {
            return Err(WireError::Invalid {
                what: format!("export name of {n} bytes (at most {MAX_STRING})"),
            });
        }
        let need = 4 + n + 2;
        if b.len() < need {
            return Err(trunc(need));
        }
        let name = std::str::from_utf8(&b[4..4 + n])
            .map_err(|_| WireError::Invalid {
                what: "export name is not UTF-8".to_owned(),
            })?
            .to_owned();
        let count = be16(b, 4 + n) as usize;
        let need = need + 2 * count;
        if b.len() != need {
            return Err(if b.len() < need {
                trunc(need)
            } else {
                WireError::Invalid {
                    what: format!("{} bytes after the info requests", b.len() - need),
                }
            });
        }
        let requests = (0..count).map(|i| be16(b, 4 + n + 2 + 2 * i)).collect();
        Ok(Self { name, requests })
    }

    /// Encodes the option's data.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(8 + self.name.len() + 2 * self.requests.len());
        b.extend_from_slice(&u32::try_from(self.name.len()).unwrap_or(0).to_be_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b.extend_from_slice(
            &u16::try_from(self.requests.len())
                .unwrap_or(0)
                .to_be_bytes(),
        );
        for r in &self.requests {
            b.extend_from_slice(&r.to_be_bytes());
        }
        b
    }
}

/// What `NBD_REP_INFO` replies carry, gathered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportInfo {
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (`TF_*`).
    pub flags: u16,
    /// Minimum, preferred and maximum block sizes, if the server sent them.
    pub block_sizes: Option<(u32, u32, u32)>,
}

/// Encodes the data of an `NBD_REP_INFO` of type `NBD_INFO_EXPORT`.
#[must_use]
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b
}

/// Encodes the data of an `NBD_REP_INFO` of type `NBD_INFO_BLOCK_SIZE`.
#[must_use]
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(14);
    b.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    b.extend_from_slice(&min.to_be_bytes());
    b.extend_from_slice(&preferred.to_be_bytes());
    b.extend_from_slice(&max.to_be_bytes());
    b
}

impl ExportInfo {
    /// Takes in the data of one `NBD_REP_INFO` reply; unknown types are ignored, as the
    /// protocol asks.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::Invalid`] for a malformed known type.
    pub fn absorb(&mut self, b: &[u8]) -> Result<(), WireError> {
        if b.len() < 2 {
            return Err(WireError::Truncated {
                what: "info reply",
                got: b.len(),
                need: 2,
            });
        }
        let exact = |need: usize| {
            if b.len() == need {
                Ok(())
            } else {
                Err(WireError::Invalid {
                    what: format!(
                        "info reply of type {} has {} bytes, not {need}",
                        be16(b, 0),
                        b.len()
                    ),
                })
            }
        };
        match be16(b, 0) {
            INFO_EXPORT => {
                exact(12)?;
                self.size = be64(b, 2);
                self.flags = be16(b, 10);
            }
            INFO_BLOCK_SIZE => {
                exact(14)?;
                let (min, pref, max) = (be32(b, 2), be32(b, 6), be32(b, 10));
                if !min.is_power_of_two()
                    || !pref.is_power_of_two()
                    || min > 65536
                    || pref < min
                    || max < min
                {
                    return Err(WireError::Invalid {
                        what: format!("block sizes {min}/{pref}/{max} break the protocol's rules"),
                    });
                }
                self.block_sizes = Some((min, pref, max));
            }
            _ => {}
        }
        Ok(())
    }
}

/// The header of an extended request (32 bytes on the wire), used once extended headers
/// are negotiated: as [`Request`] with a 64-bit length (a payload length with
/// [`CMD_FLAG_PAYLOAD_LEN`], else an effect length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtendedRequest {
    /// Command flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// The command.
    pub command: Command,
    /// The client's cookie, echoed in the reply.
    pub handle: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u64,
}

impl ExtendedRequest {
    /// Bytes on the wire.
    pub const LEN: usize = 32;

    /// Parses an extended request header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadMagic`].
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b, Self::LEN, "extended request")?;
        magic32(b, EXTENDED_REQUEST_MAGIC, "extended request")?;
        Ok(Self {
            flags: be16(b, 4),
            command: Command::from_code(be16(b, 6)),
            handle: be64(b, 8),
            offset: be64(b, 16),
            length: be64(b, 24),
        })
    }

    /// Encodes the header.
    #[must_use]
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.code().to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..32].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

fn need(b: &[u8], n: usize, what: &'static str) -> Result<(), WireError> {
    if b.len() < n {
        return Err(WireError::Truncated {
            what,
            got: b.len(),
            need: n,
        });
    }
    Ok(())
}

fn magic32(b: &[u8], expected: u32, what: &'static str) -> Result<(), WireError> {
    let got = be32(b, 0);
    if got != expected {
        return Err(WireError::BadMagic {
            what,
            got: got.into(),
            expected: expected.into(),
        });
    }
    Ok(())
}

/// The header of one reply chunk: structured (20 bytes, 32-bit length) or extended
/// (32 bytes, with the request's offset and a 64-bit length). `length` bytes of payload
/// follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Reply flags ([`REPLY_FLAG_DONE`]).
    pub flags: u16,
    /// The chunk type (`REPLY_TYPE_*`).
    pub kind: u16,
    /// The request's cookie.
    pub handle: u64,
    /// The request's offset (extended headers only; 0 in a structured chunk).
    pub offset: u64,
    /// Payload length.
    pub length: u64,
}

impl ChunkHeader {
    /// Bytes of a structured chunk header.
    pub const STRUCTURED_LEN: usize = 20;
    /// Bytes of an extended chunk header.
    pub const EXTENDED_LEN: usize = 32;

    /// Parses a chunk header of either form, by its magic.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadMagic`] (also for a simple reply).
    pub fn parse(b: &[u8]) -> Result<(Self, bool), WireError> {
        need(b, 4, "reply chunk")?;
        match be32(b, 0) {
            STRUCTURED_REPLY_MAGIC => {
                need(b, Self::STRUCTURED_LEN, "structured reply chunk")?;
                Ok((
                    Self {
                        flags: be16(b, 4),
                        kind: be16(b, 6),
                        handle: be64(b, 8),
                        offset: 0,
                        length: be32(b, 16).into(),
                    },
                    false,
                ))
            }
            EXTENDED_REPLY_MAGIC => {
                need(b, Self::EXTENDED_LEN, "extended reply chunk")?;
                Ok((
                    Self {
                        flags: be16(b, 4),
                        kind: be16(b, 6),
                        handle: be64(b, 8),
                        offset: be64(b, 16),
                        length: be64(b, 24),
                    },
                    true,
                ))
            }
            got => Err(WireError::BadMagic {
                what: "reply chunk",
                got: got.into(),
                expected: STRUCTURED_REPLY_MAGIC.into(),
            }),
        }
    }

    /// Appends the header, extended or structured, to `out`. A structured header's length
    /// is 32 bits: the caller keeps payloads below 4 GiB there.
    pub fn encode_into<B: BufMut>(&self, extended: bool, out: &mut B) {
        out.put_u32(if extended {
            EXTENDED_REPLY_MAGIC
        } else {
            STRUCTURED_REPLY_MAGIC
        });
        out.put_u16(self.flags);
        out.put_u16(self.kind);
        out.put_u64(self.handle);
        if extended {
            out.put_u64(self.offset);
            out.put_u64(self.length);
        } else {
            out.put_u32(u32::try_from(self.length).unwrap_or(u32::MAX));
        }
    }
}

/// The payload of a reply chunk, decoded by its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk {
    /// `NBD_REPLY_TYPE_NONE`.
    None,
    /// `NBD_REPLY_TYPE_OFFSET_DATA`: the data's offset (the data follows the 8 bytes).
    OffsetData {
        /// Byte offset in the export.
        offset: u64,
    },
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`: `size` bytes of zeroes at `offset`.
    OffsetHole {
        /// Byte offset in the export.
        offset: u64,
        /// Bytes of zeroes.
        size: u32,
    },
    /// `NBD_REPLY_TYPE_BLOCK_STATUS` or `_EXT`: extents `(length, status)` of one context.
    BlockStatus {
        /// The context's id.
        context: u32,
        /// `(bytes, status flags)` in order.
        extents: Vec<(u64, u64)>,
    },
    /// `NBD_REPLY_TYPE_ERROR` or `_ERROR_OFFSET`.
    Error {
        /// The errno value.
        error: u32,
        /// A message for humans.
        message: String,
        /// Where it happened (`ERROR_OFFSET`).
        offset: Option<u64>,
    },
}

impl Chunk {
    /// Decodes the payload of a chunk of type `kind`. For `OFFSET_DATA` only the first 8
    /// bytes (the offset) are read; the data is the rest.
    ///
    /// # Errors
    /// [`WireError::Invalid`] for an unknown type or a payload of the wrong shape.
    pub fn parse(kind: u16, extended: bool, b: &[u8]) -> Result<Self, WireError> {
        let bad = |what: String| Err(WireError::Invalid { what });
        match kind {
            REPLY_TYPE_NONE if b.is_empty() => Ok(Self::None),
            REPLY_TYPE_OFFSET_DATA if b.len() > 8 => Ok(Self::OffsetData { offset: be64(b, 0) }),
            REPLY_TYPE_OFFSET_HOLE if b.len() == 12 && be32(b, 8) != 0 => Ok(Self::OffsetHole {
                offset: be64(b, 0),
                size: be32(b, 8),
            }),
            REPLY_TYPE_BLOCK_STATUS if !extended && b.len() >= 12 && (b.len() - 4) % 8 == 0 => {
                let extents = b[4..]
                    .chunks(8)
                    .map(|d| (u64::from(be32(d, 0)), u64::from(be32(d, 4))))
                    .collect();
                Ok(Self::BlockStatus {
                    context: be32(b, 0),
                    extents,
                })
            }
            REPLY_TYPE_BLOCK_STATUS_EXT
                if extended
                    && b.len() >= 24
                    && (b.len() - 8) % 16 == 0
                    && be32(b, 4) as usize == (b.len() - 8) / 16 =>
            {
                let extents = b[8..]
                    .chunks(16)
                    .map(|d| (be64(d, 0), be64(d, 8)))
                    .collect();
                Ok(Self::BlockStatus {
                    context: be32(b, 0),
                    extents,
                })
            }
            REPLY_TYPE_ERROR | REPLY_TYPE_ERROR_OFFSET if b.len() >= 6 => {
                let n = be16(b, 4) as usize;
                let tail = if kind == REPLY_TYPE_ERROR { 0 } else { 8 };
                if b.len() != 6 + n + tail || be32(b, 0) == 0 {
                    return bad(format!("error chunk of {} bytes, message {n}", b.len()));
                }
                let message = String::from_utf8_lossy(&b[6..6 + n]).into_owned();
                let offset = (tail == 8).then(|| be64(b, 6 + n));
                Ok(Self::Error {
                    error: be32(b, 0),
                    message,
                    offset,
                })
            }
            _ => bad(format!(
                "reply chunk of type {kind} with {} bytes of payload",
                b.len()
            )),
        }
    }

    /// The chunk type this payload is sent as.
    #[must_use]
    pub fn kind(&self, extended: bool) -> u16 {
        match self {
            Self::None => REPLY_TYPE_NONE,
            Self::OffsetData { .. } => REPLY_TYPE_OFFSET_DATA,
            Self::OffsetHole { .. } => REPLY_TYPE_OFFSET_HOLE,
            Self::BlockStatus { .. } if extended => REPLY_TYPE_BLOCK_STATUS_EXT,
            Self::BlockStatus { .. } => REPLY_TYPE_BLOCK_STATUS,
            Self::Error { offset: None, .. } => REPLY_TYPE_ERROR,
            Self::Error { .. } => REPLY_TYPE_ERROR_OFFSET,
        }
    }

    /// Encodes the payload (for `OffsetData`, only its 8-byte offset: the data follows).
    /// Without extended headers, extent lengths and statuses are cut to 32 bits (the caller
    /// keeps them there); a message is cut to the protocol's 4096 bytes.
    #[must_use]
    pub fn encode(&self, extended: bool) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Self::None => {}
            Self::OffsetData { offset } => b.extend_from_slice(&offset.to_be_bytes()),
            Self::OffsetHole { offset, size } => {
                b.extend_from_slice(&offset.to_be_bytes());
                b.extend_from_slice(&size.to_be_bytes());
            }
            Self::BlockStatus { context, extents } => {
                b.extend_from_slice(&context.to_be_bytes());
                if extended {
                    let n = u32::try_from(extents.len()).unwrap_or(u32::MAX);
                    b.extend_from_slice(&n.to_be_bytes());
                    for &(len, status) in extents {
                        b.extend_from_slice(&len.to_be_bytes());
                        b.extend_from_slice(&status.to_be_bytes());
                    }
                } else {
                    for &(len, status) in extents {
                        b.extend_from_slice(&(len.min(u32::MAX.into()) as u32).to_be_bytes());
                        b.extend_from_slice(&(status as u32).to_be_bytes());
                    }
                }
            }
            Self::Error {
                error,
                message,
                offset,
            } => {
                let mut m = message.as_bytes();
                if m.len() > MAX_STRING {
                    m = &m[..MAX_STRING];
                }
                b.extend_from_slice(&error.to_be_bytes());
                b.extend_from_slice(&(m.len() as u16).to_be_bytes());
                b.extend_from_slice(m);
                if let Some(o) = offset {
                    b.extend_from_slice(&o.to_be_bytes());
                }
            }
        }
        b
    }
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`: an export name and
/// the context queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// The export's name.
    pub name: String,
    /// The queries (`namespace:leaf`).
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    /// Parses the option's data.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if a length runs past the data, [`WireError::Invalid`] for
    /// trailing bytes, over-long or non-UTF-8 strings.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let mut at = 0usize;
        let string = |at: &mut usize| -> Result<String, WireError> {
            need(&b[*at..], 4, "meta context request")?;
            let n = be32(b, *at) as usize;
            if n > MAX_STRING {
                return Err(WireError::Invalid {
                    what: format!("string of {n} bytes (at most {MAX_STRING})"),
                });
            }
            need(&b[*at + 4..], n, "meta context request")?;
            let s = std::str::from_utf8(&b[*at + 4..*at + 4 + n])
                .map_err(|_| WireError::Invalid {
                    what: "meta context string is not UTF-8".to_owned(),
                })?
                .to_owned();
            *at += 4 + n;
            Ok(s)
        };
        let name = string(&mut at)?;
        need(&b[at..], 4, "meta context request")?;
        let count = be32(b, at) as usize;
        at += 4;
        // Each query takes at least 4 bytes: a count beyond that is a lie.
        if count > (b.len() - at) / 4 {
            return Err(WireError::Truncated {
                what: "meta context queries",
                got: b.len(),
                need: at + 4 * count,
            });
        }
        let mut queries = Vec::with_capacity(count);
        for _ in 0..count {
            queries.push(string(&mut at)?);
        }
        if at != b.len() {
            return Err(WireError::Invalid {
                what: format!("{} bytes after the meta context queries", b.len() - at),
            });
        }
        Ok(Self { name, queries })
    }

    /// Encodes the option's data.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q.as_bytes());
        }
        b
    }
}

/// Encodes the data of an `NBD_REP_META_CONTEXT` reply: the id, then the name.
#[must_use]
pub fn meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = id.to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b
}

/// Decodes the data of an `NBD_REP_META_CONTEXT` reply.
///
/// # Errors
/// [`WireError::Truncated`] under 4 bytes, [`WireError::Invalid`] for a bad name.
pub fn parse_meta_context(b: &[u8]) -> Result<(u32, String), WireError> {
    need(b, 4, "meta context reply")?;
    if b.len() - 4 > MAX_STRING {
        return Err(WireError::Invalid {
            what: format!("meta context name of {} bytes", b.len() - 4),
        });
    }
    let name = std::str::from_utf8(&b[4..]).map_err(|_| WireError::Invalid {
        what: "meta context name is not UTF-8".to_owned(),
    })?;
    Ok((be32(b, 0), name.to_owned()))
}

/// The server's greeting in fixed newstyle (18 bytes): `NBDMAGIC`, `IHAVEOPT`, handshake
/// flags (`FLAG_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Handshake flags.
    pub flags: u16,
}

impl Hello {
    /// Bytes on the wire.
    pub const LEN: usize = 18;

    /// Parses the greeting.
    ///
    /// # Errors
    /// [`WireError::Truncated`] or [`WireError::BadMagic`] (not a newstyle server).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b, Self::LEN, "greeting")?;
        for (at, expected) in [(0, NBDMAGIC), (8, IHAVEOPT)] {
            let got = be64(b, at);
            if got != expected {
                return Err(WireError::BadMagic {
                    what: "greeting",
                    got,
                    expected,
                });
            }
        }
        Ok(Self { flags: be16(b, 16) })
    }

    /// Encodes the greeting.
    #[must_use]
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[16..18].copy_from_slice(&self.flags.to_be_bytes());
        b
    }
}

/// The server's answer to `NBD_OPT_EXPORT_NAME`: the size and transmission flags, then 124
/// zero bytes unless both sides agreed on `NO_ZEROES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportNameReply {
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (`TF_*`).
    pub flags: u16,
}

impl ExportNameReply {
    /// Bytes before the optional zeroes.
    pub const LEN: usize = 10;
    /// The zeroes that follow without `NO_ZEROES`.
    pub const ZEROES: usize = 124;

    /// Parses the first [`Self::LEN`] bytes (the zeroes, if any, are the caller's to skip).
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b, Self::LEN, "export-name reply")?;
        Ok(Self {
            size: be64(b, 0),
            flags: be16(b, 8),
        })
    }

    /// Encodes the reply, with the zeroes unless `no_zeroes`.
    #[must_use]
    pub fn encode(&self, no_zeroes: bool) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::LEN + Self::ZEROES);
        b.extend_from_slice(&self.size.to_be_bytes());
        b.extend_from_slice(&self.flags.to_be_bytes());
        if !no_zeroes {
            b.extend_from_slice(&[0u8; Self::ZEROES]);
        }
        b
    }
}

/// Encodes the data of an `NBD_REP_SERVER` reply (one export of a list): the name's length,
/// then the name.
#[must_use]
pub fn server_entry(name: &str) -> Vec<u8> {
    let mut d = Vec::with_capacity(4 + name.len());
    d.extend_from_slice(&u32::try_from(name.len()).unwrap_or(u32::MAX).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d
}

/// Decodes the data of an `NBD_REP_SERVER` reply: the name, and any details after it.
///
/// # Errors
/// [`WireError::Truncated`] if the name runs past the data, [`WireError::Invalid`] if it is
/// not UTF-8.
pub fn parse_server_entry(b: &[u8]) -> Result<(String, String), WireError> {
    need(b, 4, "export list entry")?;
    let n = be32(b, 0) as usize;
    if n > b.len() - 4 {
        return Err(WireError::Truncated {
            what: "export list entry",
            got: b.len(),
            need: 4 + n,
        });
    }
    let name = std::str::from_utf8(&b[4..4 + n]).map_err(|_| WireError::Invalid {
        what: "export name is not UTF-8".to_owned(),
    })?;
    Ok((
        name.to_owned(),
        String::from_utf8_lossy(&b[4 + n..]).into_owned(),
    ))
}

/// Encodes the data of an `NBD_REP_INFO` carrying a string (`INFO_NAME`, `INFO_DESCRIPTION`).
#[must_use]
pub fn info_string(kind: u16, text: &str) -> Vec<u8> {
    let mut d = kind.to_be_bytes().to_vec();
    d.extend_from_slice(text.as_bytes());
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            command: Command::Write,
            handle: 0x0102_0304_0506_0708,
            offset: 4096,
            length: 512,
        };
        assert_eq!(Request::parse(&r.encode()), Ok(r));
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert!(matches!(
            Request::parse(&bad),
            Err(WireError::BadMagic { .. })
        ));
        assert!(matches!(
            Request::parse(&bad[..10]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn info_request_round_trips_and_refuses_garbage() {
        let r = InfoRequest {
            name: "vol".to_owned(),
            requests: vec![INFO_BLOCK_SIZE, INFO_NAME],
        };
        let b = r.encode();
        assert_eq!(InfoRequest::parse(&b), Ok(r));
        assert!(InfoRequest::parse(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(InfoRequest::parse(&long).is_err());
        let mut huge = b;
        huge[0] = 0xff;
        assert!(InfoRequest::parse(&huge).is_err());
    }

    #[test]
    fn greeting_export_name_and_list_entries_round_trip() {
        let h = Hello {
            flags: FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES,
        };
        assert_eq!(Hello::parse(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[9] ^= 1;
        assert!(matches!(
            Hello::parse(&bad),
            Err(WireError::BadMagic { .. })
        ));
        let r = ExportNameReply {
            size: 1 << 30,
            flags: TF_HAS_FLAGS | TF_READ_ONLY,
        };
        assert_eq!(r.encode(true).len(), 10);
        assert_eq!(r.encode(false).len(), 134);
        assert_eq!(ExportNameReply::parse(&r.encode(false)), Ok(r));
        assert_eq!(
            parse_server_entry(&server_entry("vol")),
            Ok(("vol".to_owned(), String::new()))
        );
        assert!(parse_server_entry(&[0, 0, 0, 9, b'x']).is_err());
    }

    #[test]
    fn extended_request_and_chunks_round_trip() {
        let r = ExtendedRequest {
            flags: CMD_FLAG_PAYLOAD_LEN,
            command: Command::Write,
            handle: 7,
            offset: 1 << 40,
            length: 1 << 33,
        };
        assert_eq!(ExtendedRequest::parse(&r.encode()), Ok(r));
        for ext in [false, true] {
            let h = ChunkHeader {
                flags: REPLY_FLAG_DONE,
                kind: REPLY_TYPE_OFFSET_HOLE,
                handle: 9,
                offset: if ext { 4096 } else { 0 },
                length: 12,
            };
            let mut b = Vec::new();
            h.encode_into(ext, &mut b);
            assert_eq!(ChunkHeader::parse(&b), Ok((h, ext)));
            let chunks = [
                Chunk::None,
                Chunk::OffsetHole {
                    offset: 4096,
                    size: 512,
                },
                Chunk::BlockStatus {
                    context: 1,
                    extents: vec![(4096, 3), (512, 0)],
                },
                Chunk::Error {
                    error: errno::EIO,
                    message: "bad".to_owned(),
                    offset: Some(512),
                },
                Chunk::Error {
                    error: errno::EINVAL,
                    message: String::new(),
                    offset: None,
                },
            ];
            for c in chunks {
                let p = c.encode(ext);
                assert_eq!(Chunk::parse(c.kind(ext), ext, &p), Ok(c));
            }
        }
        // A hole of zero bytes, a status chunk with no extent, an error of 0: refused.
        assert!(Chunk::parse(REPLY_TYPE_OFFSET_HOLE, false, &[0; 12]).is_err());
        assert!(Chunk::parse(REPLY_TYPE_BLOCK_STATUS, false, &[0; 4]).is_err());
        assert!(Chunk::parse(REPLY_TYPE_ERROR, false, &[0; 6]).is_err());
    }

    #[test]
    fn meta_context_request_round_trips_and_refuses_garbage() {
        let r = MetaContextRequest {
            name: "vol".to_owned(),
            queries: vec!["base:allocation".to_owned(), "tagstripe:".to_owned()],
        };
        let b = r.encode();
        assert_eq!(MetaContextRequest::parse(&b), Ok(r));
        assert!(MetaContextRequest::parse(&b[..b.len() - 1]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(MetaContextRequest::parse(&long).is_err());
        // A count of a billion queries in a few bytes.
        let mut lie = 3u32.to_be_bytes().to_vec();
        lie.extend_from_slice(b"vol");
        lie.extend_from_slice(&1_000_000_000u32.to_be_bytes());
        assert!(MetaContextRequest::parse(&lie).is_err());
        assert_eq!(
            parse_meta_context(&meta_context(3, "base:allocation")),
            Ok((3, "base:allocation".to_owned()))
        );
    }

    #[test]
    fn export_info_checks_block_sizes() {
        let mut i = ExportInfo::default();
        i.absorb(&info_export(1 << 20, TF_HAS_FLAGS | TF_SEND_FLUSH))
            .unwrap();
        i.absorb(&info_block_size(512, 4096, 32 << 20)).unwrap();
        assert_eq!(i.size, 1 << 20);
        assert_eq!(i.block_sizes, Some((512, 4096, 32 << 20)));
        assert!(i.absorb(&info_block_size(3, 4096, 4096)).is_err());
        assert!(i.absorb(&[0, 0, 1]).is_err());
        // Unknown types are skipped.
        i.absorb(&[0, 99, 1, 2, 3]).unwrap();
    }
}
