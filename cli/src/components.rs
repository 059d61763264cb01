//! Opening the components named on the command line: files, block devices, `nbd://` URLs.

use std::sync::Arc;

use tagstripe::{BlockDevice, DynBlockDevice, FileOptions};

/// How to open components.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenOptions {
    /// Read-only.
    pub read_only: bool,
    /// `O_DIRECT` for files and block devices.
    pub direct: bool,
}

/// Opens one component with the library's [`tagstripe::open`]: `nbd://`, `nbd+unix://`,
/// `sim:PROFILE:SIZE`, a block device or a file.
pub(crate) async fn open(spec: &str, o: OpenOptions) -> Result<Arc<dyn DynBlockDevice>, String> {
    tagstripe::open(spec, &library_options(o))
        .await
        .map_err(|e| e.to_string())
}

fn library_options(o: OpenOptions) -> tagstripe::OpenOptions {
    tagstripe::OpenOptions::new()
        .read_only(o.read_only)
        .direct(o.direct)
}

/// Opens one of several components that serve together: with `opener`, its files and block
/// devices share one io_uring instance.
async fn open_together(
    opener: &mut tagstripe::Opener,
    spec: &str,
    o: OpenOptions,
) -> Result<Arc<dyn DynBlockDevice>, String> {
    opener
        .open(spec, &library_options(o))
        .await
        .map_err(|e| e.to_string())
}

/// Opens a file or block device (through io_uring where it is built in).
pub(crate) async fn open_file(
    path: impl AsRef<std::path::Path>,
    opts: FileOptions,
) -> Result<Arc<dyn DynBlockDevice>, String> {
    let spec = path.as_ref().display().to_string();
    let o = OpenOptions {
        read_only: opts.read_only,
        direct: opts.direct,
    };
    open(&spec, o).await
}

/// Opens every component, in order (their files and block devices on one io_uring
/// instance, see [`tagstripe::Opener`]).
pub(crate) async fn open_all(
    specs: &[String],
    o: OpenOptions,
) -> Result<Vec<Arc<dyn DynBlockDevice>>, String> {
    let mut out = Vec::with_capacity(specs.len());
    let mut opener = tagstripe::Opener::new();
    for s in specs {
        let d = open_together(&mut opener, s, o).await?;
        note_tail(s, &d);
        out.push(d);
    }
    Ok(out)
}

/// Says on stderr when a component ends in a part block, which no request reaches (a file
/// or an export whose size is not a whole number of blocks).
fn note_tail(spec: &str, d: &Arc<dyn DynBlockDevice>) {
    if let Some(line) = tail_note(d.info()) {
        eprintln!("note: {spec}: {line}");
    }
}

/// The words for a device's unused tail, if it has one.
pub(crate) fn tail_note(info: &tagstripe::DeviceInfo) -> Option<String> {
    let tail = info.unused_tail_bytes;
    (tail > 0).then(|| {
        format!(
            "its last {tail} bytes are not a whole {}-byte block and are not used (it holds {} bytes)",
            info.limits.logical_block_size,
            info.bytes() + tail
        )
    })
}

/// Whether a component spec names a file or block device (where `O_DIRECT` applies).
fn is_path(spec: &str) -> bool {
    !(spec.starts_with("sim:")
        || spec.starts_with("nbd://")
        || spec.starts_with("nbd+unix://")
        || spec.starts_with("nbds://")
        || spec.starts_with("nbds+unix://"))
}

/// Opens every component for a benchmark: files and block devices with `O_DIRECT` unless
/// `buffered` (as fio's `--direct=1`), so the page cache is not what gets measured. A file
/// whose filesystem refuses `O_DIRECT` (tmpfs) is opened buffered, with a note on stderr.
/// Returns the devices and whether every file or block device among them is direct.
pub(crate) async fn open_all_for_bench(
    specs: &[String],
    read_only: bool,
    buffered: bool,
) -> Result<(Vec<Arc<dyn DynBlockDevice>>, bool), String> {
    let mut out = Vec::with_capacity(specs.len());
    let mut all_direct = !buffered;
    let mut opener = tagstripe::Opener::new();
    for s in specs {
        let o = OpenOptions {
            read_only,
            direct: !buffered && is_path(s),
        };
        let d = match open_together(&mut opener, s, o).await {
            Ok(d) => d,
            Err(e) if o.direct => {
                let d = open_together(&mut opener, s, OpenOptions { direct: false, ..o }).await?;
                eprintln!("note: {s}: O_DIRECT refused ({e}); opened buffered");
                all_direct = false;
                d
            }
            Err(e) => return Err(e),
        };
        note_tail(s, &d);
        out.push(d);
    }
    Ok((out, all_direct))
}
