//! What a device is and can do: [`DeviceInfo`](crate::DeviceInfo), [`Caps`](crate::Caps), [`Zeroing`].

use tagstripe_quirks::{Identity, Limits};

use crate::{Error, Result};

/// How a device zeroes a range ([`BlockDevice::write_zeroes`](crate::BlockDevice::write_zeroes)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Zeroing {
    /// Without moving data: `fallocate` on a file or block device, dropped pages in
    /// memory, the server's WRITE_ZEROES over NBD, a volume whose components all do.
    Native,
    /// By writing buffers of zeroes.
    #[default]
    Emulated,
}

/// What a device can do, in one place: each backend says what it has, the split layer
/// takes away what the quirk table forbids (`notrim`, FUA or the write cache off, a
/// `max_write_zeroes_sectors` of 0), and a volume has what all its components have.
///
/// ```
/// use tagstripe::{BlockDevice, MemDevice, Zeroing};
/// let caps = MemDevice::new("m", 64).caps();
/// assert!(caps.flush && caps.trim && caps.allocation && !caps.rotational);
/// assert_eq!(caps.zeroing, Zeroing::Native);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Caps {
    /// `flush` makes written data durable. False for an NBD export whose server offers no
    /// flush: its writes' durability is the server's affair, and a volume over it does not
    /// claim flush either.
    pub flush: bool,
    /// A FUA write is durable when it completes (natively or by a flush after it).
    pub fua: bool,
    /// Discard (trim) is supported; equal to `limits.max_discard_sectors > 0`.
    pub trim: bool,
    /// How ranges are zeroed.
    pub zeroing: Zeroing,
    /// A zeroing that must be fast (`Zeroes::fast_only`) can succeed.
    pub fast_zero: bool,
    /// [`BlockDevice::allocation`](crate::BlockDevice::allocation) knows holes from data (otherwise it calls everything
    /// data).
    pub allocation: bool,
    /// The medium seeks (a disk with heads).
    pub rotational: bool,
    /// Writes may sit in a volatile cache until a flush.
    pub write_cache: bool,
}

impl Default for Caps {
    /// What a device has unless it says otherwise: flush, FUA and trim, zeroes written as
    /// data, no allocation queries, not rotational, a volatile write cache.
    fn default() -> Self {
        Self {
            flush: true,
            fua: true,
            trim: true,
            zeroing: Zeroing::Emulated,
            fast_zero: false,
            allocation: false,
            rotational: false,
            write_cache: true,
        }
    }
}

impl Caps {
    /// What a volume over devices with `parts` has: each capability only if all have it
    /// (rotational if any is, a write cache if any has one).
    #[must_use]
    pub fn stack(parts: impl IntoIterator<Item = Caps>) -> Self {
        let mut all = Self {
            rotational: false,
            write_cache: false,
            zeroing: Zeroing::Native,
            fast_zero: true,
            allocation: true,
            ..Self::default()
        };
        for c in parts {
            all.flush &= c.flush;
            all.fua &= c.fua;
            all.trim &= c.trim;
            if c.zeroing == Zeroing::Emulated {
                all.zeroing = Zeroing::Emulated;
            }
            all.fast_zero &= c.fast_zero;
            all.allocation &= c.allocation;
            all.rotational |= c.rotational;
            all.write_cache |= c.write_cache;
        }
        all
    }
}

