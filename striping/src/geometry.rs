//! Building a validated [`Geometry`]: ccd's `ccdinit` and `ccdinterleave`, step by step.

use crate::{Error, MirrorReads};

/// The most components ccd accepts (`CCD_MAXNDISKS` in NetBSD's `ccdvar.h`).
pub const MAX_COMPONENTS: usize = 65536;

/// The reserved area FreeBSD ccd skips at the start of every component (`CCD_OFFSET`).
pub const FREEBSD_RESERVED_SECTORS: u64 = 16;

/// Which kernel's rules a geometry follows.
///
/// The interleave table and the lookup are the same for every ccd flavor; they differ in the
/// reserved area, mirroring, FreeBSD's `linux` mode and the errno for requests past the end.
/// md raid0 has the same zones as ccd's rows; its [`MdLayout::Alt`] layout (Linux 3.14+) maps
/// block for block like ccd, [`MdLayout::Orig`] (before 3.14) picks devices differently in the
/// second and later zones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// NetBSD ccd today: no reserved area, no mirroring.
    #[default]
    NetBsd,
    /// NetBSD ccd as of 1997 (ccd.c 1.41): mirroring with reads from the primary half only.
    NetBsd1997,
    /// FreeBSD ccd (GEOM): 16 reserved sectors per component unless `no_offset` or `linux`,
    /// mirroring with dual-seek-zone reads, `linux` mode.
    FreeBsd,
    /// Linux md raid0 with the given zone layout; the chunk is the interleave.
    Md(MdLayout),
}

/// The two zone layouts of Linux md raid0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MdLayout {
    /// `raid0.default_layout=2`, Linux 3.14 and later: identical to ccd.
    #[default]
    Alt,
    /// `raid0.default_layout=1`, before Linux 3.14: the device in zones after the first is
    /// chosen from the absolute chunk number.
    Orig,
}

impl Flavor {
    /// The name used on the command line and in [`std::str::FromStr`].
    ///
    /// ```
    /// use tagstripe_striping::{Flavor, MdLayout};
    /// assert_eq!(Flavor::FreeBsd.name(), "freebsd");
    /// assert_eq!(Flavor::Md(MdLayout::Orig).name(), "md-orig");
    /// ```
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::NetBsd => "netbsd",
            Self::NetBsd1997 => "netbsd1997",
            Self::FreeBsd => "freebsd",
            Self::Md(MdLayout::Alt) => "md-alt",
            Self::Md(MdLayout::Orig) => "md-orig",
        }
    }
}

impl std::fmt::Display for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Flavor {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "netbsd" => Self::NetBsd,
            "netbsd1997" => Self::NetBsd1997,
            "freebsd" => Self::FreeBsd,
            "md" | "md-alt" => Self::Md(MdLayout::Alt),
            "md-orig" => Self::Md(MdLayout::Orig),
            _ => {
                return Err(Error::UnknownFlavor { name: s.to_owned() });
            }
        })
    }
}

/// Something configuration changed silently, as ccd does (and reports on the console).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Note {
    /// FreeBSD drops mirroring when the interleave is 0.
    MirrorDisabled,
    /// FreeBSD turns on uniform when mirroring is asked for without it.
    MirrorForcesUniform,
    /// FreeBSD `linux` mode doubled the interleave (Linux gives the chunk in KiB).
    LinuxInterleaveDoubled {
        /// The interleave after doubling, in sectors.
        interleave: u64,
    },
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MirrorDisabled => f.write_str("mirror silently disabled: interleave is 0"),
            Self::MirrorForcesUniform => f.write_str("mirror forces uniform"),
            Self::LinuxInterleaveDoubled { interleave } => write!(
                f,
                "linux mode: interleave doubled to {interleave} blocks, no reserved area"
            ),
        }
    }
}

