//! Opening a device by name: a file, a block device, an NBD export or a simulated disk.

use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;

use tagstripe_scheduler::Profile;

use crate::{DynBlockDevice, Error, FileDevice, FileOptions, Result, SimDevice};

/// How [`open`] opens a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Refuse writes, flushes and discards.
    pub read_only: bool,
    /// `O_DIRECT` for files and block devices.
    pub direct: bool,
}

impl OpenOptions {
    /// Read-write, through the page cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Read-only.
    #[must_use]
    pub fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// `O_DIRECT`.
    #[must_use]
    pub fn direct(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }
}

/// Opens the device `spec` names:
/// - `nbd://host[:port][/export]` or `nbd+unix:///export?socket=PATH`: an NBD export (feature
///   `nbd`); `nbds://...?tls-certificates=DIR` and `nbds+unix://...` over TLS (feature `tls`);
/// - `sim:PROFILE:SIZE`: a simulated disk (`hdd-1998`, `hdd-modern` or `ssd`; SIZE like
///   `256M`, whole sectors);
/// - a block device (detected), with its sizes, sysfs limits and identity;
/// - any other path: a regular file.
///
/// Files and block devices go through io_uring where it is built in (feature `uring`) and
/// the kernel allows it, through the thread pool otherwise.
///
/// ```
/// use tagstripe::{open, BlockDevice, OpenOptions};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let d = open("sim:ssd:64M", &OpenOptions::new()).await?;
/// assert_eq!(d.info().sectors, 64 * 2048);
/// assert!(open("sim:floppy:1M", &OpenOptions::new()).await.is_err());
/// assert!(open("/no/such/file", &OpenOptions::new()).await.is_err());
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
///
/// # Errors
/// [`Error::BadUrl`] for a spec that cannot be parsed, the backend's errors otherwise.
pub async fn open(spec: &str, o: &OpenOptions) -> Result<Arc<dyn DynBlockDevice>> {
    Opener {
        #[cfg(feature = "uring")]
        ring: None,
        #[cfg(feature = "uring")]
        share: false,
    }
    .open(spec, o)
    .await
}

/// Entries of the ring an [`Opener`] shares among its files and block devices: as many as
/// four devices of [`open`] have between them.
#[cfg(feature = "uring")]
const SHARED_RING_ENTRIES: u32 = 1024;

/// Opens devices that serve together, such as the components of one volume, as [`open`]
/// does, except that the files and block devices among them share one io_uring instance
/// (feature `uring`, see [`crate::UringRing`]): the requests one poll starts on any of them
/// reach the kernel in one `io_uring_enter`, and one task reaps all their completions.
///
/// ```
/// use tagstripe::{BlockDevice, OpenOptions, Opener};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let mut opener = Opener::new();
/// let o = OpenOptions::new();
/// let a = opener.open("sim:ssd:64M", &o).await?;
/// let b = opener.open("sim:ssd:64M", &o).await?;
/// assert_eq!(a.info().sectors + b.info().sectors, 2 * 64 * 2048);
/// assert!(opener.open("/no/such/file", &o).await.is_err());
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Opener {
    /// The ring shared by the files and block devices opened so far (made with the first).
    #[cfg(feature = "uring")]
    ring: Option<crate::UringRing>,
    /// Whether they share one (else each has its own, as [`open`] gives).
    #[cfg(feature = "uring")]
    share: bool,
}

impl Default for Opener {
    fn default() -> Self {
        Self::new()
    }
}

impl Opener {
    /// An opener whose files and block devices will share one ring.
    #[must_use]
    pub fn new() -> Self {
        Self {
            #[cfg(feature = "uring")]
            ring: None,
            #[cfg(feature = "uring")]
            share: true,
        }
    }

    /// Opens the device `spec` names (as [`open`]).
    ///
    /// # Errors
    /// As [`open`].
    pub async fn open(&mut self, spec: &str, o: &OpenOptions) -> Result<Arc<dyn DynBlockDevice>> {
        let bad = |why: String| Error::BadUrl {
            url: spec.to_owned(),
            why,
        };
        if let Some(rest) = spec.strip_prefix("sim:") {
            let (profile, size) = rest
                .split_once(':')
                .ok_or_else(|| bad("expected sim:PROFILE:SIZE".to_owned()))?;
            let profile = Profile::parse(profile)
                .ok_or_else(|| bad("profile must be hdd-1998, hdd-modern or ssd".to_owned()))?;
            let bytes = parse_size(size).map_err(|e| bad(e.to_string()))?;
            if bytes % 512 != 0 {
                return Err(bad("size must be whole 512-byte sectors".to_owned()));
            }
            return Ok(Arc::new(SimDevice::with_profile(
                spec,
                profile,
                bytes / 512,
            )?));
        }
        if ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
            .iter()
            .any(|p| spec.starts_with(p))
        {
            #[cfg(feature = "nbd")]
            {
                let config = crate::nbd::ClientConfig {
                    read_only: o.read_only,
                    ..crate::nbd::ClientConfig::default()
                };
                return Ok(Arc::new(
                    crate::nbd::NbdDevice::connect_with(spec, config).await?,
                ));
            }
            #[cfg(not(feature = "nbd"))]
            return Err(Error::Unsupported {
                device: spec.to_owned(),
                op: "NBD (built without the `nbd` feature)",
            });
        }
        let opts = FileOptions {
            read_only: o.read_only,
            direct: o.direct,
            ..FileOptions::default()
        };
        let is_block = std::fs::metadata(spec)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        #[cfg(feature = "uring")]
        if let Some(d) = self.uring(spec, opts, is_block) {
            return Ok(Arc::new(d));
        }
        let d = if is_block {
            FileDevice::open_block(spec, opts)?
        } else {
            FileDevice::open(spec, opts)?
        };
        Ok(Arc::new(d))
    }

