//! A device's queue limits, with Linux's meaning (`struct queue_limits`), their validation
//! (`blk_validate_limits`) and stacking for a striped volume (`blk_stack_limits`).

use crate::Error;

/// Bytes in a sector: every `*_sectors` field counts 512-byte units, whatever the device's
/// logical block size, as Linux does.
pub const SECTOR_BYTES: u32 = 512;

/// One 4 KiB page in sectors: the smallest `max_sectors` the block layer accepts.
pub const PAGE_SECTORS: u32 = 8;

/// Linux's `BLK_DEF_MAX_SECTORS_CAP` since 2025 (commit 9b8b84879d4a): 4 MiB. The soft cap
/// `max_sectors` defaults to it (or to `io_opt` when that is larger).
pub const DEFAULT_MAX_SECTORS_CAP: u32 = 8192;

/// Linux's `BLK_MIN_SEGMENT_SIZE`: no segment limit below 4 KiB is accepted.
pub const MIN_SEGMENT_BYTES: u32 = 4096;

/// A device's limits. Sizes in bytes or 512-byte sectors as each field says; **0 means
/// unlimited** (or "none") for every `max_*` field, the boundary masks and `chunk_sectors`.
///
/// That differs from Linux in one respect, on purpose: Linux gives a driver that sets no
/// value conservative defaults (`max_hw_sectors` 255, 128 segments of 64 KiB). A user-space
/// backend that has no limit should not be capped, so here 0 stays unlimited;
/// [`Limits::linux_defaults`] gives the kernel's values.
///
/// Build one from [`Limits::default`] and set fields, then [`Limits::validate`] to check
/// them and derive the effective `max_sectors`:
///
/// ```
/// use tagstripe_quirks::Limits;
/// let mut l = Limits::default();
/// l.logical_block_size = 512;
/// l.physical_block_size = 4096;
/// l.max_hw_sectors = 2560;
/// l.max_user_sectors = 4096; // above the hardware value: clamped, as Linux does
/// let l = l.validate()?;
/// assert_eq!(l.max_sectors, 2560);
/// # Ok::<(), tagstripe_quirks::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Smallest addressable unit in bytes; every request is a multiple of it.
    pub logical_block_size: u32,
    /// The device's internal block in bytes (0 = same as logical); smaller or misaligned
    /// writes cost a read-modify-write.
    pub physical_block_size: u32,
    /// Minimum preferred I/O in bytes (0 or less is raised to the physical block).
    pub io_min: u32,
    /// Optimal I/O in bytes (e.g. a full stripe); 0 = none. Rounded down to the physical
    /// block.
    pub io_opt: u32,
    /// The most sectors the hardware takes in one command (`max_hw_sectors_kb` × 2).
    pub max_hw_sectors: u32,
    /// The user's soft cap in sectors (sysfs `max_sectors_kb` × 2); 0 = not set.
    pub max_user_sectors: u32,
    /// The effective soft cap per request, derived by [`Limits::validate`] from the
    /// hardware value, the user's and the 4 MiB default cap. Writing it has no effect.
    pub max_sectors: u32,
    /// Most scatter/gather segments per request.
    pub max_segments: u32,
    /// Most bytes in one segment.
    pub max_segment_size: u32,
    /// A segment may not cross an address multiple of `mask + 1`.
    pub seg_boundary_mask: u64,
    /// NVMe-style "no gaps" rule: inner segment boundaries aligned to `mask + 1`.
    pub virt_boundary_mask: u64,
    /// I/O must not cross a multiple of this many sectors (RAID chunk, zone, NVMe NOIOB);
    /// need not be a power of two.
    pub chunk_sectors: u32,
    /// Most sectors per discard; 0 = no discard support.
    pub max_discard_sectors: u32,
    /// Discard unit in bytes (raised to the physical block when discard is supported).
    pub discard_granularity: u32,
    /// Offset of the discard granularity grid in bytes.
    pub discard_alignment: u32,
    /// Most sectors per write-zeroes; 0 = not supported.
    pub max_write_zeroes_sectors: u32,
    /// Tagged commands the device accepts at once (CAM's maxtags; 1 = untagged).
    pub max_tags: u32,
    /// The floor for the tag openings after QUEUE FULL (CAM's mintags).
    pub min_tags: u32,
}

