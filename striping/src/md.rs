//! Linux md's parity and mirrored-stripe layouts: raid5 and raid6 as `raid5_compute_sector`
//! lays them out (every layout mdadm names, P and Q per stripe), and raid10's near, far and
//! offset copies as `__raid10_find_phys` places them, with md's array sizes. Pure arithmetic,
//! written from the kernel's `drivers/md/raid5.c` and `drivers/md/raid10.c`; the inverse
//! maps (`compute_blocknr`, `raid10_find_virt`) too, so a member's sector can be named.
//!
//! All sizes are 512-byte sectors; a member's sectors are counted from md's data offset.
//!
//! ```
//! use tagstripe_striping::md::{Parity, ParityLayout};
//! // Four disks, 64 KiB chunks, left-symmetric (mdadm's default).
//! let a = Parity::new(5, ParityLayout::LeftSymmetric, 4, 128, 1 << 20)?;
//! assert_eq!(a.total_sectors(), 3 << 20);
//! let p = a.locate(3 * 128).unwrap(); // the fourth chunk: stripe 1's first data chunk
//! assert_eq!((p.comp, p.cblk, p.p_comp), (3, 128, 2));
//! assert_eq!(a.volume_sector(p.comp, p.cblk), Some(3 * 128));
//! # Ok::<(), tagstripe_striping::Error>(())
//! ```

use crate::Error;

/// md's raid5 / raid6 layouts (`ALGORITHM_*` in `drivers/md/raid5.h`), by mdadm's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParityLayout {
    /// `left-asymmetric` (0): parity from the last disk leftwards, data in disk order.
    LeftAsymmetric,
    /// `right-asymmetric` (1): parity from the first disk rightwards, data in disk order.
    RightAsymmetric,
    /// `left-symmetric` (2, mdadm's default): parity leftwards, data starting after it.
    LeftSymmetric,
    /// `right-symmetric` (3): parity rightwards, data starting after it.
    RightSymmetric,
    /// `parity-first` (4): P (and raid6's Q) on the first disks.
    ParityFirst,
    /// `parity-last` (5): P (and Q) on the last disks.
    ParityLast,
    /// `left-asymmetric-6` (16, raid6): raid5's left-asymmetric with Q on the last disk.
    LeftAsymmetric6,
    /// `right-asymmetric-6` (17, raid6).
    RightAsymmetric6,
    /// `left-symmetric-6` (18, raid6).
    LeftSymmetric6,
    /// `right-symmetric-6` (19, raid6).
    RightSymmetric6,
    /// `parity-first-6` (20, raid6).
    ParityFirst6,
}

impl ParityLayout {
    /// Every layout, in md's numbering order.
    pub const ALL: [Self; 11] = [
        Self::LeftAsymmetric,
        Self::RightAsymmetric,
        Self::LeftSymmetric,
        Self::RightSymmetric,
        Self::ParityFirst,
        Self::ParityLast,
        Self::LeftAsymmetric6,
        Self::RightAsymmetric6,
        Self::LeftSymmetric6,
        Self::RightSymmetric6,
        Self::ParityFirst6,
    ];

    /// mdadm's name (`--layout`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LeftAsymmetric => "left-asymmetric",
            Self::RightAsymmetric => "right-asymmetric",
            Self::LeftSymmetric => "left-symmetric",
            Self::RightSymmetric => "right-symmetric",
            Self::ParityFirst => "parity-first",
            Self::ParityLast => "parity-last",
            Self::LeftAsymmetric6 => "left-asymmetric-6",
            Self::RightAsymmetric6 => "right-asymmetric-6",
            Self::LeftSymmetric6 => "left-symmetric-6",
            Self::RightSymmetric6 => "right-symmetric-6",
            Self::ParityFirst6 => "parity-first-6",
        }
    }

    /// md's algorithm number (the superblock's `layout` field).
    #[must_use]
    pub fn md_algorithm(self) -> u32 {
        match self {
            Self::LeftAsymmetric => 0,
            Self::RightAsymmetric => 1,
            Self::LeftSymmetric => 2,
            Self::RightSymmetric => 3,
            Self::ParityFirst => 4,
            Self::ParityLast => 5,
            Self::LeftAsymmetric6 => 16,
            Self::RightAsymmetric6 => 17,
            Self::LeftSymmetric6 => 18,
            Self::RightSymmetric6 => 19,
            Self::ParityFirst6 => 20,
        }
    }

    /// The layout md's algorithm number names, if it is one of these.
    #[must_use]
    pub fn from_md(algorithm: u32) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|l| l.md_algorithm() == algorithm)
    }

    /// Whether only raid6 has it (the `-6` layouts).
    #[must_use]
    pub fn raid6_only(self) -> bool {
        self.md_algorithm() >= 16
    }
}

impl std::str::FromStr for ParityLayout {
    type Err = Error;

    /// mdadm's names, and its short forms `la`, `ra`, `ls`, `rs`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let short = match s {
            "la" => Some(Self::LeftAsymmetric),
            "ra" => Some(Self::RightAsymmetric),
            "ls" => Some(Self::LeftSymmetric),
            "rs" => Some(Self::RightSymmetric),
            _ => None,
        };
        short
            .or_else(|| Self::ALL.into_iter().find(|l| l.name() == s))
            .ok_or_else(|| Error::LayoutUnsupported {
                level: "raid5/raid6",
                layout: s.to_owned(),
            })
    }
}

/// Checks an md chunk: a power of two of at least one 4 KiB page, as md requires.
fn check_chunk(level: &'static str, chunk: u64) -> Result<u32, Error> {
    if chunk < 8 || !chunk.is_power_of_two() {
        return Err(Error::InvalidChunk { level, chunk });
    }
    Ok(chunk.trailing_zeros())
}

/// A raid5 or raid6 array's geometry: which member holds each data chunk, and P and Q.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parity {
    level: u8,
    layout: ParityLayout,
    disks: usize,
    chunk: u64,
    member_sectors: u64,
}