/// What a device is: its size, limits, identity and capabilities. Sizes in 512-byte
/// sectors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// A name for messages (a path, `mem0`, `volume`).
    pub name: String,
    /// Size in sectors.
    pub sectors: u64,
    /// The device's limits (Linux's meaning).
    pub limits: Limits,
    /// Vendor / model / revision, for quirk matching.
    pub identity: Identity,
    /// Refuses writes, flushes and discards.
    pub read_only: bool,
    /// What it can do. `caps.trim` is kept equal to `limits.max_discard_sectors > 0` (one
    /// meaning for 0 there: no discard); set both with [`DeviceInfo::set_discard`](crate::DeviceInfo::set_discard).
    pub caps: Caps,
    /// The physical device the data lives on, where known: a block device's own device
    /// number, or for a file the number of the device its filesystem is on (`st_rdev` /
    /// `st_dev`). A volume puts components with the same `media` behind one tagged queue
    /// ([`crate::Queue::group`]): they compete for one disk.
    pub media: Option<u64>,
    /// Bytes at the end of the device past its last whole block, which are never read or
    /// written: a file or an NBD export whose size is not a whole number of blocks (a
    /// 1,000,000-byte file is 1,953 sectors and 64 bytes). 0 for most devices.
    pub unused_tail_bytes: u64,
}

impl DeviceInfo {
    /// A writable device of `sectors` sectors with default limits, discard supported with
    /// no per-request cap (`max_discard_sectors` = `u32::MAX`).
    #[must_use]
    pub fn new(name: impl Into<String>, sectors: u64) -> Self {
        let mut limits = Limits::default();
        limits.max_discard_sectors = u32::MAX;
        Self {
            name: name.into(),
            sectors,
            limits,
            identity: Identity::default(),
            read_only: false,
            caps: Caps::default(),
            media: None,
            unused_tail_bytes: 0,
        }
    }

    /// Says whether discard is supported, keeping `caps.trim` and
    /// `limits.max_discard_sectors` in agreement (0 sectors: none; on, a cap already set is
    /// kept, else none is set).
    ///
    /// ```
    /// let mut i = tagstripe::DeviceInfo::new("d", 1024);
    /// i.set_discard(false);
    /// assert!(!i.caps.trim);
    /// assert_eq!(i.limits.max_discard_sectors, 0);
    /// ```
    pub fn set_discard(&mut self, on: bool) {
        self.caps.trim = on;
        self.limits.max_discard_sectors = match (on, self.limits.max_discard_sectors) {
            (false, _) => 0,
            (true, 0) => u32::MAX,
            (true, n) => n,
        };
    }

    /// Size in bytes.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.sectors.saturating_mul(512)
    }

    /// Sets the size from what the device holds, `bytes`, in whole logical blocks (set
    /// `limits.logical_block_size` first): a part block at the end goes to
    /// [`unused_tail_bytes`](Self::unused_tail_bytes), as no request can reach it.
    ///
    /// ```
    /// use tagstripe::DeviceInfo;
    /// let mut info = DeviceInfo::new("odd", 0);
    /// info.limits.logical_block_size = 4096;
    /// info.set_size_bytes(1_000_000);
    /// assert_eq!((info.sectors, info.unused_tail_bytes), (1952, 576));
    /// ```
    pub fn set_size_bytes(&mut self, bytes: u64) {
        let block = u64::from(self.limits.logical_block_size.max(512));
        self.sectors = bytes / block * block / 512;
        self.unused_tail_bytes = bytes % block;
    }

    /// Checks that `[start, start + sectors)` is inside the device and made of whole logical
    /// blocks, and not empty.
    ///
    /// # Errors
    /// [`Error::Overflow`](crate::Error::Overflow), [`Error::OutOfRange`](crate::Error::OutOfRange), [`Error::Misaligned`](crate::Error::Misaligned) or
    /// [`Error::BadLength`](crate::Error::BadLength) for zero sectors.
    pub fn check(&self, start: u64, sectors: u64) -> Result<()> {
        // Every layer checks every request: the common case in a few instructions (a mask,
        // not two divisions, for a logical block of a power of two sectors), the error's
        // detail on the cold path.
        let lbs = self.limits.lbs_sectors();
        let aligned = if lbs.is_power_of_two() {
            (start | sectors) & (lbs - 1) == 0
        } else {
            start % lbs == 0 && sectors % lbs == 0
        };
        let inside = start
            .checked_add(sectors)
            .is_some_and(|end| end <= self.sectors);
        if sectors != 0 && inside && aligned {
            return Ok(());
        }
        Err(self.refusal(start, sectors))
    }

    /// Why [`check`](Self::check) refused `[start, start + sectors)`.
    #[cold]
    fn refusal(&self, start: u64, sectors: u64) -> Error {
        let device = self.name.clone();
        if sectors == 0 {
            return Error::BadLength {
                device,
                what: "zero-length request".to_owned(),
            };
        }
        if start.checked_add(sectors).is_none() {
            return Error::Overflow {
                device,
                start,
                sectors,
            };
        }
        if start + sectors > self.sectors {
            return Error::OutOfRange {
                device,
                start,
                sectors,
                size: self.sectors,
            };
        }
        Error::Misaligned {
            device,
            start,
            sectors,
            lbs: self.limits.lbs_sectors(),
        }
    }

    /// Checks a write: writable, whole sectors, in range.
    ///
    /// # Errors
    /// As [`DeviceInfo::check`](crate::DeviceInfo::check), and [`Error::ReadOnly`](crate::Error::ReadOnly) / [`Error::BadLength`](crate::Error::BadLength).
    pub fn check_write(&self, start: u64, len: usize) -> Result<u64> {
        if self.read_only {
            return Err(Error::ReadOnly {
                device: self.name.clone(),
            });
        }
        if len % 512 != 0 {
            return Err(Error::BadLength {
                device: self.name.clone(),
                what: format!("{len} bytes is not a whole number of sectors"),
            });
        }
        let sectors = len as u64 / 512;
        self.check(start, sectors)?;
        Ok(sectors)
    }
}

