//! Mapping volume sectors to component sectors: ccd's `ccdbuffer` and `ccdstart` loop.

use std::iter::{FusedIterator, Peekable};

use crate::geometry::Fast;
use crate::{Errno, Error, Flavor, Geometry, Side};

/// One component I/O of a request: a run of sectors inside one interleave unit (or, when
/// concatenated, inside one component).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    /// First volume sector.
    pub lblk: u64,
    /// Component index, in the order the components were given.
    pub component: usize,
    /// First sector on the component, including the reserved area.
    pub cblk: u64,
    /// Length in sectors.
    pub count: u64,
    /// For a mirror, the component that holds the same sectors at the same `cblk`.
    pub mirror: Option<usize>,
}

impl Piece {
    /// One past the last volume sector of the piece.
    #[must_use]
    pub fn lblk_end(&self) -> u64 {
        self.lblk + self.count
    }

    /// Where a write of this piece goes: its component, then the mirror partner if any
    /// (ccd issues the primary first).
    ///
    /// ```
    /// use tagstripe_striping::{Flavor, Geometry, Side};
    /// let g = Geometry::builder([64; 4], 8).flavor(Flavor::FreeBsd).no_offset(true).mirror(true).build()?;
    /// let p = g.map(8, 8)?.next().unwrap();
    /// assert_eq!(p.write_targets().collect::<Vec<_>>(), [(Side::Primary, 1), (Side::Mirror, 3)]);
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    pub fn write_targets(&self) -> impl Iterator<Item = (Side, usize)> + use<> {
        std::iter::once((Side::Primary, self.component))
            .chain(self.mirror.map(|m| (Side::Mirror, m)))
    }
}

/// How ccd itself would treat a request, for comparison with ccd (see
/// [`Geometry::map_ccd`]). The library's own [`Geometry::map`] never truncates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// The whole request maps.
    Ok,
    /// The request crosses the end; ccd truncates it there.
    Truncated,
    /// The request starts exactly at the end: end of file, no data, no error.
    Eof,
    /// A zero-length request: completes at once.
    Empty,
    /// The request starts past the end: EINVAL on NetBSD, EIO on FreeBSD.
    Error(Errno),
}

impl Status {
    /// The name used in JSON output: `ok`, `truncated`, `eof`, `empty` or `error`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Truncated => "truncated",
            Self::Eof => "eof",
            Self::Empty => "empty",
            Self::Error(_) => "error",
        }
    }
}

impl Geometry {
    /// Maps `count` sectors from volume sector `start` to component pieces, in ascending
    /// volume order, one per interleave unit touched, exactly as ccd issues them (ccd never
    /// merges; see [`Pieces::merged`] for that). The iterator allocates nothing.
    ///
    /// A zero-length request maps to no pieces.
    ///
    /// ```
    /// use tagstripe_striping::Geometry;
    /// let g = Geometry::builder([100, 400], 16).build()?;
    /// // ccd issues five pieces on component 1, contiguous there.
    /// let pieces: Vec<_> = g.map(190, 60)?.map(|p| (p.component, p.cblk, p.count)).collect();
    /// assert_eq!(pieces, [(1, 94, 2), (1, 96, 16), (1, 112, 16), (1, 128, 16), (1, 144, 10)]);
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::RequestOverflow`] if `start + count` overflows, [`Error::PastEnd`] if the
    /// request reaches past the end of the volume. Nothing is mapped in either case.
    #[inline]
    pub fn map(&self, start: u64, count: u64) -> Result<Pieces<'_>, Error> {
        let end = request_end(start, count, self.total_sectors())?;
        Ok(self.pieces(start, end))
    }

    /// Maps a request the way ccd does at the end of the volume: a request that crosses the
    /// end is truncated, one at the end is EOF, one past it an error (EINVAL, or EIO for
    /// FreeBSD). Returns the status and the pieces of what ccd would transfer.
    ///
    /// ```
    /// use tagstripe_striping::{Geometry, Status};
    /// let g = Geometry::builder([1000, 2000, 1500], 0).build()?;
    /// let (status, pieces) = g.map_ccd(4495, 40);
    /// assert_eq!(status, Status::Truncated);
    /// assert_eq!(pieces.map(|p| p.count).sum::<u64>(), 5);
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    #[must_use]
    pub fn map_ccd(&self, start: u64, count: u64) -> (Status, Pieces<'_>) {
        let total = self.total_sectors();
        let status = if count == 0 {
            Status::Empty
        } else if start == total {
            Status::Eof
        } else if start > total {
            Status::Error(match self.flavor() {
                Flavor::FreeBsd => Errno::Eio,
                _ => Errno::Einval,
            })
        } else if start.checked_add(count).is_none_or(|end| end > total) {
            Status::Truncated
        } else {
            Status::Ok
        };
        let pieces = match status {
            Status::Ok => self.pieces(start, start + count),
            Status::Truncated => self.pieces(start, total),
            _ => self.pieces(0, 0),
        };
        (status, pieces)
    }