/// One row of the interleave table: a horizontal slab cut across the components at two
/// consecutive distinct sizes (ccd's `struct ccdiinfo`, md raid0's zone).
///
/// Everything is in 512-byte sectors, unlike ccd, which mixes sectors and interleave units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    lblk_start: u64,
    cblk_start: u64,
    lblk_span: u64,
    lblk_end: u64,
    /// `lblk_start` in interleave units (ccd's `ii_startblk`); 0 when concatenated.
    pub(crate) unit_start: u64,
    /// `cblk_start` in interleave units (ccd's `ii_startoff`); 0 when concatenated.
    pub(crate) cunit_start: u64,
    data: usize,
    members: Vec<usize>,
}

impl Row {
    /// First logical (volume) sector of the row.
    #[inline]
    #[must_use]
    pub fn lblk_start(&self) -> u64 {
        self.lblk_start
    }

    /// First component sector of the row, not counting the reserved area.
    #[inline]
    #[must_use]
    pub fn cblk_start(&self) -> u64 {
        self.cblk_start
    }

    /// Sectors the row spans, as ccd's table counts them: `members × height`. For a mirror
    /// that counts both halves, so it is twice the logical sectors the row holds.
    #[must_use]
    pub fn lblk_span(&self) -> u64 {
        self.lblk_span
    }

    /// One past the last logical sector the row holds.
    #[inline]
    #[must_use]
    pub fn lblk_end(&self) -> u64 {
        self.lblk_end
    }

    /// The components in the row, in component order (ccd's `ii_index`).
    #[inline]
    #[must_use]
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// How many components the row has (ccd's `ii_ndisk`).
    #[must_use]
    pub fn ndisk(&self) -> usize {
        self.members.len()
    }

    /// How many of them hold data (half of them for a mirror).
    #[inline]
    #[must_use]
    pub fn data_members(&self) -> usize {
        self.data
    }
}

/// Builds a [`Geometry`]; see [`Geometry::builder`].
///
/// Setters take `&mut self` so one builder can try several configurations.
#[derive(Clone, Debug)]
pub struct GeometryBuilder {
    sizes: Vec<u64>,
    interleave: u64,
    flavor: Flavor,
    uniform: bool,
    mirror: bool,
    no_offset: bool,
    linux: bool,
    sector_size: u32,
    reserved: Option<u64>,
}

impl GeometryBuilder {
    /// Which kernel's rules to follow (default [`Flavor::NetBsd`]).
    pub fn flavor(&mut self, flavor: Flavor) -> &mut Self {
        self.flavor = flavor;
        self
    }

    /// ccd's `CCDF_UNIFORM`: every component contributes only as much as the smallest.
    pub fn uniform(&mut self, on: bool) -> &mut Self {
        self.uniform = on;
        self
    }

    /// Mirror the first half of the components onto the second (FreeBSD, NetBSD 1997).
    pub fn mirror(&mut self, on: bool) -> &mut Self {
        self.mirror = on;
        self
    }

    /// FreeBSD's `no_offset`: do not reserve 16 sectors at the start of each component.
    pub fn no_offset(&mut self, on: bool) -> &mut Self {
        self.no_offset = on;
        self
    }

    /// FreeBSD's `linux` mode: no reserved area, and the interleave is given in KiB (Linux's
    /// chunk size), so it is doubled.
    pub fn linux(&mut self, on: bool) -> &mut Self {
        self.linux = on;
        self
    }

    /// The largest component sector size in bytes (default 512); the interleave must cover at
    /// least one such sector.
    pub fn sector_size(&mut self, bytes: u32) -> &mut Self {
        self.sector_size = bytes;
        self
    }

    /// Overrides the reserved area at the start of each component, in sectors (for example
    /// md's `data_offset`). Without it the flavor decides: 16 for FreeBSD, otherwise 0.
    pub fn reserved(&mut self, sectors: u64) -> &mut Self {
        self.reserved = Some(sectors);
        self
    }

