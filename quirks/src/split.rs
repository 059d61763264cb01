//! Splitting a request by a device's limits, in Linux's order (`bio_split_to_limits`), with
//! the mod-15 policies for sata_sil's MOD15WRITE drives.

use std::iter::FusedIterator;

use crate::{Applied, Error, Limits};

/// The operation being split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A read.
    Read,
    /// A write.
    Write,
    /// A discard (TRIM / UNMAP): follows `max_discard_sectors` and the granularity grid,
    /// ignores segments and physical blocks, as Linux does.
    Discard,
    /// Write zeroes: sized by `max_write_zeroes_sectors`.
    WriteZeroes,
}

impl Op {
    /// `"read"`, `"write"`, `"discard"` or `"write-zeroes"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Discard => "discard",
            Self::WriteZeroes => "write-zeroes",
        }
    }
}

/// How a drive with the MOD15WRITE erratum is split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mod15 {
    /// No mod-15 handling (the drive is not affected, or the user turned it off).
    #[default]
    Off,
    /// What Linux does (sata_sil `sil_dev_config`): every read and write capped at 15
    /// sectors. Safe, and slow: a 1 MiB request becomes 140 commands.
    Cap15,
    /// tagstripe's opt-in policy: writes keep pieces as large as the limits allow and only
    /// avoid piece sizes `n` with `n % 15 == 1` (n > 1), looking one piece ahead so the last
    /// piece is not such a size; reads are not touched.
    ///
    /// **This rule was never confirmed as a real fix.** Jeff Garzik (libata maintainer,
    /// August 2004) said avoiding "nblocks % 15 == 1" does not work around the erratum, only
    /// makes it harder to reproduce; Linux keeps the 15-sector cap. Use it to measure, or on
    /// drives you have tested yourself, not as a safety measure.
    Smart,
}

impl Mod15 {
    /// The mode for a device: `policy` if its quirks say it has the erratum, else `Off`.
    #[must_use]
    pub fn for_device(mod15write: bool, policy: Mod15) -> Self {
        if mod15write { policy } else { Self::Off }
    }

    /// `"off"`, `"cap15"` or `"smart"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Cap15 => "cap15",
            Self::Smart => "smart",
        }
    }
}

/// One physically contiguous buffer run of a scatter list, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Address of the run (only its alignment matters).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// One piece of a split request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    /// First sector.
    pub start: u64,
    /// Length in sectors.
    pub sectors: u64,
}

/// Splits requests by one device's limits. Cheap to build; splitting allocates nothing.
///
/// ```
/// use tagstripe_quirks::{Limits, Mod15, Op, Splitter};
/// let mut l = Limits::default();
/// l.physical_block_size = 4096;
/// l.max_hw_sectors = 2560;
/// let s = Splitter::new(&l, Mod15::Off)?;
/// // Linux's order: the first piece ends on a physical block.
/// let pieces: Vec<u64> = s.split(Op::Write, 3, 6000)?.map(|p| p.sectors).collect();
/// assert_eq!(pieces, [2557, 2560, 883]);
/// # Ok::<(), tagstripe_quirks::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Splitter {
    limits: Limits,
    mod15: Mod15,
    lbs: u64,
    pbs: u64,
    max_sectors: u64,
    cap15_sectors: u64,
    /// A read or write whose end lies at most this far past the physical block it starts
    /// in goes whole (0 where chunks or smart mod-15 make it a matter of the request).
    whole_rw: u64,
    max_write_zeroes: u64,
    discard_max: u64,
    discard_gran: u64,
    discard_offset: u64,
}

