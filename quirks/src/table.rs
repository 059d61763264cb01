//! The quirk table: built-in rows from real kernels, a TOML file, and a force string, laid
//! over each other in that order.

use std::sync::OnceLock;

use crate::{Applied, Error, Limits, Location, MatchKind, Pattern, Settings};

/// A device's identity strings, as INQUIRY / IDENTIFY report them, with padding trimmed.
///
/// ATA has no vendor field (Linux reports `ATA`), so ATA rows match any vendor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Vendor (SCSI INQUIRY vendor, NVMe/PCI vendor id).
    pub vendor: String,
    /// Model (product).
    pub model: String,
    /// Firmware revision.
    pub revision: String,
}

impl Identity {
    /// Builds an identity, trimming blanks as the kernels do.
    ///
    /// ```
    /// use tagstripe_quirks::Identity;
    /// let id = Identity::new("ATA     ", "ST380023AS      ", "3.01");
    /// assert_eq!(id.model, "ST380023AS");
    /// ```
    #[must_use]
    pub fn new(vendor: &str, model: &str, revision: &str) -> Self {
        Self {
            vendor: vendor.trim().to_owned(),
            model: model.trim().to_owned(),
            revision: revision.trim().to_owned(),
        }
    }

    /// Parses `VENDOR|MODEL|REV` (missing trailing fields are empty); bytes that are not
    /// UTF-8 in the original identity should be replaced before calling.
    ///
    /// ```
    /// use tagstripe_quirks::Identity;
    /// let id = Identity::parse("SEAGATE|ST34520N|1444");
    /// assert_eq!((id.vendor.as_str(), id.model.as_str(), id.revision.as_str()), ("SEAGATE", "ST34520N", "1444"));
    /// ```
    #[must_use]
    pub fn parse(s: &str) -> Self {
        let mut it = s.splitn(3, '|');
        let vendor = it.next().unwrap_or("");
        let model = it.next().unwrap_or("");
        let revision = it.next().unwrap_or("");
        Self::new(vendor, model, revision)
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}|{}|{}", self.vendor, self.model, self.revision)
    }
}

/// One row: which devices it matches, what it sets, and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuirkRow {
    /// Vendor pattern.
    pub vendor: Pattern,
    /// Model pattern.
    pub model: Pattern,
    /// Revision pattern.
    pub revision: Pattern,
    /// What the row sets.
    pub settings: Settings,
    /// The kernel's own flag names for the row (for reference).
    pub flags: String,
    /// Whether the row is matched. Historical rows and opt-in module parameters (sata_sil's
    /// `slow_down`) are kept with their sources but not matched.
    pub enabled: bool,
    /// Where the row comes from (kernel file and table, or the override's origin).
    pub source: String,
    /// Why the row exists.
    pub note: String,
    /// Where the row was read from.
    pub location: Location,
}

impl QuirkRow {
    /// Whether the row matches the device.
    #[must_use]
    pub fn matches(&self, id: &Identity) -> bool {
        self.vendor.matches(&id.vendor)
            && self.model.matches(&id.model)
            && self.revision.matches(&id.revision)
    }
}

/// The layer an applied rule came from, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    /// The table compiled into the library.
    Builtin,
    /// A TOML file.
    File,
    /// A force string.
    Force,
}

impl Layer {
    /// `"builtin"`, `"file"` or `"force"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Builtin => "builtin",
            Self::File => "file",
            Self::Force => "force",
        }
    }
}

/// A rule that applied to a device, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// Which layer.
    pub layer: Layer,
    /// The row (or force entry) that matched.
    pub row: QuirkRow,
}

/// The outcome of matching a device: the merged settings, and every rule that contributed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The identity matched.
    pub identity: Identity,
    /// All layers merged, later layers winning.
    pub settings: Settings,
    /// The rules that applied, lowest layer first.
    pub matches: Vec<Match>,
}

/// An ordered list of rows; within one table the first matching row wins, as in libata and
/// CAM.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuirkTable {
    rows: Vec<QuirkRow>,
}

/// The built-in table's source text: rows from Linux libata, sata_sil, scsi_devinfo, NVMe and
/// FreeBSD CAM, each with its source.
pub const BUILTIN_TSV: &str = include_str!("../data/builtin.tsv");

