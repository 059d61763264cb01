//! Bringing a mirror side back: the resync that copies what a side lacks from its partner
//! while the volume serves, and the events and status it reports.

use std::sync::Arc;
use std::time::Duration;

use tagstripe_scheduler::IoClass;
use tagstripe_striping::superblock::Side;

use crate::layers::Striped;
use crate::layers::mirror::metadata::{SHARDS, area};
use crate::{BlockDevice, Error, IoOpts, Result};

/// Sectors a copy moves at most at once: 1 MiB while the volume has no other I/O, 256 KiB
/// while it has (a client's request waits behind at most that much; measured with
/// `resync-rate`: 1 MiB copies tripled a 4 KiB client's p99, 256 KiB ones raised it by half).
const RUN_SECTORS: u64 = 2048;
const RUN_SECTORS_BUSY: u64 = 512;
/// Sectors copied between progress records (32 MiB) ...
const CHECKPOINT_SECTORS: u64 = 65536;
/// ... or this long, whichever comes first.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Where a volume's mirror events go (see [`crate::VolumeBuilder::on_event`]).
#[derive(Clone)]
pub(crate) struct EventSink(pub(crate) Arc<dyn Fn(&MirrorEvent) + Send + Sync>);

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("event callback")
    }
}

/// What happens to a mirror's sides, as it happens (see
/// [`crate::VolumeBuilder::on_event`]). The same events go to `tracing` under the target
/// `tagstripe::mirror`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MirrorEvent {
    /// A side failed a write its partner took (or could not take the metadata) and was
    /// dropped: the volume serves degraded.
    Dropped {
        /// The side dropped.
        component: usize,
        /// What it said.
        error: String,
    },
    /// Found stale when the volume was opened (its metadata is behind the volume's, or it
    /// is blank): never read until resynced.
    Stale {
        /// The side.
        component: usize,
    },
    /// A resync started: `sectors` of each side in `components` are copied from its
    /// partner (the bitmap's chunks, or everything when `whole`).
    ResyncStarted {
        /// The sides being copied back.
        components: Vec<usize>,
        /// Sectors to copy to each.
        sectors: u64,
        /// Whether every chunk is copied (a blank side), not only the bitmap's.
        whole: bool,
    },
    /// A resync recorded its progress durably: a restart resumes from here.
    ResyncProgress {
        /// The sides being copied back.
        components: Vec<usize>,
        /// Sectors copied.
        done: u64,
        /// Sectors to copy.
        total: u64,
    },
    /// A resync finished: the sides are in sync again.
    ResyncComplete {
        /// The sides now in sync.
        components: Vec<usize>,
        /// Sectors copied to each.
        sectors: u64,
        /// How long it took.
        elapsed: Duration,
    },
    /// A resync stopped on an error; the sides stay out of the mirror (not read).
    ResyncFailed {
        /// The sides it was copying.
        components: Vec<usize>,
        /// Why.
        error: String,
    },
}

/// A mirror side's state (see [`crate::Volume::status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SideStatus {
    /// Holds every acknowledged write; read and written.
    InSync,
    /// Dropped (failed a write, or found stale at open): neither read nor written.
    Degraded,
    /// Being copied back: written, not read until done.
    Resyncing {
        /// Sectors copied so far.
        done: u64,
        /// Sectors to copy.
        total: u64,
    },
}

fn component(i: usize, e: Error) -> Error {
    match e {
        Error::Component { .. } => e,
        e => Error::Component {
            component: i,
            volume_sector: None,
            source: Box::new(e),
        },
    }
}

