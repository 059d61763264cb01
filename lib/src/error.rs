//! The crate's one error type.

use std::io;

/// Everything a block-device operation can fail with. Bad input is refused before anything
/// is issued; an I/O error names the device (and, in a volume, the component) and the
/// sectors; a write that fails is never reported done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A request that reaches past the end of the device.
    #[error(
        "{device}: request at sector {start} of {sectors} sectors is past the end ({size} sectors)"
    )]
    OutOfRange {
        /// The device.
        device: String,
        /// First sector.
        start: u64,
        /// Length.
        sectors: u64,
        /// The device size.
        size: u64,
    },
    /// A request whose end overflows 64 bits.
    #[error("{device}: request at sector {start} of {sectors} sectors overflows")]
    Overflow {
        /// The device.
        device: String,
        /// First sector.
        start: u64,
        /// Length.
        sectors: u64,
    },
    /// A request that is not whole logical blocks.
    #[error(
        "{device}: request at sector {start} of {sectors} sectors is not aligned to {lbs}-sector blocks"
    )]
    Misaligned {
        /// The device.
        device: String,
        /// First sector.
        start: u64,
        /// Length.
        sectors: u64,
        /// Logical block in sectors.
        lbs: u64,
    },
    /// A zero-length read or write, or data that is not whole sectors.
    #[error("{device}: {what}")]
    BadLength {
        /// The device.
        device: String,
        /// What is wrong.
        what: String,
    },
    /// A write, flush or discard on a read-only device.
    #[error("{device}: read-only")]
    ReadOnly {
        /// The device.
        device: String,
    },
    /// An operation the device does not support.
    #[error("{device}: {op} is not supported")]
    Unsupported {
        /// The device.
        device: String,
        /// The operation.
        op: &'static str,
    },
    /// The device is temporarily full (SCSI QUEUE FULL); the queue layer retries.
    #[error("{device}: queue full")]
    QueueFull {
        /// The device.
        device: String,
    },
    /// The device is busy (SCSI BUSY); the queue layer retries after a delay.
    #[error("{device}: busy")]
    Busy {
        /// The device.
        device: String,
    },
    /// An I/O error from the operating system or the device.
    #[error("{device}: {op} of {sectors} sectors at {start} failed: {source}")]
    Io {
        /// The device.
        device: String,
        /// The operation.
        op: &'static str,
        /// First sector.
        start: u64,
        /// Length.
        sectors: u64,
        /// The cause.
        source: io::Error,
    },
    /// A component of a volume failed; the inner error says how.
    #[error("component {component}{}: {source}", at_volume(*.volume_sector))]
    Component {
        /// Index of the component in the volume.
        component: usize,
        /// Where the failed piece starts in the volume (the sector the caller asked for, or
        /// inside its request); `None` for errors of no one piece (a flush, a size check).
        volume_sector: Option<u64>,
        /// The component's error (its sectors are the component's).
        source: Box<Error>,
    },
    /// The device or queue was shut down.
    #[error("{device}: closed")]
    Closed {
        /// The device.
        device: String,
    },
    /// An NBD server answered a request with an error.
    #[error("{device}: {op} of {sectors} sectors at {start} failed on the server: {} ({errno})", nbd_errno_name(*.errno))]
    Nbd {
        /// The export (`nbd://host:port/name`).
        device: String,
        /// The operation.
        op: &'static str,
        /// First sector.
        start: u64,
        /// Length.
        sectors: u64,
        /// The error value the server sent (an errno).
        errno: u32,
    },
    /// A peer broke the NBD protocol (or negotiation failed); the connection is closed.
    #[error("{peer}: NBD protocol: {what}")]
    Protocol {
        /// Who (an export URL, or "client").
        peer: String,
        /// What went wrong.
        what: String,
    },
    /// The components' metadata refuses the volume (a component from another volume, in
    /// another order, of another geometry, torn beyond repair, or stale with no copy).
    #[error("volume metadata: {0}")]
    Metadata(#[from] tagstripe_striping::superblock::MetadataError),
    /// A mirror side could not be resynced.
    #[error("resync of component {component}: {what}")]
    Resync {
        /// The side being copied back.
        component: usize,
        /// What stopped it.
        what: String,
    },
    /// TLS credentials that cannot be used, or a TLS handshake that failed.
    #[error("TLS: {path}: {what}")]
    Tls {
        /// The file, directory or peer concerned.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// A request or connection took longer than allowed.
    #[error("{device}: {op} timed out")]
    Timeout {
        /// The device.
        device: String,
        /// The operation.
        op: &'static str,
    },
    /// A connection could not be made.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// Host and port.
        addr: String,
        /// The cause.
        source: io::Error,
    },
    /// A device URL that cannot be used.
    #[error("{url}: {why}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// A size that cannot be read (see [`crate::parse_size`]).
    #[error("{input:?}: {why}")]
    BadSize {
        /// What was given.
        input: String,
        /// What is wrong.
        why: String,
    },
    /// A crash-lab log that cannot be read as written: truncated, corrupted, or not a log.
    #[error("{path}: {what} (at byte {offset})")]
    CrashLog {
        /// The log file.
        path: String,
        /// Where it breaks: the byte offset of the first record that does not read whole.
        offset: u64,
        /// What is wrong there.
        what: String,
    },
    /// A recording layer whose log could not be written: the device refuses further
    /// writes rather than let them go unrecorded.
    #[error("{device}: recording failed: {what}")]
    Recording {
        /// The recorded device.
        device: String,
        /// Why the log could not be written.
        what: String,
    },
    /// A tenant that cannot be added or changed: a bad spec, a name taken or unknown.
    #[error("tenant {tenant}: {what}")]
    Tenant {
        /// The tenant's name.
        tenant: String,
        /// What is wrong.
        what: String,
    },
    /// A geometry ccd would refuse.
    #[error(transparent)]
    Geometry(#[from] tagstripe_striping::Error),
    /// Limits or quirks that do not validate, or a request the splitter refuses.
    #[error(transparent)]
    Limits(#[from] tagstripe_quirks::Error),
}

impl Error {
    /// Whether the queue layer should retry the request (QUEUE FULL, BUSY).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::QueueFull { .. } | Self::Busy { .. } => true,
            Self::Component { source, .. } => source.is_retryable(),
            _ => false,
        }
    }
}