impl QuirkTable {
    /// The rows.
    #[must_use]
    pub fn rows(&self) -> &[QuirkRow] {
        &self.rows
    }

    /// The table compiled into the library (parsed once).
    ///
    /// ```
    /// use tagstripe_quirks::{Identity, QuirkTable};
    /// let t = QuirkTable::builtin();
    /// let row = t.first_match(&Identity::new("ATA", "ST380023AS", "3.01")).unwrap();
    /// assert_eq!(row.settings.mod15write, Some(true));
    /// assert!(row.source.contains("sata_sil"));
    /// ```
    #[must_use]
    pub fn builtin() -> &'static QuirkTable {
        static TABLE: OnceLock<QuirkTable> = OnceLock::new();
        TABLE.get_or_init(|| {
            // The built-in text is part of the crate and a test parses it; a failure here
            // is a build defect, not an input error.
            QuirkTable::from_tsv(BUILTIN_TSV, "builtin.tsv").expect("built-in quirk table parses")
        })
    }

    /// Parses a table in the built-in format: tab-separated columns `source`, `match`
    /// (glob/exact/prefix, or `VENDOR_KIND/MODEL_KIND` such as `exact/prefix`), `vendor`, `model`, `revision` (empty = any), `settings`
    /// (force-string syntax), `flags`, `enabled` (yes/no), `note`; `#` starts a comment line.
    ///
    /// # Errors
    /// [`Error::Malformed`], [`Error::BadPattern`], [`Error::UnknownKey`] or
    /// [`Error::BadValue`] naming the line.
    pub fn from_tsv(text: &str, input: &str) -> Result<Self, Error> {
        let mut rows = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let at = Location::Line {
                input: input.to_owned(),
                line: i + 1,
            };
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let cols: Vec<&str> = line.split('\t').collect();
            let [
                source,
                kind,
                vendor,
                model,
                revision,
                settings,
                flags,
                enabled,
                note,
            ] = cols[..]
            else {
                return Err(Error::Malformed {
                    reason: format!("expected 9 tab-separated columns, found {}", cols.len()),
                    at,
                });
            };
            let (vendor_kind, model_kind) = kind.split_once('/').unwrap_or((kind, kind));
            let parse_kind = |k: &str| {
                MatchKind::parse(k).ok_or_else(|| Error::Malformed {
                    reason: format!("match kind {k:?} is not glob, exact or prefix"),
                    at: at.clone(),
                })
            };
            let (vendor_kind, model_kind) = (parse_kind(vendor_kind)?, parse_kind(model_kind)?);
            let enabled = match enabled {
                "yes" => true,
                "no" => false,
                other => {
                    return Err(Error::Malformed {
                        reason: format!("enabled must be yes or no, not {other:?}"),
                        at,
                    });
                }
            };
            rows.push(QuirkRow {
                vendor: pattern(vendor, vendor_kind)?,
                model: pattern(model, model_kind)?,
                revision: pattern(revision, MatchKind::Glob)?,
                settings: parse_settings(settings, &at)?,
                flags: flags.to_owned(),
                enabled,
                source: source.to_owned(),
                note: note.to_owned(),
                location: at,
            });
        }
        Ok(Self { rows })
    }

    /// Parses a TOML file of `[[quirk]]` entries:
    ///
    /// ```toml
    /// [[quirk]]
    /// vendor = "ATA"          # optional, default any
    /// model = "ST380023AS"    # optional, default any
    /// revision = "3.*"        # optional, default any
    /// match = "glob"          # glob (default), exact or prefix
    /// source = "lab notes"    # optional
    /// max_sec = 15
    /// mod15write = true
    /// ```
    ///
    /// Every key of [`Settings`] may appear with its value (numbers, or booleans for
    /// flags). Unknown keys and bad values are errors naming the line.
    ///
    /// ```
    /// use tagstripe_quirks::{Identity, QuirkTable};
    /// let t = QuirkTable::from_toml("[[quirk]]\nmodel = \"ST3*\"\nmax_tags = 8\n", "site.toml")?;
    /// let row = t.first_match(&Identity::new("", "ST380023AS", "")).unwrap();
    /// assert_eq!(row.settings.max_tags, Some(8));
    /// # Ok::<(), tagstripe_quirks::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Malformed`] (TOML syntax, a key that is not a quirk key, a value of the wrong
    /// type), [`Error::BadPattern`] or [`Error::BadValue`], each naming the line.
    pub fn from_toml(text: &str, input: &str) -> Result<Self, Error> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let at = |offset: usize| Location::Line {
            input: input.to_owned(),
            line: line_of(offset),
        };
        let doc: toml::Table = toml::from_str(text).map_err(|e| Error::Malformed {
            reason: e.message().to_owned(),
            at: at(e.span().map_or(0, |s| s.start)),
        })?;
        // Line ranges of the `[[quirk]]` entries, so errors name the entry's own lines.
        let lines: Vec<&str> = text.lines().collect();
        let headers: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with("[["))
            .map(|(i, _)| i)
            .collect();
        let mut rows = Vec::new();
        for (key, value) in &doc {
            if key != "quirk" {
                return Err(Error::Malformed {
                    reason: format!("unknown table {key:?}: expected [[quirk]] entries"),
                    at: at(0),
                });
            }
            let toml::Value::Array(entries) = value else {
                return Err(Error::Malformed {
                    reason: "quirk must be an array of tables ([[quirk]])".to_owned(),
                    at: at(0),
                });
            };
            for (n, entry) in entries.iter().enumerate() {
                let range = match (headers.get(n), headers.len() == entries.len()) {
                    (Some(&first), true) => {
                        first..headers.get(n + 1).copied().unwrap_or(lines.len())
                    }
                    _ => 0..lines.len(),
                };
                rows.push(toml_row(entry, &lines, range, input)?);
            }
        }
        Ok(Self { rows })
    }

    /// The first enabled row that matches the device.
    #[must_use]
    pub fn first_match(&self, id: &Identity) -> Option<&QuirkRow> {
        self.rows.iter().find(|r| r.enabled && r.matches(id))
    }
}

