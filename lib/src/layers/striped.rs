//! Striped: a ccd geometry over component devices.

use std::sync::Arc;

use bytes::Bytes;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;
use tagstripe_quirks::{Limits, StripeShape};
use tagstripe_striping::superblock::Side;
use tagstripe_striping::{Geometry, MirrorReads, Piece, ReadBalancer};

use super::Component;
use crate::device::Parts;
use crate::{BlockDevice, DeviceInfo, DynBlockDevice, Error, IoOpts, Result};
use futures_util::TryFutureExt;
use futures_util::future::Either;

/// A volume striped (or concatenated, or mirrored) over components by a
/// [`Geometry`]. Requests map to pieces issued concurrently; a read that maps to one piece is
/// returned without a copy; mirror writes go to both sides and complete when both do; a
/// mirror read that fails is retried on the partner.
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use tagstripe::striping::Geometry;
/// use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MemDevice, Striped};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let comps: Vec<Arc<dyn DynBlockDevice>> =
///     vec![Arc::new(MemDevice::new("a", 1000)), Arc::new(MemDevice::new("b", 2000))];
/// let g = Geometry::builder([1000, 2000], 16).build()?;
/// let v = Striped::new("vol", g, comps.clone())?;
/// v.write(0, Bytes::from(vec![5u8; 32 * 512]), IoOpts::new()).await?;
/// // The second interleave unit landed on component 1 at sector 0.
/// assert_eq!(comps[1].read(0, 16, IoOpts::new()).await?, vec![5u8; 16 * 512]);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Striped {
    info: DeviceInfo,
    geometry: Geometry,
    /// The components as the pieces go to them (concrete stacks: no boxing above the device).
    components: Vec<Component>,
    /// The same, erased, for callers that want them as devices.
    erased: Vec<Arc<dyn DynBlockDevice>>,
    reads: Mutex<ReadBalancer>,
    /// Each component's state ([`side_code`]): in sync; failed (missed a write, stale:
    /// never read, no longer written); resyncing (written, never read until copied back).
    sides: Vec<AtomicU8>,
    /// Serialises dropping sides, so concurrent pieces never drop both sides of a pair.
    dropping: Mutex<()>,
    /// The on-disk metadata, when the volume keeps it: a dropped side is recorded there
    /// before the write that dropped it is acknowledged.
    keeper: std::sync::OnceLock<crate::layers::mirror::metadata::Keeper>,
    /// Where the volume's mirror events go (drops, resyncs), if anyone listens.
    events: std::sync::OnceLock<crate::layers::mirror::resync::EventSink>,
    /// Buffers for reads of several pieces gathered into one (kept, not zeroed anew).
    gathered: Arc<crate::buffers::BufferPool>,
}

fn side_code(s: Side) -> u8 {
    match s {
        Side::InSync => 0,
        Side::Failed => 1,
        Side::Resyncing => 2,
    }
}

impl Striped {
    /// Stripes over `components` with `geometry` (built from their sizes). The volume's
    /// limits are the components' stacked (`Limits::stack`).
    ///
    /// # Errors
    /// [`Error::Geometry`] if the component count or a size differs from the geometry's;
    /// [`Error::Limits`] if the limits do not stack.
    pub fn new(
        name: &str,
        geometry: Geometry,
        components: Vec<Arc<dyn DynBlockDevice>>,
    ) -> Result<Self> {
        Self::over(
            name,
            geometry,
            components.into_iter().map(Component::Erased).collect(),
        )
    }