/// Copies `targets` back from their partners: the chunks the bitmap holds (all of them when
/// the caller set them all), in the bulk class through the components' queues, while
/// writes go on to both sides; progress recorded durably every 32 MiB or second. Returns the
/// sectors copied to each.
///
/// # Errors
/// A target dropped during the copy, or a read or write that failed (named): the targets
/// are left out of the mirror by the caller.
pub(crate) async fn run(s: &Striped, targets: &[usize], clients: &crate::Stats) -> Result<u64> {
    // Only sides whose partner is in sync now: the state may have changed since the resync
    // was planned (a partner dropped meanwhile leaves its side the one to keep).
    let targets = &s.begin_resync(targets)[..];
    if targets.is_empty() {
        return Ok(0);
    }
    let Some(k) = s.keeper().filter(|k| k.has_bitmap()) else {
        return Err(Error::Resync {
            component: targets.first().copied().unwrap_or(0),
            what: "a volume without mirror metadata cannot be resynced".to_owned(),
        });
    };
    let started = tokio::time::Instant::now();
    let chunk = k.chunk_sectors();
    let comps = s.components();
    // From now on every write goes to the targets too; recorded before anything is copied.
    k.persist(s).await?;
    // And takes its chunks' shard locks, once the writes that began without them are done.
    let _copying = k.start_copying().await;
    let limit = |t: usize| area(comps[t].as_ref()).min(area(comps[s.partner(t)].as_ref()));
    let end = targets.iter().map(|&t| limit(t)).max().unwrap_or(0);
    let todo: Vec<u32> = k
        .dirty_chunks()
        .into_iter()
        .filter(|&c| u64::from(c) * chunk < end)
        .collect();
    let total: u64 = todo
        .iter()
        .map(|&c| chunk.min(end - u64::from(c) * chunk))
        .sum();
    k.set_progress(Some((0, total)), 0);
    let whole = todo.len() as u64 == end.div_ceil(chunk);
    tracing::info!(
        target: "tagstripe::mirror",
        volume = %s.info().name,
        components = ?targets,
        sectors = total,
        whole,
        "resync started"
    );
    s.emit(MirrorEvent::ResyncStarted {
        components: targets.to_vec(),
        sectors: total,
        whole,
    });
    let opts = IoOpts::new().class(IoClass::Bulk);
    let (mut copied, mut done, mut since) = (Vec::new(), 0u64, 0u64);
    let mut last = tokio::time::Instant::now();
    let mut i = 0;
    let mut seen = clients.activity().1;
    while i < todo.len() {
        // Smaller copies while clients use the volume.
        let (in_flight, begun) = clients.activity();
        let busy = in_flight > 0 || begun != seen;
        seen = begun;
        let most = if busy { RUN_SECTORS_BUSY } else { RUN_SECTORS };
        let mut j = i + 1;
        while j < todo.len() && todo[j] == todo[j - 1] + 1 && (j - i + 1) as u64 * chunk <= most {
            j += 1;
        }
        let run = &todo[i..j];
        let start = u64::from(run[0]) * chunk;
        let stop = ((u64::from(run[run.len() - 1]) + 1) * chunk).min(end);
        {
            // No write may land between the read of these chunks and their copy.
            let mut shards: Vec<usize> = run.iter().map(|&c| c as usize % SHARDS).collect();
            shards.sort_unstable();
            shards.dedup();
            let mut locks = Vec::with_capacity(shards.len());
            for sh in shards {
                locks.push(k.shards[sh].write().await);
            }
            for &t in targets {
                if s.side(t) != Side::Resyncing {
                    return Err(Error::Resync {
                        component: t,
                        what: "dropped while being resynced".to_owned(),
                    });
                }
                let src = s.partner(t);
                let to = stop.min(limit(t));
                if to <= start {
                    continue;
                }
                let data = comps[src]
                    .read(start, to - start, opts)
                    .await
                    .map_err(|e| component(src, e))?;
                comps[t]
                    .write(start, data, opts)
                    .await
                    .map_err(|e| component(t, e))?;
            }
        }
        copied.extend_from_slice(run);
        done += stop - start;
        since += stop - start;
        k.set_progress(Some((done, total)), stop);
        i = j;
        if i < todo.len() && (since >= CHECKPOINT_SECTORS || last.elapsed() >= CHECKPOINT_EVERY) {
            // The chunks copied so far cleared on disk: a restart goes on from here.
            checkpoint(s, targets, &mut copied).await?;
            since = 0;
            last = tokio::time::Instant::now();
            tracing::info!(
                target: "tagstripe::mirror",
                volume = %s.info().name,
                done,
                total,
                "resync progress"
            );
            s.emit(MirrorEvent::ResyncProgress {
                components: targets.to_vec(),
                done,
                total,
            });
        }
    }
    // Everything copied and flushed: the targets are in sync, and the chunks copied clean.
    let mark = k.flush_mark_of(Some(&copied));
    flush(s, targets).await?;
    for &t in targets {
        if s.side(t) != Side::Resyncing {
            return Err(Error::Resync {
                component: t,
                what: "dropped while being resynced".to_owned(),
            });
        }
    }
    for &t in targets {
        s.set_side(t, Side::InSync);
    }
    k.set_progress(None, 0);
    if let Some((epoch, chunks)) = mark {
        k.sweep(s, epoch, &chunks, false).await;
    }
    if k.behind(s) {
        k.persist(s).await?;
    }
    let elapsed = started.elapsed();
    tracing::info!(
        target: "tagstripe::mirror",
        volume = %s.info().name,
        components = ?targets,
        sectors = total,
        ?elapsed,
        "resync complete"
    );
    s.emit(MirrorEvent::ResyncComplete {
        components: targets.to_vec(),
        sectors: total,
        elapsed,
    });
    Ok(total)
}

/// Flushes the targets and their partners.
async fn flush(s: &Striped, targets: &[usize]) -> Result<()> {
    for &t in targets {
        for c in [t, s.partner(t)] {
            s.components()[c]
                .flush(IoOpts::new())
                .await
                .map_err(|e| component(c, e))?;
        }
    }
    Ok(())
}

/// Flushes what was copied and clears it from the bitmap (durably, with the progress).
async fn checkpoint(s: &Striped, targets: &[usize], copied: &mut Vec<u32>) -> Result<()> {
    let Some(k) = s.keeper() else {
        return Ok(());
    };
    let mark = k.flush_mark_of(Some(copied));
    flush(s, targets).await?;
    if let Some((epoch, chunks)) = mark {
        k.sweep(s, epoch, &chunks, false).await;
    }
    copied.clear();
    Ok(())
}

/// After a resync failed: the targets still being copied leave the mirror, recorded.
pub(crate) async fn abandon(s: &Striped, targets: &[usize], e: &Error) {
    for &t in targets {
        if s.side(t) == Side::Resyncing {
            s.mark_failed(t);
        }
    }
    if let Some(k) = s.keeper() {
        k.set_progress(None, 0);
        if let Err(e) = k.persist(s).await {
            tracing::error!(
                target: "tagstripe::mirror",
                volume = %s.info().name,
                error = %e,
                "the end of a failed resync could not be recorded"
            );
        }
    }
    tracing::warn!(
        target: "tagstripe::mirror",
        volume = %s.info().name,
        components = ?targets,
        error = %e,
        "resync failed: the sides stay out of the mirror"
    );
    s.emit(MirrorEvent::ResyncFailed {
        components: targets.to_vec(),
        error: e.to_string(),
    });
}