fn pattern(text: &str, kind: MatchKind) -> Result<Pattern, Error> {
    if text.is_empty() {
        Ok(Pattern::any())
    } else {
        Pattern::new(text, kind)
    }
}

/// Parses `key=value,flag,...` (an empty string sets nothing).
fn parse_settings(text: &str, at: &Location) -> Result<Settings, Error> {
    let mut s = Settings::default();
    for item in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (item, None),
        };
        s.set(key, value, at)?;
    }
    Ok(s)
}

/// One `[[quirk]]` entry, whose text is `lines[range]`. Plain TOML values carry no spans, so
/// the line named for a key is found by searching the entry's own lines.
fn toml_row(
    entry: &toml::Value,
    lines: &[&str],
    range: std::ops::Range<usize>,
    input: &str,
) -> Result<QuirkRow, Error> {
    let toml::Value::Table(table) = entry else {
        return Err(Error::Malformed {
            reason: "each [[quirk]] must be a table".to_owned(),
            at: Location::Line {
                input: input.to_owned(),
                line: 1,
            },
        });
    };
    let line_of_key = |key: &str| {
        let start = range.start;
        lines[range.clone()]
            .iter()
            .position(|l| {
                let l = l.trim_start();
                l.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
            .map_or(start + 1, |i| start + i + 1)
    };
    let at_key = |key: &str| Location::Line {
        input: input.to_owned(),
        line: line_of_key(key),
    };
    let string = |key: &str| -> Result<Option<String>, Error> {
        match table.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Error::Malformed {
                reason: format!("{key} must be a string"),
                at: at_key(key),
            }),
        }
    };
    let kind = match string("match")? {
        None => MatchKind::Glob,
        Some(k) => MatchKind::parse(&k).ok_or_else(|| Error::Malformed {
            reason: format!("match kind {k:?} is not glob, exact or prefix"),
            at: at_key("match"),
        })?,
    };
    let mut settings = Settings::default();
    for (key, value) in table {
        let at = at_key(key);
        match key.as_str() {
            "vendor" | "model" | "revision" | "match" | "source" | "note" => continue,
            _ => {}
        }
        let text_value = match value {
            toml::Value::Integer(n) => {
                if *n < 0 {
                    return Err(Error::BadValue {
                        key: key.clone(),
                        value: n.to_string(),
                        reason: "must not be negative",
                        at,
                    });
                }
                n.to_string()
            }
            toml::Value::Boolean(b) => if *b { "1" } else { "0" }.to_owned(),
            other => {
                return Err(Error::BadValue {
                    key: key.clone(),
                    value: other.to_string(),
                    reason: "expected a number or a boolean",
                    at,
                });
            }
        };
        let is_flag = matches!(value, toml::Value::Boolean(_));
        let is_numeric_key = matches!(
            key.as_str(),
            "max_sec" | "max_sectors_kb" | "max_tags" | "min_tags" | "max_trim" | "chunk"
        );
        if is_flag == is_numeric_key && crate::settings::KEYS.contains(&key.as_str()) {
            return Err(Error::BadValue {
                key: key.clone(),
                value: text_value,
                reason: if is_flag {
                    "expected a number"
                } else {
                    "expected true or false"
                },
                at,
            });
        }
        settings.set(key, Some(&text_value), &at)?;
    }
    let field = |key: &str, k: MatchKind| -> Result<Pattern, Error> {
        pattern(string(key)?.as_deref().unwrap_or(""), k)
    };
    Ok(QuirkRow {
        vendor: field("vendor", kind)?,
        model: field("model", kind)?,
        revision: field("revision", MatchKind::Glob)?,
        settings,
        flags: String::new(),
        enabled: true,
        source: string("source")?.unwrap_or_else(|| input.to_owned()),
        note: string("note")?.unwrap_or_default(),
        location: Location::Line {
            input: input.to_owned(),
            line: table.keys().map(|k| line_of_key(k)).min().unwrap_or(1),
        },
    })
}

