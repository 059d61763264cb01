//! `tagstripe info PATH`: what a device looks like to tagstripe.

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;
use std::sync::Arc;

use tagstripe::{BlockDevice, DynBlockDevice, FileDevice, FileOptions};

use crate::fail;
use crate::quirks::{Overrides, limits_json, resolved_json};

/// Arguments of `tagstripe info`.
#[derive(Debug, Args)]
pub(crate) struct InfoArgs {
    /// A file, a block device, or an NBD export (`nbd://host[:port][/export]`).
    path: PathBuf,
    #[command(flatten)]
    overrides: Overrides,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &InfoArgs) -> ExitCode {
    let is_block = std::fs::metadata(&args.path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    let url = args.path.to_str().filter(|p| {
        ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
            .iter()
            .any(|s| p.starts_with(s))
    });
    // An NBD export is asked over the network; the runtime lives as long as the device.
    let rt = match url.map(|_| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }) {
        Some(Ok(rt)) => Some(rt),
        Some(Err(e)) => return fail("info", "runtime", &e.to_string(), args.json),
        None => None,
    };
    let opts = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let dev: Result<Arc<dyn DynBlockDevice>, String> = match (url, &rt) {
        (Some(u), Some(rt)) => rt.block_on(crate::components::open(
            u,
            crate::components::OpenOptions {
                read_only: true,
                direct: false,
            },
        )),
        _ if is_block => FileDevice::open_block(&args.path, opts)
            .map(|d| Arc::new(d) as Arc<dyn DynBlockDevice>)
            .map_err(|e| e.to_string()),
        _ => FileDevice::open(&args.path, opts)
            .map(|d| Arc::new(d) as Arc<dyn DynBlockDevice>)
            .map_err(|e| e.to_string()),
    };
    let dev = match dev {
        Ok(d) => d,
        Err(e) => return fail("info", "open", &e, args.json),
    };
    let kind = if url.is_some() {
        "nbd"
    } else if is_block {
        "block"
    } else {
        "file"
    };
    let set = match args.overrides.quirk_set() {
        Ok(s) => s,
        Err(e) => return fail("info", "bad_override", &e, args.json),
    };
    // The metadata a volume keeps at the end of its components, if any.
    let meta = match &rt {
        Some(rt) => rt.block_on(tagstripe::component_metadata(dev.as_ref())),
        None => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(tagstripe::component_metadata(dev.as_ref())),
            Err(e) => return fail("info", "runtime", &e.to_string(), args.json),
        },
    };
    // An md member's version-1 superblock, if it carries one.
    let md = {
        let read = tagstripe::read_md_superblock(dev.as_ref());
        match &rt {
            Some(rt) => rt.block_on(read).ok(),
            None => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()
                .and_then(|rt| rt.block_on(read).ok()),
        }
    };
    let info = dev.info();
    let resolved = set.resolve(&info.identity);
    let applied = match resolved.settings.apply(&info.limits) {
        Ok(a) => a,
        Err(e) => return fail("info", "bad_limits", &e.to_string(), args.json),
    };
    if args.json {
        let mut q = resolved_json(&resolved, &applied);
        q["effective_limits"] = limits_json(&applied.limits);
        outln!(
            "{}",
            json!({
                "path": args.path.display().to_string(),
                "kind": kind,
                "sectors": info.sectors,
                "bytes": info.bytes(),
                "unused_tail_bytes": info.unused_tail_bytes,
                "logical_block_size": info.limits.logical_block_size,
                "physical_block_size": info.limits.physical_block_size,
                "hardware_limits": limits_json(&info.limits),
                "quirks": q,
                "metadata": metadata_json(&meta),
                "md": md.as_ref().map(md_json),
                "caps": caps_json(&info.caps),
            })
        );
        return ExitCode::SUCCESS;
    }
    outln!(
        "{} ({}): {} sectors ({} bytes), logical {} B, physical {}",
        args.path.display(),
        if kind == "block" {
            "block device"
        } else {
            kind
        },
        info.sectors,
        info.bytes(),
        info.limits.logical_block_size,
        match info.limits.physical_block_size {
            0 => "not reported".to_owned(),
            b => format!("{b} B"),
        }
    );
    if let Some(line) = crate::components::tail_note(info) {
        outln!("note: {line}");
    }
    let id = &info.identity;
    if id.vendor.is_empty() && id.model.is_empty() && id.revision.is_empty() {
        outln!("identity: none reported (no quirk row can match by name)");
    } else {
        outln!("identity: {id}");
    }
    outln!("{}", caps_line(&info.caps));
    outln!("{}", metadata_line(&meta));
    if let Some(sb) = &md {
        outln!("{}", md_line(sb));
    }
    let l = &info.limits;
    outln!(
        "hardware: max_hw_sectors {} max_sectors {} max_segments {} chunk {} discard {} tags {}",
        l.max_hw_sectors,
        l.max_sectors,
        l.max_segments,
        l.chunk_sectors,
        match l.max_discard_sectors {
            0 => "none".to_owned(),
            u32::MAX => "no cap".to_owned(),
            n => n.to_string(),
        },
        l.max_tags
    );
    if resolved.matches.is_empty() {
        outln!("quirks: no row applies");
    }
    for m in &resolved.matches {
        outln!(
            "quirk ({}): {} [{}; {}]",
            m.layer.name(),
            m.row.settings.to_force_string(),
            m.row.source,
            m.row.note
        );
    }
    let e = &applied.limits;
    outln!(
        "effective: max_hw_sectors {} max_sectors {} tags {}..{} mod15write {}",
        e.max_hw_sectors,
        e.max_sectors,
        e.min_tags,
        e.max_tags,
        applied.mod15write
    );
    for w in &applied.warnings {
        outln!("warning: {w}");
    }
    ExitCode::SUCCESS
}

