//! Crash states as image files a check can read and modify: [`Images`].
//!
//! One working image a device, moved from state to state, never copied whole per state:
//! - the base (the writes durable at the crash point, or completed for prefix states) only
//!   grows as the states, taken in order of their crash points, move forward: each write
//!   joins once, written where it landed later than what is there (an interval map keeps
//!   each sector's landing);
//! - a state's other writes are laid over the base with what they cover saved first, and
//!   put back after the check;
//! - a check that modified an image (its mtime, set to a sentinel after each state, moved;
//!   or the file was replaced) makes that image rebuilt from the base image and the log.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::log::CrashLog;
use super::states::{BaseCursor, CrashState, Source, Timeline};
use crate::{Error, Result};

/// The mtime an image has between a state's materialization and its check.
const SENTINEL: Duration = Duration::from_secs(1_000_000_000);

/// Sector ranges of a device, each with the landing moment of the base write that holds it
/// and whether that write was zeroes.
#[derive(Clone, Debug, Default)]
struct Cover {
    /// start -> (end, landing, zero)
    map: BTreeMap<u64, (u64, u64, bool)>,
}

/// A piece of a range and who holds it: `None` for what no base write has touched.
type Held = (u64, u64, Option<(u64, bool)>);

impl Cover {
    /// The pieces of `[start, end)` in order, each with its holder.
    fn pieces(&self, start: u64, end: u64) -> Vec<Held> {
        let mut out = Vec::new();
        let mut at = start;
        let first = self
            .map
            .range(..=start)
            .next_back()
            .filter(|(_, (e, ..))| *e > start)
            .map(|(s, _)| *s)
            .unwrap_or(start);
        for (&s, &(e, landing, zero)) in self.map.range(first..end) {
            if s > at {
                out.push((at, s, None));
            }
            let (ps, pe) = (s.max(at), e.min(end));
            if pe > ps {
                out.push((ps, pe, Some((landing, zero))));
            }
            at = at.max(pe);
        }
        if at < end {
            out.push((at, end, None));
        }
        out
    }

    /// Sets `[start, end)` to be held by a write that landed at `landing`.
    fn set(&mut self, start: u64, end: u64, landing: u64, zero: bool) {
        // Cut the entries that straddle the edges, then drop everything inside.
        for edge in [start, end] {
            if let Some((&s, &(e, l, z))) = self.map.range(..edge).next_back() {
                if e > edge {
                    self.map.insert(s, (edge, l, z));
                    self.map.insert(edge, (e, l, z));
                }
            }
        }
        let inside: Vec<u64> = self.map.range(start..end).map(|(s, _)| *s).collect();
        for s in inside {
            self.map.remove(&s);
        }
        self.map.insert(start, (end, landing, zero));
    }
}

/// What a state's overlay covered, to put back.
#[derive(Debug)]
enum Undo {
    /// These bytes at this byte offset.
    Bytes(u64, Vec<u8>),
    /// Zeroes (a hole) over this byte range.
    Zero(u64, u64),
}

/// One device's working image.
#[derive(Debug)]
struct Image {
    path: PathBuf,
    file: File,
    base: Option<PathBuf>,
    bytes: u64,
    cover: Cover,
    undo: Vec<Undo>,
}