/// One run of a raid5/raid6 request inside one chunk: where its data is, and the stripe's
/// parity at the same member sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParityPiece {
    /// Volume sector.
    pub lblk: u64,
    /// Sectors (never crossing a chunk).
    pub count: u64,
    /// The member holding the data.
    pub comp: usize,
    /// The sector on it (from the data offset).
    pub cblk: u64,
    /// The member holding the stripe's P, at the same `cblk`.
    pub p_comp: usize,
    /// raid6: the member holding Q, at the same `cblk`.
    pub q_comp: Option<usize>,
    /// The stripe (md's `stripe`: chunk row).
    pub stripe: u64,
    /// The data chunk's index within the stripe (md's `dd_idx` before placement).
    pub data_index: usize,
}

/// Where one stripe's chunks are: P, Q (raid6) and each data index's member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeMap {
    /// The member holding P.
    pub p: usize,
    /// raid6: the member holding Q.
    pub q: Option<usize>,
    /// `data[i]`: the member holding data index `i`.
    pub data: Vec<usize>,
}

impl Parity {
    /// A raid5 (`level` 5) or raid6 (6) array of `disks` members with `chunk`-sector chunks
    /// and `member_sectors` usable on each (after md's data offset; rounded down to whole
    /// chunks, as md does).
    ///
    /// # Errors
    /// [`Error::InvalidLevel`], [`Error::InvalidChunk`] (md wants a power of two of at
    /// least 8 sectors), [`Error::TooFewDisks`] (raid5 2, raid6 4),
    /// [`Error::LayoutUnsupported`] (a `-6` layout on raid5), [`Error::MemberTooSmall`].
    pub fn new(
        level: u8,
        layout: ParityLayout,
        disks: usize,
        chunk: u64,
        member_sectors: u64,
    ) -> Result<Self, Error> {
        let name = match level {
            5 => "raid5",
            6 => "raid6",
            _ => {
                return Err(Error::InvalidLevel {
                    level: level.into(),
                });
            }
        };
        check_chunk(name, chunk)?;
        let min = if level == 5 { 2 } else { 4 };
        if disks < min {
            return Err(Error::TooFewDisks {
                level: name,
                disks,
                min,
            });
        }
        if level == 5 && layout.raid6_only() {
            return Err(Error::LayoutUnsupported {
                level: name,
                layout: layout.name().to_owned(),
            });
        }
        let member_sectors = member_sectors / chunk * chunk;
        if member_sectors == 0 {
            return Err(Error::MemberTooSmall { chunk });
        }
        Ok(Self {
            level,
            layout,
            disks,
            chunk,
            member_sectors,
        })
    }

    /// 5 or 6.
    #[must_use]
    pub fn level(&self) -> u8 {
        self.level
    }

    /// The layout.
    #[must_use]
    pub fn layout(&self) -> ParityLayout {
        self.layout
    }

    /// Members.
    #[must_use]
    pub fn disks(&self) -> usize {
        self.disks
    }

    /// Chunk in sectors.
    #[must_use]
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Each member's usable sectors (whole chunks).
    #[must_use]
    pub fn member_sectors(&self) -> u64 {
        self.member_sectors
    }

    /// Members that hold data in each stripe (`disks` less one or two).
    #[must_use]
    pub fn data_disks(&self) -> usize {
        self.disks - usize::from(self.level - 4)
    }

    /// The array's size, as md's `raid5_size`: each member's whole chunks times the data
    /// members.
    #[must_use]
    pub fn total_sectors(&self) -> u64 {
        self.member_sectors * self.data_disks() as u64
    }

    /// Stripes (chunk rows).
    #[must_use]
    pub fn stripes(&self) -> u64 {
        self.member_sectors / self.chunk
    }

    /// P, Q and the data members of stripe `stripe`, and the member of data index
    /// `dd_idx`: `raid5_compute_sector`'s placement.
    fn place(&self, stripe: u64, dd_idx: usize) -> (usize, Option<usize>, usize) {
        use ParityLayout as L;
        let n = self.disks;
        let data = self.data_disks();
        let mut dd = dd_idx;
        let rot = |m: usize| (stripe % m as u64) as usize;
        if self.level == 5 {
            let pd = match self.layout {
                L::LeftAsymmetric => {
                    let pd = data - rot(n);
                    if dd >= pd {
                        dd += 1;
                    }
                    pd
                }
                L::RightAsymmetric => {
                    let pd = rot(n);
                    if dd >= pd {
                        dd += 1;
                    }
                    pd
                }
                L::LeftSymmetric => {
                    let pd = data - rot(n);
                    dd = (pd + 1 + dd) % n;
                    pd
                }
                L::RightSymmetric => {
                    let pd = rot(n);
                    dd = (pd + 1 + dd) % n;
                    pd
                }
                L::ParityFirst => {
                    dd += 1;
                    0
                }
                // The -6 layouts are refused for raid5 at construction.
                _ => data,
            };
            return (pd, None, dd);
        }
        let (pd, qd) = match self.layout {
            L::LeftAsymmetric | L::RightAsymmetric => {
                let pd = if self.layout == L::LeftAsymmetric {
                    n - 1 - rot(n)
                } else {
                    rot(n)
                };
                let qd = if pd == n - 1 {
                    dd += 1; // Q D D D P
                    0
                } else {
                    if dd >= pd {
                        dd += 2; // D D P Q D
                    }
                    pd + 1
                };
                (pd, qd)
            }
            L::LeftSymmetric | L::RightSymmetric => {
                let pd = if self.layout == L::LeftSymmetric {
                    n - 1 - rot(n)
                } else {
                    rot(n)
                };
                dd = (pd + 2 + dd) % n;
                (pd, (pd + 1) % n)
            }
            L::ParityFirst => {
                dd += 2;
                (0, 1)
            }
            L::ParityLast => (data, data + 1),
            L::LeftAsymmetric6 | L::RightAsymmetric6 => {
                let pd = if self.layout == L::LeftAsymmetric6 {
                    data - rot(n - 1)
                } else {
                    rot(n - 1)
                };
                if dd >= pd {
                    dd += 1;
                }
                (pd, n - 1)
            }
            L::LeftSymmetric6 | L::RightSymmetric6 => {
                let pd = if self.layout == L::LeftSymmetric6 {
                    data - rot(n - 1)
                } else {
                    rot(n - 1)
                };
                dd = (pd + 1 + dd) % (n - 1);
                (pd, n - 1)
            }
            L::ParityFirst6 => {
                dd += 1;
                (0, n - 1)
            }
        };
        (pd, Some(qd), dd)
    }

