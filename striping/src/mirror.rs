//! Choosing which side of a mirror serves a read.

use crate::{Geometry, Piece};

/// How reads of a mirrored volume pick a side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MirrorReads {
    /// Always the primary half: NetBSD 1997 and FreeBSD's first mirroring. Simple, and no
    /// read speed-up from the mirror.
    Primary,
    /// FreeBSD ccd's "dual seek zone" heuristic, the default: each side keeps the position
    /// of its last read; a piece that starts within 1/16 of the volume of the current side's
    /// position stays there, otherwise reads switch sides. Tuned, in FreeBSD's words, "for a
    /// multi-tasking load rather than a sequential load".
    #[default]
    DualSeekZone,
}

/// Which half of a mirror an I/O goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The primary (first) half.
    Primary,
    /// The mirror (second) half.
    Mirror,
}

impl Side {
    /// `"primary"` or `"mirror"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Mirror => "mirror",
        }
    }
}

/// The state of a mirror's read choice, replayed piece by piece in issue order.
///
/// ```
/// use tagstripe_striping::{Flavor, Geometry, MirrorReads, ReadBalancer, Side};
/// let g = Geometry::builder([2048, 2048], 16).flavor(Flavor::FreeBsd).mirror(true).build()?;
/// let mut reads = ReadBalancer::new(&g, MirrorReads::DualSeekZone);
/// let near = g.map(0, 16)?.next().unwrap();
/// assert_eq!(reads.choose(&near), (Side::Primary, 0));
/// // Far from where the primary side last read: the other side takes it.
/// let far = g.map(1524, 12)?.next().unwrap();
/// assert_eq!(reads.choose(&far), (Side::Mirror, 1));
/// # Ok::<(), tagstripe_striping::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBalancer {
    policy: MirrorReads,
    pick: usize,
    blk: [u64; 2],
    reach: u64,
}

impl ReadBalancer {
    /// A balancer in ccd's initial state (side 0, both positions 0) for this geometry.
    #[must_use]
    pub fn new(geometry: &Geometry, policy: MirrorReads) -> Self {
        Self {
            policy,
            pick: 0,
            blk: [0, 0],
            reach: geometry.total_sectors() / 16,
        }
    }

    /// The policy in use.
    #[must_use]
    pub fn policy(&self) -> MirrorReads {
        self.policy
    }

    /// Picks the side and component that serve a read of `piece`, and records it. Pieces
    /// that are not mirrored always go to their component.
    pub fn choose(&mut self, piece: &Piece) -> (Side, usize) {
        let Some(partner) = piece.mirror else {
            return (Side::Primary, piece.component);
        };
        if self.policy == MirrorReads::Primary {
            return (Side::Primary, piece.component);
        }
        let bn = piece.lblk;
        let at = self.blk[self.pick];
        // ccd: `bn < blk - reach || bn > blk + reach`, in signed arithmetic.
        if bn.saturating_add(self.reach) < at || bn > at.saturating_add(self.reach) {
            self.pick = 1 - self.pick;
        }
        self.blk[self.pick] = piece.lblk_end();
        if self.pick == 0 {
            (Side::Primary, piece.component)
        } else {
            (Side::Mirror, partner)
        }
    }
}
