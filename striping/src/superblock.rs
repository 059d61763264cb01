//! The metadata a volume's components carry so that a mirror never serves stale data after
//! a restart: per component, the volume's UUID, the component's role, the geometry, an event
//! counter, clean/dirty, and each side's state, as md's superblock 1.0 does, kept **at the
//! end** of each component so the data area still starts at sector 0 and stays layout-exact
//! with ccd for the usable size.
//!
//! Two copies, in alternating slots: an update goes to the slot that does not hold the
//! component's newest valid copy ([`newest_slot`]; slot `e % 2` for event count `e` while no
//! write has failed), so a torn write spoils at most the copy being written and never the
//! component's last valid one. Each copy is checksummed (CRC-32, the IEEE polynomial, by
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
//! let Assembly::Existing { events, stale, .. } = a else { unreachable!() };
//! assert_eq!((events, stale), (5, vec![1]));
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
    /// For a side resyncing: the component sector up to which it has been copied.
    pub resync_from: u64,
    /// The event count of the last time bits were cleared from the bitmap: a side whose own
    /// metadata is older missed that clearing, and the bitmap cannot say what it lacks (it
    /// is copied whole).
    pub cleared: u64,
    /// The write-intent bitmap: regions where the sides may differ.
    pub bitmap: Bitmap,
}

/// The most bits a write-intent bitmap has (2 KiB of a copy): a larger component gets
/// larger chunks.
pub const MAX_BITS: u32 = 16384;
/// The smallest bitmap chunk, in sectors (64 KiB).
pub const MIN_CHUNK_SECTORS: u64 = 128;

/// A write-intent bitmap, as md's: one bit per chunk of component sectors (the same
/// offsets on every side of a mirror), set durably before a write to the chunk is issued
/// and cleared once the chunk is known to be the same on every side. A returning side is
/// resynced by copying the chunks whose bits are set, not the whole component.
///
/// ```
/// use tagstripe_striping::superblock::Bitmap;
/// let mut b = Bitmap::for_sectors(1 << 21); // a 1 GiB component
/// assert_eq!((b.chunk_sectors(), b.bits()), (128, 16384));
/// b.set_range(1000, 300); // sectors 1000..1300: chunks 7..=10
/// assert_eq!(b.iter().collect::<Vec<_>>(), [7, 8, 9, 10]);
/// assert_eq!(b.count(), 4);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bitmap {
    chunk: u64,
    bits: u32,
    bytes: Vec<u8>,
}

impl Bitmap {
    /// No bitmap (a volume without a mirror, or metadata written before bitmaps).
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// An empty bitmap for components of up to `sectors` data sectors: chunks of at least
    /// [`MIN_CHUNK_SECTORS`], a power of two, so that at most [`MAX_BITS`] cover them.
    #[must_use]
    pub fn for_sectors(sectors: u64) -> Self {
        let mut chunk = MIN_CHUNK_SECTORS;
        while sectors.div_ceil(chunk) > u64::from(MAX_BITS) {
            chunk *= 2;
        }
        let bits = sectors.div_ceil(chunk).max(1) as u32;
        Self {
            chunk,
            bits,
            bytes: vec![0; bits.div_ceil(8) as usize],
        }
    }

    /// Sectors per bit (0: no bitmap).
    #[must_use]
    pub fn chunk_sectors(&self) -> u64 {
        self.chunk
    }

    /// How many bits (chunks).
    #[must_use]
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Whether bit `i` is set (false outside the bitmap).
    #[must_use]
    pub fn get(&self, i: u32) -> bool {
        i < self.bits && self.bytes[(i / 8) as usize] & (1 << (i % 8)) != 0
    }

    /// Sets bit `i` (ignored outside the bitmap).
    pub fn set(&mut self, i: u32) {
        if i < self.bits {
            self.bytes[(i / 8) as usize] |= 1 << (i % 8);
        }
    }

    /// Clears bit `i`.
    pub fn clear(&mut self, i: u32) {
        if i < self.bits {
            self.bytes[(i / 8) as usize] &= !(1 << (i % 8));
        }
    }

    /// Sets every bit.
    pub fn set_all(&mut self) {
        for i in 0..self.bits {
            self.set(i);
        }
    }

    /// The bits covering component sectors `[start, start + sectors)`.
    #[must_use]
    pub fn chunks_of(&self, start: u64, sectors: u64) -> std::ops::Range<u32> {
        if self.chunk == 0 || sectors == 0 {
            return 0..0;
        }
        let first = (start / self.chunk).min(u64::from(self.bits)) as u32;
        let last = ((start + sectors - 1) / self.chunk + 1).min(u64::from(self.bits)) as u32;
        first..last
    }

    /// Sets the bits covering `[start, start + sectors)`.
    pub fn set_range(&mut self, start: u64, sectors: u64) {
        for i in self.chunks_of(start, sectors) {
            self.set(i);
        }
    }

    /// How many bits are set.
    #[must_use]
    pub fn count(&self) -> u32 {
        self.bytes.iter().map(|b| b.count_ones()).sum()
    }

    /// Whether no bit is set.
    #[must_use]
    pub fn is_clear(&self) -> bool {
        self.bytes.iter().all(|&b| b == 0)
    }

