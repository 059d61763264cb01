//! The crate's one error type.

/// Everything that can go wrong validating limits, loading quirks or splitting a request.
///
/// Parse errors name where the problem is (the line of a table or TOML file, the byte
/// position in a force string); limit errors name the field and value; split errors name the
/// sector.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A logical block size that is not a power of two between 512 bytes and 64 KiB.
    #[error("logical block size {bytes} is not a power of two from 512 to 65536 bytes")]
    InvalidLogicalBlockSize {
        /// The value given, in bytes.
        bytes: u32,
    },
    /// A physical block size that is not a power of two.
    #[error("physical block size {bytes} is not a power of two")]
    InvalidPhysicalBlockSize {
        /// The value given, in bytes.
        bytes: u32,
    },
    /// The physical block is smaller than the logical block.
    #[error("physical block size {physical} is smaller than the logical block size {logical}")]
    PhysicalBelowLogical {
        /// Physical block size in bytes.
        physical: u32,
        /// Logical block size in bytes.
        logical: u32,
    },
    /// A size limit below what the block layer accepts (one page, one logical block, or
    /// 4 KiB for segments).
    #[error("{field} = {value} is below the minimum {min}")]
    LimitTooSmall {
        /// The field, by its Linux name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The smallest value allowed.
        min: u64,
    },
    /// A boundary mask that is not of the form 2^k - 1.
    #[error("{field} = {value:#x} is not one less than a power of two")]
    InvalidMask {
        /// The field, by its Linux name.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// A sector quantity that is not a whole number of logical blocks.
    #[error("{field} = {value} sectors is not a multiple of the logical block ({lbs} sectors)")]
    NotBlockMultiple {
        /// The field.
        field: &'static str,
        /// The value given, in sectors.
        value: u64,
        /// The logical block size in sectors.
        lbs: u64,
    },
    /// `min_tags` above `max_tags`, or no tags at all.
    #[error("tag limits min {min} / max {max} are invalid (need 1 <= min <= max)")]
    InvalidTags {
        /// min_tags.
        min: u32,
        /// max_tags.
        max: u32,
    },
    /// Stacking was asked for with no member devices.
    #[error("a stacked volume needs at least one member")]
    NoMembers,
    /// A malformed glob pattern.
    #[error("bad pattern {pattern:?} at character {position}: {reason}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// The character index of the problem.
        position: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A quirk key that does not exist.
    #[error("unknown quirk key {key:?} {at}")]
    UnknownKey {
        /// The key as given.
        key: String,
        /// Where it was found.
        at: Location,
    },
    /// A quirk key given a value it cannot take.
    #[error("bad value {value:?} for {key} {at}: {reason}")]
    BadValue {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// Why it is wrong.
        reason: &'static str,
        /// Where it was found.
        at: Location,
    },
    /// A malformed line of a quirk table file or a malformed force-string entry.
    #[error("malformed quirk entry {at}: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
        /// Where.
        at: Location,
    },
    /// A request that does not start and end on logical-block boundaries.
    #[error(
        "request at sector {start} of {sectors} sectors is not aligned to the {lbs}-sector logical block"
    )]
    Misaligned {
        /// First sector.
        start: u64,
        /// Length in sectors.
        sectors: u64,
        /// Logical block size in sectors.
        lbs: u64,
    },
    /// A request whose end does not fit in 64 bits.
    #[error("request at sector {start} of {sectors} sectors overflows")]
    RequestOverflow {
        /// First sector.
        start: u64,
        /// Length in sectors.
        sectors: u64,
    },
    /// The device does not support this operation (e.g. discard with `max_discard_sectors` 0).
    #[error("the device does not support {op}")]
    Unsupported {
        /// The operation.
        op: &'static str,
    },
    /// The limits leave no room for even one logical block at this point of the request.
    #[error("no logical block fits the device limits at sector {sector}")]
    NoProgress {
        /// Where the split got stuck.
        sector: u64,
    },
    /// The scatter list does not hold exactly the request's bytes.
    #[error("scatter list holds {bytes} bytes, the request needs {needed}")]
    SegmentsMismatch {
        /// Bytes in the scatter list.
        bytes: u64,
        /// Bytes the request covers.
        needed: u64,
    },
    /// The mod-15 `smart` policy cannot avoid a bad count (a one-block piece is itself bad,
    /// as with 8 KiB logical blocks).
    #[error("no piece size at sector {sector} avoids a count of 1 mod 15")]
    Mod15Unavoidable {
        /// Where.
        sector: u64,
    },
}

/// Where in an input a parse error is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A line (1-based) of a named input, such as the built-in table or a TOML file.
    Line {
        /// The input's name.
        input: String,
        /// 1-based line.
        line: usize,
    },
    /// A byte offset (0-based) into a force string.
    Offset(usize),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Line { input, line } => write!(f, "at {input} line {line}"),
            Self::Offset(o) => write!(f, "at byte {o}"),
        }
    }
}