    /// The single sector `lblk`: where it lives, or `None` past the end.
    ///
    /// ```
    /// use tagstripe_striping::Geometry;
    /// let g = Geometry::builder([64, 64], 8).build()?;
    /// let p = g.locate(9).unwrap();
    /// assert_eq!((p.component, p.cblk), (1, 1));
    /// assert!(g.locate(128).is_none());
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    #[must_use]
    pub fn locate(&self, lblk: u64) -> Option<Piece> {
        self.map(lblk, 1).ok()?.next()
    }

    /// The inverse of [`locate`](Self::locate): the volume sector that component `component`'s
    /// sector `cblk` holds (counted from the component's start, reserved area included), or
    /// `None` where that sector holds no volume data (the reserved area, the tail cut off by
    /// rounding, past the end). A mirror's second-half sector maps to the volume sector it
    /// copies. What a scrub or repair tool needs to name the file-system block behind a bad
    /// component sector.
    ///
    /// ```
    /// use tagstripe_striping::{Flavor, Geometry};
    /// let g = Geometry::builder([1000, 2000, 1500], 16).flavor(Flavor::NetBsd).build()?;
    /// for lblk in [0, 17, 3000, g.total_sectors() - 1] {
    ///     let p = g.locate(lblk).unwrap();
    ///     assert_eq!(g.volume_sector(p.component, p.cblk), Some(lblk));
    /// }
    /// assert_eq!(g.volume_sector(0, 995), None); // cut off by rounding to the interleave
    /// assert_eq!(g.volume_sector(7, 0), None); // no such component
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    #[must_use]
    pub fn volume_sector(&self, component: usize, cblk: u64) -> Option<u64> {
        let x = cblk.checked_sub(self.reserved_sectors())?;
        let il = self.interleave();
        for r in self.rows() {
            let Some(pos) = r.members().iter().position(|&m| m == component) else {
                continue;
            };
            let n = r.data_members() as u64;
            // A mirror's second half holds copies of the first half's units.
            let k = (pos % r.data_members()) as u64;
            let held = r.lblk_end() - r.lblk_start();
            if il == 0 {
                let start = r.cblk_start();
                if (start..start + held).contains(&x) {
                    return Some(r.lblk_start() + (x - start));
                }
                continue;
            }
            let (cunit, cboff) = (x / il, x % il);
            let units = held / il / n;
            if !(r.cunit_start..r.cunit_start + units).contains(&cunit) {
                continue;
            }
            let first = r.unit_start + (cunit - r.cunit_start) * n;
            let j = if self.md_orig() {
                (k + n - first % n) % n
            } else {
                k
            };
            let lblk = (first + j) * il + cboff;
            return (lblk < r.lblk_end()).then_some(lblk);
        }
        None
    }

    /// Pieces of `[start, end)`, which the caller has bounds-checked.
    #[inline]
    fn pieces(&self, start: u64, end: u64) -> Pieces<'_> {
        let row = if start >= end || self.rows().len() == 1 {
            0
        } else {
            self.rows()
                .partition_point(|r| r.lblk_start() <= start)
                .saturating_sub(1)
        };
        Pieces {
            geometry: self,
            next: start,
            end,
            row,
        }
    }

    /// The O(1) path: one row holding every component in order, with a power-of-two
    /// interleave and member count, so lookup is shifts and masks.
    #[inline(always)]
    fn fast_piece(&self, fast: Fast, lblk: u64, remaining: u64) -> Piece {
        let il = 1u64 << fast.il_shift;
        let unit = lblk >> fast.il_shift;
        let cboff = lblk & (il - 1);
        let k = (unit & ((1u64 << fast.n_shift) - 1)) as usize;
        let cunit = unit >> fast.n_shift;
        Piece {
            lblk,
            component: k,
            cblk: (cunit << fast.il_shift) + cboff + self.reserved_sectors(),
            count: (il - cboff).min(remaining),
            mirror: self.is_mirror().then_some(k + (1usize << fast.n_shift)),
        }
    }

    /// The piece starting at `lblk` in row `row`, at most `remaining` long.
    #[inline]
    fn piece(&self, row: usize, lblk: u64, remaining: u64) -> Piece {
        let il = self.interleave();
        let r = &self.rows()[row];
        if il == 0 {
            return Piece {
                lblk,
                component: r.members()[0],
                cblk: lblk - r.lblk_start() + self.reserved_sectors(),
                count: (r.lblk_end() - lblk).min(remaining),
                mirror: None,
            };
        }
        let unit = lblk / il;
        let cboff = lblk % il;
        let off = unit - r.unit_start;
        let n = r.data_members() as u64;
        let k = if self.md_orig() { unit % n } else { off % n } as usize;
        let cunit = r.cunit_start + off / n;
        Piece {
            lblk,
            component: r.members()[k],
            cblk: cunit * il + cboff + self.reserved_sectors(),
            count: (il - cboff).min(remaining),
            mirror: self.is_mirror().then(|| r.members()[k + r.data_members()]),
        }
    }
}