impl Default for Limits {
    /// 512-byte logical blocks (physical = logical), no size or segment limits, no discard,
    /// 64 tags with a floor of 2.
    fn default() -> Self {
        Self {
            logical_block_size: SECTOR_BYTES,
            physical_block_size: 0,
            io_min: 0,
            io_opt: 0,
            max_hw_sectors: 0,
            max_user_sectors: 0,
            max_sectors: 0,
            max_segments: 0,
            max_segment_size: 0,
            seg_boundary_mask: 0,
            virt_boundary_mask: 0,
            chunk_sectors: 0,
            max_discard_sectors: 0,
            discard_granularity: 0,
            discard_alignment: 0,
            max_write_zeroes_sectors: 0,
            max_tags: 64,
            min_tags: 2,
        }
    }
}

/// `min` where 0 means unlimited.
pub(crate) fn min_nz<T: Ord + Default + Copy>(a: T, b: T) -> T {
    let zero = T::default();
    if a == zero {
        b
    } else if b == zero {
        a
    } else {
        a.min(b)
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Least common multiple; `None` on overflow.
fn lcm(a: u64, b: u64) -> Option<u64> {
    if a == 0 || b == 0 {
        return Some(a.max(b));
    }
    (a / gcd(a, b)).checked_mul(b)
}

fn check_mask(field: &'static str, value: u64, min: u64) -> Result<(), Error> {
    if value == 0 {
        return Ok(());
    }
    if value < min {
        return Err(Error::LimitTooSmall { field, value, min });
    }
    if value.checked_add(1).is_some_and(|v| !v.is_power_of_two()) {
        return Err(Error::InvalidMask { field, value });
    }
    Ok(())
}

impl Limits {
    /// The values Linux gives a driver that sets nothing (`BLK_SAFE_MAX_SECTORS` 255,
    /// `BLK_MAX_SEGMENTS` 128, 64 KiB segments, a 4 GiB segment boundary).
    #[must_use]
    pub fn linux_defaults() -> Self {
        Self {
            max_hw_sectors: 255,
            max_segments: 128,
            max_segment_size: 65536,
            seg_boundary_mask: 0xFFFF_FFFF,
            ..Self::default()
        }
    }

    /// Logical block size in sectors.
    #[must_use]
    pub fn lbs_sectors(&self) -> u64 {
        u64::from(self.logical_block_size / SECTOR_BYTES).max(1)
    }

    /// Physical block size in sectors (the logical one if unset).
    #[must_use]
    pub fn pbs_sectors(&self) -> u64 {
        u64::from(self.physical_block_size.max(self.logical_block_size) / SECTOR_BYTES).max(1)
    }

    /// Checks every field and returns the effective limits, deriving `max_sectors` as
    /// Linux's `blk_validate_limits` does: the user's value clamped to the hardware's, else
    /// `io_opt` or `io_min` when above the 4 MiB cap, else the cap; rounded down to the
    /// logical block.
    ///
    /// # Errors
    /// A typed [`Error`] naming the field: block sizes that are not powers of two, a
    /// physical block smaller than the logical one, size limits below one page (or one
    /// logical block, or 4 KiB per segment), masks not of the form 2^k − 1, a chunk that is
    /// not a whole number of logical blocks, or tag limits with min above max.
    pub fn validate(&self) -> Result<Self, Error> {
        let mut l = self.clone();
        let lbs = l.logical_block_size;
        if !(512..=65536).contains(&lbs) || !lbs.is_power_of_two() {
            return Err(Error::InvalidLogicalBlockSize { bytes: lbs });
        }
        if l.physical_block_size == 0 {
            l.physical_block_size = lbs;
        }
        if !l.physical_block_size.is_power_of_two() {
            return Err(Error::InvalidPhysicalBlockSize {
                bytes: l.physical_block_size,
            });
        }
        if l.physical_block_size < lbs {
            return Err(Error::PhysicalBelowLogical {
                physical: l.physical_block_size,
                logical: lbs,
            });
        }
        let pbs = l.physical_block_size;
        l.io_min = l.io_min.max(pbs);
        l.io_opt -= l.io_opt % pbs;
        let lbs_sec = lbs / SECTOR_BYTES;
        let too_small = |field, value: u32, min: u32| Error::LimitTooSmall {
            field,
            value: u64::from(value),
            min: u64::from(min),
        };
        if l.max_hw_sectors != 0 {
            let min = PAGE_SECTORS.max(lbs_sec);
            if l.max_hw_sectors < min {
                return Err(too_small("max_hw_sectors", l.max_hw_sectors, min));
            }
            l.max_hw_sectors -= l.max_hw_sectors % lbs_sec;
        }
        l.max_sectors = if l.max_user_sectors != 0 {
            if l.max_user_sectors < PAGE_SECTORS {
                return Err(too_small(
                    "max_user_sectors",
                    l.max_user_sectors,
                    PAGE_SECTORS,
                ));
            }
            // sysfs takes KiB: the value is kept in whole KiB.
            l.max_user_sectors -= l.max_user_sectors % 2;
            min_nz(l.max_hw_sectors, l.max_user_sectors)
        } else if l.io_opt / SECTOR_BYTES > DEFAULT_MAX_SECTORS_CAP {
            min_nz(l.max_hw_sectors, l.io_opt / SECTOR_BYTES)
        } else if l.io_min / SECTOR_BYTES > DEFAULT_MAX_SECTORS_CAP {
            min_nz(l.max_hw_sectors, l.io_min / SECTOR_BYTES)
        } else {
            min_nz(l.max_hw_sectors, DEFAULT_MAX_SECTORS_CAP)
        };
        l.max_sectors -= l.max_sectors % lbs_sec;
        if l.max_sectors == 0 {
            return Err(too_small("max_sectors", l.max_user_sectors, lbs_sec));
        }
        if l.max_segment_size != 0 && l.max_segment_size < MIN_SEGMENT_BYTES {
            return Err(too_small(
                "max_segment_size",
                l.max_segment_size,
                MIN_SEGMENT_BYTES,
            ));
        }
        check_mask("seg_boundary_mask", l.seg_boundary_mask, 4095)?;
        check_mask("virt_boundary_mask", l.virt_boundary_mask, 511)?;
        if l.chunk_sectors % lbs_sec != 0 {
            return Err(Error::NotBlockMultiple {
                field: "chunk_sectors",
                value: u64::from(l.chunk_sectors),
                lbs: u64::from(lbs_sec),
            });
        }
        if l.max_discard_sectors != 0 {
            l.discard_granularity = l.discard_granularity.max(pbs);
            for (field, value) in [
                ("discard_granularity", l.discard_granularity),
                ("discard_alignment", l.discard_alignment),
            ] {
                if value % lbs != 0 {
                    return Err(Error::NotBlockMultiple {
                        field,
                        value: u64::from(value / SECTOR_BYTES),
                        lbs: u64::from(lbs_sec),
                    });
                }
            }
            let gran_sectors = l.discard_granularity / SECTOR_BYTES;
            if l.max_discard_sectors < gran_sectors {
                return Err(too_small(
                    "max_discard_sectors",
                    l.max_discard_sectors,
                    gran_sectors,
                ));
            }
        } else {
            l.discard_granularity = 0;
        }
        if l.min_tags == 0 {
            l.min_tags = 1;
        }
        if l.max_tags == 0 || l.min_tags > l.max_tags {
            return Err(Error::InvalidTags {
                min: l.min_tags,
                max: l.max_tags,
            });
        }
        Ok(l)
    }

    /// The limits of a striped volume over `members`, as Linux's `blk_stack_limits` and md
    /// raid0 derive them (`blk_stack_limits`): block sizes and `io_min` take the
    /// max; size, segment and boundary limits the min (0 = unlimited); `io_opt` the lcm with
    /// the full stripe (interleave × data members); `chunk_sectors` the gcd of the interleave
    /// and the members' chunks; discard only if every member discards. Anything that does
    /// not line up is reported in [`Stacked::misaligned`], never silently.
    ///
    /// ```
    /// use tagstripe_quirks::{Limits, StripeShape};
    /// let mut disk = Limits::default();
    /// disk.max_hw_sectors = 2560;
    /// let mut other = disk.clone();
    /// other.max_hw_sectors = 1024;
    /// let shape = StripeShape { interleave_sectors: 128, data_members: 2, data_offset_sectors: 0 };
    /// let s = Limits::stack(&[disk, other], &shape)?;
    /// assert_eq!(s.limits.max_hw_sectors, 1024);
    /// assert_eq!(s.limits.io_opt, 128 * 512 * 2);
    /// assert_eq!(s.limits.chunk_sectors, 128);
    /// assert!(s.misaligned.is_empty());
    /// # Ok::<(), tagstripe_quirks::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::NoMembers`] for an empty list, and any validation error of a member or of
    /// the result.
    pub fn stack(members: &[Limits], shape: &StripeShape) -> Result<Stacked, Error> {
        let members: Vec<Limits> = members
            .iter()
            .map(Limits::validate)
            .collect::<Result<_, _>>()?;
        let first = members.first().ok_or(Error::NoMembers)?;
        let mut t = first.clone();
        t.max_user_sectors = 0;
        let mut misaligned = Vec::new();
        let mut io_opt = 0u64;
        let mut chunk = shape.interleave_sectors;
        for (i, b) in members.iter().enumerate() {
            t.logical_block_size = t.logical_block_size.max(b.logical_block_size);
            t.physical_block_size = t.physical_block_size.max(b.physical_block_size);
            t.io_min = t.io_min.max(b.io_min);
            io_opt = lcm(io_opt, u64::from(b.io_opt)).unwrap_or(0);
            t.max_hw_sectors = min_nz(t.max_hw_sectors, b.max_hw_sectors);
            t.max_sectors = min_nz(t.max_sectors, b.max_sectors);
            t.max_segments = min_nz(t.max_segments, b.max_segments);
            t.max_segment_size = min_nz(t.max_segment_size, b.max_segment_size);
            t.seg_boundary_mask = min_nz(t.seg_boundary_mask, b.seg_boundary_mask);
            t.virt_boundary_mask = min_nz(t.virt_boundary_mask, b.virt_boundary_mask);
            if b.chunk_sectors != 0 {
                chunk = gcd(chunk, u64::from(b.chunk_sectors));
            }
            t.max_discard_sectors = if t.max_discard_sectors == 0 || b.max_discard_sectors == 0 {
                0
            } else {
                t.max_discard_sectors.min(b.max_discard_sectors)
            };
            t.discard_granularity = t.discard_granularity.max(b.discard_granularity);
            t.max_write_zeroes_sectors = t.max_write_zeroes_sectors.min(b.max_write_zeroes_sectors);
            t.min_tags = t.min_tags.min(b.min_tags);
            if i > 0 {
                t.max_tags = t.max_tags.saturating_add(b.max_tags);
            }
            let gran = u64::from(b.physical_block_size.max(b.io_min));
            let offset = shape.data_offset_sectors.saturating_mul(512);
            if offset % gran != 0 {
                misaligned.push(Misalignment::DataOffset {
                    component: i,
                    offset_bytes: offset,
                    granularity: gran,
                });
            }
            let unit = shape.interleave_sectors.saturating_mul(512);
            if unit != 0 && unit % u64::from(b.physical_block_size) != 0 {
                misaligned.push(Misalignment::Interleave {
                    component: i,
                    interleave_bytes: unit,
                    physical_block: b.physical_block_size,
                });
            }
        }
        let pbs = u64::from(t.physical_block_size);
        let stripe = shape
            .interleave_sectors
            .saturating_mul(512)
            .saturating_mul(u64::from(shape.data_members));
        io_opt = lcm(io_opt, stripe).unwrap_or(0);
        if io_opt % pbs != 0 || io_opt > u64::from(u32::MAX) {
            misaligned.push(Misalignment::IoOpt { io_opt });
            io_opt = 0;
        }
        t.io_opt = u32::try_from(io_opt).unwrap_or(0);
        if chunk.saturating_mul(512) % pbs != 0 || chunk > u64::from(u32::MAX) {
            misaligned.push(Misalignment::Chunk {
                chunk_sectors: chunk,
            });
            chunk = 0;
        }
        t.chunk_sectors = u32::try_from(chunk).unwrap_or(0);
        if t.max_discard_sectors == 0 {
            t.discard_granularity = 0;
        }
        Ok(Stacked {
            limits: t.validate()?,
            misaligned,
        })
    }
}

/// The shape of a striped volume, for [`Limits::stack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeShape {
    /// The interleave in sectors (0 = concatenated).
    pub interleave_sectors: u64,
    /// Members holding distinct data (half of them for a mirror).
    pub data_members: u32,
    /// Where data starts on each member, in sectors (ccd's reserved area, md's data offset).
    pub data_offset_sectors: u64,
}

/// The result of [`Limits::stack`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stacked {
    /// The volume's limits. `max_tags` is the sum of the members' (commands in flight on the
    /// volume), `min_tags` the smallest floor.
    pub limits: Limits,
    /// Everything that does not line up; empty when the stack is aligned.
    pub misaligned: Vec<Misalignment>,
}

