//! What a quirk row or an override sets, and how that changes a device's limits.

use crate::limits::min_nz;
use crate::{Error, Limits, Location};

/// The values a quirk row, a TOML entry or a force-string entry sets. `None` leaves the
/// value to the layer below; a later layer's `Some` wins.
///
/// Keys, as written in force strings and TOML files (case-insensitive in force strings):
///
/// | key | effect |
/// |---|---|
/// | `max_sec=N` | hardware cap in sectors (libata `MAX_SEC`, scsi `BLIST_MAX_*`) |
/// | `max_sectors_kb=N` | the soft cap, as sysfs `max_sectors_kb` |
/// | `mod15write` / `nomod15write` | the drive has sata_sil's mod-15 write erratum |
/// | `max_tags=N`, `min_tags=N` | CAM's maxtags / mintags |
/// | `ncq` / `noncq` | tagged queueing on / off (off = one command at a time) |
/// | `fua` / `nofua` | forced unit access usable |
/// | `trim` / `notrim`, `max_trim=N` | discard support, discard cap in sectors |
/// | `wcache` / `nowcache` | use the write cache (off: every write is FUA) |
/// | `write_zeroes` / `nowrite_zeroes` | write-zeroes support |
/// | `chunk=N` | I/O boundary in sectors (NVMe stripe size, NOIOB) |
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// Hardware cap on sectors per command.
    pub max_sec: Option<u32>,
    /// The soft cap in KiB.
    pub max_sectors_kb: Option<u32>,
    /// sata_sil's MOD15WRITE erratum.
    pub mod15write: Option<bool>,
    /// Most tags.
    pub max_tags: Option<u32>,
    /// Floor of tag openings after QUEUE FULL.
    pub min_tags: Option<u32>,
    /// Tagged queueing allowed.
    pub ncq: Option<bool>,
    /// FUA usable.
    pub fua: Option<bool>,
    /// Discard supported.
    pub trim: Option<bool>,
    /// Discard cap in sectors.
    pub max_trim: Option<u32>,
    /// Write cache in use.
    pub wcache: Option<bool>,
    /// Write zeroes supported.
    pub write_zeroes: Option<bool>,
    /// I/O boundary in sectors.
    pub chunk: Option<u32>,
}

/// The keys [`Settings::set`] knows, for messages and listings.
pub const KEYS: &[&str] = &[
    "max_sec",
    "max_sectors_kb",
    "mod15write",
    "max_tags",
    "min_tags",
    "ncq",
    "fua",
    "trim",
    "max_trim",
    "wcache",
    "write_zeroes",
    "chunk",
];

impl Settings {
    /// Sets one key from its textual form: `key=value` for numbers, `key` / `nokey` for
    /// flags.
    ///
    /// ```
    /// use tagstripe_quirks::{Location, Settings};
    /// let mut s = Settings::default();
    /// s.set("max_sec", Some("15"), &Location::Offset(0))?;
    /// s.set("noncq", None, &Location::Offset(0))?;
    /// assert_eq!(s.max_sec, Some(15));
    /// assert_eq!(s.ncq, Some(false));
    /// assert!(s.set("max_secs", Some("15"), &Location::Offset(0)).is_err());
    /// # Ok::<(), tagstripe_quirks::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownKey`] or [`Error::BadValue`] (a flag given a value, a number missing,
    /// zero or not a number), naming `at`.
    pub fn set(&mut self, key: &str, value: Option<&str>, at: &Location) -> Result<(), Error> {
        let key_lc = key.to_ascii_lowercase();
        let bad = |reason| Error::BadValue {
            key: key.to_owned(),
            value: value.unwrap_or("").to_owned(),
            reason,
            at: at.clone(),
        };
        let number = |v: Option<&str>| -> Result<u32, Error> {
            let v = v.ok_or_else(|| bad("a number is required"))?;
            match v.trim().parse::<u32>() {
                Ok(0) => Err(bad("must be at least 1")),
                Ok(n) => Ok(n),
                Err(_) => Err(bad("not a whole number below 2^32")),
            }
        };
        let slot: &mut Option<u32> = match key_lc.as_str() {
            "max_sec" => &mut self.max_sec,
            "max_sectors_kb" => &mut self.max_sectors_kb,
            "max_tags" => &mut self.max_tags,
            "min_tags" => &mut self.min_tags,
            "max_trim" => &mut self.max_trim,
            "chunk" => &mut self.chunk,
            _ => {
                let (name, on) = match key_lc.strip_prefix("no") {
                    Some(rest) if flag_slot(self, rest).is_some() => (rest, false),
                    _ => (key_lc.as_str(), true),
                };
                let Some(flag) = flag_slot(self, name) else {
                    return Err(Error::UnknownKey {
                        key: key.to_owned(),
                        at: at.clone(),
                    });
                };
                let on = match value {
                    None => on,
                    Some(v) => match (v.trim(), on) {
                        ("1" | "true" | "on", true) => true,
                        ("0" | "false" | "off", true) => false,
                        _ => return Err(bad("a flag takes no value (or 0/1 without no-)")),
                    },
                };
                *flag = Some(on);
                return Ok(());
            }
        };
        *slot = Some(number(value)?);
        Ok(())
    }