    /// As [`new`](Self::new), over a volume's own stacks.
    pub(crate) fn over(name: &str, geometry: Geometry, components: Vec<Component>) -> Result<Self> {
        let n = geometry.components();
        if components.len() != n {
            return Err(Error::BadLength {
                device: name.to_owned(),
                what: format!(
                    "geometry has {n} components, {} devices given",
                    components.len()
                ),
            });
        }
        for (i, (c, &raw)) in components.iter().zip(geometry.raw_sizes()).enumerate() {
            if c.info().sectors < raw {
                return Err(Error::Component {
                    component: i,
                    volume_sector: None,
                    source: Box::new(Error::BadLength {
                        device: c.info().name.clone(),
                        what: format!("{} sectors, the geometry needs {raw}", c.info().sectors),
                    }),
                });
            }
        }
        let limits: Vec<Limits> = components.iter().map(|c| c.info().limits.clone()).collect();
        let shape = StripeShape {
            interleave_sectors: geometry.interleave(),
            data_members: geometry.data_components() as u32,
            data_offset_sectors: geometry.reserved_sectors(),
        };
        let stacked = Limits::stack(&limits, &shape)?;
        let mut info = DeviceInfo::new(name, geometry.total_sectors());
        info.limits = stacked.limits;
        info.read_only = components.iter().any(|c| c.info().read_only);
        info.caps = crate::Caps::stack(components.iter().map(|c| c.caps()));
        let policy = geometry.default_mirror_reads();
        Ok(Self {
            reads: Mutex::new(ReadBalancer::new(&geometry, policy)),
            sides: (0..n).map(|_| AtomicU8::new(0)).collect(),
            dropping: Mutex::new(()),
            keeper: std::sync::OnceLock::new(),
            events: std::sync::OnceLock::new(),
            gathered: Arc::default(),
            info,
            geometry,
            erased: components.iter().map(Component::erased).collect(),
            components,
        })
    }

    /// Refuses every write, zeroing and discard from now on (a read-only volume).
    pub(crate) fn set_read_only(&mut self) {
        self.info.read_only = true;
    }

