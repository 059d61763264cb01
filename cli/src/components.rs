//! Opening the components named on the command line: files, block devices, `nbd://` URLs.

use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;

use tagstripe::nbd::NbdDevice;
use tagstripe::{BlockDevice, FileDevice, FileOptions};

/// How to open components.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenOptions {
    /// Read-only.
    pub read_only: bool,
    /// `O_DIRECT` for files and block devices.
    pub direct: bool,
}

/// Opens one component: `nbd://host[:port][/export]`, a block device, or a regular file.
pub(crate) async fn open(spec: &str, o: OpenOptions) -> Result<Arc<dyn BlockDevice>, String> {
    if spec.starts_with("nbd://") {
        let d = NbdDevice::connect(spec).await.map_err(|e| e.to_string())?;
        return Ok(Arc::new(d));
    }
    let opts = FileOptions {
        read_only: o.read_only,
        direct: o.direct,
        ..FileOptions::default()
    };
    let is_block = std::fs::metadata(spec)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    let dev = if is_block {
        FileDevice::open_block(spec, opts)
    } else {
        FileDevice::open(spec, opts)
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