impl DeviceInfo {
    /// Checks a discard: writable, supported, in range.
    ///
    /// # Errors
    /// As [`DeviceInfo::check`](crate::DeviceInfo::check), and [`Error::ReadOnly`](crate::Error::ReadOnly) / [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn check_discard(&self, start: u64, sectors: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly {
                device: self.name.clone(),
            });
        }
        if !self.caps.trim {
            return Err(Error::Unsupported {
                device: self.name.clone(),
                op: "discard",
            });
        }
        self.check(start, sectors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(info: &DeviceInfo, start: u64, sectors: u64) -> &'static str {
        match info.check(start, sectors) {
            Ok(()) => "ok",
            Err(Error::BadLength { .. }) => "empty",
            Err(Error::Overflow { .. }) => "overflow",
            Err(Error::OutOfRange { .. }) => "range",
            Err(Error::Misaligned { lbs, .. }) => {
                assert_eq!(lbs, info.limits.lbs_sectors());
                "misaligned"
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn a_check_names_the_first_thing_wrong_with_a_range_for_any_logical_block() {
        // 4 KiB blocks (a mask), 1.5 KiB blocks (a division), 512-byte sectors.
        for (lbs_bytes, lbs) in [(4096u32, 8u64), (1536, 3), (512, 1)] {
            let mut info = DeviceInfo::new("d", 96);
            info.limits.logical_block_size = lbs_bytes;
            assert_eq!(refused(&info, 0, lbs), "ok");
            assert_eq!(refused(&info, 96 - lbs, lbs), "ok", "the last block");
            assert_eq!(refused(&info, 0, 96), "ok", "the whole device");
            assert_eq!(refused(&info, 0, 0), "empty");
            assert_eq!(refused(&info, 1, 0), "empty", "empty before misaligned");
            assert_eq!(refused(&info, u64::MAX, 2), "overflow");
            assert_eq!(refused(&info, 96, lbs), "range");
            assert_eq!(
                refused(&info, 95, 2),
                "range",
                "out of range before misaligned"
            );
            if lbs > 1 {
                assert_eq!(refused(&info, 1, lbs), "misaligned");
                assert_eq!(refused(&info, 0, lbs + 1), "misaligned");
                assert_eq!(refused(&info, lbs, 2 * lbs - 1), "misaligned");
            }
        }
    }
}