    /// Chooses how mirror reads pick a side.
    pub fn set_mirror_reads(&self, policy: MirrorReads) {
        *self.reads.lock() = ReadBalancer::new(&self.geometry, policy);
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The components.
    pub fn components(&self) -> &[Arc<dyn DynBlockDevice>] {
        &self.erased
    }

    /// The mirror sides that failed a write and were dropped from the mirror (they hold
    /// stale data): the volume keeps serving from their partners, degraded. Empty when
    /// healthy (always, without a mirror).
    pub fn failed_components(&self) -> Vec<usize> {
        (0..self.sides.len())
            .filter(|&i| self.is_failed(i))
            .collect()
    }

    /// Component `i`'s state.
    pub(crate) fn side(&self, i: usize) -> Side {
        match self.sides[i].load(Ordering::Acquire) {
            0 => Side::InSync,
            1 => Side::Failed,
            _ => Side::Resyncing,
        }
    }

    pub(crate) fn set_side(&self, i: usize, s: Side) {
        self.sides[i].store(side_code(s), Ordering::Release);
    }

    /// Dropped: neither read nor written.
    pub(crate) fn is_failed(&self, i: usize) -> bool {
        self.side(i) == Side::Failed
    }

    /// In sync: may be read.
    pub(crate) fn readable(&self, i: usize) -> bool {
        self.side(i) == Side::InSync
    }

    /// Marks component `i` as holding stale data (from the metadata, at open): never read,
    /// no longer written.
    pub(crate) fn mark_failed(&self, i: usize) {
        self.set_side(i, Side::Failed);
    }

    /// Drops component `c` from the mirror for `error` (a failed write or metadata record,
    /// or a replacement), if its partner `q` is in sync: two concurrent failures must never
    /// drop both sides of a pair. Whether `c` is out of the mirror now.
    pub(crate) fn try_drop(&self, c: usize, q: usize, error: &dyn std::fmt::Display) -> bool {
        {
            let _g = self.dropping.lock();
            if !self.readable(q) || self.is_failed(c) {
                return self.is_failed(c);
            }
            self.mark_failed(c);
        }
        if let Some(k) = self.keeper.get() {
            k.note_drop(c);
        }
        tracing::warn!(
            target: "tagstripe::mirror",
            volume = %self.info.name,
            component = c,
            partner = q,
            error = %error,
            "mirror side dropped; the volume serves degraded from its partner"
        );
        self.emit(crate::MirrorEvent::Dropped {
            component: c,
            error: error.to_string(),
        });
        true
    }

    /// Sets each of `targets` resyncing (written, not read) whose partner is in sync now,
    /// atomically with drops (a partner cannot be dropped once its side resyncs); returns
    /// those set.
    pub(crate) fn begin_resync(&self, targets: &[usize]) -> Vec<usize> {
        let _g = self.dropping.lock();
        targets
            .iter()
            .copied()
            .filter(|&t| {
                let ok = self.readable(self.partner(t)) && t != self.partner(t);
                if ok {
                    self.set_side(t, Side::Resyncing);
                }
                ok
            })
            .collect()
    }

    /// Sends `e` to whoever listens ([`crate::VolumeBuilder::on_event`]).
    pub(crate) fn emit(&self, e: crate::MirrorEvent) {
        if let Some(sink) = self.events.get() {
            (sink.0)(&e);
        }
    }

    /// Where mirror events go from now on (once).
    pub(crate) fn set_events(&self, sink: crate::layers::mirror::resync::EventSink) {
        let _ = self.events.set(sink);
    }

    /// The mirror partner of component `i` (ccd mirrors the first half onto the second).
    pub(crate) fn partner(&self, i: usize) -> usize {
        let half = self.components.len() / 2;
        if i < half { i + half } else { i - half }
    }

    /// The metadata keeper, if the volume keeps metadata.
    pub(crate) fn keeper(&self) -> Option<&crate::layers::mirror::metadata::Keeper> {
        self.keeper.get()
    }

    /// Keeps the volume's metadata from now on.
    pub(crate) fn keep(&self, k: crate::layers::mirror::metadata::Keeper) {
        let _ = self.keeper.set(k);
    }

    /// The side to read a piece from first, and the other side, if any: a failed side is
    /// never chosen (its data is stale).
    fn sides(&self, p: &Piece) -> (usize, Option<usize>) {
        let Some(m) = p.mirror else {
            return (p.component, None);
        };
        let first = self.reads.lock().choose(p).1;
        let other = if first == m { p.component } else { m };
        match (self.readable(first), self.readable(other)) {
            (true, true) => (first, Some(other)),
            (false, true) => (other, None),
            (true, false) => (first, None),
            // Neither in sync cannot happen (the last side is never dropped); read what
            // there is.
            (false, false) => (first, None),
        }
    }

    /// Writes (or discards) one piece on every live side. A mirror side that fails while
    /// its partner succeeds is dropped from the mirror and the piece succeeds, degraded; the
    /// last live side is never dropped, and its failure fails the piece.
    ///
    /// One target (the common case): its own future, its error named by component.
    /// Mirrored: boxed, so that a request's future carries no room for a mirror's
    /// gathering (every layer above holds it inline, and a server boxes it whole).
    fn on_sides<'a, F, Fut>(&'a self, p: &'a Piece, op: F) -> impl Future<Output = Result<()>> + 'a
    where
        F: Fn(usize) -> Fut + 'a,
        Fut: Future<Output = Result<()>> + 'a,
    {
        if p.mirror.is_none() {
            let (c, lblk) = (p.component, p.lblk);
            return Either::Left(op(c).map_err(move |e| component(c, Some(lblk), e)));
        }
        Either::Right(Box::pin(self.on_mirror_sides(p, op)))
    }

    /// [`on_sides`](Self::on_sides) for a mirrored piece: each live side written at once.
    async fn on_mirror_sides<F, Fut>(&self, p: &Piece, op: F) -> Result<()>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let targets: Vec<usize> = p
            .write_targets()
            .map(|(_, c)| c)
            .filter(|&c| !self.is_failed(c))
            .collect();
        let targets = if targets.is_empty() {
            p.write_targets().map(|(_, c)| c).collect()
        } else {
            targets
        };
        let results = futures_util::future::join_all(targets.iter().map(|&c| op(c))).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        let mut first_err = None;
        let mut dropped_any = false;
        for (&c, r) in targets.iter().zip(results) {
            let Err(e) = r else { continue };
            let partner = match p.mirror {
                Some(m) if m == c => Some(p.component),
                m => m,
            };
            // Drop this side only if its partner took the write and is itself in sync: two
            // concurrent pieces must not drop both sides of the pair, and a side being
            // resynced cannot stand in for one.
            let dropped =
                ok > 0 && !e.is_retryable() && partner.is_some_and(|q| self.try_drop(c, q, &e));
            dropped_any |= dropped;
            if !dropped && first_err.is_none() {
                first_err = Some(component(c, Some(p.lblk), e));
            }
        }
        if first_err.is_none() {
            if let Some(k) = self.keeper.get() {
                // Durably degraded before this write is acknowledged: after a restart the
                // dropped side is known stale, whatever happens next. A record that failed
                // to be written before is tried again: until it is, nothing is acknowledged.
                if dropped_any || k.behind(self) {
                    k.persist(self).await?;
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// With a write-intent bitmap: the pieces' regions marked durably before they are
    /// written (the guard holds them as in flight until dropped).
    async fn intent(
        &self,
        pieces: &[Piece],
    ) -> Result<Option<crate::layers::mirror::metadata::WriteGuard<'_>>> {
        match self.keeper.get() {
            // Boxed: only a mirror with a bitmap marks regions (see `on_sides`).
            Some(k) if k.has_bitmap() => Ok(Some(Box::pin(k.begin_write(self, pieces)).await?)),
            _ => Ok(None),
        }
    }

    /// The pieces of a volume range, those contiguous on one component merged into one
    /// command (a single-component or concatenated volume sends a large request as one, as
    /// the Linux block layer merges adjacent bios).
    fn pieces(&self, start: u64, sectors: u64) -> Result<Vec<Piece>> {
        Ok(self.geometry.map(start, sectors)?.merged().collect())
    }

    /// A write of `data` (checked: `sectors` long) at volume sector `start`. One piece (the
    /// common small write): the data as it came, to its component (or its mirror sides);
    /// more: [`write_runs`](Self::write_runs).
    /// (An `async move` block, not an `async fn`, here and in `write`: an `async fn`'s
    /// future keeps room for its arguments twice, and every layer above holds a request's
    /// future inline.)
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future keeps its arguments twice"
    )]
    fn write_data(
        &self,
        start: u64,
        sectors: u64,
        data: Parts,
        opts: IoOpts,
    ) -> impl Future<Output = Result<()>> + Send + '_ {
        async move {
            // The map's iterators are not kept across the writes.
            let one = self
                .geometry
                .map(start, sectors)?
                .merged()
                .next()
                .filter(|p| p.count == sectors);
            let Some(p) = one else {
                // Boxed: the pieces' joined futures kept out of the one-piece path's.
                let pieces = self.geometry.map(start, sectors)?.merged().collect();
                return Box::pin(self.write_runs(start, pieces, data, opts)).await;
            };
            let _intent = self.intent(std::slice::from_ref(&p)).await?;
            let data = &data;
            self.on_sides(&p, move |c| {
                data.clone().write_to(&self.components[c], p.cblk, opts)
            })
            .await
        }
    }

