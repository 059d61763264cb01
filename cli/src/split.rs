//! `tagstripe split`: how a request is split by a device's limits and quirks.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::json;
use tagstripe_quirks::{Identity, Limits, Mod15, Op, Segment, Splitter};

use crate::fail;
use crate::quirks::{Overrides, limits_json, resolved_json};

/// Arguments of `tagstripe split`.
#[derive(Debug, Args)]
pub(crate) struct SplitArgs {
    /// First sector of the request.
    #[arg(long)]
    start: u64,
    /// Length of the request in sectors.
    #[arg(long)]
    sectors: u64,
    /// Logical block size in bytes.
    #[arg(long, default_value_t = 512)]
    lbs: u32,
    /// Physical block size in bytes (default: the logical block size).
    #[arg(long, default_value_t = 0)]
    pbs: u32,
    /// The device's max_hw_sectors (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    max_sectors: u32,
    /// The soft cap, as sysfs max_sectors_kb.
    #[arg(long)]
    max_sectors_kb: Option<u32>,
    /// I/O boundary in sectors (RAID chunk, NVMe NOIOB); 0 = none.
    #[arg(long, default_value_t = 0)]
    chunk_sectors: u32,
    /// A quirk cap in sectors (as libata's max_sec=), applied as an override.
    #[arg(long)]
    max_sec: Option<u32>,
    /// Most segments per request (with --segments); 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    max_segments: u32,
    /// Most bytes per segment; 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    max_segment_size: u32,
    /// Segment boundary mask, e.g. 0xffff; 0 = none.
    #[arg(long, default_value = "0", value_parser = parse_u64)]
    seg_boundary_mask: u64,
    /// Discard cap in sectors (0 = no discard).
    #[arg(long, default_value_t = 0)]
    max_discard_sectors: u32,
    /// Discard granularity in bytes.
    #[arg(long, default_value_t = 0)]
    discard_granularity: u32,
    /// The data's scatter list: ADDR:LEN,... in bytes (ADDR may be 0x...).
    #[arg(long, value_parser = parse_segments)]
    segments: Option<Segments>,
    /// Mod-15 policy: off, cap15 (Linux's) or smart. Default: cap15 for a listed drive.
    #[arg(long, value_enum)]
    mod15write: Option<Mod15Arg>,
    /// The operation.
    #[arg(long, value_enum, default_value_t = OpArg::Write)]
    op: OpArg,
    /// The device's identity, "VENDOR|MODEL|REV", matched against the quirk table.
    #[arg(long)]
    device: Option<String>,
    #[command(flatten)]
    overrides: Overrides,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mod15Arg {
    Off,
    Cap15,
    Smart,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OpArg {
    Read,
    Write,
    Discard,
    WriteZeroes,
}

#[derive(Clone, Debug)]
struct Segments(Vec<Segment>);

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a number: {e}"))
}

fn parse_segments(s: &str) -> Result<Segments, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (addr, len) = p
                .split_once(':')
                .ok_or_else(|| format!("segment {p:?}: expected ADDR:LEN"))?;
            let len = u32::try_from(parse_u64(len.trim())?)
                .map_err(|_| format!("segment {p:?}: length above 4 GiB"))?;
            Ok(Segment {
                addr: parse_u64(addr.trim())?,
                len,
            })
        })
        .collect::<Result<_, String>>()
        .map(Segments)
}

