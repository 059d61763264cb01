//! The NBD wire format: constants and the parsing and encoding of every message tagstripe
//! sends or receives, as pure functions (no I/O), so they can be tested and fuzzed alone.
//!
//! Source: the NBD protocol, `doc/proto.md` in the NetworkBlockDevice/nbd repository
//! (fixed-newstyle negotiation, the `INFO` extension's `NBD_OPT_INFO` / `NBD_OPT_GO`, simple
//! replies). All integers are big-endian.

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
/// The magic of a structured reply (tagstripe never negotiates them).
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

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
/// Transmission flag: flush and FUA are visible across connections.
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: `NBD_CMD_FLAG_FAST_ZERO` supported on `WRITE_ZEROES`.
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

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
/// Option: structured replies (not supported).
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply: accepted / end of list.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of a list.
pub const REP_SERVER: u32 = 2;
/// Option reply: one piece of information about an export.
pub const REP_INFO: u32 = 3;
/// Option reply error: unknown option.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// Option reply error: not allowed.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// Option reply error: malformed option.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// Option reply error: no such export.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

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
/// Command flag: fail fast if zeroing is not fast.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

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
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
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
            Self::WriteZeroes => 6,
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
            6 => Self::WriteZeroes,
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
    /// [`WireError::Truncated`] or [`WireError::BadMagic`] (also for a structured reply,
    /// which tagstripe never negotiates).
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