/// The working images of a log's devices, moved from state to state.
///
/// ```
/// use bytes::Bytes;
/// use tagstripe::crash::{CrashLog, Images, Mode, StateId, Tail, Timeline};
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, Recorder};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dir = std::env::temp_dir().join(format!("ts-doc-img-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let rec = Recorder::create(dir.join("log"))?;
/// let dev = rec.record(MemDevice::new("m", 64)).await?;
/// dev.write(0, Bytes::from(vec![1u8; 512]), IoOpts::new()).await?;
/// dev.flush(IoOpts::new()).await?;
/// dev.write(0, Bytes::from(vec![2u8; 512]), IoOpts::new()).await?; // never flushed
/// rec.finish().await?;
///
/// let log = CrashLog::open(dir.join("log"), Tail::Strict)?;
/// let t = Timeline::new(&log);
/// let mut images = Images::new(&log, dir.join("work"), &[])?;
/// // The first prefix state: at the flush's submission, the first write had completed.
/// let s = t.state(StateId { mode: Mode::Prefix, seed: 0, index: 0 }).unwrap();
/// images.materialize(&log, &t, &s)?;
/// assert_eq!(std::fs::read(&images.paths()[0])?[0], 1);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Images {
    images: Vec<Image>,
    cursor: Option<BaseCursor>,
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl Fn(std::io::Error) -> Error + 'a {
    move |e| Error::Io {
        device: path.display().to_string(),
        op,
        start: 0,
        sectors: 0,
        source: e,
    }
}

impl Images {
    /// Creates a working image a device of `log` in `dir` (made if missing), named
    /// `image` (one device) or `image-N`. `bases` gives each device's content when
    /// recording began (missing entries: zeroes, allowed only where the log says the device
    /// read as zeroes).
    ///
    /// # Errors
    /// [`Error::BadLength`] for a device that needs a base image and has none, or a base
    /// image shorter than the device; [`Error::Io`] for files that cannot be made.
    pub fn new(log: &CrashLog, dir: impl AsRef<Path>, bases: &[PathBuf]) -> Result<Self> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(io_err(dir, "create"))?;
        let mut images = Vec::new();
        for (i, d) in log.devices().iter().enumerate() {
            let base = bases.get(i).cloned();
            let bytes = d.sectors * 512;
            match &base {
                None if !d.zero_base => {
                    return Err(Error::BadLength {
                        device: d.name.clone(),
                        what: format!(
                            "device {i} held data when recording began: give the image it \
                             held then as its base"
                        ),
                    });
                }
                Some(b) => {
                    let len = std::fs::metadata(b).map_err(io_err(b, "stat"))?.len();
                    if len < bytes {
                        return Err(Error::BadLength {
                            device: d.name.clone(),
                            what: format!(
                                "base image {} is {len} bytes, the device {bytes}",
                                b.display()
                            ),
                        });
                    }
                }
                None => {}
            }
            let path = if log.devices().len() == 1 {
                dir.join("image")
            } else {
                dir.join(format!("image-{i}"))
            };
            let file = fresh(&path, base.as_deref(), bytes)?;
            images.push(Image {
                path,
                file,
                base,
                bytes,
                cover: Cover::default(),
                undo: Vec::new(),
            });
        }
        Ok(Self {
            images,
            cursor: None,
        })
    }

    /// The images' paths, a device each.
    #[must_use]
    pub fn paths(&self) -> Vec<PathBuf> {
        self.images.iter().map(|i| i.path.clone()).collect()
    }

    /// Makes the images show `state`: puts back what the last state laid over the base (or
    /// rebuilds an image its check modified), moves the base to the state's point, lays the
    /// state's other writes over it.
    ///
    /// # Errors
    /// [`Error::Io`] if an image or the log cannot be read or written.
    pub fn materialize(&mut self, log: &CrashLog, t: &Timeline, state: &CrashState) -> Result<()> {
        let mut rebuild = false;
        for img in &mut self.images {
            if img.modified() {
                rebuild = true;
            } else {
                img.put_back()?;
            }
        }
        let rule_changed = self.cursor.as_ref().is_some_and(|c| c.rule() != state.base);
        let behind = self
            .cursor
            .as_ref()
            .is_some_and(|c| c.point() > state.point);
        if rebuild || behind || rule_changed || self.cursor.is_none() {
            for img in &mut self.images {
                img.file = fresh(&img.path, img.base.as_deref(), img.bytes)?;
                img.cover = Cover::default();
                img.undo.clear();
            }
            self.cursor = Some(t.cursor(state.base));
        }
        let Some(cursor) = self.cursor.as_mut() else {
            return Ok(());
        };
        for w in cursor.advance(t, state.point) {
            let wr = t.writes()[w];
            let img = &mut self.images[usize::from(wr.dev)];
            img.land(log, &wr, wr.start, wr.sectors, t.base_landing(w), false)?;
        }
        for o in &state.overlay {
            let wr = t.writes()[o.write];
            let img = &mut self.images[usize::from(wr.dev)];
            match &o.kept {
                None => img.land(log, &wr, wr.start, wr.sectors, o.landing, true)?,
                Some(kept) => {
                    for &(s, n) in kept {
                        img.land(log, &wr, s, n, o.landing, true)?;
                    }
                }
            }
        }
        for img in &mut self.images {
            img.file
                .set_modified(SystemTime::UNIX_EPOCH + SENTINEL)
                .map_err(io_err(&img.path, "set mtime"))?;
        }
        Ok(())
    }
}