/// Overrides in the style of `libata.force`: comma-separated `[ID:]VAL` entries, where ID is
/// a model glob or a `VENDOR|MODEL|REV` triple of globs, and VAL a quirk key
/// (`max_sec=15`, `noncq`, ...). An entry without ID reuses the previous entry's; the first
/// one without ID applies to every device. Every matching entry applies, later ones winning.
///
/// ```
/// use tagstripe_quirks::{ForceString, Identity};
/// let f = ForceString::parse("ST380023AS:max_sec=15,noncq,*:max_tags=16")?;
/// let s = f.settings_for(&Identity::new("ATA", "ST380023AS", ""));
/// assert_eq!((s.max_sec, s.ncq, s.max_tags), (Some(15), Some(false), Some(16)));
/// assert!(ForceString::parse("ST380023AS:max_sec=fifteen").is_err());
/// # Ok::<(), tagstripe_quirks::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForceString {
    entries: Vec<QuirkRow>,
}

impl ForceString {
    /// Parses a force string.
    ///
    /// # Errors
    /// [`Error::UnknownKey`], [`Error::BadValue`], [`Error::BadPattern`] or
    /// [`Error::Malformed`] (an empty entry or ID), naming the byte position.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut entries = Vec::new();
        let mut id: Option<(Pattern, Pattern, Pattern)> = None;
        let mut offset = 0usize;
        for raw in text.split(',') {
            let at = Location::Offset(offset);
            offset += raw.len() + 1;
            let item = raw.trim();
            if item.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(Error::Malformed {
                    reason: "empty entry".to_owned(),
                    at,
                });
            }
            let val = match item.rsplit_once(':') {
                Some((device, val)) => {
                    if device.trim().is_empty() {
                        return Err(Error::Malformed {
                            reason: "empty device before ':'".to_owned(),
                            at,
                        });
                    }
                    id = Some(device_patterns(device.trim())?);
                    val
                }
                None => item,
            };
            let mut settings = Settings::default();
            let (key, value) = match val.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (val.trim(), None),
            };
            settings.set(key, value, &at)?;
            let (vendor, model, revision) = id
                .clone()
                .unwrap_or_else(|| (Pattern::any(), Pattern::any(), Pattern::any()));
            entries.push(QuirkRow {
                vendor,
                model,
                revision,
                settings,
                flags: String::new(),
                enabled: true,
                source: format!("force string at byte {}", offset - raw.len() - 1),
                note: item.to_owned(),
                location: at,
            });
        }
        Ok(Self { entries })
    }

    /// The entries, one per key set.
    #[must_use]
    pub fn entries(&self) -> &[QuirkRow] {
        &self.entries
    }

    /// The settings every matching entry sets, in order.
    #[must_use]
    pub fn settings_for(&self, id: &Identity) -> Settings {
        let mut s = Settings::default();
        for e in self.entries.iter().filter(|e| e.matches(id)) {
            s.merge(&e.settings);
        }
        s
    }
}