    /// The file or block device `spec` through io_uring, on the shared ring (made now if
    /// this is the first) or a ring of its own; `None` where io_uring or the open fails
    /// (then the thread-pool backend opens it, or says why not).
    #[cfg(feature = "uring")]
    fn uring(&mut self, spec: &str, opts: FileOptions, block: bool) -> Option<crate::UringDevice> {
        if !self.share {
            return crate::UringDevice::open(spec, opts, block, 256).ok();
        }
        if self.ring.is_none() {
            self.ring = Some(crate::UringRing::new(SHARED_RING_ENTRIES).ok()?);
        }
        crate::UringDevice::open_on(self.ring.as_ref()?, spec, opts, block).ok()
    }
}

/// A size in bytes as the CLI and device specs write it: `4096`, `4k`, `64M`, `1G` or `2T`
/// (binary multiples, either case), positive and within 64 bits. The one size parser of the
/// project: `sim:` specs, `bench --size`, `--bs` and the rest all use it.
///
/// ```
/// use tagstripe::parse_size;
/// assert_eq!(parse_size("64M")?, 64 << 20);
/// assert_eq!(parse_size("4k")?, 4096);
/// assert!(parse_size("0").is_err());
/// assert!(parse_size("12Q").unwrap_err().to_string().contains("unknown size suffix"));
/// # Ok::<(), tagstripe::Error>(())
/// ```
///
/// # Errors
/// [`Error::BadSize`] for no number, an unknown suffix, zero, or a size past 64 bits.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = |why: &str| Error::BadSize {
        input: s.to_owned(),
        why: why.to_owned(),
    };
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                _ => return Err(bad("unknown size suffix (use k, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| bad("expected a size like 4k or 256M"))?;
    n.checked_mul(mul)
        .filter(|&b| b > 0)
        .ok_or_else(|| bad("a size must be positive and fit 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("4k").ok(), Some(4096));
        assert_eq!(parse_size("64M").ok(), Some(64 << 20));
        assert_eq!(parse_size("1t").ok(), Some(1 << 40));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert!(parse_size("").is_err());
    }

    /// An opener's files share one ring (made with the first file, not for a simulated
    /// disk); `open` gives each file a ring of its own; a file that cannot be opened says why
    /// and leaves the shared ring as it was.
    #[cfg(feature = "uring")]
    #[test]
    fn an_openers_files_share_one_ring() {
        use super::{OpenOptions, Opener, open};
        use crate::{FileDevice, FileOptions};
        let dir = std::env::temp_dir();
        let paths: Vec<_> = (0..2)
            .map(|i| dir.join(format!("tagstripe-opener-{}-{i}.img", std::process::id())))
            .collect();
        for p in &paths {
            drop(FileDevice::create(p, 2048, FileOptions::default()).unwrap());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let o = OpenOptions::new();
            let mut opener = Opener::new();
            let sim = opener.open("sim:ssd:1M", &o).await.unwrap();
            assert!(opener.ring.is_none(), "a simulated disk needs no ring");
            if crate::UringRing::new(2).is_err() {
                eprintln!("skipping the rest: io_uring is not available here");
                return;
            }
            let a = opener.open(paths[0].to_str().unwrap(), &o).await.unwrap();
            let b = opener.open(paths[1].to_str().unwrap(), &o).await.unwrap();
            let ring = opener.ring.clone().expect("the first file made the ring");
            // The opener's handle, this clone and the two devices.
            assert_eq!(ring.holders(), 4);
            let missing = dir.join(format!("tagstripe-opener-{}-none", std::process::id()));
            let e = opener
                .open(missing.to_str().unwrap(), &o)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("tagstripe-opener"), "{e}");
            assert_eq!(ring.holders(), 4);
            drop((a, b, sim));
            assert_eq!(ring.holders(), 2);
            // `open` shares nothing with the opener.
            let c = open(paths[0].to_str().unwrap(), &o).await.unwrap();
            assert_eq!(ring.holders(), 2);
            drop(c);
        });
        for p in &paths {
            std::fs::remove_file(p).unwrap();
        }
    }
}
