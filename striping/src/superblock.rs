//! The metadata a volume's components carry so that a mirror never serves stale data after
//! a restart: per component, the volume's UUID, the component's role, the geometry, an event
//! counter, clean/dirty, and each side's state, as md's superblock 1.0 does, kept **at the
//! end** of each component so the data area still starts at sector 0 and stays layout-exact
//! with ccd for the usable size.
//!
//! Two copies, in alternating slots: an update with event count `e` goes to slot `e % 2`,
//! so a write torn by a crash spoils at most the copy being written, and the other (one
//! event older) still decodes. Each copy is checksummed (CRC-32, the IEEE polynomial, by
//! `crc32fast`) and versioned. This module is the format and the decision of
//! which sides to trust, with no I/O: [`Superblock::encode`], [`Superblock::decode`],
//! [`newest`] of the two slots, and [`assemble`] over a volume's components.
//!
//! ```
//! use tagstripe_striping::superblock::{self, Assembly, Side, Superblock};
//!
//! let mut sb = Superblock::new([7u8; 16], 2, 0x1234, 1 << 20);
//! sb.events = 5;
//! sb.sides = vec![Side::InSync, Side::Failed];
//! let bytes = sb.encode();
//! assert_eq!(Superblock::decode(&bytes)?, sb);
//!
//! // Component 1 missed the writes that dropped it: its own copy is older.
//! let mut old = sb.clone();
//! old.role = 1;
//! old.events = 3;
//! old.sides = vec![Side::InSync, Side::InSync];
//! let a = superblock::assemble(&[Some(sb), Some(old)], 0x1234)?;
//! assert_eq!(a, Assembly::Existing { uuid: [7u8; 16], events: 5, stale: vec![1] });
//! # Ok::<(), tagstripe_striping::superblock::MetadataError>(())
//! ```

/// Bytes of one copy (eight sectors).
pub const SIZE: usize = 4096;
/// Sectors a component gives up at its end: two copies.
pub const RESERVED_SECTORS: u64 = 2 * (SIZE as u64 / 512);
/// The format's magic.
pub const MAGIC: [u8; 8] = *b"TSTRIPE\0";
/// The format's version.
pub const VERSION: u32 = 1;
/// The most components a volume with metadata may have.
pub const MAX_COMPONENTS: usize = 256;

/// What the metadata says of one component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Holds every acknowledged write.
    InSync,
    /// Dropped: missed writes, never to be read until resynced.
    Failed,
    /// Being copied back; `resync_from` in the superblock says how far.
    Resyncing,
}

impl Side {
    fn code(self) -> u8 {
        match self {
            Self::InSync => 0,
            Self::Failed => 1,
            Self::Resyncing => 2,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(Self::InSync),
            1 => Some(Self::Failed),
            2 => Some(Self::Resyncing),
            _ => None,
        }
    }
}

/// One copy of a component's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Superblock {
    /// The volume's identity, the same on every component.
    pub uuid: [u8; 16],
    /// Bumped by every change of state; the highest among the components wins.
    pub events: u64,
    /// This component's index in the volume.
    pub role: u32,
    /// A fingerprint of the geometry (flavor, interleave, options, sizes), so a component
    /// is never assembled into a volume of another shape.
    pub geometry: u64,
    /// Sectors of this component's data area (its size less the metadata).
    pub data_sectors: u64,
    /// Writes may be in flight (set before the first write after a clean open, cleared at a
    /// clean close): a dirty mirror's sides may differ where writes were in flight.
    pub dirty: bool,
    /// The state of every component, as this one last knew it.
    pub sides: Vec<Side>,
    /// For a side resyncing: the volume sector up to which it has been copied.
    pub resync_from: u64,
}

