//! `tagstripe map`: a ccd geometry and the pieces of requests, as `ccdconfig -g` would show.

use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};
use tagstripe_striping::{Error, Geometry, Piece, ReadBalancer, Side, Status};

use crate::EXIT_USAGE;
use crate::layout::LayoutArgs;

/// Arguments of `tagstripe map`.
#[derive(Debug, Args)]
pub(crate) struct MapArgs {
    /// Raw component sizes in 512-byte sectors, comma-separated (e.g. 1000,2000,1500).
    #[arg(long, value_parser = parse_sizes, required_unless_present = "level")]
    sizes: Option<Sizes>,
    /// Interleave in sectors; 0 concatenates.
    #[arg(long, allow_negative_numbers = true, required_unless_present = "level")]
    interleave: Option<i64>,
    #[command(flatten)]
    md: crate::map_md::MdArgs,
    #[command(flatten)]
    layout: LayoutArgs,
    /// Largest component sector size in bytes.
    #[arg(long, default_value_t = 512)]
    secsize: u32,
    /// Requests to map, each [r:|w:]START:COUNT in sectors (reads if no prefix).
    #[arg(long = "request", num_args = 1.., value_parser = parse_request)]
    requests: Vec<Request>,
    /// Print JSON (the contract in the README) instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Debug)]
struct Sizes(Vec<u64>);

#[derive(Clone, Copy, Debug)]
struct Request {
    write: bool,
    start: u64,
    count: u64,
}

fn parse_sizes(s: &str) -> Result<Sizes, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u64>()
                .map_err(|e| format!("size {p:?} is not a sector count: {e}"))
        })
        .collect::<Result<_, _>>()
        .map(Sizes)
}

fn parse_request(s: &str) -> Result<Request, String> {
    let (write, rest) = match s.split_once(':') {
        Some(("r", rest)) => (false, rest),
        Some(("w", rest)) => (true, rest),
        _ => (false, s),
    };
    let (start, count) = rest
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected [r:|w:]START:COUNT"))?;
    let num = |what: &str, v: &str| {
        v.parse::<u64>()
            .map_err(|e| format!("{s:?}: {what} {v:?} is not a sector number: {e}"))
    };
    Ok(Request {
        write,
        start: num("start", start)?,
        count: num("count", count)?,
    })
}