    /// Validates the configuration the way `ccdinit` does and builds the interleave table.
    ///
    /// # Errors
    /// Every configuration ccd (or md) refuses, as a precise [`Error`] variant naming the
    /// component where one is at fault.
    pub fn build(&self) -> Result<Geometry, Error> {
        let n = self.sizes.len();
        if n == 0 {
            return Err(Error::NoComponents);
        }
        if n > MAX_COMPONENTS {
            return Err(Error::TooManyComponents {
                count: n,
                max: MAX_COMPONENTS,
            });
        }
        if self.sector_size < 512 || !self.sector_size.is_power_of_two() {
            return Err(Error::InvalidSectorSize {
                sector_size: self.sector_size,
            });
        }
        let flavor = self.flavor;
        let mut notes = Vec::new();
        let mut interleave = self.interleave;
        let mut mirror = self.mirror;
        let mut uniform = self.uniform;
        let unsupported = |option| Error::OptionUnsupported { option, flavor };
        match flavor {
            Flavor::NetBsd => {
                if mirror {
                    return Err(Error::MirrorUnsupported { flavor });
                }
                if self.linux {
                    return Err(unsupported("linux"));
                }
            }
            Flavor::NetBsd1997 => {
                if self.linux {
                    return Err(unsupported("linux"));
                }
                if mirror && interleave == 0 {
                    return Err(Error::MirrorNeedsInterleave);
                }
                uniform |= mirror;
            }
            Flavor::FreeBsd => {
                if mirror && interleave == 0 {
                    mirror = false;
                    notes.push(Note::MirrorDisabled);
                }
                if mirror && !uniform {
                    uniform = true;
                    notes.push(Note::MirrorForcesUniform);
                }
                if self.linux && mirror && n != 2 {
                    return Err(Error::LinuxMirrorNeedsTwo { count: n });
                }
            }
            Flavor::Md(_) => {
                if mirror {
                    return Err(Error::MirrorUnsupported { flavor });
                }
                if uniform {
                    return Err(unsupported("uniform"));
                }
                if self.linux {
                    return Err(unsupported("linux"));
                }
                if interleave == 0 {
                    return Err(Error::ChunkRequired);
                }
            }
        }
        if self.linux {
            interleave = interleave
                .checked_mul(2)
                .ok_or(Error::Overflow { what: "interleave" })?;
            notes.push(Note::LinuxInterleaveDoubled { interleave });
        }
        let reserved = self.reserved.unwrap_or(match flavor {
            Flavor::FreeBsd if !self.no_offset && !self.linux => FREEBSD_RESERVED_SECTORS,
            _ => 0,
        });

        let mut sizes = Vec::with_capacity(n);
        for (component, &raw) in self.sizes.iter().enumerate() {
            if raw <= reserved {
                return Err(Error::ComponentEmpty {
                    component,
                    raw_sectors: raw,
                    reserved,
                });
            }
            let mut s = raw - reserved;
            if interleave > 1 {
                s -= s % interleave;
            }
            if s == 0 {
                return Err(Error::ComponentSmallerThanInterleave {
                    component,
                    sectors: raw - reserved,
                    interleave,
                });
            }
            sizes.push(s);
        }

        let min_interleave = u64::from(self.sector_size / 512);
        if interleave > 0 && interleave < min_interleave {
            return Err(Error::InterleaveBelowSectorSize {
                interleave,
                min: min_interleave,
                sector_size: self.sector_size,
            });
        }
        if matches!(flavor, Flavor::Md(_)) && interleave % min_interleave != 0 {
            return Err(Error::ChunkNotBlockMultiple {
                interleave,
                sector_size: self.sector_size,
            });
        }

        // `sizes` is non-empty, so the minimum exists.
        let smallest = sizes.iter().copied().min().unwrap_or(0);
        if uniform {
            sizes.iter_mut().for_each(|s| *s = smallest);
        }
        if mirror && n % 2 != 0 {
            return Err(Error::MirrorOddCount { count: n });
        }
        // Σ sizes bounds every table quantity (a mirror's row counts both halves), and
        // reserved + size every component address: check both once, here.
        let overflow = Error::Overflow {
            what: "volume size",
        };
        let sum = sizes
            .iter()
            .try_fold(0u64, |acc, &s| acc.checked_add(s))
            .ok_or(overflow.clone())?;
        sizes
            .iter()
            .try_for_each(|s| s.checked_add(reserved).map(drop))
            .ok_or(overflow)?;
        let total = if mirror {
            smallest * (n / 2) as u64
        } else {
            sum
        };

        let rows = if interleave == 0 {
            concat_rows(&sizes)
        } else {
            interleave_rows(&sizes, interleave, mirror)
        };
        let fast = fast_path(&rows, interleave);
        Ok(Geometry {
            raw_sizes: self.sizes.clone(),
            sizes,
            interleave,
            requested_interleave: self.interleave,
            flavor,
            uniform,
            mirror,
            reserved,
            sector_size: self.sector_size,
            total,
            rows,
            notes,
            fast,
        })
    }
}

