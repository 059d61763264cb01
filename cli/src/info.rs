//! `tagstripe info PATH`: what a device looks like to tagstripe.

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;
use std::sync::Arc;

use tagstripe::{BlockDevice, FileDevice, FileOptions};

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
    let url = args
        .path
        .to_str()
        .filter(|p| p.starts_with("nbd://") || p.starts_with("nbd+unix://"));
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
    let dev: Result<Arc<dyn BlockDevice>, String> = match (url, &rt) {
        (Some(u), Some(rt)) => rt.block_on(crate::components::open(
            u,
            crate::components::OpenOptions {
                read_only: true,
                direct: false,
            },
        )),
        _ if is_block => FileDevice::open_block(&args.path, opts)
            .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
            .map_err(|e| e.to_string()),
        _ => FileDevice::open(&args.path, opts)
            .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
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
                "logical_block_size": info.limits.logical_block_size,
                "physical_block_size": info.limits.physical_block_size,
                "hardware_limits": limits_json(&info.limits),
                "quirks": q,
            })
        );
        return ExitCode::SUCCESS;
    }
    outln!(
        "{} ({}): {} sectors ({} bytes), logical {} B, physical {} B",
        args.path.display(),
        if kind == "block" {
            "block device"
        } else {
            kind
        },
        info.sectors,
        info.bytes(),
        info.limits.logical_block_size,
        info.limits.physical_block_size
    );
    outln!("identity: {}", info.identity);
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