    /// Lays `other` over `self`: every value `other` sets wins.
    pub fn merge(&mut self, other: &Settings) {
        macro_rules! over {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f; } )* };
        }
        over!(
            max_sec,
            max_sectors_kb,
            mod15write,
            max_tags,
            min_tags,
            ncq,
            fua,
            trim,
            max_trim,
            wcache,
            write_zeroes,
            chunk
        );
    }

    /// Whether nothing is set (a row that matches and changes nothing, like libata's
    /// exclusion rows).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Settings::default()
    }

    /// The settings in force-string form, e.g. `max_sec=15,mod15write`.
    #[must_use]
    pub fn to_force_string(&self) -> String {
        let mut out = Vec::new();
        let num = |out: &mut Vec<String>, k: &str, v: Option<u32>| {
            if let Some(v) = v {
                out.push(format!("{k}={v}"));
            }
        };
        let flag = |out: &mut Vec<String>, k: &str, v: Option<bool>| match v {
            Some(true) => out.push(k.to_owned()),
            Some(false) => out.push(format!("no{k}")),
            None => {}
        };
        num(&mut out, "max_sec", self.max_sec);
        num(&mut out, "max_sectors_kb", self.max_sectors_kb);
        flag(&mut out, "mod15write", self.mod15write);
        num(&mut out, "max_tags", self.max_tags);
        num(&mut out, "min_tags", self.min_tags);
        flag(&mut out, "ncq", self.ncq);
        flag(&mut out, "fua", self.fua);
        flag(&mut out, "trim", self.trim);
        num(&mut out, "max_trim", self.max_trim);
        flag(&mut out, "wcache", self.wcache);
        flag(&mut out, "write_zeroes", self.write_zeroes);
        num(&mut out, "chunk", self.chunk);
        out.join(",")
    }

    /// Applies the settings to a device's hardware limits.
    ///
    /// Caps only ever lower a limit: a value above the hardware's is clamped to it and
    /// reported as a [`Warning`], as Linux clamps `max_sectors_kb`.
    ///
    /// ```
    /// use tagstripe_quirks::{Limits, Settings, Location};
    /// let mut hw = Limits::default();
    /// hw.max_hw_sectors = 2560;
    /// hw.max_tags = 32;
    /// let mut s = Settings::default();
    /// s.set("max_sec", Some("15"), &Location::Offset(0))?;
    /// s.set("max_tags", Some("64"), &Location::Offset(0))?;
    /// let p = s.apply(&hw)?;
    /// assert_eq!(p.limits.max_hw_sectors, 15);
    /// assert_eq!(p.limits.max_tags, 32);
    /// assert_eq!(p.warnings.len(), 1); // max_tags 64 clamped to 32
    /// # Ok::<(), tagstripe_quirks::Error>(())
    /// ```
    ///
    /// # Errors
    /// Any [`Limits::validate`] error of the hardware limits or of the result (for example a
    /// `max_sec` below one page on a 4 KiB-sector device).
    pub fn apply(&self, hw: &Limits) -> Result<Applied, Error> {
        let mut l = hw.validate()?;
        let mut warnings = Vec::new();
        let mut cap = |key: &'static str, asked: u32, limit: u32| -> u32 {
            if limit != 0 && asked > limit {
                warnings.push(Warning::Clamped { key, asked, limit });
                limit
            } else {
                asked
            }
        };
        if let Some(v) = self.max_sec {
            l.max_hw_sectors = cap("max_sec", v, l.max_hw_sectors);
        }
        if let Some(kb) = self.max_sectors_kb {
            let sectors = kb.saturating_mul(2);
            l.max_user_sectors = cap("max_sectors_kb", sectors, l.max_hw_sectors);
        }
        if let Some(v) = self.max_tags {
            l.max_tags = cap("max_tags", v, l.max_tags);
        }
        if let Some(v) = self.min_tags {
            l.min_tags = cap("min_tags", v, l.max_tags);
        }
        if self.ncq == Some(false) {
            l.max_tags = 1;
            l.min_tags = 1;
        }
        if self.trim == Some(false) {
            l.max_discard_sectors = 0;
        }
        if let Some(v) = self.max_trim {
            l.max_discard_sectors = min_nz(l.max_discard_sectors, v).min(l.max_discard_sectors);
        }
        if self.write_zeroes == Some(false) {
            l.max_write_zeroes_sectors = 0;
        }
        if let Some(v) = self.chunk {
            l.chunk_sectors = v;
        }
        l.min_tags = l.min_tags.min(l.max_tags);
        Ok(Applied {
            limits: l.validate()?,
            mod15write: self.mod15write.unwrap_or(false),
            fua: self.fua.unwrap_or(true),
            write_cache: self.wcache.unwrap_or(true),
            warnings,
        })
    }
}

fn flag_slot<'a>(s: &'a mut Settings, name: &str) -> Option<&'a mut Option<bool>> {
    Some(match name {
        "mod15write" => &mut s.mod15write,
        "ncq" => &mut s.ncq,
        "fua" => &mut s.fua,
        "trim" => &mut s.trim,
        "wcache" => &mut s.wcache,
        "write_zeroes" => &mut s.write_zeroes,
        _ => return None,
    })
}

/// Settings applied to a device: its effective limits and features.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The effective, validated limits.
    pub limits: Limits,
    /// The drive has the mod-15 write erratum: the splitter's mod-15 policy applies.
    pub mod15write: bool,
    /// FUA may be used.
    pub fua: bool,
    /// The write cache may be used (off: writes go FUA).
    pub write_cache: bool,
    /// Values that were clamped to the hardware's.
    pub warnings: Vec<Warning>,
}

/// Something an override asked for that could not be honoured as given.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// A cap above the hardware's limit, clamped to it.
    Clamped {
        /// The key.
        key: &'static str,
        /// What was asked.
        asked: u32,
        /// What was used.
        limit: u32,
    },
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Clamped { key, asked, limit } => {
                write!(
                    f,
                    "{key}={asked} is above the hardware limit; clamped to {limit}"
                )
            }
        }
    }
}