fn device_patterns(device: &str) -> Result<(Pattern, Pattern, Pattern), Error> {
    let parts: Vec<&str> = device.split('|').collect();
    let glob = |s: &str| pattern(s.trim(), MatchKind::Glob);
    match parts[..] {
        [model] => Ok((Pattern::any(), glob(model)?, Pattern::any())),
        [vendor, model] => Ok((glob(vendor)?, glob(model)?, Pattern::any())),
        [vendor, model, rev] => Ok((glob(vendor)?, glob(model)?, glob(rev)?)),
        _ => Err(Error::BadPattern {
            pattern: device.to_owned(),
            position: 0,
            reason: "expected MODEL or VENDOR|MODEL|REV",
        }),
    }
}

/// The three override layers together: built-in table < TOML file < force string.
///
/// ```
/// use tagstripe_quirks::{Identity, Limits, QuirkSet};
/// let set = QuirkSet::builtin().with_force("ST380023AS:max_tags=4")?;
/// let id = Identity::new("ATA", "ST380023AS", "3.01");
/// let resolved = set.resolve(&id);
/// assert_eq!(resolved.settings.mod15write, Some(true)); // built-in sata_sil row
/// assert_eq!(resolved.settings.max_tags, Some(4)); // force string
/// let applied = set.apply(&id, &Limits::default())?;
/// assert!(applied.mod15write);
/// assert_eq!(applied.limits.max_tags, 4);
/// # Ok::<(), tagstripe_quirks::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct QuirkSet {
    builtin: Option<&'static QuirkTable>,
    file: QuirkTable,
    force: ForceString,
}

impl QuirkSet {
    /// The built-in table with no overrides.
    #[must_use]
    pub fn builtin() -> Self {
        Self {
            builtin: Some(QuirkTable::builtin()),
            ..Self::default()
        }
    }

    /// No rows at all (for devices whose limits are known exactly).
    #[must_use]
    pub fn empty() -> Self {
        Self::default()
    }

    /// Adds a TOML file's rows (replacing any earlier file).
    ///
    /// # Errors
    /// As [`QuirkTable::from_toml`].
    pub fn with_file(mut self, toml_text: &str, input: &str) -> Result<Self, Error> {
        self.file = QuirkTable::from_toml(toml_text, input)?;
        Ok(self)
    }

    /// Adds a force string (replacing any earlier one).
    ///
    /// # Errors
    /// As [`ForceString::parse`].
    pub fn with_force(mut self, force: &str) -> Result<Self, Error> {
        self.force = ForceString::parse(force)?;
        Ok(self)
    }

    /// The built-in table in use, if any.
    #[must_use]
    pub fn builtin_table(&self) -> Option<&QuirkTable> {
        self.builtin
    }

    /// The file layer.
    #[must_use]
    pub fn file_table(&self) -> &QuirkTable {
        &self.file
    }

    /// The force layer.
    #[must_use]
    pub fn force(&self) -> &ForceString {
        &self.force
    }

    /// Matches a device against every layer: the first matching row of the built-in table,
    /// then of the file, then every matching force entry.
    #[must_use]
    pub fn resolve(&self, id: &Identity) -> Resolved {
        let mut settings = Settings::default();
        let mut matches = Vec::new();
        let tables = [
            (Layer::Builtin, self.builtin),
            (Layer::File, Some(&self.file)),
        ];
        for (layer, table) in tables {
            if let Some(row) = table.and_then(|t| t.first_match(id)) {
                settings.merge(&row.settings);
                matches.push(Match {
                    layer,
                    row: row.clone(),
                });
            }
        }
        for e in self.force.entries().iter().filter(|e| e.matches(id)) {
            settings.merge(&e.settings);
            matches.push(Match {
                layer: Layer::Force,
                row: e.clone(),
            });
        }
        Resolved {
            identity: id.clone(),
            settings,
            matches,
        }
    }

    /// Resolves the device and applies the result to its hardware limits.
    ///
    /// # Errors
    /// As [`Settings::apply`].
    pub fn apply(&self, id: &Identity, hw: &Limits) -> Result<Applied, Error> {
        self.resolve(id).settings.apply(hw)
    }
}