    /// Where stripe `stripe`'s chunks are.
    ///
    /// ```
    /// use tagstripe_striping::md::{Parity, ParityLayout};
    /// let a = Parity::new(6, ParityLayout::LeftSymmetric, 5, 8, 64)?;
    /// let s = a.stripe(0);
    /// assert_eq!((s.p, s.q, s.data), (4, Some(0), vec![1, 2, 3]));
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    #[must_use]
    pub fn stripe(&self, stripe: u64) -> StripeMap {
        let (p, q, _) = self.place(stripe, 0);
        let data = (0..self.data_disks())
            .map(|i| self.place(stripe, i).2)
            .collect();
        StripeMap { p, q, data }
    }

    /// The piece holding volume sector `lblk`, to the end of its chunk; `None` past the end.
    #[must_use]
    pub fn locate(&self, lblk: u64) -> Option<ParityPiece> {
        if lblk >= self.total_sectors() {
            return None;
        }
        let (chunk_number, offset) = (lblk / self.chunk, lblk % self.chunk);
        let data = self.data_disks() as u64;
        let (stripe, dd_idx) = (chunk_number / data, (chunk_number % data) as usize);
        let (p, q, comp) = self.place(stripe, dd_idx);
        Some(ParityPiece {
            lblk,
            count: self.chunk - offset,
            comp,
            cblk: stripe * self.chunk + offset,
            p_comp: p,
            q_comp: q,
            stripe,
            data_index: dd_idx,
        })
    }

    /// The pieces of `[start, start + count)`, one per chunk it touches.
    ///
    /// # Errors
    /// [`Error::RequestOverflow`], [`Error::PastEnd`] for a request not wholly inside.
    pub fn map(&self, start: u64, count: u64) -> Result<Vec<ParityPiece>, Error> {
        let end = crate::map::request_end(start, count, self.total_sectors())?;
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            let Some(mut p) = self.locate(at) else { break };
            p.count = p.count.min(end - at);
            at += p.count;
            out.push(p);
        }
        Ok(out)
    }

    /// The volume sector member `comp`'s sector `cblk` holds (md's `compute_blocknr`);
    /// `None` for a parity chunk or a sector past the member's usable size.
    #[must_use]
    pub fn volume_sector(&self, comp: usize, cblk: u64) -> Option<u64> {
        if comp >= self.disks || cblk >= self.member_sectors {
            return None;
        }
        let (stripe, offset) = (cblk / self.chunk, cblk % self.chunk);
        let s = self.stripe(stripe);
        let i = s.data.iter().position(|&m| m == comp)?;
        let chunk_number = stripe * self.data_disks() as u64 + i as u64;
        Some(chunk_number * self.chunk + offset)
    }
}

/// raid10's copy placement: `near` copies side by side, `far` copies further down every
/// member, `offset` far copies in the next chunk row instead of the far half.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Raid10Layout {
    /// Near copies (md's `nc`, layout bits 0-7).
    pub near: u8,
    /// Far copies (md's `fc`, bits 8-15).
    pub far: u8,
    /// Far copies are offset ones (bit 16).
    pub offset: bool,
    /// Far copies stay within sets of `disks / far` members (bit 17, md's "far sets").
    pub far_sets: bool,
}

impl Raid10Layout {
    /// `n2` and the like: `near` copies.
    #[must_use]
    pub fn near(copies: u8) -> Self {
        Self {
            near: copies,
            far: 1,
            offset: false,
            far_sets: false,
        }
    }

    /// md's layout number (the superblock's `layout` field).
    #[must_use]
    pub fn md_layout(self) -> u32 {
        u32::from(self.near)
            | u32::from(self.far) << 8
            | u32::from(self.offset) << 16
            | u32::from(self.far_sets) << 17
    }

    /// The layout md's number names.
    ///
    /// # Errors
    /// [`Error::LayoutUnsupported`] for bits md does not define or no copies.
    pub fn from_md(layout: u32) -> Result<Self, Error> {
        let l = Self {
            near: (layout & 255) as u8,
            far: (layout >> 8 & 255) as u8,
            offset: layout & 1 << 16 != 0,
            far_sets: layout & 1 << 17 != 0,
        };
        if layout >> 18 != 0 || l.near == 0 || l.far == 0 {
            return Err(Error::LayoutUnsupported {
                level: "raid10",
                layout: format!("{layout:#x}"),
            });
        }
        Ok(l)
    }

    /// Copies of each chunk.
    #[must_use]
    pub fn copies(self) -> usize {
        usize::from(self.near) * usize::from(self.far)
    }
}

impl std::fmt::Display for Raid10Layout {
    /// mdadm's name: `n2`, `f2`, `o2` (both near and far: `n2f2`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let far = if self.offset { 'o' } else { 'f' };
        match (self.near, self.far) {
            (n, 1) => write!(f, "n{n}"),
            (1, k) => write!(f, "{far}{k}"),
            (n, k) => write!(f, "n{n}{far}{k}"),
        }
    }
}

impl std::str::FromStr for Raid10Layout {
    type Err = Error;

    /// mdadm's names: `nK`, `fK`, `oK`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::LayoutUnsupported {
            level: "raid10",
            layout: s.to_owned(),
        };
        let (kind, k) = s.split_at_checked(1).ok_or_else(bad)?;
        let k: u8 = k.parse().map_err(|_| bad())?;
        if k == 0 {
            return Err(bad());
        }
        let one = Self::near(1);
        Ok(match kind {
            "n" => Self::near(k),
            "f" => Self { far: k, ..one },
            "o" => Self {
                far: k,
                offset: true,
                ..one
            },
            _ => return Err(bad()),
        })
    }
}

/// A raid10 array's geometry.
///
/// ```
/// use tagstripe_striping::md::Raid10;
/// // Four members, two far copies, 64 KiB chunks, 1 GiB usable on each.
/// let r = Raid10::new("f2".parse()?, 4, 128, 1 << 21)?;
/// assert_eq!(r.total_sectors(), 2 << 21); // half of four members' space
/// let copies = r.copies(0);
/// assert_eq!(copies, [(0, 0), (1, r.member_sectors() / 2)]); // a far copy, one member on
/// assert_eq!(r.volume_sector(1, r.member_sectors() / 2), Some(0));
/// # Ok::<(), tagstripe_striping::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raid10 {
    layout: Raid10Layout,
    disks: usize,
    chunk: u64,
    chunk_shift: u32,
    far_set_size: usize,
    member_sectors: u64,
    total: u64,
    stride: u64,
}