pub(crate) fn run(args: &MapArgs) -> ExitCode {
    if let Some(level) = args.md.level {
        let requests: Vec<(bool, u64, u64)> = args
            .requests
            .iter()
            .map(|r| (r.write, r.start, r.count))
            .collect();
        return crate::map_md::run(level, &args.md, &requests, args.json);
    }
    let geometry = match build(args) {
        Ok(g) => g,
        Err(e) => {
            if args.json {
                let out = json!({"error": {"kind": e.kind(), "errno": e.errno().as_str(), "message": e.to_string()}});
                outln!("{out}");
            } else {
                eprintln!(
                    "tagstripe map: ccd would refuse this geometry: {e} ({})",
                    e.errno()
                );
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let policy = args
        .layout
        .mirror_reads
        .unwrap_or_else(|| geometry.default_mirror_reads());
    let mut reads = ReadBalancer::new(&geometry, policy);
    let results: Vec<Mapped> = args
        .requests
        .iter()
        .map(|r| Mapped::new(&geometry, *r, &mut reads))
        .collect();
    if args.json {
        outln!("{}", to_json(&geometry, &results));
    } else {
        crate::write_out(format_args!("{}", render(&geometry, &results)));
    }
    ExitCode::SUCCESS
}

fn build(args: &MapArgs) -> Result<Geometry, Error> {
    // Both are required by clap unless --level is given, which takes the md path.
    let given = args.interleave.unwrap_or(0);
    let interleave =
        u64::try_from(given).map_err(|_| Error::NegativeInterleave { interleave: given })?;
    let sizes = args.sizes.as_ref().map(|s| s.0.clone()).unwrap_or_default();
    let mut b = Geometry::builder(sizes, interleave);
    args.layout.geometry(&mut b);
    b.sector_size(args.secsize);
    b.build()
}

/// One request's outcome: ccd's status, the pieces, and the component I/O in issue order.
struct Mapped {
    req: Request,
    status: Status,
    pieces: Vec<Piece>,
    issued: Vec<(Piece, Side, usize)>,
}

impl Mapped {
    fn new(g: &Geometry, req: Request, reads: &mut ReadBalancer) -> Self {
        let (status, pieces) = g.map_ccd(req.start, req.count);
        let pieces: Vec<Piece> = pieces.collect();
        let mut issued = Vec::with_capacity(pieces.len());
        for p in &pieces {
            if req.write {
                issued.extend(p.write_targets().map(|(side, comp)| (*p, side, comp)));
            } else {
                let (side, comp) = reads.choose(p);
                issued.push((*p, side, comp));
            }
        }
        Self {
            req,
            status,
            pieces,
            issued,
        }
    }

    fn op(&self) -> &'static str {
        if self.req.write { "w" } else { "r" }
    }
}

fn to_json(g: &Geometry, results: &[Mapped]) -> Value {
    let table: Vec<Value> = g
        .rows()
        .iter()
        .map(|r| {
            json!({
                "ndisk": r.ndisk(),
                "index": r.members(),
                "lblk_start": r.lblk_start(),
                "cblk_start": r.cblk_start(),
                "lblk_span": r.lblk_span(),
            })
        })
        .collect();
    let requests: Vec<Value> = results
        .iter()
        .map(|m| {
            let pieces: Vec<Value> = m
                .pieces
                .iter()
                .map(|p| {
                    let mut v = json!({"lblk": p.lblk, "comp": p.component, "cblk": p.cblk, "count": p.count});
                    if let Some(mc) = p.mirror {
                        v["mirror_comp"] = json!(mc);
                    }
                    v
                })
                .collect();
            let issued: Vec<Value> = m
                .issued
                .iter()
                .map(|(p, side, comp)| {
                    let mut v = json!({"lblk": p.lblk, "comp": comp, "cblk": p.cblk, "count": p.count});
                    if p.mirror.is_some() {
                        v["side"] = json!(side.name());
                    }
                    v
                })
                .collect();
            let mut v = json!({
                "op": m.op(),
                "start": m.req.start,
                "count": m.req.count,
                "status": m.status.name(),
                "effective_count": m.pieces.iter().map(|p| p.count).sum::<u64>(),
                "pieces": pieces,
                "issued": issued,
            });
            if let Status::Error(errno) = m.status {
                v["errno"] = json!(errno.as_str());
            }
            v
        })
        .collect();
    json!({
        "flavor": g.flavor().name(),
        "interleave": g.interleave(),
        "uniform": g.is_uniform(),
        "mirror": g.is_mirror(),
        "notes": g.notes().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "total_sectors": g.total_sectors(),
        "component_sizes": g.component_sizes(),
        "reserved_offset": g.reserved_sectors(),
        "table": table,
        "requests": requests,
    })
}

fn render(g: &Geometry, results: &[Mapped]) -> String {
    use std::fmt::Write as _;
    let mut out = g.to_string();
    for m in results {
        let _ = write!(
            out,
            "\nrequest {}:{}:{}  {}",
            m.op(),
            m.req.start,
            m.req.count,
            m.status.name()
        );
        if let Status::Error(errno) = m.status {
            let _ = write!(out, " ({errno})");
        }
        let _ = writeln!(out);
        if m.issued.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "  {:>14} {:>6} {:>14} {:>10}  side",
            "lblk", "comp", "cblk", "count"
        );
        for (p, side, comp) in &m.issued {
            let side = if p.mirror.is_some() { side.name() } else { "-" };
            let _ = writeln!(
                out,
                "  {:>14} {:>6} {:>14} {:>10}  {side}",
                p.lblk, comp, p.cblk, p.count
            );
        }
    }
    out
}