    /// A write of `data` at volume sector `start` over `pieces` (more than one): the
    /// pieces that lie back to back on one component go to it as one command, a run inside
    /// one buffer as one buffer, else gathered.
    async fn write_runs(
        &self,
        start: u64,
        pieces: Vec<Piece>,
        data: Parts,
        opts: IoOpts,
    ) -> Result<()> {
        let _intent = self.intent(&pieces).await?;
        let (data, all_pieces) = (&data, &pieces);
        let writes = gather(&pieces)
            .into_iter()
            .map(|(run, members)| async move {
                let run_data = match members[..] {
                    [m] => {
                        let p = &all_pieces[m];
                        data.slice(((p.lblk - start) * 512) as usize, p.count as usize * 512)
                    }
                    _ => {
                        let mut gathered = Vec::with_capacity(members.len());
                        for p in members.iter().map(|&m| &all_pieces[m]) {
                            let off = ((p.lblk - start) * 512) as usize;
                            gathered.extend(crate::device::slice_parts(
                                data.as_slice(),
                                off,
                                p.count as usize * 512,
                            ));
                        }
                        Parts::Many(gathered)
                    }
                };
                let run_data = &run_data;
                self.on_sides(&run, move |c| {
                    run_data
                        .clone()
                        .write_to(&self.components[c], run.cblk, opts)
                })
                .await
            });
        crate::device::all(writes).await?;
        Ok(())
    }

