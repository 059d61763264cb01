//! The crate's one error type.

use crate::Flavor;

/// The errno a BSD kernel (or ccdconfig) reports for a refusal, kept so results can be
/// compared with ccd's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Errno {
    /// Invalid argument: a configuration ccd refuses, or (NetBSD) a request past the end.
    Einval,
    /// No such device: a component with no usable sectors.
    Enodev,
    /// I/O error: FreeBSD's answer to a request that starts past the end.
    Eio,
}

impl Errno {
    /// The symbolic name, e.g. `"EINVAL"`.
    ///
    /// ```
    /// assert_eq!(tagstripe_striping::Errno::Enodev.as_str(), "ENODEV");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Einval => "EINVAL",
            Self::Enodev => "ENODEV",
            Self::Eio => "EIO",
        }
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong building a [`Geometry`](crate::Geometry) or mapping a request.
///
/// Configuration variants correspond one to one with the refusals of ccd's `ccdinit` (and
/// ccdconfig, and md raid0's `create_strip_zones`); [`Error::errno`] gives the errno the kernel
/// would have returned. Request variants are the library's bounds policy: nothing is mapped
/// for a request that does not fit entirely inside the volume.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The component list is empty.
    #[error("no components")]
    NoComponents,
    /// More components than ccd accepts (`CCD_MAXNDISKS`).
    #[error("{count} components, at most {max} are allowed")]
    TooManyComponents {
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A component sector size that is zero, not a power of two, or below 512 bytes.
    #[error("sector size {sector_size} is not a power of two of at least 512 bytes")]
    InvalidSectorSize {
        /// The sector size in bytes.
        sector_size: u32,
    },
    /// An interleave given as a negative number (ccdconfig rejects it).
    #[error("negative interleave {interleave}")]
    NegativeInterleave {
        /// The value given.
        interleave: i64,
    },
    /// The interleave is smaller than one component sector.
    #[error("interleave must be at least {min} (sector size {sector_size})")]
    InterleaveBelowSectorSize {
        /// The effective interleave, in 512-byte sectors.
        interleave: u64,
        /// The smallest interleave allowed, in 512-byte sectors.
        min: u64,
        /// The largest component sector size, in bytes.
        sector_size: u32,
    },
    /// md raid0 needs a chunk that is a whole number of component sectors.
    #[error("chunk of {interleave} sectors is not a multiple of the {sector_size}-byte sector")]
    ChunkNotBlockMultiple {
        /// The chunk, in 512-byte sectors.
        interleave: u64,
        /// The largest component sector size, in bytes.
        sector_size: u32,
    },
    /// md raid0 needs a nonzero chunk.
    #[error("md raid0 needs a nonzero chunk size")]
    ChunkRequired,
    /// A component has nothing left once the reserved area is taken off.
    #[error("component {component} has effective size zero")]
    ComponentEmpty {
        /// Index of the component, in the order given.
        component: usize,
        /// Its raw size in sectors.
        raw_sectors: u64,
        /// The reserved area in sectors.
        reserved: u64,
    },
    /// A component is smaller than one interleave, so rounding leaves nothing.
    #[error("component {component} is smaller than the interleave")]
    ComponentSmallerThanInterleave {
        /// Index of the component, in the order given.
        component: usize,
        /// Its size in sectors after the reserved area.
        sectors: u64,
        /// The effective interleave.
        interleave: u64,
    },
    /// Mirroring needs an even number of components.
    #[error("mirroring requires an even number of components, got {count}")]
    MirrorOddCount {
        /// How many components were given.
        count: usize,
    },
    /// This flavor has no mirroring.
    #[error("{flavor} has no mirroring")]
    MirrorUnsupported {
        /// The flavor asked for.
        flavor: Flavor,
    },
    /// NetBSD's 1997 mirroring refuses an interleave of 0.
    #[error("mirroring requires an interleave")]
    MirrorNeedsInterleave,
    /// FreeBSD's `linux` mode mirrors exactly two components.
    #[error("mirror mode for linux raids is only supported with 2 components, got {count}")]
    LinuxMirrorNeedsTwo {
        /// How many components were given.
        count: usize,
    },
    /// An option this flavor does not have (e.g. `linux` outside FreeBSD).
    #[error("option {option} is not supported by {flavor}")]
    OptionUnsupported {
        /// The option's name.
        option: &'static str,
        /// The flavor asked for.
        flavor: Flavor,
    },
    /// A flavor name that is not known.
    #[error("unknown flavor {name:?} (expected netbsd, netbsd1997, freebsd, md-alt or md-orig)")]
    UnknownFlavor {
        /// The name given.
        name: String,
    },
    /// The interleave, a component or the volume is too large for 64-bit sector numbers.
    #[error("{what} overflows 64-bit sector arithmetic")]
    Overflow {
        /// Which quantity overflowed.
        what: &'static str,
    },
    /// A request whose end does not fit in a `u64`.
    #[error("request at sector {start} of {count} sectors overflows")]
    RequestOverflow {
        /// First sector.
        start: u64,
        /// Length in sectors.
        count: u64,
    },
    /// An md RAID level this crate does not lay out.
    #[error("md level {level} is not laid out here (raid5, raid6 and raid10 are)")]
    InvalidLevel {
        /// The level given.
        level: u32,
    },
    /// An md chunk that is not a power of two of at least one 4 KiB page.
    #[error("{level}: a chunk of {chunk} sectors; md needs a power of two of at least 8 sectors")]
    InvalidChunk {
        /// The level.
        level: &'static str,
        /// The chunk in sectors.
        chunk: u64,
    },
    /// Fewer members than the level needs.
    #[error("{level} needs at least {min} members, got {disks}")]
    TooFewDisks {
        /// The level.
        level: &'static str,
        /// Members given.
        disks: usize,
        /// The least it takes.
        min: usize,
    },
    /// A layout the level does not have (or md does not define).
    #[error("{level} has no layout {layout:?}")]
    LayoutUnsupported {
        /// The level.
        level: &'static str,
        /// The layout asked for.
        layout: String,
    },
    /// An md superblock that cannot be used (named: magic, version, size, checksum).
    #[error("md superblock: {what}")]
    MdSuperblock {
        /// What is wrong.
        what: String,
    },
    /// Members too small for one chunk of data.
    #[error("members hold less than one {chunk}-sector chunk of data")]
    MemberTooSmall {
        /// The chunk in sectors.
        chunk: u64,
    },
    /// A request that reaches past the end of the volume: nothing is mapped.
    #[error("request at sector {start} of {count} sectors ends past the volume end {total}")]
    PastEnd {
        /// First sector.
        start: u64,
        /// Length in sectors.
        count: u64,
        /// The volume size in sectors.
        total: u64,
    },
}

