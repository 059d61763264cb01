//! The layout flags every command that builds a geometry shares (`map`, `serve`, `bench`),
//! declared once: whose rules, uniform, mirror, the reserved area and how mirror reads
//! choose a side. The interleave is each command's own (`map` requires it and reports a
//! negative one; `serve` and `bench` default to 128).

use clap::Args;
use tagstripe::VolumeBuilder;
use tagstripe::striping::{Error, Flavor, GeometryBuilder, MirrorReads};

/// The geometry's layout flags.
#[derive(Clone, Debug, Args)]
pub(crate) struct LayoutArgs {
    /// Whose rules to follow: netbsd, netbsd1997, freebsd, md-alt or md-orig.
    #[arg(long, default_value = "netbsd", value_parser = parse_flavor)]
    pub flavor: Flavor,
    /// Every component contributes only as much as the smallest (CCDF_UNIFORM).
    #[arg(long)]
    pub uniform: bool,
    /// Mirror the first half of the components onto the second (ccd's CCDF_MIRROR; with
    /// --flavor freebsd or netbsd1997).
    #[arg(long)]
    pub mirror: bool,
    /// FreeBSD: no reserved area at the start of each component.
    #[arg(long)]
    pub no_offset: bool,
    /// FreeBSD linux mode: interleave given in KiB (doubled), no reserved area.
    #[arg(long)]
    pub linux: bool,
    /// Sectors reserved at the start of each component (e.g. md's data_offset), instead of
    /// the flavor's.
    #[arg(long)]
    pub reserved: Option<u64>,
    /// How mirror reads choose a side: primary or dual-seek-zone (default: the flavor's).
    #[arg(long, value_parser = parse_mirror_reads)]
    pub mirror_reads: Option<MirrorReads>,
}

impl Default for LayoutArgs {
    /// NetBSD's rules, striped, nothing else: the flags' defaults.
    fn default() -> Self {
        Self {
            flavor: Flavor::NetBsd,
            uniform: false,
            mirror: false,
            no_offset: false,
            linux: false,
            reserved: None,
            mirror_reads: None,
        }
    }
}

impl LayoutArgs {
    /// Sets the flags on a geometry builder (mirror reads are the volume's, not the
    /// geometry's).
    pub(crate) fn geometry(&self, b: &mut GeometryBuilder) {
        b.flavor(self.flavor)
            .uniform(self.uniform)
            .mirror(self.mirror)
            .no_offset(self.no_offset)
            .linux(self.linux);
        if let Some(r) = self.reserved {
            b.reserved(r);
        }
    }

    /// Sets the flags on a volume builder.
    pub(crate) fn volume(&self, b: VolumeBuilder) -> VolumeBuilder {
        let mut b = b
            .flavor(self.flavor)
            .uniform(self.uniform)
            .mirror(self.mirror)
            .no_offset(self.no_offset)
            .linux(self.linux);
        if let Some(r) = self.reserved {
            b = b.reserved(r);
        }
        if let Some(m) = self.mirror_reads {
            b = b.mirror_reads(m);
        }
        b
    }
}

pub(crate) fn parse_flavor(s: &str) -> Result<Flavor, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

pub(crate) fn parse_mirror_reads(s: &str) -> Result<MirrorReads, String> {
    match s {
        "primary" => Ok(MirrorReads::Primary),
        "dual-seek-zone" => Ok(MirrorReads::DualSeekZone),
        _ => Err(format!("{s:?}: expected primary or dual-seek-zone")),
    }
}