    /// A piped payload cut into its components' runs (see
    /// [`BlockDevice::write_piped`]): each piece moved, in the payload's order, to the end
    /// of its component's run (pipe to pipe), then the runs written at once.
    async fn write_piped_runs(
        &self,
        start: u64,
        sectors: u64,
        mut data: crate::Piped,
        opts: IoOpts,
    ) -> Result<()> {
        let merged = self.geometry.map(start, sectors)?.merged();
        if let Some(p) = merged.clone().next().filter(|p| p.count == sectors) {
            let _intent = self.intent(std::slice::from_ref(&p)).await?;
            return self.components[p.component]
                .write_piped(p.cblk, data, opts)
                .await
                .map_err(|e| component(p.component, Some(p.lblk), e));
        }
        let pieces: Vec<Piece> = merged.collect();
        let _intent = self.intent(&pieces).await?;
        let runs = gather(&pieces);
        // Which run each piece goes to, and the runs' payloads.
        let mut run_of = vec![0usize; pieces.len()];
        for (r, (_, members)) in runs.iter().enumerate() {
            for &m in members {
                run_of[m] = r;
            }
        }
        let mut piped: Vec<crate::Piped> = runs
            .iter()
            .map(|(run, _)| crate::Piped::new(Bytes::new(), run.count as usize * 512))
            .collect();
        // Nothing is written unless every piece found its run (a pipe's failure is the
        // volume's, not a component's).
        for (p, &r) in pieces.iter().zip(&run_of) {
            data.move_front_to(&mut piped[r], p.count as usize * 512)
                .map_err(|source| Error::Io {
                    device: self.info.name.clone(),
                    op: "write",
                    start: p.lblk,
                    sectors: p.count,
                    source,
                })?;
        }
        let writes = runs.iter().zip(piped).map(|((run, _), data)| async move {
            self.components[run.component]
                .write_piped(run.cblk, data, opts)
                .await
                .map_err(|e| component(run.component, None, e))
        });
        crate::device::all(writes).await?;
        Ok(())
    }

    /// One piece read from its component, or its mirror side where the first fails.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future keeps its arguments twice"
    )]
    fn read_piece(
        &self,
        p: Piece,
        opts: IoOpts,
        send: bool,
    ) -> impl Future<Output = Result<Bytes>> + Send + '_ {
        async move {
            let (first, other) = self.sides(&p);
            let read = |c: usize| {
                crate::device::read_or_send(&self.components[c], p.cblk, p.count, opts, send)
            };
            let e = match read(first).await {
                Ok(b) => return Ok(b),
                Err(e) => e,
            };
            let Some(other) = other else {
                return Err(component(first, Some(p.lblk), e));
            };
            read(other)
                .await
                .map_err(|_| component(first, Some(p.lblk), e))
        }
    }

    /// A read into bytes: one piece's as its component gives them (`send`: its
    /// `read_to_send`); several gathered into one buffer.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future keeps its arguments twice"
    )]
    fn read_bytes(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
        send: bool,
    ) -> impl Future<Output = Result<Bytes>> + Send + '_ {
        async move {
            self.info.check(start, sectors)?;
            let first = self.geometry.map(start, sectors)?.merged().next();
            if let Some(p) = first.filter(|p| p.count == sectors) {
                // One piece: the component's bytes as they come, no copy here.
                return self.read_piece(p, opts, send).await;
            }
            // Boxed: the rare path kept out of the common one's future.
            Box::pin(self.read_gathered(start, sectors, opts)).await
        }
    }

    /// A read of several pieces: each read straight into its place in one buffer (one
    /// copy, not two), a kept one where there is one (every byte of it is read over).
    async fn read_gathered(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<Bytes> {
        let len = sectors as usize * 512;
        let mut buf = self.gathered.take(len).unwrap_or_else(|| vec![0u8; len]);
        match self.read_into(start, &mut buf[..len], opts).await {
            Ok(()) => Ok(crate::buffers::BufferPool::bytes(
                &self.gathered,
                buf,
                0,
                len,
            )),
            Err(e) => {
                self.gathered.give_back(buf);
                Err(e)
            }
        }
    }
}

