//! `tagstripe map --level raid5|raid6|raid10`: md's parity and raid10 layouts, and where
//! requests land on the members (the JSON contract scripts read is in the README).

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use tagstripe_striping::Error;
use tagstripe_striping::md::{MdGeometry, Parity, ParityLayout, Raid10, Raid10Layout};

use crate::EXIT_USAGE;

/// An md level `map` lays out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Level {
    /// Striping with one parity chunk (P) per stripe.
    Raid5,
    /// Striping with two (P, and Q over GF(2^8)).
    Raid6,
    /// Striped copies: near, far or offset.
    Raid10,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Self::Raid5 => "raid5",
            Self::Raid6 => "raid6",
            Self::Raid10 => "raid10",
        }
    }
}

/// md's geometry flags of `tagstripe map` (with `--level`, in place of `--sizes` and
/// `--interleave`).
#[derive(Debug, Args)]
pub(crate) struct MdArgs {
    /// An md array instead of a ccd geometry: raid5, raid6 or raid10.
    #[arg(long, value_enum, conflicts_with_all = ["sizes", "interleave"], requires_all = ["disks", "chunk", "size"])]
    pub level: Option<Level>,
    /// md: members in the array.
    #[arg(long, requires = "level")]
    pub disks: Option<usize>,
    /// md: chunk in sectors (a power of two, at least 8).
    #[arg(long, requires = "level")]
    pub chunk: Option<u64>,
    /// md: each member's usable size in sectors, after md's data offset (rounded down as md
    /// does).
    #[arg(long, requires = "level")]
    pub size: Option<u64>,
    /// md layout as mdadm names it: left-symmetric (default), left-asymmetric,
    /// right-symmetric, right-asymmetric, parity-first, parity-last and raid6's -6 forms;
    /// raid10: nK (default n2), fK, oK.
    #[arg(long = "layout", requires = "level")]
    pub layout: Option<String>,
}

/// The geometry of an md array of `level` (`layout` as mdadm names it, or the level's
/// default) over `disks` members of `size` usable sectors with `chunk`-sector chunks.
fn geometry(
    level: Level,
    layout: Option<&str>,
    disks: usize,
    chunk: u64,
    size: u64,
) -> Result<MdGeometry, Error> {
    match level {
        Level::Raid5 | Level::Raid6 => {
            let layout: ParityLayout = layout.unwrap_or("left-symmetric").parse()?;
            let n = if level == Level::Raid5 { 5 } else { 6 };
            Parity::new(n, layout, disks, chunk, size).map(MdGeometry::Parity)
        }
        Level::Raid10 => {
            let layout: Raid10Layout = layout.unwrap_or("n2").parse()?;
            Raid10::new(layout, disks, chunk, size).map(MdGeometry::Raid10)
        }
    }
}

fn build(level: Level, a: &MdArgs) -> Result<MdGeometry, Error> {
    // clap requires all three with --level.
    geometry(
        level,
        a.layout.as_deref(),
        a.disks.unwrap_or(0),
        a.chunk.unwrap_or(0),
        a.size.unwrap_or(0),
    )
}