impl Splitter {
    /// A splitter for `limits` (validated here) and a mod-15 mode.
    ///
    /// # Errors
    /// Any [`Limits::validate`] error; [`Error::LimitTooSmall`] when `Cap15` cannot hold
    /// one logical block (blocks of 8 KiB or more); [`Error::Mod15Unavoidable`] for `Smart`
    /// on 8 KiB blocks, where a one-block piece is itself a bad count.
    pub fn new(limits: &Limits, mod15: Mod15) -> Result<Self, Error> {
        let l = limits.validate()?;
        let lbs = l.lbs_sectors();
        let pbs = l.pbs_sectors();
        // `validate` keeps both powers of two: requests are checked and cut with masks.
        debug_assert!(lbs.is_power_of_two() && pbs.is_power_of_two());
        let unlimited = |v: u32| if v == 0 { u64::MAX } else { u64::from(v) };
        let max_sectors = u64::from(l.max_sectors);
        let cap15_sectors = 15 - 15 % lbs;
        if mod15 == Mod15::Cap15 && cap15_sectors == 0 {
            return Err(Error::LimitTooSmall {
                field: "max_sectors (mod15 cap15)",
                value: 15,
                min: lbs,
            });
        }
        if mod15 == Mod15::Smart && lbs > 1 && lbs % 15 == 1 {
            return Err(Error::Mod15Unavoidable { sector: 0 });
        }
        // Without chunks or smart mod-15, a piece starting `s0` into its physical block may
        // run to the last physical block boundary within the per-piece cap (`cap_at`).
        let whole_rw = if l.chunk_sectors == 0 && mod15 != Mod15::Smart {
            let m = if mod15 == Mod15::Cap15 {
                max_sectors.min(cap15_sectors)
            } else {
                max_sectors
            };
            m & !(pbs - 1)
        } else {
            0
        };
        let discard_gran = (u64::from(l.discard_granularity) / 512).max(1);
        let discard_max = u64::from(l.max_discard_sectors).min(u64::from(u32::MAX) / lbs * lbs);
        let discard_max = discard_max - discard_max % discard_gran;
        Ok(Self {
            max_write_zeroes: unlimited(l.max_write_zeroes_sectors),
            discard_offset: u64::from(l.discard_alignment) / 512 % discard_gran,
            limits: l,
            mod15,
            lbs,
            pbs,
            max_sectors,
            cap15_sectors,
            whole_rw,
            discard_max,
            discard_gran,
        })
    }

    /// A splitter for a device whose quirks were applied: the mod-15 `policy` is used only
    /// if the device has the erratum.
    ///
    /// # Errors
    /// As [`Splitter::new`].
    pub fn for_device(applied: &Applied, policy: Mod15) -> Result<Self, Error> {
        Self::new(
            &applied.limits,
            Mod15::for_device(applied.mod15write, policy),
        )
    }

    /// The validated limits in use.
    #[must_use]
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The mod-15 mode in use.
    #[must_use]
    pub fn mod15(&self) -> Mod15 {
        self.mod15
    }