/// ccd's `ccdinterleave` for `ileave > 0`: cut the components at every distinct size.
fn interleave_rows(sizes: &[u64], interleave: u64, mirror: bool) -> Vec<Row> {
    let mut distinct: Vec<u64> = sizes.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let mut rows = Vec::with_capacity(distinct.len());
    let (mut level, mut bn, mut lend) = (0u64, 0u64, 0u64);
    for h in distinct {
        let members: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] >= h).collect();
        let ndisk = members.len();
        let data = if mirror { ndisk / 2 } else { ndisk };
        // Bounded by the validated total (or twice it for a mirror's single row, which is
        // at most Σ sizes): no overflow.
        let span = ndisk as u64 * (h - level);
        let data_span = data as u64 * (h - level);
        rows.push(Row {
            lblk_start: lend,
            cblk_start: level,
            lblk_span: span,
            lblk_end: lend + data_span,
            unit_start: lend / interleave,
            cunit_start: level / interleave,
            data,
            members,
        });
        bn += span;
        lend += data_span;
        level = h;
    }
    debug_assert!(bn >= lend);
    rows
}

/// Concatenation: one row per component, in order.
fn concat_rows(sizes: &[u64]) -> Vec<Row> {
    let mut start = 0u64;
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let row = Row {
                lblk_start: start,
                cblk_start: 0,
                lblk_span: s,
                lblk_end: start + s,
                unit_start: 0,
                cunit_start: 0,
                data: 1,
                members: vec![i],
            };
            start += s;
            row
        })
        .collect()
}

/// Shift/mask constants for one row with a power-of-two interleave and member count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fast {
    pub(crate) il_shift: u32,
    pub(crate) n_shift: u32,
}

fn fast_path(rows: &[Row], interleave: u64) -> Option<Fast> {
    match rows {
        [row]
            if interleave.is_power_of_two()
                && row.data.is_power_of_two()
                && row.members.iter().enumerate().all(|(i, &m)| i == m) =>
        {
            Some(Fast {
                il_shift: interleave.trailing_zeros(),
                n_shift: row.data.trailing_zeros(),
            })
        }
        _ => None,
    }
}

/// A validated striping geometry: the effective component sizes, the interleave table, and
/// the map from volume sectors to component sectors.
///
/// Built with [`Geometry::builder`], following ccd's `ccdinit` exactly (reserved area, sizes
/// rounded down to the interleave, uniform, mirror), so the member images of an existing ccd
/// or md raid0 array open with the same layout.
///
/// ```
/// use tagstripe_striping::Geometry;
///
/// // Three unequal components, interleave 16 (NetBSD).
/// let g = Geometry::builder([1000, 2000, 1500], 16).build()?;
/// assert_eq!(g.component_sizes(), &[992, 2000, 1488]);
/// assert_eq!(g.total_sectors(), 4480);
/// assert_eq!(g.rows().len(), 3);
///
/// // Sector 3968 is the first of the last row, which only component 1 reaches.
/// let p = g.map(3968, 40)?.next().unwrap();
/// assert_eq!((p.component, p.cblk, p.count), (1, 1488, 16));
/// # Ok::<(), tagstripe_striping::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    raw_sizes: Vec<u64>,
    sizes: Vec<u64>,
    interleave: u64,
    requested_interleave: u64,
    flavor: Flavor,
    uniform: bool,
    mirror: bool,
    reserved: u64,
    sector_size: u32,
    total: u64,
    rows: Vec<Row>,
    notes: Vec<Note>,
    pub(crate) fast: Option<Fast>,
}