/// Maps `requests` (`(write, start, count)`) on the array `a` describes and prints them.
pub(crate) fn run(level: Level, a: &MdArgs, requests: &[(bool, u64, u64)], json: bool) -> ExitCode {
    let md = match build(level, a) {
        Ok(m) => m,
        Err(e) => {
            if json {
                outln!(
                    "{}",
                    json!({"error": {"kind": e.kind(), "errno": e.errno().as_str(), "message": e.to_string()}})
                );
            } else {
                eprintln!("tagstripe map: md would refuse this array: {e}");
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let (layout, disks, chunk, total) = match &md {
        MdGeometry::Parity(p) => (
            p.layout().name().to_owned(),
            p.disks(),
            p.chunk(),
            p.total_sectors(),
        ),
        MdGeometry::Raid10(r) => (
            r.layout().to_string(),
            r.disks(),
            r.chunk(),
            r.total_sectors(),
        ),
    };
    let mapped: Vec<Value> = requests
        .iter()
        .map(|&(write, start, count)| {
            let pieces = match &md {
                MdGeometry::Parity(p) => p.map(start, count).map(|v| {
                    v.iter()
                        .map(|x| {
                            let mut o = json!({"lblk": x.lblk, "count": x.count, "comp": x.comp, "cblk": x.cblk, "p_comp": x.p_comp});
                            if let Some(q) = x.q_comp {
                                o["q_comp"] = json!(q);
                            }
                            o
                        })
                        .collect::<Vec<_>>()
                }),
                MdGeometry::Raid10(r) => r.map(start, count).map(|v| {
                    v.iter()
                        .map(|x| {
                            let copies: Vec<Value> = x
                                .copies
                                .iter()
                                .map(|&(comp, cblk)| json!({"comp": comp, "cblk": cblk}))
                                .collect();
                            json!({"lblk": x.lblk, "count": x.count, "copies": copies})
                        })
                        .collect()
                }),
            };
            let (status, pieces) = match pieces {
                Ok(p) => ("ok", p),
                Err(_) => ("error", Vec::new()),
            };
            json!({
                "op": if write { "w" } else { "r" },
                "start": start,
                "count": count,
                "status": status,
                "pieces": pieces,
            })
        })
        .collect();
    if json {
        outln!(
            "{}",
            json!({
                "level": level.name(),
                "layout": layout,
                "disks": disks,
                "chunk": chunk,
                "total_sectors": total,
                "requests": mapped,
            })
        );
        return ExitCode::SUCCESS;
    }
    outln!(
        "md {} {layout}: {disks} members, chunk {chunk} sectors, {total} sectors",
        level.name()
    );
    if let MdGeometry::Parity(p) = &md {
        outln!(
            "  stripe 0: P on member {}{}",
            p.stripe(0).p,
            p.stripe(0)
                .q
                .map_or(String::new(), |q| format!(", Q on member {q}"))
        );
    }
    for r in &mapped {
        outln!(
            "\nrequest {}:{}:{}  {}",
            r["op"].as_str().unwrap_or(""),
            r["start"],
            r["count"],
            r["status"].as_str().unwrap_or("")
        );
        for p in r["pieces"].as_array().into_iter().flatten() {
            match &md {
                MdGeometry::Parity(_) => outln!(
                    "  lblk {:>12} count {:>6}  member {} at {:>12}  P {}{}",
                    p["lblk"],
                    p["count"],
                    p["comp"],
                    p["cblk"],
                    p["p_comp"],
                    p.get("q_comp")
                        .map_or(String::new(), |q| format!("  Q {q}"))
                ),
                MdGeometry::Raid10(_) => {
                    let copies: Vec<String> = p["copies"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|c| format!("{}@{}", c["comp"], c["cblk"]))
                        .collect();
                    outln!(
                        "  lblk {:>12} count {:>6}  copies {}",
                        p["lblk"],
                        p["count"],
                        copies.join(" ")
                    );
                }
            }
        }
    }
    ExitCode::SUCCESS
}

/// An md array of `level` over `comps` (member sector 0 at `offset` on each), named `name`,
/// behind tagged queues with the fair policy `fair`: what `serve --level` and `bench
/// --level` serve.
pub(crate) fn build_raid(
    name: &str,
    level: Level,
    layout: Option<&str>,
    chunk: u64,
    offset: u64,
    comps: Vec<std::sync::Arc<dyn tagstripe::DynBlockDevice>>,
    fair: tagstripe::scheduler::FairConfig,
) -> Result<tagstripe::Raid, String> {
    use tagstripe::BlockDevice;
    let size = comps
        .iter()
        .map(|c| c.info().sectors.saturating_sub(offset))
        .min()
        .unwrap_or(0);
    let disks = comps.len();
    let geo = geometry(level, layout, disks, chunk, size).map_err(|e| e.to_string())?;
    let raid = tagstripe::Raid::new(name, geo, comps)
        .and_then(|r| r.with_data_offsets(vec![offset; disks]))
        .map_err(|e| e.to_string())?;
    Ok(raid.with_queues(fair))
}