/// The pieces of one request, from [`Geometry::map`] or [`Geometry::map_ccd`].
#[derive(Clone, Debug)]
pub struct Pieces<'g> {
    geometry: &'g Geometry,
    next: u64,
    end: u64,
    row: usize,
}

impl Pieces<'_> {
    /// Merges consecutive pieces that are contiguous on the same component (and mirror), so
    /// a backend gets one I/O where ccd would issue several. Not what ccd does: use it where
    /// fewer, larger component requests matter more than issuing exactly ccd's pieces.
    ///
    /// ```
    /// use tagstripe_striping::Geometry;
    /// let g = Geometry::builder([100, 400], 16).build()?;
    /// let merged: Vec<_> = g.map(190, 60)?.merged().map(|p| (p.component, p.cblk, p.count)).collect();
    /// assert_eq!(merged, [(1, 94, 60)]);
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    #[must_use]
    pub fn merged(self) -> Merged<Self> {
        Merged {
            inner: self.peekable(),
        }
    }

    /// Sectors not yet returned.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.end - self.next
    }
}

impl Iterator for Pieces<'_> {
    type Item = Piece;

    #[inline]
    fn next(&mut self) -> Option<Piece> {
        if self.next >= self.end {
            return None;
        }
        let g = self.geometry;
        if let Some(fast) = g.fast {
            let piece = g.fast_piece(fast, self.next, self.end - self.next);
            self.next += piece.count;
            return Some(piece);
        }
        let rows = g.rows();
        while self.row + 1 < rows.len() && rows[self.row].lblk_end() <= self.next {
            self.row += 1;
        }
        let piece = self
            .geometry
            .piece(self.row, self.next, self.end - self.next);
        self.next += piece.count;
        Some(piece)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.end - self.next;
        if left == 0 {
            return (0, Some(0));
        }
        match left.checked_div(self.geometry.interleave()) {
            // Concatenated: at most one piece per component.
            None => (1, Some(self.geometry.components())),
            Some(units) => (1, usize::try_from(units.saturating_add(2)).ok()),
        }
    }
}

impl FusedIterator for Pieces<'_> {}

/// An iterator adapter that merges pieces contiguous on one component; see
/// [`Pieces::merged`].
#[derive(Clone, Debug)]
pub struct Merged<I: Iterator<Item = Piece>> {
    inner: Peekable<I>,
}

impl<I: Iterator<Item = Piece>> Iterator for Merged<I> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let mut cur = self.inner.next()?;
        while let Some(next) = self.inner.peek() {
            let contiguous = next.component == cur.component
                && next.mirror == cur.mirror
                && next.lblk == cur.lblk_end()
                && Some(next.cblk) == cur.cblk.checked_add(cur.count);
            if !contiguous {
                break;
            }
            cur.count += next.count;
            self.inner.next();
        }
        Some(cur)
    }
}

/// The end of request `[start, start + count)` on a volume of `total` sectors: the library's
/// bounds policy (nothing is mapped for a request not wholly inside).
///
/// # Errors
/// [`Error::RequestOverflow`], [`Error::PastEnd`].
#[inline]
pub(crate) fn request_end(start: u64, count: u64, total: u64) -> Result<u64, Error> {
    let end = start
        .checked_add(count)
        .ok_or(Error::RequestOverflow { start, count })?;
    if end > total {
        return Err(Error::PastEnd {
            start,
            count,
            total,
        });
    }
    Ok(end)
}
