//! A readable view of a geometry, in the spirit of `ccdconfig -g` plus the interleave table.

use std::fmt;

use crate::Geometry;

impl fmt::Display for Geometry {
    /// Renders the configuration, each component's sizes and the interleave table.
    ///
    /// ```
    /// use tagstripe_striping::Geometry;
    /// let g = Geometry::builder([5, 3, 7], 1).build()?;
    /// let text = g.to_string();
    /// assert!(text.starts_with("netbsd, interleave 1, 3 components, 15 sectors"));
    /// # Ok::<(), tagstripe_striping::Error>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, interleave {}, {} components, {} sectors",
            self.flavor(),
            self.interleave(),
            self.components(),
            self.total_sectors()
        )?;
        for (flag, on) in [("uniform", self.is_uniform()), ("mirror", self.is_mirror())] {
            if on {
                write!(f, ", {flag}")?;
            }
        }
        writeln!(f)?;
        for note in self.notes() {
            writeln!(f, "note: {note}")?;
        }
        writeln!(
            f,
            "{:>6} {:>14} {:>10} {:>14}",
            "comp", "raw", "reserved", "effective"
        )?;
        for (i, (raw, eff)) in self
            .raw_sizes()
            .iter()
            .zip(self.component_sizes())
            .enumerate()
        {
            writeln!(
                f,
                "{i:>6} {raw:>14} {:>10} {eff:>14}",
                self.reserved_sectors()
            )?;
        }
        writeln!(
            f,
            "{:>6} {:>6} {:>14} {:>14} {:>14}  members",
            "row", "ndisk", "lblk_start", "lblk_span", "cblk_start"
        )?;
        for (i, row) in self.rows().iter().enumerate() {
            write!(
                f,
                "{i:>6} {:>6} {:>14} {:>14} {:>14} ",
                row.ndisk(),
                row.lblk_start(),
                row.lblk_span(),
                row.cblk_start()
            )?;
            for m in row.members() {
                write!(f, " {m}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