/// What is wrong with metadata, or with a set of components.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// Not tagstripe metadata (no magic): the component carries none.
    #[error("no tagstripe metadata")]
    Absent,
    /// The checksum does not match: a torn or corrupt copy.
    #[error("metadata checksum {got:#010x}, expected {expected:#010x}: a torn or corrupt copy")]
    Checksum {
        /// The checksum stored.
        got: u32,
        /// The checksum of the bytes.
        expected: u32,
    },
    /// A version this code does not know.
    #[error("metadata version {0} (this build reads version {VERSION})")]
    Version(u32),
    /// A field with an impossible value.
    #[error("metadata field {field}: {what}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// What is wrong.
        what: String,
    },
    /// A component from another volume.
    #[error(
        "component {component} belongs to another volume (UUID {found}, this volume {expected})"
    )]
    Foreign {
        /// Which component (as given).
        component: usize,
        /// Its volume's UUID, in hex.
        found: String,
        /// The volume's UUID, in hex.
        expected: String,
    },
    /// Components given in another order.
    #[error("component {component} holds role {role}: the components are in another order")]
    Swapped {
        /// Which component (as given).
        component: usize,
        /// The role its metadata names.
        role: u32,
    },
    /// A component of a volume of another shape.
    #[error(
        "component {component} was part of a volume with another geometry ({found:#x}, expected {expected:#x})"
    )]
    Geometry {
        /// Which component.
        component: usize,
        /// The fingerprint it carries.
        found: u64,
        /// The fingerprint of the geometry asked for.
        expected: u64,
    },
    /// The metadata names a different number of components.
    #[error("component {component} says the volume has {says} components, {given} are given")]
    Count {
        /// Which component.
        component: usize,
        /// How many its metadata names.
        says: usize,
        /// How many were given.
        given: usize,
    },
    /// No component holds metadata that can be trusted, though some carry some.
    #[error("no component holds a side in sync: nothing to trust")]
    NoneInSync,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Where the checksum sits: the last four bytes.
const CRC_AT: usize = SIZE - 4;
/// Where the per-side states start.
const SIDES_AT: usize = 128;

impl Superblock {
    /// Metadata for component `role` of a new volume of `n` components, all in sync,
    /// event 1, clean.
    #[must_use]
    pub fn new(uuid: [u8; 16], n: usize, geometry: u64, data_sectors: u64) -> Self {
        Self {
            uuid,
            events: 1,
            role: 0,
            geometry,
            data_sectors,
            dirty: false,
            sides: vec![Side::InSync; n],
            resync_from: 0,
        }
    }

    /// The slot (0 or 1) this copy is written to: alternating with the event count, so the
    /// previous copy survives a torn write of this one.
    #[must_use]
    pub fn slot(&self) -> usize {
        (self.events % 2) as usize
    }

