//! The crate's one error type.

/// Misuse of the queue or the disk model; the state is unchanged when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A completion for a tag no command holds (never dispatched, or already completed).
    #[error("no command holds tag {tag}")]
    UnknownTag {
        /// The tag.
        tag: u32,
    },
    /// A command sent to the disk model with a tag already in use there.
    #[error("tag {tag} is already in use at the device")]
    TagInUse {
        /// The tag.
        tag: u32,
    },
    /// A command past the end of the modelled disk, or of zero length.
    #[error(
        "command at sector {lba} of {sectors} sectors is outside the disk ({capacity} sectors)"
    )]
    OutOfRange {
        /// First sector.
        lba: u64,
        /// Length.
        sectors: u64,
        /// The disk's size.
        capacity: u64,
    },
}