impl Striped {
    /// Reads a run of pieces back to back on one component into their places (one command),
    /// from the other mirror side if the first fails.
    async fn read_run_into(&self, p: Piece, mut parts: Vec<&mut [u8]>, opts: IoOpts) -> Result<()> {
        if parts.len() == 1 {
            if let Some(buf) = parts.pop() {
                return self.read_piece_into(p, buf, opts).await;
            }
        }
        let (first, other) = self.sides(&p);
        // Lent for the first try, so the second has them again.
        let lent: Vec<&mut [u8]> = parts.iter_mut().map(|b| &mut **b).collect();
        let Err(e) = self.components[first]
            .read_vectored_into(p.cblk, lent, opts)
            .await
        else {
            return Ok(());
        };
        let Some(other) = other else {
            return Err(component(first, Some(p.lblk), e));
        };
        self.components[other]
            .read_vectored_into(p.cblk, parts, opts)
            .await
            .map_err(|_| component(first, Some(p.lblk), e))
    }

    /// Reads `pieces` (a request's, in volume order) into `bufs` (its bytes, one after the
    /// other): each piece's places in the buffers, then the pieces back to back on one
    /// component read there as one command, scattered straight into their places.
    async fn read_scattered(
        &self,
        pieces: Vec<Piece>,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> Result<()> {
        let mut bufs = bufs.into_iter().filter(|b| !b.is_empty());
        let mut rest: &mut [u8] = &mut [];
        let mut places: Vec<Vec<&mut [u8]>> = Vec::with_capacity(pieces.len());
        for p in &pieces {
            // A piece may span the end of one buffer and the start of the next: every
            // buffer is whole sectors, so each part of it is too.
            let mut want = p.count as usize * 512;
            let mut parts = Vec::with_capacity(1);
            while want > 0 {
                if rest.is_empty() {
                    rest = bufs.next().ok_or_else(|| Error::BadLength {
                        device: self.info.name.clone(),
                        what: "buffers shorter than the request".to_string(),
                    })?;
                }
                let n = want.min(rest.len());
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(n);
                rest = tail;
                parts.push(part);
                want -= n;
            }
            places.push(parts);
        }
        let mut runs = Vec::new();
        for (run, members) in gather(&pieces) {
            let parts: Vec<&mut [u8]> = members
                .iter()
                .flat_map(|&m| std::mem::take(&mut places[m]))
                .collect();
            runs.push((run, parts));
        }
        crate::device::all(
            runs.into_iter()
                .map(|(run, parts)| self.read_run_into(run, parts, opts)),
        )
        .await?;
        Ok(())
    }

    async fn read_piece_into(&self, p: Piece, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let (first, other) = self.sides(&p);
        match self.components[first].read_into(p.cblk, buf, opts).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let Some(other) = other else {
                    return Err(component(first, Some(p.lblk), e));
                };
                self.components[other]
                    .read_into(p.cblk, buf, opts)
                    .await
                    .map_err(|_| component(first, Some(p.lblk), e))
            }
        }
    }
}

/// The runs of `pieces` (in volume order) that lie back to back on one component (and its
/// mirror): each run as one piece (its volume sector the first member's) and the indices of
/// its members in `pieces`. A striped request's units on one component are contiguous there,
/// so each component gets one command (the block layer's plug merging, done before
/// issuing). Members of a run are consecutive on the component, so they are every
/// `components`-th piece: a run is closed as soon as a piece of its component does not
/// continue it.
fn gather(pieces: &[Piece]) -> Vec<(Piece, Vec<usize>)> {
    // Open runs, one a component at most: (run, its member indices).
    let mut open: Vec<(Piece, Vec<usize>)> = Vec::new();
    let mut done: Vec<(Piece, Vec<usize>)> = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        match open
            .iter_mut()
            .position(|(r, _)| r.component == p.component && r.mirror == p.mirror)
        {
            Some(at) if open[at].0.cblk + open[at].0.count == p.cblk => {
                open[at].0.count += p.count;
                open[at].1.push(i);
            }
            Some(at) => {
                let closed = open.swap_remove(at);
                done.push(closed);
                open.push((*p, vec![i]));
            }
            None => open.push((*p, vec![i])),
        }
    }
    done.extend(open);
    done
}

/// `e` from component `i`, for a piece at `volume_sector` (if of one piece).
fn component(i: usize, volume_sector: Option<u64>, e: Error) -> Error {
    match e {
        Error::Component { .. } => e,
        e => Error::Component {
            component: i,
            volume_sector,
            source: Box::new(e),
        },
    }
}