/// One run of a raid10 request inside one chunk, and each copy's place in md's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raid10Piece {
    /// Volume sector.
    pub lblk: u64,
    /// Sectors (never crossing a chunk).
    pub count: u64,
    /// `(member, sector)` of each copy, in md's order (`r10bio->devs[]`).
    pub copies: Vec<(usize, u64)>,
}

impl Raid10 {
    /// A raid10 array of `disks` members, `chunk`-sector chunks and `member_sectors` usable
    /// on each (after md's data offset), sized as md's `raid10_size` and `calc_sectors`.
    ///
    /// # Errors
    /// [`Error::InvalidChunk`], [`Error::TooFewDisks`] (fewer members than copies, or fewer
    /// than two copies), [`Error::MemberTooSmall`], [`Error::LayoutUnsupported`] for near
    /// and offset copies together over a member count near does not divide, and for a
    /// layout that would put two copies of a chunk on one member.
    pub fn new(
        layout: Raid10Layout,
        disks: usize,
        chunk: u64,
        member_sectors: u64,
    ) -> Result<Self, Error> {
        let chunk_shift = check_chunk("raid10", chunk)?;
        let copies = layout.copies();
        if copies < 2 || disks < copies {
            return Err(Error::TooFewDisks {
                level: "raid10",
                disks,
                min: copies.max(2),
            });
        }
        // Offset copies sit in the chunk row after their stripe's; near copies that wrap
        // round the members also move on a row, onto those offset copies (md computes the
        // same overlapping places): refused.
        if layout.offset
            && layout.far > 1
            && layout.near > 1
            && disks % usize::from(layout.near) != 0
        {
            return Err(Error::LayoutUnsupported {
                level: "raid10",
                layout: format!(
                    "{layout} over {disks} members (near copies that wrap onto the offset copies' row)"
                ),
            });
        }
        let (near, far) = (u64::from(layout.near), u64::from(layout.far));
        let far_set_size = if layout.far_sets {
            disks / usize::from(layout.far)
        } else {
            disks
        };

        // raid10_size: whole chunks, a far copy's share, times the members, over near.
        let array_chunks = (member_sectors >> chunk_shift) / far * disks as u64 / near;
        if array_chunks == 0 {
            return Err(Error::MemberTooSmall { chunk });
        }
        // calc_sectors: the members' size the array needs, and the far copies' stride.
        let dev_chunks = (array_chunks * copies as u64).div_ceil(disks as u64);
        let stride = if layout.offset {
            chunk
        } else {
            (dev_chunks / far) << chunk_shift
        };
        let r = Self {
            layout,
            disks,
            chunk,
            chunk_shift,
            far_set_size,
            member_sectors: dev_chunks << chunk_shift,
            total: array_chunks << chunk_shift,
            stride,
        };
        // Where a chunk's copies go repeats with its first member: each of those must put
        // every copy on another member. Some layouts md accepts do not (far sets no larger
        // than the near copies, which md warns "does not provide data safety" of).
        for c in 0..disks as u64 {
            let copies = r.place(c << chunk_shift);
            let mut members: Vec<usize> = copies.iter().map(|x| x.0).collect();
            members.sort_unstable();
            members.dedup();
            if members.len() != copies.len() {
                return Err(Error::LayoutUnsupported {
                    level: "raid10",
                    layout: format!(
                        "{layout} over {disks} members (copies of one chunk would share a member)"
                    ),
                });
            }
        }
        Ok(r)
    }

    /// The layout.
    #[must_use]
    pub fn layout(&self) -> Raid10Layout {
        self.layout
    }

    /// Members.
    #[must_use]
    pub fn disks(&self) -> usize {
        self.disks
    }

    /// Chunk in sectors.
    #[must_use]
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// The array's size (md's `raid10_size`).
    #[must_use]
    pub fn total_sectors(&self) -> u64 {
        self.total
    }

    /// The sectors of each member the array uses (md's `dev_sectors`).
    #[must_use]
    pub fn member_sectors(&self) -> u64 {
        self.member_sectors
    }

    /// Every copy of volume sector `lblk`, in md's order (`__raid10_find_phys`); empty past
    /// the end.
    #[must_use]
    pub fn copies(&self, lblk: u64) -> Vec<(usize, u64)> {
        if lblk >= self.total {
            return Vec::new();
        }
        self.place(lblk)
    }

    /// `__raid10_find_phys`, for any sector.
    fn place(&self, lblk: u64) -> Vec<(usize, u64)> {
        let (near, far) = (usize::from(self.layout.near), usize::from(self.layout.far));
        let disks = self.disks;
        let fss = self.far_set_size;
        let last_set_start = (disks / fss - 1) * fss;
        let last_set_size = fss + disks % fss;
        let mut chunk = lblk >> self.chunk_shift;
        let mut sector = lblk & (self.chunk - 1);
        chunk *= near as u64;
        let mut stripe = chunk / disks as u64;
        let mut dev = (chunk % disks as u64) as usize;
        if self.layout.offset {
            stripe *= far as u64;
        }
        sector += stripe << self.chunk_shift;
        let mut out = Vec::with_capacity(near * far);
        for _ in 0..near {
            let (mut d, mut s) = (dev, sector);
            out.push((d, s));
            for _ in 1..far {
                let set = d / fss;
                d += near;
                if disks % fss != 0 && d > last_set_start {
                    d -= last_set_start;
                    d %= last_set_size;
                    d += last_set_start;
                } else {
                    d %= fss;
                    d += fss * set;
                }
                s += self.stride;
                out.push((d, s));
            }
            dev += 1;
            if dev >= disks {
                dev = 0;
                sector += self.chunk;
            }
        }
        out
    }

