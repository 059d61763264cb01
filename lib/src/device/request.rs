//! What travels with a request and what comes back: [`IoOpts`](crate::IoOpts), [`Zeroes`](crate::Zeroes), [`Extent`](crate::Extent).

use tagstripe_scheduler::{IoClass, TagKind};

/// How a request is to be treated: its I/O class, its tag kind, and forced unit access.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoOpts {
    /// Class, for the tagged queue's fairness.
    pub class: IoClass,
    /// Tag kind (ordered: a barrier; head-of-queue: next).
    pub kind: TagKind,
    /// The write is durable when it completes.
    pub fua: bool,
}

impl IoOpts {
    /// Best-effort, simple tag, no FUA.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The same with another class.
    #[must_use]
    pub fn class(mut self, class: IoClass) -> Self {
        self.class = class;
        self
    }

    /// The same with FUA.
    #[must_use]
    pub fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }
}

/// A run of sectors in one allocation state, as [`BlockDevice::allocation`](crate::BlockDevice::allocation) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Length in sectors (never 0).
    pub sectors: u64,
    /// Not allocated on the backing store (NBD's `NBD_STATE_HOLE`).
    pub hole: bool,
    /// Reads as zeroes (NBD's `NBD_STATE_ZERO`).
    pub zero: bool,
}

impl Extent {
    /// Allocated data.
    #[must_use]
    pub fn data(sectors: u64) -> Self {
        Self {
            sectors,
            hole: false,
            zero: false,
        }
    }

    /// A hole that reads as zeroes.
    #[must_use]
    pub fn hole(sectors: u64) -> Self {
        Self {
            sectors,
            hole: true,
            zero: true,
        }
    }

    /// Allocated, and reads as zeroes.
    #[must_use]
    pub fn zero(sectors: u64) -> Self {
        Self {
            sectors,
            hole: false,
            zero: true,
        }
    }

    /// Whether two extents have the same state.
    #[must_use]
    pub fn same_state(&self, other: &Self) -> bool {
        self.hole == other.hole && self.zero == other.zero
    }
}

/// Appends `e` to `out`, merging it into the last extent if their states match; empty
/// extents are dropped.
pub(crate) fn push_extent(out: &mut Vec<Extent>, e: Extent) {
    if e.sectors == 0 {
        return;
    }
    match out.last_mut() {
        Some(last) if last.same_state(&e) => last.sectors += e.sectors,
        _ => out.push(e),
    }
}

/// How [`BlockDevice::write_zeroes`](crate::BlockDevice::write_zeroes) may zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Zeroes {
    /// The sectors may be deallocated (a hole that reads as zeroes).
    pub unmap: bool,
    /// Fail with [`Error::Unsupported`](crate::Error::Unsupported) rather than write zeroes the slow way.
    pub fast_only: bool,
}

impl Zeroes {
    /// Zero in place, falling back to writing zeroes.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// May deallocate.
    #[must_use]
    pub fn unmap(mut self, on: bool) -> Self {
        self.unmap = on;
        self
    }

    /// Only if fast.
    #[must_use]
    pub fn fast_only(mut self, on: bool) -> Self {
        self.fast_only = on;
        self
    }
}