    /// Splits `sectors` sectors from `start`, with no scatter list (segment limits do not
    /// apply). Pieces come in ascending order, each as large as the rules allow.
    ///
    /// # Errors
    /// [`Error::Misaligned`] if the request is not whole logical blocks,
    /// [`Error::RequestOverflow`], [`Error::Unsupported`] for discard or write-zeroes on a
    /// device without them. Nothing is split in those cases.
    pub fn split(&self, op: Op, start: u64, sectors: u64) -> Result<Pieces<'_>, Error> {
        self.check(op, start, sectors)?;
        Ok(Pieces {
            splitter: self,
            op,
            next: start,
            end: start + sectors,
        })
    }

    /// Whether the request goes as one piece: [`split`](Self::split)'s first piece is all
    /// of it. What every layer asks of every request before cutting it; for a read or write
    /// well within the limits (the common case) a mask and a compare.
    ///
    /// ```
    /// use tagstripe_quirks::{Limits, Mod15, Op, Splitter};
    /// let mut l = Limits::default();
    /// l.max_hw_sectors = 256;
    /// let s = Splitter::new(&l, Mod15::Off)?;
    /// assert!(s.whole(Op::Write, 8, 8)?);
    /// assert!(!s.whole(Op::Write, 0, 512)?);
    /// assert!(s.whole(Op::Write, 1, 7).is_ok(), "512-byte blocks: any sector");
    /// # Ok::<(), tagstripe_quirks::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Splitter::split`].
    pub fn whole(&self, op: Op, start: u64, sectors: u64) -> Result<bool, Error> {
        self.check(op, start, sectors)?;
        if matches!(op, Op::Read | Op::Write)
            && sectors > 0
            && (start & (self.pbs - 1)) + sectors <= self.whole_rw
        {
            // The cap at `start` reaches at least the boundary `whole_rw` names.
            return Ok(true);
        }
        Ok(self
            .split(op, start, sectors)?
            .next()
            .is_some_and(|p| p.sectors == sectors))
    }

    /// Splits a request whose data is the scatter list `segments`, honouring
    /// `max_segments`, `max_segment_size`, `seg_boundary_mask` and `virt_boundary_mask` as
    /// Linux's segment walk does, then rounding each piece down to whole logical blocks.
    ///
    /// ```
    /// use tagstripe_quirks::{Limits, Mod15, Op, Segment, Splitter};
    /// let mut l = Limits::default();
    /// l.max_segments = 2;
    /// let s = Splitter::new(&l, Mod15::Off)?;
    /// let bufs: Vec<Segment> = (0..10).map(|i| Segment { addr: i * 65536, len: 4096 }).collect();
    /// let pieces: Vec<u64> = s.split_sg(Op::Read, 0, &bufs)?.map(|p| p.map(|p| p.sectors)).collect::<Result<_, _>>()?;
    /// assert_eq!(pieces, [16; 5]);
    /// # Ok::<(), tagstripe_quirks::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Splitter::split`], and [`Error::SegmentsMismatch`] if the list's bytes are not
    /// a whole number of sectors. While iterating, [`Error::NoProgress`] if the segment
    /// limits leave less than one logical block for a piece.
    pub fn split_sg<'a>(
        &'a self,
        op: Op,
        start: u64,
        segments: &'a [Segment],
    ) -> Result<SgPieces<'a>, Error> {
        let bytes: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
        if bytes % 512 != 0 {
            return Err(Error::SegmentsMismatch {
                bytes,
                needed: bytes.next_multiple_of(512),
            });
        }
        let sectors = bytes / 512;
        self.check(op, start, sectors)?;
        Ok(SgPieces {
            splitter: self,
            op,
            next: start,
            end: start + sectors,
            cursor: Cursor {
                segments,
                index: 0,
                offset: 0,
            },
            failed: false,
        })
    }

    fn check(&self, op: Op, start: u64, sectors: u64) -> Result<(), Error> {
        if start.checked_add(sectors).is_none() {
            return Err(Error::RequestOverflow { start, sectors });
        }
        // (Block sizes are powers of two, validated: masks, not divisions, on every
        // request.)
        if (start | sectors) & (self.lbs - 1) != 0 {
            return Err(Error::Misaligned {
                start,
                sectors,
                lbs: self.lbs,
            });
        }
        match op {
            Op::Discard if self.discard_max == 0 => Err(Error::Unsupported { op: "discard" }),
            Op::WriteZeroes if self.limits.max_write_zeroes_sectors == 0 => {
                Err(Error::Unsupported { op: "write-zeroes" })
            }
            _ => Ok(()),
        }
    }

    /// Step A of Linux's split (`get_max_io_size`): the most sectors a piece starting at `s` may
    /// have: the per-piece cap, cut at the chunk boundary, then shortened to end on a
    /// physical block.
    #[inline]
    fn cap_at(&self, op: Op, s: u64) -> u64 {
        let mut m = match op {
            Op::WriteZeroes => self.max_write_zeroes,
            _ => self.max_sectors,
        };
        if self.mod15 == Mod15::Cap15 && matches!(op, Op::Read | Op::Write) {
            m = m.min(self.cap15_sectors);
        }
        let chunk = u64::from(self.limits.chunk_sectors);
        if chunk != 0 {
            m = m.min(chunk - s % chunk);
        }
        let s0 = s & (self.pbs - 1);
        let end = s0.saturating_add(m) & !(self.pbs - 1);
        if end > s0 {
            end - s0
        } else {
            m & !(self.lbs - 1)
        }
    }

    /// The discard piece at `s` with `r` left (`bio_split_discard`).
    #[inline]
    fn discard_piece(&self, s: u64, r: u64) -> u64 {
        if r <= self.discard_max {
            return r;
        }
        let mut p = self.discard_max;
        let t = (s + p - self.discard_offset) % self.discard_gran;
        if p > t {
            p -= t;
        }
        p
    }

    /// Linux's piece at `s` with `r` left, walking `cursor` if there is a scatter list.
    fn linux_piece(
        &self,
        op: Op,
        s: u64,
        r: u64,
        cursor: Option<&Cursor<'_>>,
    ) -> Result<u64, Error> {
        if op == Op::Discard {
            return Ok(self.discard_piece(s, r));
        }
        let cap = self.cap_at(op, s).min(r);
        let Some(cursor) = cursor else {
            return Ok(cap);
        };
        let bytes = self.walk(cursor, cap * 512);
        if bytes == cap * 512 {
            return Ok(cap);
        }
        let sectors = bytes / 512;
        let piece = sectors & !(self.lbs - 1);
        if piece == 0 {
            return Err(Error::NoProgress { sector: s });
        }
        Ok(piece)
    }

    /// Step B: how many of `budget` bytes from `cursor` fit the segment limits.
    fn walk(&self, cursor: &Cursor<'_>, budget: u64) -> u64 {
        let l = &self.limits;
        let max_segs = u64::from(l.max_segments);
        let max_seg = u64::from(l.max_segment_size);
        let boundary = l.seg_boundary_mask;
        let virt = l.virt_boundary_mask;
        let (mut bytes, mut nsegs) = (0u64, 0u64);
        let mut prev_end: Option<u64> = None;
        let (mut index, mut offset) = (cursor.index, u64::from(cursor.offset));
        while bytes < budget {
            let Some(seg) = cursor.segments.get(index) else {
                break;
            };
            let addr = seg.addr.wrapping_add(offset);
            let len = u64::from(seg.len) - offset;
            if virt != 0 && prev_end.is_some_and(|end| end & virt != 0 || addr & virt != 0) {
                break;
            }
            let want = len.min(budget - bytes);
            let mut taken = 0u64;
            while taken < want && (max_segs == 0 || nsegs < max_segs) {
                let a = addr.wrapping_add(taken);
                let mut n = want - taken;
                if max_seg != 0 {
                    n = n.min(max_seg);
                }
                if boundary != 0 {
                    n = n.min((boundary - (a & boundary)).saturating_add(1));
                }
                nsegs += 1;
                taken += n;
                if virt != 0 && a.wrapping_add(n) & virt != 0 && taken < want {
                    break;
                }
            }
            bytes += taken;
            if taken < len {
                break;
            }
            prev_end = Some(addr.wrapping_add(len));
            index += 1;
            offset = 0;
        }
        bytes
    }

    /// The next piece at `s` with `r` left, with the mod-15 policy applied.
    fn piece(&self, op: Op, s: u64, r: u64, cursor: Option<&Cursor<'_>>) -> Result<u64, Error> {
        let p = self.linux_piece(op, s, r, cursor)?;
        if self.mod15 != Mod15::Smart || op != Op::Write {
            return Ok(p);
        }
        let good = |n: u64| n == 1 || n % 15 != 1;
        // Whether the `rest` sectors after a piece of `c` go out as one single piece.
        let one_piece = |c: u64| -> Result<bool, Error> {
            let rest = r - c;
            let after = cursor.map(|k| k.advanced(c * 512));
            Ok(self.linux_piece(op, s + c, rest, after.as_ref())? == rest)
        };
        // Smaller candidates, largest first: keep the physical-block end alignment Linux
        // chose while that works, then any whole logical block.
        let pbs_first = self.pbs > self.lbs && (s + p) % self.pbs == 0;
        // An empty range when the alignment is not kept: a filter on each step instead would
        // walk all `p / pbs` of them for nothing on every bad piece (a fuzzed request of
        // 2^32 sectors in 33,871-sector pieces took 14 s that way).
        let pbs_count = if pbs_first { p / self.pbs } else { 1 };
        let candidates = || {
            let pbs_steps = (1..pbs_count).map(move |k| p - k * self.pbs);
            let lbs_steps = (1..p / self.lbs).map(move |k| p - k * self.lbs);
            pbs_steps.chain(lbs_steps)
        };
        if p == r {
            // The last piece: if it is bad, split it into two good pieces (one piece more,
            // which no policy can avoid).
            if good(p) {
                return Ok(p);
            }
            for c in candidates() {
                if good(c) && good(r - c) {
                    return Ok(c);
                }
            }
        } else if !one_piece(p)? {
            // More than one piece follows: only this piece's own size matters now.
            if good(p) {
                return Ok(p);
            }
            if let Some(c) = candidates().find(|&c| good(c)) {
                return Ok(c);
            }
        } else {
            // One piece follows: look ahead so both are good, without adding a piece.
            if good(p) && good(r - p) {
                return Ok(p);
            }
            for c in candidates() {
                if good(c) && good(r - c) && one_piece(c)? {
                    return Ok(c);
                }
            }
            // Not possible in two pieces: keep this one if good and split the last later.
            if good(p) {
                return Ok(p);
            }
            if let Some(c) = candidates().find(|&c| good(c)) {
                return Ok(c);
            }
        }
        Err(Error::Mod15Unavoidable { sector: s })
    }
}