/// A new image at `path`: `bytes` of zeroes (sparse), with `base`'s data copied in (only
/// its data: its holes stay holes, so a mostly empty base costs what it holds).
fn fresh(path: &Path, base: Option<&Path>, bytes: u64) -> Result<File> {
    let _ = std::fs::remove_file(path);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io_err(path, "create"))?;
    f.set_len(bytes).map_err(io_err(path, "size"))?;
    if let Some(b) = base {
        let src = File::open(b).map_err(io_err(b, "open"))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        for e in crate::backend::seek_extents(&src, 0, bytes / 512, 1) {
            let len = e.sectors * 512;
            if !e.zero {
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(buf.len() as u64) as usize;
                    src.read_exact_at(&mut buf[..n], at + done)
                        .map_err(io_err(b, "read"))?;
                    f.write_all_at(&buf[..n], at + done)
                        .map_err(io_err(path, "write"))?;
                    done += n as u64;
                }
            }
            at += len;
        }
    }
    Ok(f)
}

impl Image {
    /// Whether the last check changed the image (or replaced the file).
    fn modified(&self) -> bool {
        let Ok(now) = std::fs::metadata(&self.path) else {
            return true;
        };
        let Ok(ours) = self.file.metadata() else {
            return true;
        };
        now.ino() != ours.ino()
            || now.dev() != ours.dev()
            || now.len() != self.bytes
            || ours.modified().ok() != Some(SystemTime::UNIX_EPOCH + SENTINEL)
    }

    /// Puts back what the last overlay covered, newest first.
    fn put_back(&mut self) -> Result<()> {
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Bytes(at, b) => self
                    .file
                    .write_all_at(&b, at)
                    .map_err(io_err(&self.path, "write"))?,
                Undo::Zero(at, len) => crate::backend::punch_hole(&self.file, at, len)
                    .map_err(io_err(&self.path, "punch"))?,
            }
        }
        Ok(())
    }

    /// Lands sectors `[start, start + sectors)` of write `wr` at `landing`, where nothing
    /// that landed later holds them; an overlay saves what it covers first.
    fn land(
        &mut self,
        log: &CrashLog,
        wr: &super::states::Write,
        start: u64,
        sectors: u64,
        landing: u64,
        overlay: bool,
    ) -> Result<()> {
        let zero = wr.src == Source::Zero;
        for (s, e, held) in self.cover.pieces(start, start + sectors) {
            if held.is_some_and(|(l, _)| l > landing) {
                continue;
            }
            let (at, len) = (s * 512, (e - s) * 512);
            if overlay {
                let was_zero = match held {
                    Some((_, z)) => z,
                    None => self.base.is_none(),
                };
                if was_zero {
                    self.undo.push(Undo::Zero(at, len));
                } else {
                    let mut b = vec![0u8; len as usize];
                    self.file
                        .read_exact_at(&mut b, at)
                        .map_err(io_err(&self.path, "read"))?;
                    self.undo.push(Undo::Bytes(at, b));
                }
            } else {
                self.cover.set(s, e, landing, zero);
            }
            match wr.src {
                Source::Zero => crate::backend::punch_hole(&self.file, at, len)
                    .map_err(io_err(&self.path, "punch"))?,
                Source::Log(data_at) => {
                    let mut b = vec![0u8; len as usize];
                    log.read_data(data_at + (s - wr.start) * 512, &mut b)?;
                    self.file
                        .write_all_at(&b, at)
                        .map_err(io_err(&self.path, "write"))?;
                }
            }
        }
        Ok(())
    }
}
