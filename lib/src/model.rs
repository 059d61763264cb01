//! A byte model of a block device, the oracle for model tests, fuzz targets and soaks:
//! what every sector must read back as, given which writes, zeroings and discards were
//! acknowledged. A request that failed leaves its sectors unknown (old or new bytes, or a
//! torn mix) until they are written again; unknown sectors are not checked.

/// The expected contents of a device, sector by sector.
///
/// ```
/// use tagstripe::ByteModel;
/// let mut m = ByteModel::new(4);
/// m.write(1, &[7u8; 1024], true); // sectors 1-2 acknowledged
/// m.write(3, &[9u8; 512], false); // sector 3 failed: unknown
/// let mut got = vec![0u8; 4 * 512];
/// got[512..1536].fill(7);
/// let c = m.check(0, &got);
/// assert_eq!((c.verified, c.mismatched), (3 * 512, vec![]));
/// got[600] = 1;
/// assert_eq!(m.check(0, &got).mismatched, [1]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByteModel {
    data: Vec<u8>,
    unknown: Vec<bool>,
}

/// What a read compared against the model found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Bytes that matched (known sectors only).
    pub verified: u64,
    /// Known sectors that did not match, ascending.
    pub mismatched: Vec<u64>,
}

impl Check {
    /// Bytes of the known sectors that did not match.
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.mismatched.len() as u64 * 512
    }
}

impl ByteModel {
    /// A device of `sectors` zeroed sectors, all known.
    #[must_use]
    pub fn new(sectors: u64) -> Self {
        Self {
            data: vec![0; sectors as usize * 512],
            unknown: vec![false; sectors as usize],
        }
    }

    /// Its size in sectors.
    #[must_use]
    pub fn sectors(&self) -> u64 {
        self.unknown.len() as u64
    }

    fn range(&self, start: u64, sectors: u64) -> std::ops::Range<usize> {
        let s = (start.min(self.sectors())) as usize;
        let e = (start.saturating_add(sectors).min(self.sectors())) as usize;
        s..e
    }

    /// `bytes` written at `start`: acknowledged (`ok`), they are the contents; failed, the
    /// sectors are unknown.
    pub fn write(&mut self, start: u64, bytes: &[u8], ok: bool) {
        let r = self.range(start, bytes.len() as u64 / 512);
        if ok {
            self.data[r.start * 512..r.end * 512].copy_from_slice(&bytes[..(r.len()) * 512]);
            self.unknown[r].fill(false);
        } else {
            self.unknown[r].fill(true);
        }
    }

    /// `sectors` zeroed or discarded at `start` (acknowledged: zeroes; failed: unknown).
    pub fn zero(&mut self, start: u64, sectors: u64, ok: bool) {
        let r = self.range(start, sectors);
        if ok {
            self.data[r.start * 512..r.end * 512].fill(0);
            self.unknown[r].fill(false);
        } else {
            self.unknown[r].fill(true);
        }
    }

    /// Whether sector `sector` is known.
    #[must_use]
    pub fn known(&self, sector: u64) -> bool {
        self.unknown.get(sector as usize).is_some_and(|u| !u)
    }

    /// What known sector `sector` must read back as (`None` if unknown or outside).
    #[must_use]
    pub fn expected(&self, sector: u64) -> Option<&[u8]> {
        self.known(sector)
            .then(|| &self.data[sector as usize * 512..(sector as usize + 1) * 512])
    }

    /// Compares `got`, read at `start`, with the model.
    #[must_use]
    pub fn check(&self, start: u64, got: &[u8]) -> Check {
        let mut c = Check::default();
        for (k, part) in got.chunks(512).enumerate() {
            let sector = start + k as u64;
            match self.expected(sector) {
                Some(want) if want == part => c.verified += 512,
                Some(_) => c.mismatched.push(sector),
                None => {}
            }
        }
        c
    }
}