impl Error {
    /// The component of the volume the error comes from (the outermost, for volumes of
    /// volumes), if it came from one.
    ///
    /// ```
    /// use tagstripe::Error;
    /// let e = Error::Component {
    ///     component: 2,
    ///     volume_sector: Some(4096),
    ///     source: Box::new(Error::Closed { device: "nbd0".into() }),
    /// };
    /// assert_eq!(e.to_string(), "component 2 (volume sector 4096): nbd0: closed");
    /// assert_eq!(e.component(), Some(2));
    /// assert!(matches!(e.root(), Error::Closed { .. }));
    /// assert_eq!(e.errno(), libc::ESHUTDOWN);
    /// let io: std::io::Error = e.into();
    /// assert_eq!(io.raw_os_error(), None);
    /// assert_eq!(io.kind(), std::io::Error::from_raw_os_error(libc::ESHUTDOWN).kind());
    /// ```
    #[must_use]
    pub fn component(&self) -> Option<usize> {
        match self {
            Self::Component { component, .. } => Some(*component),
            _ => None,
        }
    }

    /// The error under every [`Error::Component`] wrapper: what the device itself said.
    #[must_use]
    pub fn root(&self) -> &Error {
        match self {
            Self::Component { source, .. } => source.root(),
            e => e,
        }
    }

    /// The errno that best says what went wrong: the device's own for I/O and NBD errors
    /// (EIO if it gave none), EINVAL for bad requests, EROFS, EOPNOTSUPP, EAGAIN for
    /// QUEUE FULL and BUSY, ESHUTDOWN for a closed device, ETIMEDOUT, ECONNREFUSED for a
    /// connection that failed without one, EPROTO for a protocol violation, EACCES for TLS.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self.root() {
            Self::OutOfRange { .. }
            | Self::Overflow { .. }
            | Self::Misaligned { .. }
            | Self::BadLength { .. }
            | Self::BadUrl { .. }
            | Self::BadSize { .. }
            | Self::CrashLog { .. }
            | Self::Tenant { .. }
            | Self::Geometry(_)
            | Self::Limits(_) => libc::EINVAL,
            Self::ReadOnly { .. } => libc::EROFS,
            Self::Unsupported { .. } => libc::EOPNOTSUPP,
            Self::QueueFull { .. } | Self::Busy { .. } => libc::EAGAIN,
            Self::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Self::Closed { .. } => libc::ESHUTDOWN,
            Self::Nbd { errno, .. } => i32::try_from(*errno).unwrap_or(libc::EIO),
            Self::Protocol { .. } => libc::EPROTO,
            Self::Tls { .. } => libc::EACCES,
            Self::Metadata(_) => libc::EUCLEAN,
            Self::Resync { .. } | Self::Recording { .. } => libc::EIO,
            Self::Timeout { .. } => libc::ETIMEDOUT,
            Self::Connect { source, .. } => source.raw_os_error().unwrap_or(libc::ECONNREFUSED),
            Self::Component { .. } => libc::EIO,
        }
    }
}

/// An [`Error`] as an `io::Error` whose kind follows [`Error::errno`]; the error itself is
/// kept as the source (its message names the device and the sectors).
impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = io::Error::from_raw_os_error(e.errno()).kind();
        io::Error::new(kind, e)
    }
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The symbolic name of an NBD error value.
fn at_volume(s: Option<u64>) -> String {
    s.map(|s| format!(" (volume sector {s})"))
        .unwrap_or_default()
}

fn nbd_errno_name(e: u32) -> &'static str {
    match e {
        1 => "EPERM",
        5 => "EIO",
        12 => "ENOMEM",
        22 => "EINVAL",
        28 => "ENOSPC",
        75 => "EOVERFLOW",
        95 => "ENOTSUP",
        108 => "ESHUTDOWN",
        _ => "unknown error",
    }
}