/// The pieces of a request without a scatter list; see [`Splitter::split`].
#[derive(Clone, Debug)]
pub struct Pieces<'a> {
    splitter: &'a Splitter,
    op: Op,
    next: u64,
    end: u64,
}

impl Iterator for Pieces<'_> {
    type Item = Piece;

    #[inline]
    fn next(&mut self) -> Option<Piece> {
        if self.next >= self.end {
            return None;
        }
        let r = self.end - self.next;
        // Without a scatter list nothing can fail: the limits were validated (every cap
        // holds at least one logical block), and smart mode, refused where a one-block piece
        // is bad, always finds a good size among two consecutive block counts.
        let sectors = self
            .splitter
            .piece(self.op, self.next, r, None)
            .unwrap_or(r);
        let piece = Piece {
            start: self.next,
            sectors,
        };
        self.next += sectors;
        Some(piece)
    }
}

impl FusedIterator for Pieces<'_> {}

/// Position in a scatter list.
#[derive(Clone, Copy, Debug)]
struct Cursor<'a> {
    segments: &'a [Segment],
    index: usize,
    offset: u32,
}

impl Cursor<'_> {
    fn advanced(&self, mut bytes: u64) -> Self {
        let mut c = *self;
        while bytes > 0 {
            let Some(seg) = c.segments.get(c.index) else {
                break;
            };
            let left = u64::from(seg.len - c.offset);
            if bytes < left {
                // bytes < left <= u32::MAX
                c.offset += bytes as u32;
                break;
            }
            bytes -= left;
            c.index += 1;
            c.offset = 0;
        }
        c
    }
}

/// The pieces of a request with a scatter list; see [`Splitter::split_sg`]. Ends after the
/// first error.
#[derive(Clone, Debug)]
pub struct SgPieces<'a> {
    splitter: &'a Splitter,
    op: Op,
    next: u64,
    end: u64,
    cursor: Cursor<'a>,
    failed: bool,
}

impl Iterator for SgPieces<'_> {
    type Item = Result<Piece, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.next >= self.end {
            return None;
        }
        let r = self.end - self.next;
        match self
            .splitter
            .piece(self.op, self.next, r, Some(&self.cursor))
        {
            Ok(sectors) => {
                let piece = Piece {
                    start: self.next,
                    sectors,
                };
                self.next += sectors;
                self.cursor = self.cursor.advanced(sectors * 512);
                Some(Ok(piece))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

impl FusedIterator for SgPieces<'_> {}