    /// The pieces of `[start, start + count)`, one per chunk it touches.
    ///
    /// # Errors
    /// [`Error::RequestOverflow`], [`Error::PastEnd`] for a request not wholly inside.
    pub fn map(&self, start: u64, count: u64) -> Result<Vec<Raid10Piece>, Error> {
        let end = crate::map::request_end(start, count, self.total)?;
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            let n = (self.chunk - at % self.chunk).min(end - at);
            out.push(Raid10Piece {
                lblk: at,
                count: n,
                copies: self.copies(at),
            });
            at += n;
        }
        Ok(out)
    }

    /// The volume sector member `comp`'s sector `cblk` holds a copy of (md's
    /// `raid10_find_virt`); `None` past the member's used sectors.
    #[must_use]
    pub fn volume_sector(&self, comp: usize, cblk: u64) -> Option<u64> {
        if comp >= self.disks || cblk >= self.member_sectors {
            return None;
        }
        let (near, far) = (usize::from(self.layout.near), u64::from(self.layout.far));
        let disks = self.disks;
        let mut dev = comp;
        let mut fss = self.far_set_size;
        let mut set_start = dev / fss * fss;
        if disks % fss != 0 {
            let last = (disks / fss - 1) * fss;
            if dev >= last {
                fss += disks % fss;
                set_start = last;
            }
        }
        let offset = cblk & (self.chunk - 1);
        let mut sector = cblk;
        let chunk = if self.layout.offset {
            let c = sector >> self.chunk_shift;
            let fc = (c % far) as usize;
            // dev -= fc * near, wrapping once within the far set, as md does.
            let back = fc * near;
            dev = if dev >= set_start + back {
                dev - back
            } else {
                (dev + fss).checked_sub(back)?
            };
            c / far
        } else {
            while sector >= self.stride {
                sector -= self.stride;
                if dev < near + set_start {
                    dev += fss - near;
                } else {
                    dev -= near;
                }
            }
            sector >> self.chunk_shift
        };
        let vchunk = (chunk * disks as u64 + dev as u64) / near as u64;
        let lblk = (vchunk << self.chunk_shift) + offset;
        (lblk < self.total).then_some(lblk)
    }
}

impl StripeMap {
    /// The data members in the order md's raid6 syndrome takes them (`raid6_d0` and
    /// `raid6_idx_to_slot` for md's own layouts): from the member after Q onwards, round
    /// the array, skipping P and Q. Data at position `c` of this order enters Q as
    /// `g^c · D`.
    #[must_use]
    pub fn syndrome_order(&self) -> Vec<usize> {
        let n = self.data.len() + 1 + usize::from(self.q.is_some());
        let Some(q) = self.q else {
            return self.data.clone();
        };
        (1..=n)
            .map(|k| (q + k) % n)
            .filter(|&m| m != self.p && m != q)
            .collect()
    }
}