/// One thing that does not line up in a stacked volume (Linux prints "Device … is
/// misaligned").
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Misalignment {
    /// A member's data starts off its physical-block (or io_min) grid.
    DataOffset {
        /// The member.
        component: usize,
        /// Where data starts, in bytes.
        offset_bytes: u64,
        /// The member's alignment unit in bytes.
        granularity: u64,
    },
    /// The interleave is not a whole number of a member's physical blocks.
    Interleave {
        /// The member.
        component: usize,
        /// The interleave in bytes.
        interleave_bytes: u64,
        /// The member's physical block size.
        physical_block: u32,
    },
    /// `io_opt` is not a multiple of the physical block (or too large); dropped to 0.
    IoOpt {
        /// The value that was dropped, in bytes.
        io_opt: u64,
    },
    /// `chunk_sectors` is not a multiple of the physical block (or too large); dropped.
    Chunk {
        /// The value that was dropped.
        chunk_sectors: u64,
    },
}

impl std::fmt::Display for Misalignment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DataOffset {
                component,
                offset_bytes,
                granularity,
            } => write!(
                f,
                "component {component}: data offset {offset_bytes} bytes is not a multiple of {granularity}"
            ),
            Self::Interleave {
                component,
                interleave_bytes,
                physical_block,
            } => write!(
                f,
                "component {component}: interleave of {interleave_bytes} bytes is not a multiple of its {physical_block}-byte physical block"
            ),
            Self::IoOpt { io_opt } => write!(f, "io_opt {io_opt} bytes dropped: not aligned"),
            Self::Chunk { chunk_sectors } => {
                write!(f, "chunk_sectors {chunk_sectors} dropped: not aligned")
            }
        }
    }
}
