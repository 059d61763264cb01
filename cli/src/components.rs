//! Opening the components named on the command line: files, block devices, `nbd://` URLs.

use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;

use tagstripe::nbd::NbdDevice;
use tagstripe::scheduler::Profile;
use tagstripe::{BlockDevice, FileDevice, FileOptions, SimDevice};

/// How to open components.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenOptions {
    /// Read-only.
    pub read_only: bool,
    /// `O_DIRECT` for files and block devices.
    pub direct: bool,
}

/// Opens one component: `nbd://host[:port][/export]`, `nbd+unix:///export?socket=PATH`,
/// `sim:PROFILE:SIZE` (a simulated disk
/// in memory, e.g. `sim:hdd-1998:256M`), a block device, or a regular file.
pub(crate) async fn open(spec: &str, o: OpenOptions) -> Result<Arc<dyn BlockDevice>, String> {
    if let Some(rest) = spec.strip_prefix("sim:") {
        let (profile, size) = rest
            .split_once(':')
            .ok_or_else(|| format!("{spec:?}: expected sim:PROFILE:SIZE"))?;
        let profile = Profile::parse(profile)
            .ok_or_else(|| format!("{spec:?}: profile must be hdd-1998, hdd-modern or ssd"))?;
        let bytes = crate::load::parse_size(size)?;
        if bytes % 512 != 0 {
            return Err(format!("{spec:?}: size must be whole 512-byte sectors"));
        }
        let d = SimDevice::with_profile(spec, profile, bytes / 512).map_err(|e| e.to_string())?;
        return Ok(Arc::new(d));
    }
    if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://") {
        let d = NbdDevice::connect(spec).await.map_err(|e| e.to_string())?;
        return Ok(Arc::new(d));
    }
    let opts = FileOptions {
        read_only: o.read_only,
        direct: o.direct,
        ..FileOptions::default()
    };
    open_file(spec, opts)
}

/// Opens a file or block device: through io_uring where it is built in and the kernel
/// allows it, through the thread pool otherwise.
pub(crate) fn open_file(
    path: impl AsRef<std::path::Path>,
    opts: FileOptions,
) -> Result<Arc<dyn BlockDevice>, String> {
    let path = path.as_ref();
    let is_block = std::fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    #[cfg(feature = "uring")]
    if let Ok(d) = tagstripe::UringDevice::open(path, opts, is_block, 256) {
        return Ok(Arc::new(d));
    }
    let dev = if is_block {
        FileDevice::open_block(path, opts)
    } else {
        FileDevice::open(path, opts)
    };
    dev.map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
        .map_err(|e| e.to_string())
}

/// Opens every component, in order.
pub(crate) async fn open_all(
    specs: &[String],
    o: OpenOptions,
) -> Result<Vec<Arc<dyn BlockDevice>>, String> {
    let mut out = Vec::with_capacity(specs.len());
    for s in specs {
        out.push(open(s, o).await?);
    }
    Ok(out)
}

/// Whether a component spec names a file or block device (where `O_DIRECT` applies).
fn is_path(spec: &str) -> bool {
    !(spec.starts_with("sim:") || spec.starts_with("nbd://") || spec.starts_with("nbd+unix://"))
}

/// Opens every component for a benchmark: files and block devices with `O_DIRECT` unless
/// `buffered` (as fio's `--direct=1`), so the page cache is not what gets measured. A file
/// whose filesystem refuses `O_DIRECT` (tmpfs) is opened buffered, with a note on stderr.
/// Returns the devices and whether every file or block device among them is direct.
pub(crate) async fn open_all_for_bench(
    specs: &[String],
    read_only: bool,
    buffered: bool,
) -> Result<(Vec<Arc<dyn BlockDevice>>, bool), String> {
    let mut out = Vec::with_capacity(specs.len());
    let mut all_direct = !buffered;
    for s in specs {
        let o = OpenOptions {
            read_only,
            direct: !buffered && is_path(s),
        };
        let d = match open(s, o).await {
            Ok(d) => d,
            Err(e) if o.direct => {
                let d = open(s, OpenOptions { direct: false, ..o }).await?;
                eprintln!("note: {s}: O_DIRECT refused ({e}); opened buffered");
                all_direct = false;
                d
            }
            Err(e) => return Err(e),
        };
        out.push(d);
    }
    Ok((out, all_direct))
}