/// Arithmetic in GF(2^8) with md's raid6 polynomial (x^8 + x^4 + x^3 + x^2 + 1, 0x11d) and
/// generator 2, for the Q syndrome and for recovering data from P and Q (H. Peter Anvin,
/// "The mathematics of RAID-6", the paper md's raid6 code follows).
pub mod gf {
    /// `2^i` for i in 0..255 (and repeated, so products need no modulo).
    const EXP: [u8; 512] = {
        let mut t = [0u8; 512];
        let mut x: u16 = 1;
        let mut i = 0;
        while i < 512 {
            t[i] = x as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
            i += 1;
        }
        t
    };
    /// `log2(x)` for x in 1..=255 (`LOG[0]` unused).
    const LOG: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 255 {
            t[EXP[i] as usize] = i as u8;
            i += 1;
        }
        t
    };

    /// `a · b`.
    ///
    /// ```
    /// use tagstripe_striping::md::gf;
    /// assert_eq!(gf::mul(2, 0x80), 0x1d); // the polynomial folds back in
    /// assert_eq!(gf::mul(gf::inv(7), 7), 1);
    /// ```
    #[must_use]
    pub fn mul(a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            return 0;
        }
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }

    /// `2^i`, the coefficient of the `i`th data block in Q.
    #[must_use]
    pub fn pow2(i: usize) -> u8 {
        EXP[i % 255]
    }

    /// The inverse of a nonzero `a` (0 for 0).
    #[must_use]
    pub fn inv(a: u8) -> u8 {
        if a == 0 {
            return 0;
        }
        EXP[255 - LOG[a as usize] as usize]
    }

    /// `dst ^= c · src`, byte by byte.
    pub fn mul_acc(dst: &mut [u8], c: u8, src: &[u8]) {
        if c == 0 {
            return;
        }
        if c == 1 {
            xor_into(dst, src);
            return;
        }
        // One row of the multiplication table: a lookup a byte.
        let mut row = [0u8; 256];
        for (x, r) in row.iter_mut().enumerate() {
            *r = mul(c, x as u8);
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d ^= row[*s as usize];
        }
    }

    /// `dst ^= src`, eight bytes at a time.
    pub fn xor_into(dst: &mut [u8], src: &[u8]) {
        let n = dst.len().min(src.len());
        let (dst, src) = (&mut dst[..n], &src[..n]);
        let mut d8 = dst.chunks_exact_mut(8);
        let mut s8 = src.chunks_exact(8);
        for (d, s) in (&mut d8).zip(&mut s8) {
            let x = u64::from_ne_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
                ^ u64::from_ne_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
            d.copy_from_slice(&x.to_ne_bytes());
        }
        for (d, s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
            *d ^= s;
        }
    }

    /// `dst ^= a ^ b` (or `dst = a ^ b` when `init`), 32 bytes at a time: two sources
    /// a pass, so the result is loaded and stored half as often as one at a time.
    fn xor2_into(dst: &mut [u8], a: &[u8], b: &[u8], init: bool) {
        const LANE: usize = 32;
        #[inline(always)]
        fn load(s: &[u8]) -> [u64; LANE / 8] {
            let mut w = [0u64; LANE / 8];
            for (x, c) in w.iter_mut().zip(s.chunks_exact(8)) {
                *x = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            }
            w
        }
        let n = dst.len().min(a.len()).min(b.len());
        let (dst, a, b) = (&mut dst[..n], &a[..n], &b[..n]);
        let mut lanes = dst.chunks_exact_mut(LANE);
        for ((d, x), y) in (&mut lanes)
            .zip(a.chunks_exact(LANE))
            .zip(b.chunks_exact(LANE))
        {
            let (x, y) = (load(x), load(y));
            let old = if init { [0; LANE / 8] } else { load(d) };
            for (i, c) in d.chunks_exact_mut(8).enumerate() {
                c.copy_from_slice(&(x[i] ^ y[i] ^ old[i]).to_ne_bytes());
            }
        }
        let tail = n - n % LANE;
        for (i, d) in lanes.into_remainder().iter_mut().enumerate() {
            let v = a[tail + i] ^ b[tail + i];
            *d = if init { v } else { *d ^ v };
        }
    }

    /// `srcs[0] + srcs[1] + ...` (XOR) into a new buffer of `len` bytes, in blocks that
    /// stay in the first-level cache while every source is added: two sources a pass
    /// over the block (the first copied in alone when their number is odd), the result
    /// never zeroed in memory first.
    ///
    /// ```
    /// use tagstripe_striping::md::gf;
    /// assert_eq!(gf::xor_sum_new(&[&[1, 2, 3], &[1, 0, 7]], 3), [0, 2, 4]);
    /// assert_eq!(gf::xor_sum_new(&[&[1, 2], &[1, 0], &[4, 4]], 2), [4, 6]);
    /// ```
    #[must_use]
    pub fn xor_sum_new(srcs: &[&[u8]], len: usize) -> Vec<u8> {
        const BLOCK: usize = 4096;
        let (lead, pairs) = match srcs.len() {
            0 => return vec![0u8; len],
            n if n % 2 == 1 => (Some(srcs[0]), &srcs[1..]),
            _ => (None, srcs),
        };
        let mut out = Vec::with_capacity(len);
        let mut at = 0;
        while at < len {
            let end = (at + BLOCK).min(len);
            let init = match lead {
                Some(first) => {
                    out.extend_from_slice(&first[at..end]);
                    false
                }
                None => {
                    // Zeroes in a block that is in the first-level cache: overwritten by
                    // the first pair at once.
                    out.resize(end, 0);
                    true
                }
            };
            for (k, pair) in pairs.chunks_exact(2).enumerate() {
                xor2_into(
                    &mut out[at..end],
                    &pair[0][at..end],
                    &pair[1][at..end],
                    init && k == 0,
                );
            }
            at = end;
        }
        out
    }

    /// Eight bytes multiplied by 2 at once in GF(2^8) (each byte shifted left, the
    /// polynomial 0x11d folded back into the bytes whose top bit fell out): the SWAR step
    /// of hpa's "The mathematics of RAID-6", which md's portable `int64` code uses too.
    #[inline]
    fn mul2x8(v: u64) -> u64 {
        const HIGH: u64 = 0x8080_8080_8080_8080;
        let top = v & HIGH;
        // 0xff in each byte whose top bit was set, then masked to 0x1d.
        let fold = ((top << 1).wrapping_sub(top >> 7)) & 0x1d1d_1d1d_1d1d_1d1d;
        ((v << 1) & 0xfefe_fefe_fefe_fefe) ^ fold
    }

    /// P and Q of a stripe row in one pass: `p = Σ D_c`, `q = Σ 2^c · D_c` over the data
    /// blocks in syndrome order (`data[c]`; `None` counts as zeroes), by Horner's rule
    /// from the last block, eight bytes at a time, a 4 KiB block of every source at a time
    /// so that it stays in the first-level cache. The same P and Q as [`xor_sum_new`] and
    /// [`mul_acc`] with [`pow2`] give, several times faster.
    ///
    /// ```
    /// use tagstripe_striping::md::gf;
    /// let (a, b, c) = ([1u8, 2, 3, 200, 0, 0, 0, 9], [7u8; 8], [0x80u8; 8]);
    /// let (mut p, mut q) = ([0u8; 8], [0u8; 8]);
    /// gf::gen_syndrome(&[Some(&a[..]), Some(&b[..]), None, Some(&c[..])], &mut p, &mut q);
    /// for i in 0..8 {
    ///     assert_eq!(p[i], a[i] ^ b[i] ^ c[i]);
    ///     assert_eq!(q[i], a[i] ^ gf::mul(2, b[i]) ^ gf::mul(8, c[i]));
    /// }
    /// ```
    pub fn gen_syndrome(data: &[Option<&[u8]>], p: &mut [u8], q: &mut [u8]) {
        const WORDS: usize = 512; // 4 KiB a block
        let len = p.len().min(q.len());
        let (mut wp, mut wq) = ([0u64; WORDS], [0u64; WORDS]);
        let mut at = 0;
        while at < len {
            let end = (at + WORDS * 8).min(len);
            let n = (end - at) / 8;
            let (wp, wq) = (&mut wp[..n], &mut wq[..n]);
            wp.fill(0);
            wq.fill(0);
            // Horner's rule, a whole block a step: q = 2q + D, from the last block down.
            for d in data.iter().rev() {
                for w in wq.iter_mut() {
                    *w = mul2x8(*w);
                }
                if let Some(d) = d {
                    let words = d[at..at + n * 8].chunks_exact(8);
                    for ((p, q), b) in wp.iter_mut().zip(wq.iter_mut()).zip(words) {
                        let w = u64::from_ne_bytes(b.try_into().unwrap_or_default());
                        *p ^= w;
                        *q ^= w;
                    }
                }
            }
            for ((pb, qb), (x, y)) in p[at..at + n * 8]
                .chunks_exact_mut(8)
                .zip(q[at..at + n * 8].chunks_exact_mut(8))
                .zip(wp.iter().zip(wq.iter()))
            {
                pb.copy_from_slice(&x.to_ne_bytes());
                qb.copy_from_slice(&y.to_ne_bytes());
            }
            // The bytes past the last whole word, one at a time.
            for j in at + n * 8..end {
                let (mut bp, mut bq) = (0u8, 0u8);
                for d in data.iter().rev() {
                    bq = mul(2, bq);
                    if let Some(d) = d {
                        bp ^= d[j];
                        bq ^= d[j];
                    }
                }
                p[j] = bp;
                q[j] = bq;
            }
            at = end;
        }
    }

    /// `buf = c · buf`.
    pub fn scale(buf: &mut [u8], c: u8) {
        let mut row = [0u8; 256];
        for (x, r) in row.iter_mut().enumerate() {
            *r = mul(c, x as u8);
        }
        for b in buf {
            *b = row[*b as usize];
        }
    }
}

