//! Device-string patterns: shell globs as libata's `glob_match` and CAM's `cam_strmatch`
//! take them, plus the exact and prefix matches of sata_sil, NVMe and scsi_devinfo.

use crate::Error;

/// How a row's patterns are compared with a device's identity strings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatchKind {
    /// Shell glob over the whole string: `*`, `?`, `[a-z]`, `[!x]` or `[^x]`, `\` escapes
    /// (libata, FreeBSD CAM).
    #[default]
    Glob,
    /// The whole string, byte for byte (sata_sil's `strcmp`, NVMe).
    Exact,
    /// The pattern is a prefix of the string (scsi_devinfo models, sata_sil in 2005).
    Prefix,
}

impl MatchKind {
    /// `"glob"`, `"exact"` or `"prefix"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Glob => "glob",
            Self::Exact => "exact",
            Self::Prefix => "prefix",
        }
    }

    /// Parses a name as [`MatchKind::name`] gives it.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "glob" => Some(Self::Glob),
            "exact" => Some(Self::Exact),
            "prefix" => Some(Self::Prefix),
            _ => None,
        }
    }
}

/// A validated pattern for one identity field.
///
/// ```
/// use tagstripe_quirks::{MatchKind, Pattern};
/// let p = Pattern::new("ST3*AS", MatchKind::Glob)?;
/// assert!(p.matches("ST380023AS"));
/// assert!(!p.matches("ST380023ASL"));
/// # Ok::<(), tagstripe_quirks::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pattern {
    text: String,
    kind: MatchKind,
}

impl Pattern {
    /// A pattern that matches anything.
    #[must_use]
    pub fn any() -> Self {
        Self {
            text: "*".to_owned(),
            kind: MatchKind::Glob,
        }
    }

    /// Validates `text` as a pattern of `kind`.
    ///
    /// # Errors
    /// [`Error::BadPattern`] for an unterminated `[` or a trailing `\` in a glob.
    pub fn new(text: &str, kind: MatchKind) -> Result<Self, Error> {
        if kind == MatchKind::Glob {
            check_glob(text)?;
        }
        Ok(Self {
            text: text.to_owned(),
            kind,
        })
    }

    /// The pattern text.
    #[must_use]
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How it matches.
    #[must_use]
    pub fn kind(&self) -> MatchKind {
        self.kind
    }

    /// Whether the pattern matches anything at all.
    #[must_use]
    pub fn is_any(&self) -> bool {
        self.kind == MatchKind::Glob && self.text.chars().all(|c| c == '*')
            || self.kind == MatchKind::Prefix && self.text.is_empty()
    }

    /// Whether `s` (already trimmed of padding) matches.
    #[must_use]
    pub fn matches(&self, s: &str) -> bool {
        match self.kind {
            MatchKind::Glob => glob_match(&self.text, s),
            MatchKind::Exact => self.text == s,
            MatchKind::Prefix => s.starts_with(self.text.as_str()),
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            MatchKind::Glob => f.write_str(&self.text),
            kind => write!(f, "{}({})", kind.name(), self.text),
        }
    }
}

fn check_glob(p: &str) -> Result<(), Error> {
    let chars: Vec<char> = p.chars().collect();
    let bad = |position, reason| Error::BadPattern {
        pattern: p.to_owned(),
        position,
        reason,
    };
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 == chars.len() => return Err(bad(i, "trailing backslash")),
            '\\' => i += 2,
            '[' => match class_end(&chars, i) {
                Some(end) => i = end + 1,
                None => return Err(bad(i, "unterminated [")),
            },
            _ => i += 1,
        }
    }
    Ok(())
}

/// Index of the `]` closing the class opened at `open`, as lib/glob.c reads it: a `]` right
/// after `[` (or after the negation mark) is a literal.
fn class_end(p: &[char], open: usize) -> Option<usize> {
    let mut i = open + 1;
    if matches!(p.get(i), Some('!' | '^')) {
        i += 1;
    }
    if p.get(i) == Some(&']') {
        i += 1;
    }
    while i < p.len() {
        if p[i] == ']' {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// Whether `c` is in the class `p[open..=end]`.
fn class_matches(p: &[char], open: usize, end: usize, c: char) -> bool {
    let mut i = open + 1;
    let negate = matches!(p[i], '!' | '^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    while i < end {
        let lo = p[i];
        if i + 2 < end && p[i + 1] == '-' {
            let hi = p[i + 2];
            hit |= lo <= c && c <= hi;
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
    hit != negate
}

/// Shell-glob match of the whole of `s`, with backtracking over the last `*` (linear in
/// practice, as lib/glob.c). Malformed patterns never match.
///
/// ```
/// use tagstripe_quirks::glob_match;
/// assert!(glob_match("INTEL*SSD*", "INTEL SSDSC2KG480G8"));
/// assert!(glob_match("WDC WD2500JD-*", "WDC WD2500JD-00HBB0"));
/// assert!(glob_match("[!X]*", "ST380023AS"));
/// assert!(!glob_match("ST3?0023AS", "ST38800023AS"));
/// ```
#[must_use]
pub fn glob_match(pattern: &str, s: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = s.chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
                continue;
            }
            Some('?') => Some(pi + 1),
            Some('[') => match class_end(&p, pi) {
                Some(end) if class_matches(&p, pi, end, t[ti]) => Some(end + 1),
                Some(_) => None,
                None => return false,
            },
            Some('\\') => match p.get(pi + 1) {
                Some(&c) if c == t[ti] => Some(pi + 2),
                Some(_) => None,
                None => return false,
            },
            Some(&c) if c == t[ti] => Some(pi + 1),
            _ => None,
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                ti += 1;
            }
            (None, Some((sp, st))) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}