pub(crate) fn run(args: &SplitArgs) -> ExitCode {
    let mut hw = Limits::default();
    hw.logical_block_size = args.lbs;
    hw.physical_block_size = args.pbs;
    hw.max_hw_sectors = args.max_sectors;
    hw.chunk_sectors = args.chunk_sectors;
    hw.max_segments = args.max_segments;
    hw.max_segment_size = args.max_segment_size;
    hw.seg_boundary_mask = args.seg_boundary_mask;
    hw.max_discard_sectors = args.max_discard_sectors;
    hw.discard_granularity = args.discard_granularity;
    let set = match args.overrides.quirk_set() {
        Ok(s) => s,
        Err(e) => return fail("split", "bad_override", &e, args.json),
    };
    let id = args
        .device
        .as_deref()
        .map(Identity::parse)
        .unwrap_or_default();
    let mut resolved = set.resolve(&id);
    if args.device.is_none() {
        // No device: no table row can apply, only explicit overrides.
        resolved
            .matches
            .retain(|m| m.row.vendor.is_any() && m.row.model.is_any());
    }
    let mut extra = tagstripe_quirks::Settings::default();
    let at = tagstripe_quirks::Location::Offset(0);
    let mut set_extra = |key: &str, v: Option<u32>| match v {
        Some(v) => extra.set(key, Some(&v.to_string()), &at),
        None => Ok(()),
    };
    if let Err(e) = set_extra("max_sec", args.max_sec)
        .and_then(|()| set_extra("max_sectors_kb", args.max_sectors_kb))
    {
        return fail("split", e_kind(&e), &e.to_string(), args.json);
    }
    resolved.settings.merge(&extra);
    let applied = match resolved.settings.apply(&hw) {
        Ok(a) => a,
        Err(e) => return fail("split", "bad_limits", &e.to_string(), args.json),
    };
    let mode = match args.mod15write {
        Some(Mod15Arg::Off) => Mod15::Off,
        Some(Mod15Arg::Cap15) => Mod15::Cap15,
        Some(Mod15Arg::Smart) => Mod15::Smart,
        None => Mod15::for_device(applied.mod15write, Mod15::Cap15),
    };
    let op = match args.op {
        OpArg::Read => Op::Read,
        OpArg::Write => Op::Write,
        OpArg::Discard => Op::Discard,
        OpArg::WriteZeroes => Op::WriteZeroes,
    };
    let splitter = match Splitter::new(&applied.limits, mode) {
        Ok(s) => s,
        Err(e) => return fail("split", "bad_limits", &e.to_string(), args.json),
    };
    let pieces: Result<Vec<_>, _> = match &args.segments {
        None => splitter
            .split(op, args.start, args.sectors)
            .map(Iterator::collect),
        Some(Segments(segs)) => {
            let bytes: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
            if bytes != args.sectors.saturating_mul(512) {
                let msg = format!(
                    "--segments hold {bytes} bytes but --sectors {} needs {}",
                    args.sectors,
                    args.sectors.saturating_mul(512)
                );
                return fail("split", "segments_mismatch", &msg, args.json);
            }
            splitter
                .split_sg(op, args.start, segs)
                .and_then(Iterator::collect)
        }
    };
    let pieces = match pieces {
        Ok(p) => p,
        Err(e) => return fail("split", e_kind(&e), &e.to_string(), args.json),
    };
    if args.json {
        let out = json!({
            "op": op.name(),
            "start": args.start,
            "sectors": args.sectors,
            "mod15write": mode.name(),
            "limits": limits_json(splitter.limits()),
            "quirks": resolved_json(&resolved, &applied)["matches"],
            "warnings": applied.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "pieces": pieces.iter().map(|p| json!({"start": p.start, "sectors": p.sectors})).collect::<Vec<_>>(),
        });
        outln!("{out}");
    } else {
        let l = splitter.limits();
        outln!(
            "{} {}+{} sectors: lbs {} pbs {} max_hw_sectors {} max_sectors {} chunk {} mod15 {}",
            op.name(),
            args.start,
            args.sectors,
            l.logical_block_size,
            l.physical_block_size,
            l.max_hw_sectors,
            l.max_sectors,
            l.chunk_sectors,
            mode.name()
        );
        for m in &resolved.matches {
            outln!(
                "quirk ({}): {} [{}]",
                m.layer.name(),
                m.row.settings.to_force_string(),
                m.row.source
            );
        }
        for w in &applied.warnings {
            outln!("warning: {w}");
        }
        outln!("{} pieces:", pieces.len());
        for p in &pieces {
            outln!("  {:>14} {:>10}", p.start, p.sectors);
        }
    }
    ExitCode::SUCCESS
}

fn e_kind(e: &tagstripe_quirks::Error) -> &'static str {
    use tagstripe_quirks::Error as E;
    match e {
        E::Misaligned { .. } => "misaligned",
        E::RequestOverflow { .. } => "overflow",
        E::Unsupported { .. } => "unsupported",
        E::NoProgress { .. } => "no_progress",
        E::Mod15Unavoidable { .. } => "mod15_unavoidable",
        E::SegmentsMismatch { .. } => "segments_mismatch",
        _ => "bad_limits",
    }
}