type Meta = tagstripe::Result<Option<tagstripe::striping::superblock::Superblock>>;

fn uuid_hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

fn side_name(s: tagstripe::striping::superblock::Side) -> &'static str {
    use tagstripe::striping::superblock::Side;
    match s {
        Side::InSync => "in-sync",
        Side::Failed => "failed",
        Side::Resyncing => "resyncing",
    }
}

/// What the device can do, in one line.
fn caps_line(c: &tagstripe::Caps) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    format!(
        "caps: flush {} fua {} trim {} zeroing {} fast-zero {} allocation {} rotational {} write-cache {}",
        yes(c.flush),
        yes(c.fua),
        yes(c.trim),
        zeroing_name(c.zeroing),
        yes(c.fast_zero),
        yes(c.allocation),
        yes(c.rotational),
        yes(c.write_cache)
    )
}

fn zeroing_name(z: tagstripe::Zeroing) -> &'static str {
    match z {
        tagstripe::Zeroing::Native => "native",
        tagstripe::Zeroing::Emulated => "emulated",
    }
}

fn caps_json(c: &tagstripe::Caps) -> serde_json::Value {
    json!({
        "flush": c.flush,
        "fua": c.fua,
        "trim": c.trim,
        "zeroing": zeroing_name(c.zeroing),
        "fast_zero": c.fast_zero,
        "allocation": c.allocation,
        "rotational": c.rotational,
        "write_cache": c.write_cache,
    })
}

/// The component's metadata in one line.
fn metadata_line(m: &Meta) -> String {
    match m {
        Ok(None) => "metadata: none".to_owned(),
        Ok(Some(sb)) => format!(
            "metadata: volume {}, component {} of {}, events {}, {}, sides [{}], data {} sectors{}",
            uuid_hex(&sb.uuid),
            sb.role,
            sb.sides.len(),
            sb.events,
            if sb.dirty { "dirty" } else { "clean" },
            sb.sides
                .iter()
                .map(|&s| side_name(s))
                .collect::<Vec<_>>()
                .join(", "),
            sb.data_sectors,
            if sb.bitmap.chunk_sectors() == 0 {
                String::new()
            } else {
                format!(
                    ", bitmap {} of {} chunks of {} KiB dirty",
                    sb.bitmap.count(),
                    sb.bitmap.bits(),
                    sb.bitmap.chunk_sectors() / 2
                )
            }
        ),
        Err(e) => format!("metadata: unreadable: {e}"),
    }
}

fn metadata_json(m: &Meta) -> serde_json::Value {
    match m {
        Ok(None) => serde_json::Value::Null,
        Ok(Some(sb)) => json!({
            "volume": uuid_hex(&sb.uuid),
            "role": sb.role,
            "components": sb.sides.len(),
            "events": sb.events,
            "dirty": sb.dirty,
            "sides": sb.sides.iter().map(|&s| side_name(s)).collect::<Vec<_>>(),
            "data_sectors": sb.data_sectors,
            "bitmap": {
                "chunk_sectors": sb.bitmap.chunk_sectors(),
                "chunks": sb.bitmap.bits(),
                "dirty": sb.bitmap.count(),
            },
            "resync_from": sb.resync_from,
        }),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// An md member's superblock in one line.
fn md_line(sb: &tagstripe::striping::md::Superblock1) -> String {
    let role = sb
        .role()
        .map_or_else(|| "spare or faulty".to_owned(), |r| format!("member {r}"));
    let layout = md_layout_name(sb);
    format!(
        "md: array {:?} ({}), raid{} {layout}, chunk {} sectors, {} members, {role}, events {}, data offset {} sectors, {} sectors used",
        sb.set_name,
        hex(&sb.set_uuid),
        sb.level,
        sb.chunk,
        sb.raid_disks,
        sb.events,
        sb.data_offset,
        sb.size
    )
}

/// mdadm's name for the superblock's layout, or md's number.
fn md_layout_name(sb: &tagstripe::striping::md::Superblock1) -> String {
    use tagstripe::striping::md::{ParityLayout, Raid10Layout};
    match sb.level {
        5 | 6 => ParityLayout::from_md(sb.layout)
            .map_or_else(|| format!("layout {}", sb.layout), |l| l.name().to_owned()),
        10 => Raid10Layout::from_md(sb.layout)
            .map_or_else(|_| format!("layout {:#x}", sb.layout), |l| l.to_string()),
        _ => format!("layout {}", sb.layout),
    }
}

fn md_json(sb: &tagstripe::striping::md::Superblock1) -> serde_json::Value {
    json!({
        "array": sb.set_name,
        "uuid": hex(&sb.set_uuid),
        "level": sb.level,
        "layout": md_layout_name(sb),
        "chunk": sb.chunk,
        "raid_disks": sb.raid_disks,
        "role": sb.role(),
        "events": sb.events,
        "data_offset": sb.data_offset,
        "size": sb.size,
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