impl Error {
    /// The errno ccd (or md) would report for this refusal.
    ///
    /// ```
    /// use tagstripe_striping::{Errno, Geometry};
    /// let err = Geometry::builder([1000, 15, 1000], 16).build().unwrap_err();
    /// assert_eq!(err.errno(), Errno::Enodev);
    /// ```
    #[must_use]
    pub fn errno(&self) -> Errno {
        match self {
            Self::ComponentEmpty { .. } | Self::ComponentSmallerThanInterleave { .. } => {
                Errno::Enodev
            }
            _ => Errno::Einval,
        }
    }

    /// A short stable name for the variant, for machine-readable output.
    ///
    /// ```
    /// use tagstripe_striping::Error;
    /// assert_eq!(Error::NoComponents.kind(), "no_components");
    /// ```
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NoComponents => "no_components",
            Self::TooManyComponents { .. } => "too_many_components",
            Self::InvalidSectorSize { .. } => "invalid_sector_size",
            Self::NegativeInterleave { .. } => "negative_interleave",
            Self::InterleaveBelowSectorSize { .. } => "interleave_below_sector_size",
            Self::ChunkNotBlockMultiple { .. } => "chunk_not_block_multiple",
            Self::ChunkRequired => "chunk_required",
            Self::ComponentEmpty { .. } => "component_empty",
            Self::ComponentSmallerThanInterleave { .. } => "component_smaller_than_interleave",
            Self::MirrorOddCount { .. } => "mirror_odd_count",
            Self::MirrorUnsupported { .. } => "mirror_unsupported",
            Self::MirrorNeedsInterleave => "mirror_needs_interleave",
            Self::LinuxMirrorNeedsTwo { .. } => "linux_mirror_needs_two",
            Self::OptionUnsupported { .. } => "option_unsupported",
            Self::UnknownFlavor { .. } => "unknown_flavor",
            Self::Overflow { .. } => "overflow",
            Self::RequestOverflow { .. } => "request_overflow",
            Self::PastEnd { .. } => "past_end",
            Self::InvalidLevel { .. } => "invalid_level",
            Self::InvalidChunk { .. } => "invalid_chunk",
            Self::TooFewDisks { .. } => "too_few_disks",
            Self::LayoutUnsupported { .. } => "layout_unsupported",
            Self::MemberTooSmall { .. } => "member_too_small",
            Self::MdSuperblock { .. } => "md_superblock",
        }
    }
}