    /// The set bits, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.bits).filter(|&i| self.get(i))
    }
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
/// Where the write-intent bitmap starts.
const BITMAP_AT: usize = 1024;

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
            cleared: 0,
            bitmap: Bitmap::none(),
        }
    }

    /// The slot (0 or 1) this copy goes to when nothing else is known: alternating with the
    /// event count, so the previous copy survives a torn write of this one. After a torn
    /// write the component's last valid copy may be in this very slot: a writer that knows
    /// where it is ([`newest_slot`]) writes to the other one.
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
        b[80..88].copy_from_slice(&self.bitmap.chunk.to_le_bytes());
        b[88..92].copy_from_slice(&self.bitmap.bits.to_le_bytes());
        b[96..104].copy_from_slice(&self.cleared.to_le_bytes());
        let nb = self.bitmap.bytes.len().min((MAX_BITS / 8) as usize);
        b[BITMAP_AT..BITMAP_AT + nb].copy_from_slice(&self.bitmap.bytes[..nb]);
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
        let chunk = le64(b, 80);
        let bits = le32(b, 88);
        if bits > MAX_BITS || (chunk == 0) != (bits == 0) {
            return Err(invalid(
                "bitmap",
                format!("{bits} bits of {chunk} sectors (up to {MAX_BITS}, both or neither 0)"),
            ));
        }
        let nb = bits.div_ceil(8) as usize;
        let bytes = b[BITMAP_AT..BITMAP_AT + nb].to_vec();
        if bits % 8 != 0 && bytes[nb - 1] >> (bits % 8) != 0 {
            return Err(invalid("bitmap", format!("bits set beyond bit {bits}")));
        }
        // Version 1 uses nothing else: bytes that are not zero are not this format.
        let reserved = [
            65..72,
            92..96,
            104..SIDES_AT,
            SIDES_AT + n..BITMAP_AT,
            BITMAP_AT + nb..CRC_AT,
        ];
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
            cleared: le64(b, 96),
            bitmap: Bitmap { chunk, bits, bytes },
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
    Ok(newest_slot(slot0, slot1)?.map(|(sb, _)| sb))
}

/// [`newest`], and which slot (0 or 1) holds it. A writer puts its next copy in the other
/// slot, so that a write torn part-way never takes the component's last valid copy with
/// it (the slot [`Superblock::slot`] names is right only while no write has failed).
///
/// ```
/// use tagstripe_striping::superblock::{newest_slot, Superblock};
/// # fn main() -> Result<(), tagstripe_striping::superblock::MetadataError> {
/// let sb = Superblock::new([7; 16], 2, 0x1234, 984);
/// let copy = sb.encode();
/// let torn = vec![0x5a; copy.len()];
/// let (found, slot) = newest_slot(&torn, &copy)?.unwrap();
/// assert_eq!((found.events, slot), (sb.events, 1));
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// As [`newest`].
pub fn newest_slot(
    slot0: &[u8],
    slot1: &[u8],
) -> Result<Option<(Superblock, usize)>, MetadataError> {
    match (Superblock::decode(slot0), Superblock::decode(slot1)) {
        (Ok(a), Ok(b)) => Ok(Some(if b.events > a.events { (b, 1) } else { (a, 0) })),
        (Ok(a), Err(_)) => Ok(Some((a, 0))),
        (Err(_), Ok(b)) => Ok(Some((b, 1))),
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
        /// Of the stale components, those the write-intent bitmap cannot tell what they
        /// lack (blank, or older than the bitmap's last clearing): they are copied whole.
        whole: Vec<usize>,
        /// The winner's write-intent bitmap.
        bitmap: Bitmap,
        /// The event count of the bitmap's last clearing.
        cleared: u64,
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
    let whole = stale
        .iter()
        .copied()
        .filter(|&i| {
            components[i]
                .as_ref()
                .is_none_or(|c| c.events < winner.cleared || winner.bitmap.chunk == 0)
        })
        .collect();
    Ok(Assembly::Existing {
        uuid: winner.uuid,
        events: winner.events,
        stale,
        whole,
        bitmap: winner.bitmap.clone(),
        cleared: winner.cleared,
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
                stale: vec![1],
                whole: vec![1],
                bitmap: Bitmap::none(),
                cleared: 0,
            })
        );
        assert_eq!(assemble(&[None, None], 77), Ok(Assembly::New));
    }

    #[test]
    fn the_bitmap_travels_and_says_which_stale_sides_it_covers() {
        let mut bm = Bitmap::for_sectors(1000);
        assert_eq!((bm.chunk_sectors(), bm.bits()), (128, 8));
        bm.set_range(130, 1);
        bm.set(7);
        let mut a = sb(0, 9, vec![Side::InSync, Side::Failed]);
        a.bitmap = bm.clone();
        a.cleared = 6;
        let bytes = a.encode();
        assert_eq!(Superblock::decode(&bytes).as_ref(), Ok(&a));
        // A bit past the end is refused, not ignored.
        let mut bad = bytes.clone();
        bad[BITMAP_AT + 1] = 1;
        let crc = crc32fast::hash(&bad[..CRC_AT]);
        bad[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&bad),
            Err(MetadataError::Invalid {
                field: "reserved",
                ..
            })
        ));
        // Side 1 dropped at event 7, after the last clearing (6): the bitmap covers it.
        let b = sb(1, 7, vec![Side::InSync; 2]);
        let Ok(Assembly::Existing {
            stale,
            whole,
            bitmap,
            ..
        }) = assemble(&[Some(a.clone()), Some(b)], 77)
        else {
            panic!("not assembled")
        };
        assert_eq!(
            (stale, whole, bitmap.iter().collect::<Vec<_>>()),
            (vec![1], vec![], vec![1, 7])
        );
        // Side 1 left before the clearing: copied whole.
        let b = sb(1, 5, vec![Side::InSync; 2]);
        let Ok(Assembly::Existing { whole, .. }) = assemble(&[Some(a), Some(b)], 77) else {
            panic!("not assembled")
        };
        assert_eq!(whole, vec![1]);
        // The largest components get larger chunks, never more than MAX_BITS.
        let big = Bitmap::for_sectors(1 << 40);
        assert!(big.bits() <= MAX_BITS && big.chunk_sectors() * u64::from(big.bits()) >= 1 << 40);
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