impl BlockDevice for Striped {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    // `read_to_send`: a read of one piece is its component's `read_to_send`.
    crate::device::read_through_bytes!(|self| read_bytes);

    /// Each piece as its component gives it (`read_to_send`): the pieces back to back on one
    /// component read as one run (one command, as `read_into` sends), then cut into the
    /// pieces (no copy), in volume order.
    async fn read_parts_to_send(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> Result<Vec<Bytes>> {
        self.info.check(start, sectors)?;
        let pieces: Vec<Piece> = self.geometry.map(start, sectors)?.merged().collect();
        if let [p] = pieces[..] {
            return Ok(vec![self.read_piece(p, opts, true).await?]);
        }
        let runs = gather(&pieces);
        let got = crate::device::all(
            runs.iter()
                .map(|(run, _)| self.read_piece(*run, opts, true)),
        )
        .await?;
        let mut parts = vec![Bytes::new(); pieces.len()];
        for ((r, members), run) in runs.iter().zip(got) {
            if run.len() as u64 != r.count * 512 {
                let e = Error::BadLength {
                    device: self.info.name.clone(),
                    what: format!("read {} bytes, {} asked", run.len(), r.count * 512),
                };
                return Err(component(r.component, Some(r.lblk), e));
            }
            let mut at = 0;
            for &m in members {
                let n = pieces[m].count as usize * 512;
                parts[m] = run.slice(at..at + n);
                at += n;
            }
        }
        Ok(parts)
    }

    async fn read_into(&self, start: u64, buf: &mut [u8], opts: IoOpts) -> Result<()> {
        let sectors = crate::device::sectors_of(&self.info, buf.len())?;
        self.info.check(start, sectors)?;
        let pieces = self.geometry.map(start, sectors)?.merged();
        if let Some(p) = pieces.clone().next().filter(|p| p.count == sectors) {
            // One piece (the common small request): no gathering at all.
            return self.read_piece_into(p, buf, opts).await;
        }
        self.read_scattered(pieces.collect(), vec![buf], opts).await
    }

    /// Reads into `bufs` one after the other, as [`read_into`](Self::read_into) into one
    /// buffer: each component's run straight into its places, with no buffer of the whole.
    async fn read_vectored_into(
        &self,
        start: u64,
        bufs: Vec<&mut [u8]>,
        opts: IoOpts,
    ) -> Result<()> {
        let sectors = crate::device::check_bufs(&self.info, start, &bufs)?;
        let pieces = self.geometry.map(start, sectors)?.merged().collect();
        self.read_scattered(pieces, bufs, opts).await
    }

    crate::device::write_through_parts!(|self| write_data);

    /// Where every component does, on a volume without a mirror (a pipe's bytes cannot
    /// go to two sides).
    fn takes_piped_writes(&self) -> bool {
        !self.geometry.is_mirror() && self.components.iter().all(BlockDevice::takes_piped_writes)
    }

    /// Each component's run of the payload moved into a pipe of its own, in the payload's
    /// order, and written there (see [`takes_piped_writes`](Self::takes_piped_writes));
    /// else read into memory and written as any other.
    async fn write_piped(&self, start: u64, data: crate::Piped, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        if !self.takes_piped_writes() {
            return crate::device::write_piped_from_memory(self, start, data, opts).await;
        }
        self.write_piped_runs(start, sectors, data, opts).await
    }

    async fn flush(&self, opts: IoOpts) -> Result<()> {
        // What was written before now is durable on every side once this flush is: the
        // bitmap's bits for it may then be cleared.
        let sweep = self
            .keeper
            .get()
            .and_then(crate::layers::mirror::metadata::Keeper::flush_mark);
        // A side dropped from the mirror holds nothing the volume still needs.
        let flushes = self
            .components
            .iter()
            .enumerate()
            .filter(|&(i, _)| !self.is_failed(i))
            .map(|(i, c)| async move { c.flush(opts).await.map_err(|e| component(i, None, e)) });
        crate::device::all(flushes).await?;
        if let (Some(k), Some((epoch, chunks))) = (self.keeper.get(), sweep) {
            k.sweep(self, epoch, &chunks, true).await;
        }
        Ok(())
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        crate::device::check_zeroes(&self.info, start, sectors)?;
        let pieces = self.pieces(start, sectors)?;
        let _intent = self.intent(&pieces).await?;
        let zeroes = pieces.iter().map(|p| {
            self.on_sides(p, move |c| async move {
                self.components[c]
                    .write_zeroes(p.cblk, p.count, z, opts)
                    .await
            })
        });
        crate::device::all(zeroes).await?;
        Ok(())
    }

    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> Result<()> {
        self.info.check_discard(start, sectors)?;
        let pieces = self.pieces(start, sectors)?;
        let _intent = self.intent(&pieces).await?;
        let discards = pieces.iter().map(|p| {
            self.on_sides(p, move |c| async move {
                self.components[c].discard(p.cblk, p.count, opts).await
            })
        });
        crate::device::all(discards).await?;
        Ok(())
    }

    /// Each piece asks the component that holds it (for a mirror, a side in sync), and the
    /// answers are joined in volume order, equal neighbours merged.
    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        self.info.check(start, sectors)?;
        let pieces = self.pieces(start, sectors)?;
        let asks = pieces.iter().map(|p| {
            let c = match p.mirror {
                Some(m) if !self.readable(p.component) => m,
                _ => p.component,
            };
            async move {
                self.components[c]
                    .allocation(p.cblk, p.count)
                    .await
                    .map_err(|e| component(c, Some(p.lblk), e))
            }
        });
        let mut out = Vec::new();
        for extents in crate::device::all(asks).await? {
            for e in extents {
                crate::device::push_extent(&mut out, e);
            }
        }
        Ok(out)
    }
}