/// md's version-1 superblock (`struct mdp_superblock_1` in `include/uapi/linux/raid/md_p.h`):
/// what a member says of its array, read from its bytes, so an md array's members can be
/// opened without the md driver. Version 1.2 sits 4 KiB into the member, 1.1 at its start,
/// 1.0 at its end (see [`Superblock1::locations`]).
///
/// ```
/// use tagstripe_striping::md::{ParityLayout, Superblock1};
/// let sb = Superblock1 {
///     feature_map: 0, set_uuid: [1; 16], set_name: "host:md0".into(), level: 5,
///     layout: ParityLayout::LeftSymmetric.md_algorithm(), size: 8192, chunk: 128,
///     raid_disks: 4, data_offset: 2048, data_size: 8192, super_offset: 8, dev_number: 2,
///     events: 7, resync_offset: u64::MAX, recovery_offset: 0, dev_roles: vec![0, 1, 2, 3],
/// };
/// let bytes = sb.encode(); // what md writes 4 KiB into a 1.2 member
/// let back = Superblock1::parse(&bytes)?;
/// assert_eq!((back.role(), back.clean()), (Some(2), true));
/// assert_eq!(back.geometry()?.total_sectors(), 3 * 8192);
/// # Ok::<(), tagstripe_striping::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock1 {
    /// `feature_map`.
    pub feature_map: u32,
    /// The array's UUID.
    pub set_uuid: [u8; 16],
    /// The array's name (`host:name`).
    pub set_name: String,
    /// RAID level (5, 6, 10; md also has 0, 1, 4, -1 for linear).
    pub level: i32,
    /// Layout (md's algorithm number, or raid10's near/far/offset word).
    pub layout: u32,
    /// Sectors of each member the array uses.
    pub size: u64,
    /// Chunk in sectors.
    pub chunk: u32,
    /// Members in the array.
    pub raid_disks: u32,
    /// Where the data starts on this member, in sectors.
    pub data_offset: u64,
    /// Sectors of data this member can hold.
    pub data_size: u64,
    /// Where this superblock is on the member, in sectors.
    pub super_offset: u64,
    /// Index of this member in `dev_roles`.
    pub dev_number: u32,
    /// The event count (the newest wins at assembly).
    pub events: u64,
    /// Data before this member sector is known in sync; `u64::MAX` (md's `MaxSector`)
    /// when the array was stopped cleanly. Anything else: a crash may have left a
    /// stripe's parity behind its data, and the array must be resynced.
    pub resync_offset: u64,
    /// With [`FEATURE_RECOVERY_OFFSET`] in `feature_map`: this member is being rebuilt and
    /// holds the array's data below this member sector (md's `recovery_offset`, which it
    /// writes as a rebuild goes so that the next assembly takes it up there). 0 otherwise.
    pub recovery_offset: u64,
    /// Each device number's role: a member index, or 0xffff spare, 0xfffe faulty,
    /// 0xfffd journal.
    pub dev_roles: Vec<u16>,
}

/// md's superblock magic.
pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;
/// `feature_map` bit: the member is partly rebuilt, up to `recovery_offset`
/// (`MD_FEATURE_RECOVERY_OFFSET`).
pub const FEATURE_RECOVERY_OFFSET: u32 = 2;
/// A `dev_roles` entry for a spare.
pub const ROLE_SPARE: u16 = 0xffff;
/// A `dev_roles` entry for a faulty device.
pub const ROLE_FAULTY: u16 = 0xfffe;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | u64::from(le32(b, at + 4)) << 32
}