impl Geometry {
    /// Starts a builder for components of the given raw sizes (512-byte sectors) and an
    /// interleave in sectors; 0 concatenates.
    ///
    /// ```
    /// use tagstripe_striping::{Flavor, Geometry};
    /// let g = Geometry::builder([2048, 2048], 16)
    ///     .flavor(Flavor::FreeBsd)
    ///     .mirror(true)
    ///     .build()?;
    /// assert_eq!(g.reserved_sectors(), 16);
    /// assert_eq!(g.total_sectors(), 2032);
    /// assert!(g.is_uniform());
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    pub fn builder(sizes: impl Into<Vec<u64>>, interleave: u64) -> GeometryBuilder {
        GeometryBuilder {
            sizes: sizes.into(),
            interleave,
            flavor: Flavor::default(),
            uniform: false,
            mirror: false,
            no_offset: false,
            linux: false,
            sector_size: 512,
            reserved: None,
        }
    }

    /// The volume size in sectors.
    #[inline]
    #[must_use]
    pub fn total_sectors(&self) -> u64 {
        self.total
    }

    /// Each component's usable size after the reserved area, rounding and uniform.
    #[must_use]
    pub fn component_sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The raw component sizes given to the builder.
    #[must_use]
    pub fn raw_sizes(&self) -> &[u64] {
        &self.raw_sizes
    }

    /// The number of components.
    #[must_use]
    pub fn components(&self) -> usize {
        self.sizes.len()
    }

    /// The effective interleave in sectors (doubled in FreeBSD `linux` mode); 0 = concatenated.
    #[inline]
    #[must_use]
    pub fn interleave(&self) -> u64 {
        self.interleave
    }

    /// The interleave as given to the builder.
    #[must_use]
    pub fn requested_interleave(&self) -> u64 {
        self.requested_interleave
    }

    /// The flavor the geometry follows.
    #[must_use]
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Whether every component contributes only the smallest size.
    #[must_use]
    pub fn is_uniform(&self) -> bool {
        self.uniform
    }

    /// Whether the second half of the components mirrors the first.
    #[inline]
    #[must_use]
    pub fn is_mirror(&self) -> bool {
        self.mirror
    }

    /// Sectors skipped at the start of every component.
    #[inline]
    #[must_use]
    pub fn reserved_sectors(&self) -> u64 {
        self.reserved
    }

    /// The largest component sector size in bytes, as given to the builder.
    #[must_use]
    pub fn sector_size(&self) -> u32 {
        self.sector_size
    }

    /// Components that hold distinct data: all of them, or half for a mirror.
    #[must_use]
    pub fn data_components(&self) -> usize {
        if self.mirror {
            self.sizes.len() / 2
        } else {
            self.sizes.len()
        }
    }

    /// The interleave table, rows in ascending order.
    #[inline]
    #[must_use]
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// What configuration changed silently (FreeBSD's console messages).
    #[must_use]
    pub fn notes(&self) -> &[Note] {
        &self.notes
    }

    /// Whether lookups take the O(1) shift/mask path (one row, power-of-two interleave and
    /// member count).
    #[must_use]
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// How mirror reads pick a side by default for this flavor: FreeBSD's dual seek zones,
    /// or the primary half for NetBSD 1997 (and for anything that is not a mirror).
    #[must_use]
    pub fn default_mirror_reads(&self) -> MirrorReads {
        match self.flavor {
            Flavor::FreeBsd => MirrorReads::DualSeekZone,
            _ => MirrorReads::Primary,
        }
    }

    /// Whether zones after the first pick devices md's pre-3.14 way.
    pub(crate) fn md_orig(&self) -> bool {
        self.flavor == Flavor::Md(MdLayout::Orig)
    }
}