impl Striped {
    /// Which component holds each part of `[start, start + sectors)`: runs of
    /// `(sectors, component, mirror partner)` in volume order, from the geometry alone (no
    /// I/O). The mirror partner is `None` without a mirror, and a dropped side is still
    /// named (see [`Striped::failed_components`]).
    ///
    /// # Errors
    /// [`Error::Geometry`] if the range is outside the volume.
    pub fn component_map(
        &self,
        start: u64,
        sectors: u64,
    ) -> Result<Vec<(u64, usize, Option<usize>)>> {
        let mut out: Vec<(u64, usize, Option<usize>)> = Vec::new();
        for p in self.geometry.map(start, sectors)? {
            match out.last_mut() {
                Some(last) if last.1 == p.component && last.2 == p.mirror => last.0 += p.count,
                _ => out.push((p.count, p.component, p.mirror)),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(g: &Geometry, start: u64, sectors: u64) -> Vec<(usize, u64, u64, Vec<u64>)> {
        let pieces: Vec<Piece> = g.map(start, sectors).unwrap().merged().collect();
        gather(&pieces)
            .into_iter()
            .map(|(r, m)| {
                let lblks = m.iter().map(|&i| pieces[i].lblk).collect();
                (r.component, r.cblk, r.count, lblks)
            })
            .collect()
    }

    #[test]
    fn gather_joins_the_units_back_to_back_on_each_component() {
        // Two components of different sizes, interleave 4: rows of 8 sectors while both
        // last, then the larger one alone (one piece a request there, merged already).
        let g = Geometry::builder([16, 40], 4)
            .no_offset(true)
            .build()
            .unwrap();
        let mut got = runs(&g, 2, 20);
        got.sort();
        assert_eq!(
            got,
            [(0, 2, 10, vec![2, 8, 16]), (1, 0, 10, vec![4, 12, 20])],
            "units 2..22: component 0 gets 2..4, 4..8, 8..12 of its own"
        );
        // A mirror: the pieces' partners ride along; each side gets one run.
        let m = Geometry::builder([32; 4], 4)
            .flavor(tagstripe_striping::Flavor::FreeBsd)
            .no_offset(true)
            .mirror(true)
            .build()
            .unwrap();
        let pieces: Vec<Piece> = m.map(0, 32).unwrap().merged().collect();
        let got = gather(&pieces);
        assert_eq!(got.len(), 2);
        for (run, members) in got {
            assert_eq!((run.cblk, run.count, members.len()), (0, 16, 4));
            assert!(run.mirror.is_some());
        }
    }
}