/// md's `calc_sb_1_csum` over `b` (the superblock and its `dev_roles`), its own checksum
/// field taken as zero.
fn csum(b: &[u8]) -> u32 {
    let mut sum: u64 = 0;
    let mut at = 0;
    while at + 4 <= b.len() {
        let w = if at == 216 { 0 } else { le32(b, at) };
        sum += u64::from(w);
        at += 4;
    }
    if b.len() - at == 2 {
        sum += u64::from(u16::from_le_bytes([b[at], b[at + 1]]));
    }
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

impl Superblock1 {
    /// Where md's version-1 superblocks may be on a member of `sectors` sectors, with the
    /// version each means: 1.2 at sector 8, 1.1 at 0, 1.0 at the end less 8 KiB, rounded
    /// down to 4 KiB.
    #[must_use]
    pub fn locations(sectors: u64) -> [(u64, &'static str); 3] {
        let end = sectors.saturating_sub(16) & !7;
        [(8, "1.2"), (0, "1.1"), (end, "1.0")]
    }

    /// Reads a superblock from its bytes (at least 256, plus 2 per `dev_roles` entry).
    ///
    /// # Errors
    /// [`Error::MdSuperblock`] for a wrong magic or version, a short buffer, or a checksum
    /// that does not match (md's own test).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        let bad = |what: String| Error::MdSuperblock { what };
        if b.len() < 256 {
            return Err(bad(format!("{} bytes, a superblock takes 256", b.len())));
        }
        let magic = le32(b, 0);
        if magic != MD_SB_MAGIC {
            return Err(bad(format!("magic {magic:#x}, md's is {MD_SB_MAGIC:#x}")));
        }
        if le32(b, 4) != 1 {
            return Err(bad(format!("major version {}, expected 1", le32(b, 4))));
        }
        let max_dev = le32(b, 220) as usize;
        let end = 256 + 2 * max_dev;
        if max_dev > 1920 || b.len() < end {
            return Err(bad(format!(
                "{max_dev} device roles do not fit the {} bytes read",
                b.len()
            )));
        }
        let stored = le32(b, 216);
        let computed = csum(&b[..end]);
        if stored != computed {
            return Err(bad(format!(
                "checksum {stored:#010x}, the bytes give {computed:#010x}"
            )));
        }
        let mut set_uuid = [0u8; 16];
        set_uuid.copy_from_slice(&b[16..32]);
        let name = &b[32..64];
        let name_end = name.iter().position(|&c| c == 0).unwrap_or(32);
        Ok(Self {
            feature_map: le32(b, 8),
            set_uuid,
            set_name: String::from_utf8_lossy(&name[..name_end]).into_owned(),
            level: le32(b, 72) as i32,
            layout: le32(b, 76),
            size: le64(b, 80),
            chunk: le32(b, 88),
            raid_disks: le32(b, 92),
            data_offset: le64(b, 128),
            data_size: le64(b, 136),
            super_offset: le64(b, 144),
            dev_number: le32(b, 160),
            events: le64(b, 200),
            resync_offset: le64(b, 208),
            recovery_offset: le64(b, 152),
            dev_roles: (0..max_dev)
                .map(|i| u16::from_le_bytes([b[256 + 2 * i], b[257 + 2 * i]]))
                .collect(),
        })
    }

    /// The superblock's bytes, checksummed, padded to 4 KiB (what md writes; for tests and
    /// tools that lay out members by hand).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        let put32 =
            |b: &mut [u8], at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let put64 =
            |b: &mut [u8], at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        put32(&mut b, 0, MD_SB_MAGIC);
        put32(&mut b, 4, 1);
        put32(&mut b, 8, self.feature_map);
        b[16..32].copy_from_slice(&self.set_uuid);
        let name = self.set_name.as_bytes();
        let n = name.len().min(32);
        b[32..32 + n].copy_from_slice(&name[..n]);
        put32(&mut b, 72, self.level as u32);
        put32(&mut b, 76, self.layout);
        put64(&mut b, 80, self.size);
        put32(&mut b, 88, self.chunk);
        put32(&mut b, 92, self.raid_disks);
        put64(&mut b, 128, self.data_offset);
        put64(&mut b, 136, self.data_size);
        put64(&mut b, 144, self.super_offset);
        put64(&mut b, 152, self.recovery_offset);
        put32(&mut b, 160, self.dev_number);
        put64(&mut b, 200, self.events);
        put64(&mut b, 208, self.resync_offset);
        let max_dev = self.dev_roles.len().min(1920);
        put32(&mut b, 220, max_dev as u32);
        for (i, r) in self.dev_roles.iter().take(max_dev).enumerate() {
            b[256 + 2 * i..258 + 2 * i].copy_from_slice(&r.to_le_bytes());
        }
        let c = csum(&b[..256 + 2 * max_dev]);
        put32(&mut b, 216, c);
        b
    }

    /// This member's role in the array (`dev_roles[dev_number]`): a member index, `None`
    /// for a spare, a faulty device or a journal.
    #[must_use]
    pub fn role(&self) -> Option<usize> {
        self.role_of(self.dev_number as usize)
    }

    /// The role device number `dev` has in this superblock's view (`None`: spare, faulty,
    /// journal, or no such device).
    #[must_use]
    pub fn role_of(&self, dev: usize) -> Option<usize> {
        self.dev_roles
            .get(dev)
            .filter(|&&r| r < 0xff00)
            .map(|&r| usize::from(r))
    }

    /// How far this member is rebuilt, if it is being rebuilt (md's recovery offset, with
    /// its feature bit): it holds the array's data below that member sector only.
    #[must_use]
    pub fn recovering(&self) -> Option<u64> {
        (self.feature_map & FEATURE_RECOVERY_OFFSET != 0).then_some(self.recovery_offset)
    }

    /// Whether the array was stopped cleanly (no resync owed).
    #[must_use]
    pub fn clean(&self) -> bool {
        self.resync_offset == u64::MAX
    }

    /// The layout the superblock describes, as this module maps it.
    ///
    /// # Errors
    /// [`Error::InvalidLevel`] for a level other than 5, 6 or 10, and the geometry's own
    /// errors.
    pub fn geometry(&self) -> Result<MdGeometry, Error> {
        let disks = self.raid_disks as usize;
        let chunk = u64::from(self.chunk);
        match self.level {
            5 | 6 => {
                let layout =
                    ParityLayout::from_md(self.layout).ok_or_else(|| Error::LayoutUnsupported {
                        level: if self.level == 5 { "raid5" } else { "raid6" },
                        layout: format!("md algorithm {}", self.layout),
                    })?;
                Parity::new(self.level as u8, layout, disks, chunk, self.size)
                    .map(MdGeometry::Parity)
            }
            10 => Raid10::new(Raid10Layout::from_md(self.layout)?, disks, chunk, self.size)
                .map(MdGeometry::Raid10),
            l => Err(Error::InvalidLevel {
                level: u32::try_from(l).unwrap_or(u32::MAX),
            }),
        }
    }
}

/// An md array's layout, either kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MdGeometry {
    /// raid5 or raid6.
    Parity(Parity),
    /// raid10.
    Raid10(Raid10),
}

impl MdGeometry {
    /// Members.
    #[must_use]
    pub fn disks(&self) -> usize {
        match self {
            Self::Parity(g) => g.disks(),
            Self::Raid10(r) => r.disks(),
        }
    }

    /// Chunk in sectors.
    #[must_use]
    pub fn chunk(&self) -> u64 {
        match self {
            Self::Parity(g) => g.chunk(),
            Self::Raid10(r) => r.chunk(),
        }
    }

    /// Each member's sectors the array uses.
    #[must_use]
    pub fn member_sectors(&self) -> u64 {
        match self {
            Self::Parity(g) => g.member_sectors(),
            Self::Raid10(r) => r.member_sectors(),
        }
    }

    /// The array's size.
    #[must_use]
    pub fn total_sectors(&self) -> u64 {
        match self {
            Self::Parity(g) => g.total_sectors(),
            Self::Raid10(r) => r.total_sectors(),
        }
    }

    /// How many members may fail with the data still whole (raid5 1, raid6 2, raid10 its
    /// copies less one, at best).
    #[must_use]
    pub fn redundancy(&self) -> usize {
        match self {
            Self::Parity(g) => usize::from(g.level() - 4),
            Self::Raid10(r) => r.layout().copies() - 1,
        }
    }

    /// The optimal I/O size in bytes: a full stripe of data (raid10: a chunk).
    #[must_use]
    pub fn io_opt(&self) -> u64 {
        match self {
            Self::Parity(g) => g.chunk() * 512 * g.data_disks() as u64,
            Self::Raid10(r) => r.chunk() * 512,
        }
    }
}
