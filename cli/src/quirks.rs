//! `tagstripe quirks`: the quirk table with sources, and what applies to a device and why.

use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};
use tagstripe_quirks::{Applied, Identity, Limits, QuirkRow, QuirkSet, Resolved};

use crate::fail;

/// Override layers shared by `quirks` and `split`.
#[derive(Debug, Args)]
pub(crate) struct Overrides {
    /// A libata.force-style override string, e.g. "ST380023AS:max_sec=15,*:max_tags=16".
    #[arg(long)]
    force: Option<String>,
    /// A TOML file of [[quirk]] entries laid over the built-in table.
    #[arg(long)]
    file: Option<std::path::PathBuf>,
    /// Ignore the built-in table.
    #[arg(long)]
    no_builtin: bool,
}

impl Overrides {
    /// The quirk set with every layer asked for.
    pub(crate) fn quirk_set(&self) -> Result<QuirkSet, String> {
        let mut set = if self.no_builtin {
            QuirkSet::empty()
        } else {
            QuirkSet::builtin()
        };
        if let Some(path) = &self.file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            set = set
                .with_file(&text, &path.display().to_string())
                .map_err(|e| e.to_string())?;
        }
        if let Some(force) = &self.force {
            set = set.with_force(force).map_err(|e| format!("--force: {e}"))?;
        }
        Ok(set)
    }
}

/// Arguments of `tagstripe quirks`.
#[derive(Debug, Args)]
pub(crate) struct QuirksArgs {
    /// Show what applies to this device: "VENDOR|MODEL|REV".
    #[arg(long = "match")]
    device: Option<String>,
    #[command(flatten)]
    overrides: Overrides,
    /// Also list rows that are kept for history but not matched.
    #[arg(long)]
    all: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &QuirksArgs) -> ExitCode {
    let set = match args.overrides.quirk_set() {
        Ok(s) => s,
        Err(e) => return fail("quirks", "bad_override", &e, args.json),
    };
    let Some(device) = &args.device else {
        let rows: Vec<&QuirkRow> = set
            .builtin_table()
            .into_iter()
            .flat_map(|t| t.rows())
            .chain(set.file_table().rows())
            .chain(set.force().entries())
            .filter(|r| args.all || r.enabled)
            .collect();
        if args.json {
            let rows: Vec<Value> = rows.iter().map(|r| row_json(r)).collect();
            outln!("{}", json!({"rows": rows}));
        } else {
            for r in rows {
                outln!(
                    "{:<10} {:<24} {:<12} {:<28} {}{}",
                    r.vendor.to_string(),
                    r.model.to_string(),
                    r.revision.to_string(),
                    r.settings.to_force_string(),
                    r.source,
                    if r.enabled { "" } else { " (not matched)" }
                );
            }
        }
        return ExitCode::SUCCESS;
    };
    let id = Identity::parse(device);
    let resolved = set.resolve(&id);
    let applied = match resolved.settings.apply(&Limits::default()) {
        Ok(a) => a,
        Err(e) => return fail("quirks", "bad_limits", &e.to_string(), args.json),
    };
    if args.json {
        outln!("{}", resolved_json(&resolved, &applied));
    } else {
        outln!("device {id}");
        if resolved.matches.is_empty() {
            outln!("no quirk row applies");
        }
        for m in &resolved.matches {
            outln!(
                "{:<8} {} {}|{}|{}: {} ({}; {})",
                m.layer.name(),
                m.row.location,
                m.row.vendor,
                m.row.model,
                m.row.revision,
                m.row.settings.to_force_string(),
                m.row.source,
                m.row.note
            );
        }
        outln!("settings: {}", resolved.settings.to_force_string());
        for w in &applied.warnings {
            outln!("warning: {w}");
        }
    }
    ExitCode::SUCCESS
}

/// One row as JSON.
pub(crate) fn row_json(r: &QuirkRow) -> Value {
    json!({
        "vendor": r.vendor.text(),
        "model": r.model.text(),
        "revision": r.revision.text(),
        "match": {"vendor": r.vendor.kind().name(), "model": r.model.kind().name(), "revision": r.revision.kind().name()},
        "settings": r.settings.to_force_string(),
        "flags": r.flags,
        "enabled": r.enabled,
        "source": r.source,
        "note": r.note,
        "at": r.location.to_string(),
    })
}

/// What applied to a device and why.
pub(crate) fn resolved_json(resolved: &Resolved, applied: &Applied) -> Value {
    let matches: Vec<Value> = resolved
        .matches
        .iter()
        .map(|m| {
            let mut v = row_json(&m.row);
            v["layer"] = json!(m.layer.name());
            v
        })
        .collect();
    json!({
        "identity": {"vendor": resolved.identity.vendor, "model": resolved.identity.model, "revision": resolved.identity.revision},
        "matches": matches,
        "settings": resolved.settings.to_force_string(),
        "mod15write": applied.mod15write,
        "fua": applied.fua,
        "write_cache": applied.write_cache,
        "warnings": applied.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

/// Effective limits as JSON, with Linux's field names.
pub(crate) fn limits_json(l: &Limits) -> Value {
    json!({
        "logical_block_size": l.logical_block_size,
        "physical_block_size": l.physical_block_size,
        "io_min": l.io_min,
        "io_opt": l.io_opt,
        "max_hw_sectors": l.max_hw_sectors,
        "max_user_sectors": l.max_user_sectors,
        "max_sectors": l.max_sectors,
        "max_segments": l.max_segments,
        "max_segment_size": l.max_segment_size,
        "seg_boundary_mask": l.seg_boundary_mask,
        "virt_boundary_mask": l.virt_boundary_mask,
        "chunk_sectors": l.chunk_sectors,
        "max_discard_sectors": l.max_discard_sectors,
        "discard_granularity": l.discard_granularity,
        "discard_alignment": l.discard_alignment,
        "max_write_zeroes_sectors": l.max_write_zeroes_sectors,
        "max_tags": l.max_tags,
        "min_tags": l.min_tags,
    })
}