    /// The copy's [`SIZE`] bytes. More than [`MAX_COMPONENTS`] sides are cut there (the
    /// builder refuses such volumes first).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SIZE];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SIZE as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.events.to_le_bytes());
        b[40..44].copy_from_slice(&self.role.to_le_bytes());
        let n = self.sides.len().min(MAX_COMPONENTS);
        b[44..48].copy_from_slice(&(n as u32).to_le_bytes());
        b[48..56].copy_from_slice(&self.geometry.to_le_bytes());
        b[56..64].copy_from_slice(&self.data_sectors.to_le_bytes());
        b[64] = u8::from(self.dirty);
        b[72..80].copy_from_slice(&self.resync_from.to_le_bytes());
        for (i, s) in self.sides.iter().take(n).enumerate() {
            b[SIDES_AT + i] = s.code();
        }
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes one copy.
    ///
    /// # Errors
    /// [`MetadataError::Absent`] with no magic (a component that never carried metadata,
    /// or zeroes); [`MetadataError::Checksum`] for a torn or corrupt copy;
    /// [`MetadataError::Version`]; [`MetadataError::Invalid`] for impossible fields. Never
    /// a panic, whatever the bytes.
    pub fn decode(b: &[u8]) -> Result<Self, MetadataError> {
        if b.len() < SIZE || b[0..8] != MAGIC {
            return Err(MetadataError::Absent);
        }
        let b = &b[..SIZE];
        let got = le32(b, CRC_AT);
        let expected = crc32fast::hash(&b[..CRC_AT]);
        if got != expected {
            return Err(MetadataError::Checksum { got, expected });
        }
        let version = le32(b, 8);
        if version != VERSION {
            return Err(MetadataError::Version(version));
        }
        let invalid = |field, what: String| MetadataError::Invalid { field, what };
        if le32(b, 12) as usize != SIZE {
            return Err(invalid("size", format!("{} bytes", le32(b, 12))));
        }
        let n = le32(b, 44) as usize;
        if n == 0 || n > MAX_COMPONENTS {
            return Err(invalid(
                "components",
                format!("{n} (1 to {MAX_COMPONENTS})"),
            ));
        }
        let role = le32(b, 40);
        if role as usize >= n {
            return Err(invalid("role", format!("{role} of {n} components")));
        }
        let events = le64(b, 32);
        if events == 0 {
            return Err(invalid("events", "0 (counts start at 1)".to_owned()));
        }
        if b[64] > 1 {
            return Err(invalid("dirty", format!("{}", b[64])));
        }
        let sides = (0..n)
            .map(|i| {
                Side::from_code(b[SIDES_AT + i]).ok_or_else(|| {
                    invalid("sides", format!("state {} of side {i}", b[SIDES_AT + i]))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Version 1 uses nothing else: bytes that are not zero are not this format.
        let reserved = [65..72, 80..SIDES_AT, SIDES_AT + n..CRC_AT];
        if let Some(at) = reserved.into_iter().flatten().find(|&i| b[i] != 0) {
            return Err(invalid(
                "reserved",
                format!("byte {at} is {:#04x}, not 0", b[at]),
            ));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        Ok(Self {
            uuid,
            events,
            role,
            geometry: le64(b, 48),
            data_sectors: le64(b, 56),
            dirty: b[64] == 1,
            sides,
            resync_from: le64(b, 72),
        })
    }
}

/// A stable fingerprint of a geometry's shape: flavor, interleave, uniform, mirror, reserved
/// area, sector size, and every component's size (FNV-1a over them, the same in every build).
///
/// ```
/// use tagstripe_striping::{Geometry, superblock::fingerprint};
/// let a = Geometry::builder([1000, 2000], 16).build()?;
/// let b = Geometry::builder([1000, 2000], 32).build()?;
/// assert_ne!(fingerprint(&a), fingerprint(&b));
/// assert_eq!(fingerprint(&a), fingerprint(&Geometry::builder([1000, 2000], 16).build()?));
/// # Ok::<(), tagstripe_striping::Error>(())
/// ```
#[must_use]
pub fn fingerprint(g: &crate::Geometry) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(g.flavor().to_string().as_bytes());
    eat(&g.interleave().to_le_bytes());
    eat(&[u8::from(g.is_uniform()), u8::from(g.is_mirror())]);
    eat(&g.reserved_sectors().to_le_bytes());
    eat(&g.sector_size().to_le_bytes());
    for s in g.raw_sizes() {
        eat(&s.to_le_bytes());
    }
    h
}

/// The copy to trust of a component's two slots: the valid one with the higher event
/// count. `Ok(None)` if neither holds metadata (a blank component).
///
/// # Errors
/// The error of the better slot when metadata is there but neither copy is usable (both
/// torn or corrupt): such a component is neither new nor trustworthy.
pub fn newest(slot0: &[u8], slot1: &[u8]) -> Result<Option<Superblock>, MetadataError> {
    match (Superblock::decode(slot0), Superblock::decode(slot1)) {
        (Ok(a), Ok(b)) => Ok(Some(if b.events > a.events { b } else { a })),
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(Some(a)),
        (Err(MetadataError::Absent), Err(MetadataError::Absent)) => Ok(None),
        (Err(MetadataError::Absent), Err(e)) | (Err(e), Err(_)) => Err(e),
    }
}

/// What the components of a volume say together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assembly {
    /// None carries metadata: a new volume (write it before first use).
    New,
    /// An existing volume: the highest event count, and the components not to be read
    /// (dropped, or blank, or behind the newest metadata).
    Existing {
        /// The volume's UUID.
        uuid: [u8; 16],
        /// The highest event count.
        events: u64,
        /// Components that hold stale data, ascending.
        stale: Vec<usize>,
    },
}

/// Decides, from each component's newest metadata (`None`: blank), whether this is a new
/// volume or which components are stale: the highest event count wins, its view of the
/// sides holds, and a component behind it (or blank among ones that are not) is stale.
/// `geometry` is the fingerprint of the geometry asked for.
///
/// # Errors
/// [`MetadataError::Foreign`], [`MetadataError::Swapped`], [`MetadataError::Geometry`] or
/// [`MetadataError::Count`] naming the first component that does not fit;
/// [`MetadataError::NoneInSync`] if the winner's view leaves no side in sync.
pub fn assemble(
    components: &[Option<Superblock>],
    geometry: u64,
) -> Result<Assembly, MetadataError> {
    // The highest event count; among equals the first component (so that an intruder given
    // later is the one named).
    let Some(winner) =
        components
            .iter()
            .flatten()
            .fold(None::<&Superblock>, |best, s| match best {
                Some(b) if b.events >= s.events => Some(b),
                _ => Some(s),
            })
    else {
        return Ok(Assembly::New);
    };
    let n = components.len();
    for (i, c) in components.iter().enumerate() {
        let Some(c) = c else { continue };
        if c.uuid != winner.uuid {
            return Err(MetadataError::Foreign {
                component: i,
                found: hex(&c.uuid),
                expected: hex(&winner.uuid),
            });
        }
        if c.sides.len() != n {
            return Err(MetadataError::Count {
                component: i,
                says: c.sides.len(),
                given: n,
            });
        }
        if c.role as usize != i {
            return Err(MetadataError::Swapped {
                component: i,
                role: c.role,
            });
        }
        if c.geometry != geometry {
            return Err(MetadataError::Geometry {
                component: i,
                found: c.geometry,
                expected: geometry,
            });
        }
    }
    let stale: Vec<usize> = (0..n)
        .filter(|&i| match &components[i] {
            None => true,
            Some(c) => c.events < winner.events || winner.sides[i] != Side::InSync,
        })
        .collect();
    if stale.len() == n {
        return Err(MetadataError::NoneInSync);
    }
    Ok(Assembly::Existing {
        uuid: winner.uuid,
        events: winner.events,
        stale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sb(role: u32, events: u64, sides: Vec<Side>) -> Superblock {
        Superblock {
            role,
            events,
            sides,
            ..Superblock::new([9; 16], 2, 77, 1000)
        }
    }

    #[test]
    fn a_torn_copy_falls_back_to_the_other_slot() {
        let a = sb(0, 4, vec![Side::InSync; 2]);
        let b = sb(0, 5, vec![Side::InSync, Side::Failed]);
        assert_eq!((a.slot(), b.slot()), (0, 1));
        let (ea, mut eb) = (a.encode(), b.encode());
        assert_eq!(newest(&ea, &eb), Ok(Some(b.clone())));
        // The newer copy torn halfway: the older one is trusted.
        eb[2000..].fill(0);
        assert_eq!(newest(&ea, &eb), Ok(Some(a.clone())));
        // Both spoiled: an error, not a blank component.
        let mut ea2 = ea.clone();
        ea2[100] ^= 1;
        assert!(matches!(
            newest(&ea2, &eb),
            Err(MetadataError::Checksum { .. })
        ));
        // Never written: blank.
        assert_eq!(newest(&[0u8; SIZE], &[0u8; SIZE]), Ok(None));
    }

    #[test]
    fn components_that_do_not_fit_are_named() {
        let a = sb(0, 3, vec![Side::InSync; 2]);
        let mut foreign = sb(1, 3, vec![Side::InSync; 2]);
        foreign.uuid = [1; 16];
        let e = assemble(&[Some(a.clone()), Some(foreign)], 77).unwrap_err();
        assert!(
            matches!(e, MetadataError::Foreign { component: 1, .. }),
            "{e}"
        );
        let swapped = sb(0, 3, vec![Side::InSync; 2]);
        let e = assemble(&[Some(a.clone()), Some(swapped)], 77).unwrap_err();
        assert_eq!(
            e,
            MetadataError::Swapped {
                component: 1,
                role: 0
            }
        );
        assert!(e.to_string().contains("another order"));
        let e = assemble(
            &[Some(a.clone()), Some(sb(1, 3, vec![Side::InSync; 2]))],
            78,
        )
        .unwrap_err();
        assert!(
            matches!(e, MetadataError::Geometry { component: 0, .. }),
            "{e}"
        );
        // A blank component next to a known one: stale (a replaced side).
        assert_eq!(
            assemble(&[Some(a), None], 77),
            Ok(Assembly::Existing {
                uuid: [9; 16],
                events: 3,
                stale: vec![1]
            })
        );
        assert_eq!(assemble(&[None, None], 77), Ok(Assembly::New));
    }

    proptest! {
        /// Whatever the bytes, decoding neither panics nor accepts a copy that does not
        /// re-encode to itself.
        #[test]
        fn decoding_garbage_is_an_error_or_exact(mut bytes in proptest::collection::vec(any::<u8>(), SIZE..=SIZE), magic in any::<bool>()) {
            if magic {
                bytes[0..8].copy_from_slice(&MAGIC);
            }
            if let Ok(s) = Superblock::decode(&bytes) {
                prop_assert_eq!(s.encode(), bytes);
            }
        }

        /// The side the newest metadata calls failed, or one whose own metadata is older,
        /// is never among those trusted.
        #[test]
        fn stale_sides_are_never_trusted(e0 in 1u64..10, e1 in 1u64..10, f0 in any::<bool>(), f1 in any::<bool>()) {
            let side = |f: bool| if f { Side::Failed } else { Side::InSync };
            let sides = vec![side(f0), side(f1)];
            let comps = [Some(sb(0, e0, sides.clone())), Some(sb(1, e1, sides.clone()))];
            match assemble(&comps, 77) {
                Ok(Assembly::Existing { stale, events, .. }) => {
                    prop_assert_eq!(events, e0.max(e1));
                    for (i, e) in [e0, e1].into_iter().enumerate() {
                        if e < events || sides[i] == Side::Failed {
                            prop_assert!(stale.contains(&i));
                        } else {
                            prop_assert!(!stale.contains(&i));
                        }
                    }
                }
                Ok(Assembly::New) => prop_assert!(false, "components with metadata are not new"),
                Err(e) => prop_assert_eq!(e, MetadataError::NoneInSync),
            }
        }
    }
}
